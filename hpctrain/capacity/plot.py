"""The capacity plot: time to train and scaling efficiency against nodes, with the calibration runs, and the
effective training time ratio: three panels side by side in one SVG (:mod:`hpctrain.charts`, stdlib only;
never torch).

:func:`render_plot` returns the SVG as bytes for a report to inline (a ``data:`` image) or a file to hold;
the same report gives the same bytes. The plot is SVG only: a PNG is one conversion away (open the SVG in a
browser, or ``rsvg-convert plot.svg -o plot.png``).
"""

from __future__ import annotations

import os
import typing as tp

from hpctrain._human import fmt_duration, fmt_num, real
from hpctrain.charts.xy import XYChart, side_by_side
from hpctrain.errors import HpctrainError

__all__ = ["render_plot", "FORMATS", "PNG_HINT"]

FORMATS = ("svg",)
PNG_HINT = (
    "the capacity plot is SVG only: write -o plot.svg, then open it in a browser "
    "or convert it with rsvg-convert plot.svg -o plot.png"
)

_TRAIN, _WALL, _CAL = "#1f5fbf", "#e07000", "#263238"


def _positive(x: tp.Any) -> bool:
    v = real(x)
    return v is not None and v > 0


def _where(p: tp.Mapping[str, tp.Any]) -> str:
    """A calibration point's hover text: its run directory's name (recorded text: escaped by the chart)."""
    name = os.path.basename(str(p.get("run_dir") or "").rstrip("/")) or "calibration"
    return f"{name}, {fmt_num(p.get('nodes'))} node(s)"


def render_plot(report: tp.Mapping[str, tp.Any], fmt: str = "svg") -> bytes:
    """The plot of a capacity report (:func:`hpctrain.capacity.capacity_report`) as SVG bytes: time to train
    (training alone and the wall time, with the calibration runs as stars), the scaling efficiency E(N) and
    the effective training time ratio, each against nodes on a log axis. ``fmt`` other than ``"svg"``:
    :class:`~hpctrain.errors.HpctrainError` (``png`` with one line saying how to get one)."""
    if fmt == "png":
        raise HpctrainError(PNG_HINT)
    if fmt not in FORMATS:
        raise HpctrainError(f"capacity plot: format {fmt!r} is not svg (the plot is SVG only)")
    rows = [r for r in report.get("rows", []) if r.get("feasible") and _positive(r.get("wall_s"))]
    points = [p for p in report.get("points", []) if p.get("comparable")]
    hours = 3600.0

    def h(v: tp.Any) -> tp.Any:
        v = real(v)
        return v / hours if v is not None else None

    def hover(r: tp.Mapping[str, tp.Any], key: str) -> str:
        return f"{fmt_num(r.get('nodes'))} node(s): {fmt_duration(r.get(key))}"

    t = XYChart(title="time to train", xlabel="nodes", ylabel="hours", xlog=True, ylog=True)
    t.line("training (no failures)", _TRAIN, [(r["nodes"], h(r.get("train_s")), hover(r, "train_s")) for r in rows])
    t.line(
        "wall (failures, saves, limits)",
        _WALL,
        [(r["nodes"], h(r.get("wall_s")), hover(r, "wall_s")) for r in rows],
        dash=True,
        marker="square",
    )
    cal = [p for p in points if _positive(p.get("train_s"))]
    if cal:
        stars = [(p.get("nodes"), h(p.get("train_s")), f"{_where(p)}: {fmt_duration(p.get('train_s'))}") for p in cal]
        t.stars("calibration (measured)", _CAL, stars)

    e = XYChart(title="scaling efficiency", xlabel="nodes", ylabel="E(N)", xlog=True, ylim=(0.0, 1.1))
    e.line("predicted", _TRAIN, [(r["nodes"], r.get("efficiency")) for r in rows])
    cal_e = [p for p in points if _positive(p.get("efficiency"))]
    if cal_e:
        e.stars("calibration", _CAL, [(p.get("nodes"), p["efficiency"], _where(p)) for p in cal_e])

    q = XYChart(title="effective training time ratio", xlabel="nodes", ylabel="ratio", xlog=True, ylim=(0.0, 1.05))
    q.line("ETTR (failures + saves)", _TRAIN, [(r["nodes"], r.get("ettr")) for r in rows])
    q.line(
        "overall (+ start-ups, queue, limits)",
        _WALL,
        [(r["nodes"], r.get("ettr_overall")) for r in rows],
        dash=True,
        marker="square",
    )
    svg = side_by_side([t, e, q], label="capacity plot: time to train, scaling efficiency, ETTR", standalone=True)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n").encode("utf-8")
