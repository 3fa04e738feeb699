"""The pieces every SVG chart is drawn with: the palette, coordinates, elements, patterns, text (stdlib only).

Private to the charts (:mod:`hpctrain.report.svg`, :mod:`hpctrain.report.svg_timeline`,
:mod:`hpctrain.report.svg_range_bars`) but :data:`COLORS`, which the page uses for its own pills. The
attribute values passed here are constants or :func:`~hpctrain.report.text.esc`'d text already.
"""

from __future__ import annotations

import itertools
import math
import typing as tp

from hpctrain.report.text import esc

__all__ = ["COLORS", "PLOTTABLE", "plottable"]

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
"""The id prefix of each chart's patterns (many charts share one HTML document: one counter for all)."""


PLOTTABLE = 1e30
"""The largest magnitude a chart draws (after its unit: ms, %): no metric of a run comes near it (an
exaFLOP/s is 1e18), so a value beyond it is damage, not a measurement. The charts leave such values out,
with non-finite ones, and say so in the chart (:func:`plottable`, :func:`_left_out`)."""

COORD_MAX = 1e6
"""Coordinates are clamped to +-this: a renderer must never see ``nan``, ``inf`` or 1e300 in an attribute."""


def plottable(v: tp.Any) -> bool:
    """Whether ``v`` is a number a chart can draw: finite (not NaN or infinite) and within :data:`PLOTTABLE`."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= PLOTTABLE


def _g(v: float) -> str:
    """A measured value with three significant digits (``0.123``, ``12.3``, ``456``); ``?`` if not finite."""
    if not math.isfinite(v):
        return "?"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _f(x: float) -> str:
    """A coordinate: one decimal, no trailing zeros; clamped to :data:`COORD_MAX` (NaN: 0), so an SVG
    attribute never holds ``nan`` or ``inf`` whatever the arithmetic before it did."""
    if not math.isfinite(x):
        x = 0.0 if math.isnan(x) else math.copysign(COORD_MAX, x)
    x = min(max(x, -COORD_MAX), COORD_MAX)
    text = f"{x:.1f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _left_out(n: int, x: float, y: float, **attrs: tp.Any) -> str:
    """The line a chart carries when it left ``n`` points out (a value non-finite or beyond :data:`PLOTTABLE`)."""
    if not n:
        return ""
    text = f"{n} point(s) left out: a value not finite or beyond ±{PLOTTABLE:.0e}"
    return _el("text", text, x=x, y=y, font_size=10.5, fill=COLORS["slow"], class_="left-out", **attrs)


def _el(name: str, body: str = "", **attrs: tp.Any) -> str:
    """One SVG element. ``font_size=11`` is ``font-size="11"`` (a trailing ``_`` is dropped: ``class_``);
    floats are coordinates (:func:`_f`); None leaves the attribute out. Strings go in as they are: callers
    pass constants or :func:`esc`'d text, and ``body`` is markup already."""
    parts = [name]
    for key, value in attrs.items():
        if value is None:
            continue
        text = _f(value) if isinstance(value, float) else str(value)
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{text}"')
    return f"<{' '.join(parts)}>{body}</{name}>" if body else f"<{' '.join(parts)}/>"


def _path(*points: tp.Tuple[float, float], close: bool = True) -> str:
    """A path's ``d`` through ``points``."""
    d = "M" + "L".join(f"{_f(x)},{_f(y)}" for x, y in points)
    return d + ("Z" if close else "")


def _cross(x: float, y: float, r: float = 4.0) -> str:
    return _path((x - r, y - r), (x + r, y + r), close=False) + _path((x - r, y + r), (x + r, y - r), close=False)


def _diamond(x: float, y: float, r: float = 4.5) -> str:
    return _path((x, y - r), (x + r * 0.85, y), (x, y + r), (x - r * 0.85, y))


_FONT = "system-ui, -apple-system, Segoe UI, sans-serif"


def _svg_open(width: float, height: float, label: str) -> str:
    return (
        f'<svg viewBox="0 0 {_f(width)} {_f(height)}" width="100%" role="img" aria-label="{esc(label)}"'
        f' font-family="{_FONT}">'
    )


def _hatch(pid: str, *, size: float = 6.0, fill: str = "#f4f6f7", stroke: str = "#b0bec5", angle: int = 45) -> str:
    """A diagonal hatch pattern (gaps, start-up, lost progress)."""
    body = _el("rect", width=size, height=size, fill=fill) + _el(
        "line", x1=0.0, y1=0.0, x2=0.0, y2=size, stroke=stroke, stroke_width=2
    )
    return _el(
        "pattern",
        body,
        id=pid,
        width=size,
        height=size,
        patternUnits="userSpaceOnUse",
        patternTransform=f"rotate({angle})",
    )


def _text(x: float, y: float, body: str, *, size: float = 10.5, color: str = "", **attrs: tp.Any) -> str:
    """A ``<text>`` whose ``body`` is escaped already."""
    return _el("text", body, x=x, y=y, font_size=size, fill=color or COLORS["muted"], **attrs)
