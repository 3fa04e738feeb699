"""An x/y chart: lines, dashed lines and star markers on log or linear axes, with a legend (stdlib only).

``XYChart(title=..., xlabel=..., ylabel=..., xlog=True)``, then :meth:`XYChart.line` and
:meth:`XYChart.stars`, then :meth:`XYChart.svg` for one chart or :func:`side_by_side` for several panels in
one ``<svg>``. A point that cannot be drawn (a coordinate not finite or beyond
:data:`~hpctrain.charts.elements.PLOTTABLE`, or not positive on a log axis) is left out: the line breaks
there and the panel says how many in a line of its own. Names, titles, labels and hover text are plain
text: escaped here (:func:`~hpctrain._human.esc`).
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain._human import esc, fmt_num
from hpctrain.charts.axes import log_ticks, nice_ticks
from hpctrain.charts.elements import (
    COLORS,
    PLOTTABLE,
    el,
    fmt_coord,
    fmt_sig,
    plottable,
    star_d,
    svg_open,
    svg_text,
    swatch,
)

__all__ = ["XYChart", "side_by_side"]

XY = tp.Tuple[tp.Any, tp.Any]


class _Series(tp.NamedTuple):
    name: str
    color: str
    kind: str  # "line", "dash" or "star"
    marker: str  # "circle", "square", "star" or ""
    runs: tp.List[tp.List[tp.Tuple[float, float, str]]]  # (x, y, hover title) in order, broken where left out


class _Scale:
    """Value -> pixel along one axis (``lo_px`` at the low end), linear or log10, with its ticks."""

    def __init__(self, values: tp.Sequence[float], log: bool, lo_px: float, hi_px: float, fixed: tp.Any) -> None:
        self.log, self.lo_px, self.hi_px = log, lo_px, hi_px
        if fixed is not None and not log:
            lo, hi = float(fixed[0]), float(fixed[1])
            self.ticks = [t for t in nice_ticks(lo, hi) if lo - 1e-12 <= t <= hi + 1e-12] or [lo, hi]
            self.tlo, self.thi = lo, hi
            return
        if log:
            logs = [math.log10(v) for v in values] or [0.0, 1.0]
            lo, hi = min(logs), max(logs)
            pad = 0.06 * (hi - lo) if hi > lo else 0.5
            self.tlo, self.thi = lo - pad, hi + pad
            self.ticks = [10**t for t in log_ticks(self.tlo, self.thi)]
            return
        lo, hi = min(values, default=0.0), max(values, default=1.0)
        pad = (hi - lo) * 0.06 or abs(hi) * 0.05 or 1.0
        ticks = nice_ticks(lo - pad, hi + pad)
        self.tlo, self.thi = min(ticks[0], lo - pad), max(ticks[-1], hi + pad)
        self.ticks = [t for t in ticks if self.tlo - 1e-12 <= t <= self.thi + 1e-12]

    def __call__(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        frac = (t - self.tlo) / (self.thi - self.tlo) if self.thi > self.tlo else 0.5
        frac = min(max(frac, 0.0), 1.0)  # a value beyond a fixed range is drawn at its edge
        return self.lo_px + frac * (self.hi_px - self.lo_px)


class XYChart:
    """One panel: x against y, each axis linear or log10 (``xlog``, ``ylog``); ``ylim=(lo, hi)`` fixes a
    linear y range (a ratio: 0..1.05). Lines keep the order their points are given in."""

    W, H = 400.0, 290.0
    LEFT, RIGHT, TOP, BOTTOM = 58.0, 14.0, 42.0, 44.0

    def __init__(
        self,
        *,
        title: str,
        xlabel: str = "",
        ylabel: str = "",
        xlog: bool = False,
        ylog: bool = False,
        ylim: tp.Optional[tp.Tuple[float, float]] = None,
        fmt_x: tp.Callable[[float], str] = fmt_num,
        fmt_y: tp.Callable[[float], str] = fmt_num,
    ) -> None:
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.xlog, self.ylog, self.ylim = xlog, ylog, ylim
        self.fmt_x, self.fmt_y = fmt_x, fmt_y
        self._series: tp.List[_Series] = []
        self.left_out = 0
        """Points not drawn: a coordinate not finite, beyond PLOTTABLE, or not positive on a log axis."""

    # ---- what to draw --------------------------------------------------------------------------------
    def _ok(self, v: tp.Any, log: bool) -> bool:
        return plottable(v) and (not log or v > 0)

    def _add(self, name: str, color: str, kind: str, marker: str, points: tp.Sequence[tp.Any]) -> None:
        runs: tp.List[tp.List[tp.Tuple[float, float, str]]] = [[]]
        for p in points:
            x, y = p[0], p[1]
            tip = p[2] if len(p) > 2 else ""
            if self._ok(x, self.xlog) and self._ok(y, self.ylog):
                runs[-1].append((float(x), float(y), tip))
            else:
                self.left_out += 1
                if runs[-1]:
                    runs.append([])
        self._series.append(_Series(name, color, kind, marker, [r for r in runs if r]))

    def line(
        self, name: str, color: str, points: tp.Sequence[XY], *, dash: bool = False, marker: str = "circle"
    ) -> None:
        """A line through ``points`` (``(x, y)``, or ``(x, y, hover title)``), dashed when ``dash``, a
        ``marker`` (circle, square, none: ``""``) at each point."""
        self._add(name, color, "dash" if dash else "line", marker, points)

    def stars(self, name: str, color: str, points: tp.Sequence[XY]) -> None:
        """A star at each point and no line (measured points among predicted ones)."""
        self._add(name, color, "star", "star", points)

    # ---- drawing ---------------------------------------------------------------------------------------
    def height(self) -> float:
        """The panel's height, its legend included (one row per series under the axes)."""
        return self.H + 15.0 * len(self._series)

    def draw(self, x0: float) -> str:
        """The panel as a ``<g>`` with its left edge at ``x0``."""
        L, R, T = x0 + self.LEFT, x0 + self.W - self.RIGHT, self.TOP
        base = self.H - self.BOTTOM
        pts = [(x, y) for s in self._series for run in s.runs for x, y, _ in run]
        sx = _Scale([x for x, _ in pts], self.xlog, L, R, None)
        sy = _Scale([y for _, y in pts], self.ylog, base, T, self.ylim)
        out = [el("rect", x=x0 + self.LEFT, y=T, width=R - L, height=base - T, fill="#fff", stroke=COLORS["axis"])]
        for v in sy.ticks:
            yy = sy(v)
            out.append(el("line", x1=L, x2=R, y1=yy, y2=yy, stroke=COLORS["grid"]))
            out.append(svg_text(L - 5, yy + 4, esc(self.fmt_y(v)), size=10.5, text_anchor="end"))
        for v in sx.ticks:
            xx = sx(v)
            out.append(el("line", x1=xx, x2=xx, y1=T, y2=base, stroke=COLORS["grid"]))
            out.append(svg_text(xx, base + 15, esc(self.fmt_x(v)), size=10.5, text_anchor="middle"))
        title = esc(self.title, 80)
        out.append(
            svg_text(
                x0 + self.W / 2, 16, title, size=13, color=COLORS["text"], text_anchor="middle", class_="panel-title"
            )
        )
        if self.xlabel:
            out.append(svg_text((L + R) / 2, base + 32, esc(self.xlabel, 80), size=11, text_anchor="middle"))
        if self.ylabel:
            mid = (T + base) / 2
            tr = f"rotate(-90 {fmt_coord(x0 + 14)} {fmt_coord(mid)})"
            out.append(svg_text(x0 + 14, mid, esc(self.ylabel, 80), size=11, text_anchor="middle", transform=tr))
        if self.left_out:
            note = (
                f"{self.left_out} point(s) left out: not finite, beyond ±{PLOTTABLE:.0e}, or not positive on a log axis"
            )
            out.append(el("text", esc(note), x=L, y=32.0, font_size=9.5, fill=COLORS["slow"], class_="left-out"))
        if not pts:
            out.append(svg_text((L + R) / 2, (T + base) / 2, "no data", size=13, text_anchor="middle"))
        for s in self._series:
            out.append(self._draw_series(s, sx, sy))
        for i, s in enumerate(self._series):  # the legend, under the axes, one series a row
            ly = self.H + 4 + 15.0 * i
            out.append(swatch(s.kind, s.color, L, ly - 4))
            out.append(svg_text(L + 22, ly, esc(s.name, 80), size=10.5, color=COLORS["text"]))
        return el("g", "".join(out), class_="panel")

    def _draw_series(self, s: _Series, sx: _Scale, sy: _Scale) -> str:
        out = []
        for run in s.runs:
            xy = [(sx(x), sy(y), tip) for x, y, tip in run]
            if s.kind != "star" and len(xy) > 1:
                out.append(
                    el(
                        "polyline",
                        points=" ".join(f"{fmt_coord(a)},{fmt_coord(b)}" for a, b, _ in xy),
                        fill="none",
                        stroke=s.color,
                        stroke_width=1.8,
                        stroke_linejoin="round",
                        stroke_dasharray="5 3" if s.kind == "dash" else None,
                    )
                )
            for (a, b, tip), (x, y, _) in zip(xy, run):
                title = el("title", esc(f"{s.name}: {tip}" if tip else f"{s.name}: {fmt_sig(x)}, {fmt_sig(y)}", 400))
                if s.marker == "star":
                    out.append(el("path", title, d=star_d(a, b), fill=s.color, stroke="#fff", stroke_width=0.6))
                elif s.marker == "square":
                    out.append(el("rect", title, x=a - 3.0, y=b - 3.0, width=6.0, height=6.0, fill=s.color))
                elif s.marker:
                    out.append(el("circle", title, cx=a, cy=b, r=3.0, fill=s.color))
        return "".join(out)

    def svg(self, *, aria: str = "", standalone: bool = False) -> str:
        """This chart alone as one ``<svg>`` (``standalone``: a file of its own, with the SVG namespace)."""
        return side_by_side([self], label=aria or self.title, standalone=standalone)


def side_by_side(charts: tp.Sequence[XYChart], *, label: str, standalone: bool = False) -> str:
    """``charts`` as panels side by side in one ``<svg>``, all as tall as the tallest (its legend)."""
    height = max((c.height() for c in charts), default=XYChart.H)
    width = sum(c.W for c in charts) or XYChart.W
    out = [svg_open(width, height, label, standalone=standalone)]
    if standalone:  # a file of its own: a white page (a browser's dark theme would show through)
        out.append(el("rect", x=0.0, y=0.0, width=width, height=height, fill="#fff"))
    x0 = 0.0
    for c in charts:
        out.append(c.draw(x0))
        x0 += c.W
    out.append("</svg>")
    return "".join(out)
