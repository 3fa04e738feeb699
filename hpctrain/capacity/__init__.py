"""Capacity from measurements: how many nodes, how long, how many GPU-hours, how often to checkpoint, what
failures cost and what limits a run, predicted from calibration runs' own records (docs/capacity.md).

Login-node code (never imports torch; the plot is SVG drawn by :mod:`hpctrain.charts`, stdlib only). For
other tools (the run report):

* :func:`capacity_report` ``(run_dirs, targets=None) -> dict``: the table and everything behind it, the
  ``python -m hpctrain capacity --json`` object (schema ``hpctrain.capacity/1``);
* :func:`render_plot` ``(report, fmt="svg") -> bytes``: the plot of such a report (SVG only);
* :class:`Targets`: what to predict for; :func:`read_calibrations`: one run directory's measurements.

The arithmetic is :mod:`hpctrain.capacity.model` and :mod:`hpctrain.reliability` (the latter shared with
the Trainer's ``every_minutes="auto"``). The calibration's all-reduce probe is the node-side entry
``hpctrain.launch.probe:main``, submitted by name, never imported here.
"""

from __future__ import annotations

from hpctrain.capacity.calibration import Calibration, read_calibrations
from hpctrain.capacity.plot import render_plot
from hpctrain.capacity.predict import SCHEMA, capacity_report
from hpctrain.capacity.targets import Targets

__all__ = [
    "SCHEMA",
    "Calibration",
    "Targets",
    "capacity_report",
    "read_calibrations",
    "render_plot",
]
