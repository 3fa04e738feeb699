"""From calibration run directories to the capacity report: :func:`capacity_report` (stdlib only).

The report is :func:`fit`, then :func:`predict`, shaped as the ``--json`` object (:data:`SCHEMA`) with the
calibration runs placed on the prediction's curves. The steps live by job: :class:`Targets` in
:mod:`hpctrain.capacity.targets`; :func:`fit`, :class:`Fitted`, :class:`Param` and
:func:`interconnect_from_probe` in :mod:`hpctrain.capacity.fit`; :func:`predict` (a row per node count) in
:mod:`hpctrain.capacity.rows`; what bounds each row in :mod:`hpctrain.capacity.advice`. They are importable
from here too. The formulas and the choices made are in docs/capacity.md.
"""

from __future__ import annotations

import math
import typing as tp
from dataclasses import asdict

from hpctrain.capacity import model as m
from hpctrain.capacity.calibration import Calibration
from hpctrain.capacity.fit import Fitted, Param, fit, interconnect_from_probe
from hpctrain.capacity.rows import _row, predict, storage_bound_from
from hpctrain.capacity.targets import DEFAULT_NODES, Targets

__all__ = [
    "Targets",
    "Param",
    "Fitted",
    "fit",
    "predict",
    "capacity_report",
    "interconnect_from_probe",
    "DEFAULT_NODES",
    "SCHEMA",
]

SCHEMA = "hpctrain.capacity/1"


def _points(
    points: tp.Sequence[Calibration], f: Fitted, rows: tp.Sequence[tp.Dict[str, tp.Any]]
) -> tp.List[tp.Dict[str, tp.Any]]:
    """The calibration runs as they would sit on the prediction's curves: measured throughput and the time to
    train the target samples at it (comparable when the ranks per node and the batch policy match)."""
    thr_1 = next((r.get("samples_per_s") for r in rows if r["nodes"] == 1 and r.get("feasible")), None)
    if thr_1 is None:
        base = _row(f, 1, None)
        thr_1 = base.get("samples_per_s") if base.get("feasible") else None
    samples = f.samples.value or 0.0
    out = []
    for p in points:
        thr = p.local_batch * p.world_size / p.step_s if p.step_s else p.samples_per_s
        same_batch = (
            abs(p.local_batch - f.local_batch.value) < 1e-9
            if f.local_batch.value
            else abs(p.global_batch - (f.global_batch.value or 0.0)) < 1e-9
        )
        out.append(
            {
                "run_dir": p.run_dir,
                "nodes": p.nodes,
                "world_size": p.world_size,
                "step_s": p.step_s,
                "samples_per_s": thr,
                "train_s": samples / thr if thr else None,
                "efficiency": m.scaling_efficiency(thr, p.nodes, thr_1) if thr_1 else None,
                "comparable": same_batch and abs(p.ranks_per_node - (f.ranks_per_node.value or 1)) < 1e-9,
            }
        )
    return out


def capacity_report(
    run_dirs: tp.Union[str, "tp.Any", tp.Sequence[tp.Any]], targets: tp.Optional[Targets] = None
) -> tp.Dict[str, tp.Any]:
    """The capacity report of one or more calibration run directories as a JSON-able dict (the ``--json``
    schema ``hpctrain.capacity/1``, docs/capacity.md). Torch-free; raises UsageError for a directory that is
    not a calibration run."""
    import os

    from hpctrain.capacity.calibration import read_calibrations

    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    targets = targets or Targets()
    points = [c for d in run_dirs for c in read_calibrations(d)]
    f = fit(points, targets)
    rows = predict(f, targets.nodes)
    notes = list(dict.fromkeys([*f.notes, *(n for p in points for n in p.notes)]))
    feasible = [r for r in rows if r.get("feasible") and math.isfinite(r["wall_s"])]
    summary: tp.Dict[str, tp.Any] = {}
    if feasible:
        summary["fastest"] = min(feasible, key=lambda r: r["wall_s"])["nodes"]
        summary["cheapest"] = min(feasible, key=lambda r: r["gpu_hours"] or math.inf)["nodes"]
        half = [r["nodes"] for r in feasible if r["efficiency"] is not None and r["efficiency"] < 0.5]
        summary["efficiency_below_half_from"] = min(half) if half else None
        summary["storage_bound_from"] = storage_bound_from(f, targets.nodes)
    return {
        "schema": SCHEMA,
        "run_dirs": [os.fspath(d) for d in run_dirs],
        "calibration": [p.as_dict() for p in points],
        "targets": asdict(targets),
        "model": f.as_dict(),
        "rows": rows,
        "points": _points(points, f, rows),
        "summary": summary,
        "notes": notes,
    }
