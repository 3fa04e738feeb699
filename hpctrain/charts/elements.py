"""The pieces every SVG chart is drawn with: the palette, coordinates, elements, patterns, text (stdlib only).

Used by every chart of :mod:`hpctrain.charts` and by the run report for :data:`COLORS` (its pills). The
attribute values passed here are constants or :func:`~hpctrain._human.esc`'d text already.
"""

from __future__ import annotations

import itertools
import math
import typing as tp

from hpctrain._human import esc

__all__ = [
    "COLORS",
    "PLOTTABLE",
    "COORD_MAX",
    "FONT",
    "plottable",
    "fmt_sig",
    "fmt_coord",
    "left_out_note",
    "el",
    "svg_path",
    "cross_d",
    "diamond_d",
    "star_d",
    "svg_open",
    "hatch_pattern",
    "svg_text",
    "swatch",
    "new_id",
]

COLORS = {
    "loss": "#1f5fbf",
    "eval": "#e07000",
    "nan": "#c62828",
    "rate": "#2e7d32",
    "mfu": "#6a1b9a",
    "band": "#90a4ae",
    "median": "#37474f",
    "slow": "#c62828",
    "ckpt": "#5d4037",
    "data_wait_s": "#e8a33d",
    "forward_backward_s": "#3f7fcf",
    "grad_comm_exposed_s": "#c0504d",
    "optimizer_s": "#8064a2",
    "checkpoint_s": "#6d6d6d",
    "completed": "#43a047",
    "stopped": "#1e88e5",
    "failed": "#e53935",
    "died": "#8d6e63",
    "unknown": "#9e9e9e",
    "startup": "#cfd8dc",
    "lost": "#e53935",
    "grid": "#e3e7ea",
    "axis": "#78909c",
    "text": "#263238",
    "muted": "#607d8b",
}

_ids = itertools.count(1)


def new_id() -> str:
    """A new id prefix for one chart's patterns (``c1``, ``c2``, ...): many charts share one HTML document,
    so one counter serves them all."""
    return f"c{next(_ids)}"


PLOTTABLE = 1e30
"""The largest magnitude a chart draws (after its unit: ms, %): no metric of a run comes near it (an
exaFLOP/s is 1e18), so a value beyond it is damage, not a measurement. The charts leave such values out,
with non-finite ones, and say so in the chart (:func:`plottable`, :func:`left_out_note`)."""

COORD_MAX = 1e6
"""Coordinates are clamped to +-this: a renderer must never see ``nan``, ``inf`` or 1e300 in an attribute."""


def plottable(v: tp.Any) -> bool:
    """Whether ``v`` is a number a chart can draw: finite (not NaN or infinite) and within :data:`PLOTTABLE`."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= PLOTTABLE


def fmt_sig(v: float) -> str:
    """A measured value with three significant digits (``0.123``, ``12.3``, ``456``); ``?`` if not finite."""
    if not math.isfinite(v):
        return "?"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def fmt_coord(x: float) -> str:
    """A coordinate: one decimal, no trailing zeros; clamped to :data:`COORD_MAX` (NaN: 0), so an SVG
    attribute never holds ``nan`` or ``inf`` whatever the arithmetic before it did."""
    if not math.isfinite(x):
        x = 0.0 if math.isnan(x) else math.copysign(COORD_MAX, x)
    x = min(max(x, -COORD_MAX), COORD_MAX)
    text = f"{x:.1f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def left_out_note(n: int, x: float, y: float, **attrs: tp.Any) -> str:
    """The line a chart carries when it left ``n`` points out (a value non-finite or beyond :data:`PLOTTABLE`)."""
    if not n:
        return ""
    text = f"{n} point(s) left out: a value not finite or beyond ±{PLOTTABLE:.0e}"
    return el("text", text, x=x, y=y, font_size=10.5, fill=COLORS["slow"], class_="left-out", **attrs)


def el(name: str, body: str = "", **attrs: tp.Any) -> str:
    """One SVG element. ``font_size=11`` is ``font-size="11"`` (a trailing ``_`` is dropped: ``class_``);
    floats are coordinates (:func:`fmt_coord`); None leaves the attribute out. Strings go in as they are: callers
    pass constants or :func:`esc`'d text, and ``body`` is markup already."""
    parts = [name]
    for key, value in attrs.items():
        if value is None:
            continue
        text = fmt_coord(value) if isinstance(value, float) else str(value)
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{text}"')
    return f"<{' '.join(parts)}>{body}</{name}>" if body else f"<{' '.join(parts)}/>"


def svg_path(*points: tp.Tuple[float, float], close: bool = True) -> str:
    """A path's ``d`` through ``points``."""
    d = "M" + "L".join(f"{fmt_coord(x)},{fmt_coord(y)}" for x, y in points)
    return d + ("Z" if close else "")


def cross_d(x: float, y: float, r: float = 4.0) -> str:
    return svg_path((x - r, y - r), (x + r, y + r), close=False) + svg_path((x - r, y + r), (x + r, y - r), close=False)


def diamond_d(x: float, y: float, r: float = 4.5) -> str:
    return svg_path((x, y - r), (x + r * 0.85, y), (x, y + r), (x - r * 0.85, y))


FONT = "system-ui, -apple-system, Segoe UI, sans-serif"


def star_d(x: float, y: float, r: float = 7.0) -> str:
    """A five-pointed star's ``d`` centred on ``(x, y)`` (a measured point among predicted ones)."""
    pts = []
    for i in range(10):
        a = math.pi / 2 + i * math.pi / 5
        rr = r if i % 2 == 0 else r * 0.42
        pts.append((x + rr * math.cos(a), y - rr * math.sin(a)))
    return svg_path(*pts)


def svg_open(width: float, height: float, label: str, *, standalone: bool = False) -> str:
    """The opening ``<svg>`` tag: scales with the page (``width="100%"``). ``standalone``: a file of its own
    or a ``data:`` image (the SVG namespace, and a fixed size, as a viewer needs them)."""
    if standalone:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {fmt_coord(width)} {fmt_coord(height)}"'
            f' width="{fmt_coord(width)}" height="{fmt_coord(height)}" role="img" aria-label="{esc(label)}"'
            f' font-family="{FONT}">'
        )
    return (
        f'<svg viewBox="0 0 {fmt_coord(width)} {fmt_coord(height)}" width="100%" role="img" aria-label="{esc(label)}"'
        f' font-family="{FONT}">'
    )


def hatch_pattern(
    pid: str, *, size: float = 6.0, fill: str = "#f4f6f7", stroke: str = "#b0bec5", angle: int = 45
) -> str:
    """A diagonal hatch pattern (gaps, start-up, lost progress)."""
    body = el("rect", width=size, height=size, fill=fill) + el(
        "line", x1=0.0, y1=0.0, x2=0.0, y2=size, stroke=stroke, stroke_width=2
    )
    return el(
        "pattern",
        body,
        id=pid,
        width=size,
        height=size,
        patternUnits="userSpaceOnUse",
        patternTransform=f"rotate({angle})",
    )


def svg_text(x: float, y: float, body: str, *, size: float = 10.5, color: str = "", **attrs: tp.Any) -> str:
    """A ``<text>`` whose ``body`` is escaped already."""
    return el("text", body, x=x, y=y, font_size=size, fill=color or COLORS["muted"], **attrs)


def swatch(kind: str, color: str, x: float, y: float) -> str:
    """A legend's sample of a series drawn as ``kind`` (line, dash, band, area, cross, diamond, star, circle)."""
    if kind in ("line", "dash"):
        dash = "4 3" if kind == "dash" else None
        return el("line", x1=x, x2=x + 16, y1=y, y2=y, stroke=color, stroke_width=2.5, stroke_dasharray=dash)
    if kind in ("band", "area"):
        return el("rect", x=x, y=y - 6, width=16, height=10, fill=color, fill_opacity=0.35 if kind == "band" else 0.85)
    if kind == "cross":
        return el("path", d=cross_d(x + 8, y), stroke=color, stroke_width=2)
    if kind == "diamond":
        return el("path", d=diamond_d(x + 8, y), fill=color)
    if kind == "star":
        return el("path", d=star_d(x + 8, y, 6.0), fill=color)
    return el("circle", cx=x + 8, cy=y, r=3.5, fill=color)
