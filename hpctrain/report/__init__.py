"""A run's records for people: one self-contained HTML report, and the metrics as TensorBoard event files.

* ``python -m hpctrain report RUN_DIR [-o FILE]`` (:mod:`hpctrain.report.cli`): one HTML file, no server, no
  network, no script: inline SVG drawn here (:mod:`hpctrain.charts`) from what
  :func:`hpctrain.report.gather.gather` reads (the status report of :func:`hpctrain.status.report.collect`
  plus every metrics record, sanitised against the same schemas), laid out by :mod:`hpctrain.report.page`.
* ``python -m hpctrain export-tensorboard RUN_DIR [-o DIR]`` (:mod:`hpctrain.report.tensorboard`): the
  interval and eval records as TensorBoard scalars (the ``tensorboard`` package's own writer; the optional
  extra ``hpctrain[tensorboard]``).

Login node: stdlib only (tensorboard for the export), never torch. See docs/report.md.
"""

from __future__ import annotations

import typing as tp

__all__ = ["gather", "render", "write_report"]


def __getattr__(name: str) -> tp.Any:
    if name == "gather":
        from hpctrain.report.gather import gather

        return gather
    if name == "render":
        from hpctrain.report.page import render

        return render
    if name == "write_report":
        from hpctrain.report.cli import write_report

        return write_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
