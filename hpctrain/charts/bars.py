"""Ratio bars: one horizontal bar per row on a log ratio axis, against a reference line (stdlib only).

The benchmarks' picture (measured / goal per benchmark, the goal line at 1x) is drawn with
:func:`ratio_bars`. A row without a value (a failed or skipped benchmark) is a full-width band holding its
note; a value that cannot be drawn (not finite, not positive) is left out with a note in its row and a
count in the chart. Labels, notes and hover text are plain text: escaped here.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain._human import esc
from hpctrain.charts.elements import COLORS, el, left_out_note, plottable, svg_open, svg_text

__all__ = ["Bar", "ratio_bars"]


class Bar(tp.NamedTuple):
    """One row: ``value`` is the ratio the bar reaches (clamped to the axis); None draws no bar but a
    ``color`` band across the axis holding ``note``. ``text`` goes right of the axis, ``tip`` on hover."""

    label: str
    value: tp.Optional[float]
    color: str
    text: str = ""
    tip: str = ""
    note: str = ""


def ratio_bars(
    bars: tp.Sequence[Bar],
    *,
    title: str,
    subtitle: str = "",
    lo: float = 0.1,
    hi: float = 10.0,
    ticks: tp.Sequence[float] = (0.1, 0.2, 0.5, 1, 2, 5, 10),
    reference: float = 1.0,
    reference_label: str = "goal",
    standalone: bool = True,
) -> str:
    """The rows as one ``<svg>`` (``standalone``: a file of its own, on a white background): a label right
    aligned before the axis, the bar from ``lo``, ``text`` after the axis, ``reference`` a dashed line."""
    width, left, x0, x1, row_h, top = 1060.0, 400.0, 410.0, 820.0, 22.0, 78.0
    height = top + row_h * max(1, len(bars)) + 40
    llo, lhi = math.log10(lo), math.log10(hi)

    def x(v: float) -> float:
        v = min(max(v, lo), hi)
        return x0 + (math.log10(v) - llo) / (lhi - llo) * (x1 - x0)

    out = [svg_open(width, height, title, standalone=standalone)]
    if standalone:
        out.append(el("rect", x=0.0, y=0.0, width=width, height=height, fill="#fff"))
    out.append(svg_text(12, 22, esc(title, 200), size=16, color=COLORS["text"], font_weight="bold"))
    if subtitle:
        out.append(svg_text(12, 42, esc(subtitle, 300), size=12))
    axis_y = top - 10
    for t in ticks:
        out.append(el("line", x1=x(t), y1=axis_y, x2=x(t), y2=height - 34, stroke=COLORS["grid"]))
        out.append(svg_text(x(t), axis_y - 4, esc(f"{t:g}×"), size=12, text_anchor="middle"))
    left_out = 0
    for i, b in enumerate(bars):
        y = top + i * row_h
        out.append(svg_text(left, y + 15, esc(b.label, 120), size=12, color=COLORS["text"], text_anchor="end"))
        if b.value is None:
            out.append(el("rect", x=x0, y=y + 4, width=x1 - x0, height=row_h - 8, fill=b.color))
            out.append(svg_text(x0 + 6, y + 15, esc(b.note, 90), size=12, color="#000"))
            continue
        if not (plottable(b.value) and b.value > 0):
            left_out += 1
            out.append(svg_text(x0 + 6, y + 15, "left out: not a finite ratio > 0", size=12, color=COLORS["slow"]))
        else:
            tip = el("title", esc(f"{b.label}: {b.tip or b.text}", 400))
            out.append(el("rect", tip, x=x0, y=y + 4, width=x(b.value) - x0, height=row_h - 8, fill=b.color))
        out.append(svg_text(x1 + 8, y + 15, esc(b.text, 120), size=12, color=COLORS["text"]))
    gx = x(reference)
    out.append(
        el(
            "line",
            x1=gx,
            y1=axis_y,
            x2=gx,
            y2=height - 34,
            stroke="#000",
            stroke_width=2,
            stroke_dasharray="5 3",
        )
    )
    label = esc(reference_label, 40)
    out.append(svg_text(gx, height - 18, label, size=12, color="#000", text_anchor="middle", font_weight="bold"))
    out.append(left_out_note(left_out, width - 12, 42.0, text_anchor="end"))
    out.append("</svg>")
    return "".join(out)
