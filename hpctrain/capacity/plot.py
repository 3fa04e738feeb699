"""The capacity plot: time to train and scaling efficiency against nodes, with the calibration runs, and the
effective training time ratio (matplotlib, the optional ``[plot]`` extra; never torch).

:func:`render_plot` returns the image as bytes (SVG or PNG) for a report to inline or a file to hold;
without matplotlib it raises :class:`PlotUnavailable` (one line saying how to install it). The figure is
drawn on a ``matplotlib.figure.Figure`` with its own canvas: pyplot's global state and backend are never
touched, so it is safe inside another program.
"""

from __future__ import annotations

import io
import math
import typing as tp

from hpctrain.errors import HpctrainError

__all__ = ["render_plot", "PlotUnavailable", "FORMATS"]

FORMATS = ("svg", "png")


class PlotUnavailable(HpctrainError):
    """matplotlib is not installed."""


def _finite(x: tp.Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def render_plot(report: tp.Mapping[str, tp.Any], fmt: str = "svg") -> bytes:
    """The plot of a capacity report (:func:`hpctrain.capacity.capacity_report`) as ``fmt`` bytes."""
    if fmt not in FORMATS:
        raise HpctrainError(f"capacity plot: format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(
            "the capacity plot needs matplotlib: pip install 'hpctrain[plot]' (the table and --json work without it)"
        ) from None

    rows = [r for r in report.get("rows", []) if r.get("feasible") and _finite(r.get("wall_s"))]
    points = [p for p in report.get("points", []) if p.get("comparable")]
    with matplotlib.rc_context({"svg.hashsalt": "hpctrain-capacity", "font.size": 9}):
        fig = Figure(figsize=(12, 3.8), layout="constrained")
        FigureCanvasAgg(fig)
        ax_t, ax_e, ax_r = fig.subplots(1, 3)
        nodes = [r["nodes"] for r in rows]
        hours = 3600.0
        ax_t.plot(nodes, [r["train_s"] / hours for r in rows], "o-", label="training (no failures)")
        ax_t.plot(nodes, [r["wall_s"] / hours for r in rows], "s--", label="wall (failures, saves, limits)")
        cal = [p for p in points if _finite(p.get("train_s"))]
        if cal:
            ax_t.plot(
                [p["nodes"] for p in cal],
                [p["train_s"] / hours for p in cal],
                "k*",
                ms=11,
                label="calibration (measured)",
            )
        ax_t.set(xscale="log", yscale="log", xlabel="nodes", ylabel="hours", title="time to train")
        ax_e.plot(nodes, [r["efficiency"] for r in rows], "o-", label="predicted")
        cal_e = [p for p in points if _finite(p.get("efficiency"))]
        if cal_e:
            ax_e.plot([p["nodes"] for p in cal_e], [p["efficiency"] for p in cal_e], "k*", ms=11, label="calibration")
        ax_e.set(xscale="log", ylim=(0, 1.1), xlabel="nodes", ylabel="E(N)", title="scaling efficiency")
        ax_r.plot(nodes, [r["ettr"] for r in rows], "o-", label="ETTR (failures + saves)")
        ax_r.plot(nodes, [r["ettr_overall"] for r in rows], "s--", label="overall (+ start-ups, queue, limits)")
        ax_r.set(xscale="log", ylim=(0, 1.05), xlabel="nodes", ylabel="ratio", title="effective training time ratio")
        for ax in (ax_t, ax_e, ax_r):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="best", fontsize=7)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None, dpi=110)
    return buf.getvalue()
