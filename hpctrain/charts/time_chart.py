"""The chart over wall time (:class:`TimeChart`): lines, bands, stacked areas, markers and events over the
broken time axis of :class:`~hpctrain.charts.axes.TimeAxis` (stdlib only).

Every chart is one ``<svg>`` string with a ``viewBox`` (it scales with the page) and its own id prefix for
the patterns it defines (many charts share one HTML document). Text that came from a run directory goes
through :func:`~hpctrain._human.esc` (cut, control characters shown as escapes, HTML-escaped); numbers are
formatted by :mod:`hpctrain._human`.
"""

from __future__ import annotations

import itertools
import math
import typing as tp

from hpctrain._human import esc, fmt_duration, fmt_num
from hpctrain.charts.axes import TimeAxis, axis_line, log_ticks, nice_ticks, robust_top
from hpctrain.charts.elements import (
    COLORS,
    cross_d,
    diamond_d,
    el,
    fmt_coord,
    hatch_pattern,
    left_out_note,
    new_id,
    plottable,
    svg_open,
    svg_path,
    svg_text,
    swatch,
)

__all__ = ["TimeChart"]


# ------------------------------------------------------------------------------------------------ charts
def _thin(points: tp.List[tp.Tuple[float, float]]) -> tp.List[tp.Tuple[float, float]]:
    """Pixel points thinned, when there are more than two per pixel of their width, to the first, lowest,
    highest and last of each pixel column (spikes survive, the page stays small)."""
    if len(points) <= max(16, 2 * abs(points[-1][0] - points[0][0])):
        return points
    out: tp.List[tp.Tuple[float, float]] = []
    for _, group in itertools.groupby(points, key=lambda p: int(p[0])):
        g = list(group)
        if len(g) <= 4:
            out += g
            continue
        lo, hi = min(g, key=lambda p: p[1]), max(g, key=lambda p: p[1])
        out += sorted({g[0], lo, hi, g[-1]}, key=lambda p: g.index(p))
    return out


Point = tp.Tuple[float, tp.Optional[float]]
Draw = tp.Callable[[tp.Callable[[float], float]], str]


class TimeChart:
    """A chart over a :class:`TimeAxis`: lines, min..max bands, a stacked area, markers, event ticks.

    ``TimeChart(spans, label=..., fmt=...)``, then ``line``/``band``/``stack``/``markers``/``events``, then
    :meth:`svg`. Lines break across the gaps between attempts and at unknown (None) values. A value that is not
    finite or beyond :data:`~hpctrain.charts.elements.PLOTTABLE` is left out (a break, like None) and
    counted in :attr:`left_out`, which the chart states in a line of its own. Names, titles and labels are
    recorded or plain text: escaped here.
    """

    W = 1160.0
    LEFT, RIGHT, TOP, BOTTOM = 70.0, 18.0, 30.0, 34.0

    def __init__(
        self,
        spans: tp.Sequence[tp.Tuple[float, float]],
        *,
        label: str,
        fmt: tp.Callable[[float], str] = fmt_num,
        zero: bool = True,
        height: float = 250.0,
        piece_labels: tp.Sequence[str] = (),
        clip: bool = False,
        log: tp.Optional[bool] = None,
    ) -> None:
        self.H = height
        self.axis = TimeAxis(spans, self.LEFT, self.W - self.LEFT - self.RIGHT)
        self.label, self.fmt, self.zero, self.clip = label, fmt, zero, clip
        self.log = log
        """None: a log scale when every value is positive and they span 30x or more (a loss), unless ``zero``."""
        self.piece_labels = list(piece_labels)
        self.id = new_id()
        self._layers: tp.List[Draw] = []
        self._values: tp.List[float] = []
        self._tops: tp.List[tp.Tuple[float, float]] = []
        self._legend: tp.List[tp.Tuple[str, str, str]] = []  # (name, color, kind)
        self.clipped = False
        """Set by :meth:`svg` when a spike was cut off (the caller may say so in its caption)."""
        self._dropped: tp.Set[float] = set()  # the times of points with a value left out
        self._untimed = 0  # points whose time cannot be drawn

    # ---- what to draw ------------------------------------------------------------------------------
    @property
    def left_out(self) -> int:
        """Points (records) with a value not drawn: not finite, or beyond PLOTTABLE (damage, not a measurement)."""
        return len(self._dropped) + self._untimed

    def _clean(self, t: float, v: tp.Optional[float]) -> tp.Optional[float]:
        """``v`` if a chart can draw it, else None (a break), counted in :attr:`left_out` unless it was None."""
        if v is None:
            return None
        if plottable(v):
            return float(v)
        self._dropped.add(t)
        return None

    def _times(self, points: tp.Iterable[tp.Any]) -> tp.List[tp.Any]:
        """The points whose time (their first item) can be drawn; the others counted in :attr:`left_out`."""
        out = []
        for p in points:
            if plottable(p[0]):
                out.append(p)
            else:
                self._untimed += 1
        return out

    def _note(self, values: tp.Iterable[tp.Optional[float]]) -> None:
        self._values += [v for v in values if v is not None and math.isfinite(v)]

    def _peaks(self, points: tp.Iterable[tp.Tuple[float, tp.Optional[float]]]) -> None:
        """Values that may be cut by a clipped y axis (marked at the top edge with their value)."""
        self._tops += [(t, v) for t, v in points if v is not None and math.isfinite(v)]

    def line(self, name: str, color: str, points: tp.Sequence[Point], *, dash: str = "", width: float = 1.8) -> None:
        pts = [(t, self._clean(t, v)) for t, v in self._times(points)]
        self._note(v for _, v in pts)
        self._peaks(pts)
        self._legend.append((name, color, "dash" if dash else "line"))

        def draw(y: tp.Callable[[float], float]) -> str:
            out = []
            for run in self._runs(pts):
                xy = _thin([(self.axis.x(t), y(v)) for t, v in run])
                if len(xy) == 1:
                    out.append(el("circle", cx=xy[0][0], cy=xy[0][1], r=2.2, fill=color))
                    continue
                out.append(
                    el(
                        "polyline",
                        points=" ".join(f"{fmt_coord(a)},{fmt_coord(b)}" for a, b in xy),
                        fill="none",
                        stroke=color,
                        stroke_width=width,
                        stroke_linejoin="round",
                        stroke_dasharray=dash or None,
                    )
                )
            return "".join(out)

        self._layers.append(draw)

    def band(
        self, name: str, color: str, points: tp.Sequence[tp.Tuple[float, tp.Optional[float], tp.Optional[float]]]
    ) -> None:
        """A filled band from ``lo`` to ``hi`` (a per-rank min..max)."""
        pts = []
        for t, lo, hi in self._times(points):
            if lo is None or hi is None:
                continue
            if plottable(lo) and plottable(hi):
                pts.append((t, (float(lo), float(hi))))
            else:
                self._dropped.add(t)
        self._note(v for _, pair in pts for v in pair)
        self._peaks((t, pair[1]) for t, pair in pts)
        self._legend.append((name, color, "band"))
        self._layers.append(lambda y: self._areas(pts, y, color, 0.35, ""))

    def stack(self, parts: tp.Sequence[tp.Tuple[str, str, tp.Sequence[Point]]]) -> None:
        """A stacked area: ``parts`` share their times; an unknown value counts as 0 in the stack."""
        if not parts:
            return
        keep = [i for i, (t, _) in enumerate(parts[0][2]) if plottable(t)]
        self._untimed += len(parts[0][2]) - len(keep)
        times = [parts[0][2][i][0] for i in keep]
        totals = [0.0] * len(times)
        layers = []
        for name, color, pts in parts:
            lower = list(totals)
            for i, j in enumerate(keep):
                totals[i] += self._clean(times[i], pts[j][1]) or 0.0
            layers.append((name, color, list(zip(times, zip(lower, list(totals))))))
            self._legend.append((name, color, "area"))
        self._note(totals + [0.0])
        self._peaks(zip(times, totals))
        self._layers.append(lambda y: "".join(self._areas(pts, y, color, 0.85, name) for name, color, pts in layers))

    def _areas(
        self,
        pts: tp.Sequence[tp.Tuple[float, tp.Any]],
        y: tp.Callable[[float], float],
        color: str,
        opacity: float,
        title: str,
    ) -> str:
        """Polygons between ``(lo, hi)`` pairs, one per run of points within an attempt."""
        out = []
        for run in self._runs(pts):
            top = [(self.axis.x(t), y(v[1])) for t, v in run]
            bottom = [(self.axis.x(t), y(v[0])) for t, v in reversed(run)]
            if len(top) == 1:  # one interval in this attempt: a thin bar
                (x, yt), (_, yb) = top[0], bottom[0]
                top, bottom = [(x - 1.5, yt), (x + 1.5, yt)], [(x + 1.5, yb), (x - 1.5, yb)]
            d = " ".join(f"{fmt_coord(a)},{fmt_coord(b)}" for a, b in _thin(top) + _thin(bottom[::-1])[::-1])
            body = el("title", esc(title)) if title else ""
            out.append(el("polygon", body, points=d, fill=color, fill_opacity=opacity, stroke="#fff", stroke_width=0.3))
        return "".join(out)

    def markers(
        self,
        name: str,
        color: str,
        points: tp.Sequence[tp.Tuple[float, tp.Optional[float], str]],
        *,
        shape: str = "circle",
        labels: tp.Sequence[tp.Tuple[float, float, str]] = (),
        legend: bool = True,
    ) -> None:
        """Points with a hover title each (``(t, value, title)``; at most 400 get their own element);
        ``labels`` are ``(t, value, text)`` drawn above their point (none closer than 28 px to the previous).
        A None value is drawn at the top edge (a non-finite loss: the writer recorded null)."""
        pts = []
        for t, v, title in self._times(points):
            if v is None or plottable(v):
                pts.append((t, v, title))
            else:  # None is drawn (at the top edge); a value that cannot be, is not
                self._dropped.add(t)
        labels = [(t, v, text) for t, v, text in labels if plottable(t) and plottable(v)]
        self._note(v for _, v, _ in pts)
        self._peaks((t, v) for t, v, _ in pts)
        if legend:
            self._legend.append((name, color, shape))

        def draw(y: tp.Callable[[float], float]) -> str:
            out = []
            for t, v, title in pts[:: max(1, math.ceil(len(pts) / 400))]:
                x, yy = self.axis.x(t), self.TOP + 6 if v is None else y(v)
                tip = el("title", esc(title))
                if shape == "cross":
                    out.append(el("path", tip, d=cross_d(x, yy), stroke=color, stroke_width=2))
                elif shape == "diamond":
                    out.append(el("path", tip, d=diamond_d(x, yy), fill=color))
                else:
                    out.append(el("circle", tip, cx=x, cy=yy, r=3.0, fill=color, stroke="#fff", stroke_width=0.8))
            last = -1e9
            for t, v, text in labels:
                x = self.axis.x(t)
                if abs(x - last) >= 28:
                    out.append(svg_text(x, y(v) - 7, esc(text, 40), color=color, text_anchor="middle", font_weight=600))
                    last = x
            return "".join(out)

        self._layers.append(draw)

    def events(self, name: str, color: str, points: tp.Sequence[tp.Tuple[float, str]]) -> None:
        """Small diamonds on the time axis (checkpoint commits), with a hover title each."""
        pts = self._times(points)[-400:]
        if not pts:
            return
        self._legend.append((name, color, "diamond"))
        base = self.H - self.BOTTOM
        self._layers.append(
            lambda y: "".join(
                el("path", el("title", esc(title)), d=diamond_d(self.axis.x(t), base - 6), fill=color)
                for t, title in pts
            )
        )

    def _runs(self, pts: tp.Sequence[tp.Tuple[float, tp.Any]]) -> tp.List[tp.List[tp.Tuple[float, tp.Any]]]:
        """Consecutive known points within one piece of the axis."""
        runs: tp.List[tp.List[tp.Tuple[float, tp.Any]]] = []
        prev_piece = None
        for t, v in sorted(pts, key=lambda p: p[0]):
            if v is None:
                prev_piece = None
                continue
            piece = self.axis.piece(t)
            if piece != prev_piece or not runs:
                runs.append([])
            runs[-1].append((t, v))
            prev_piece = piece
        return runs

    # ---- the y scale -------------------------------------------------------------------------------------
    def _scale(self) -> tp.Tuple[tp.Callable[[float], float], tp.List[float]]:
        """``(value -> y, the values to put ticks at)``: linear from 0 (``zero``), linear around the data, or
        log10 (``log``, or automatic for positive data spanning 30x); spikes cut when ``clip``."""
        T, plot_h = self.TOP, self.H - self.TOP - self.BOTTOM
        lo, hi = min(self._values, default=0.0), max(self._values, default=1.0)
        cut = robust_top(self._values) if self.clip else None
        if cut is not None and cut < hi:
            hi, self.clipped = cut, True
        log = self.log if self.log is not None else (not self.zero and lo > 0 and hi / lo >= 30)
        if log and lo > 0:
            pad = 0.05 * (math.log10(hi) - math.log10(lo) or 1.0)
            tlo, thi = math.log10(lo) - pad, math.log10(hi) + pad
            ticks = [10**t for t in log_ticks(tlo, thi)]

            def tr(v: float) -> float:
                return math.log10(v) if v > 0 else tlo

        else:

            def tr(v: float) -> float:
                return v

            if self.zero:
                lo = min(lo, 0.0)
                hi = hi + 0.08 * (hi - lo)  # headroom for labels above the highest point
                ticks = nice_ticks(lo, hi)
                tlo, thi = min(ticks[0], lo), max(ticks[-1], hi)
            else:
                pad = (hi - lo) * 0.06 or abs(hi) * 0.05 or 1.0
                tlo, thi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
                ticks = [v for v in nice_ticks(tlo, thi) if tlo - 1e-12 <= v <= thi + 1e-12] or [tlo, thi]

        def y(v: float) -> float:
            if not thi > tlo:
                return T + plot_h / 2
            return min(max(T + plot_h * (1 - (tr(v) - tlo) / (thi - tlo)), T), T + plot_h)

        return y, ticks

    # ---- drawing ---------------------------------------------------------------------------------------
    def svg(self, *, aria: str = "") -> str:
        W, H, L, T, B = self.W, self.H, self.LEFT, self.TOP, self.BOTTOM
        plot_h, base = H - T - B, H - B
        y, ticks = self._scale()
        out = [svg_open(W, H, aria or self.label), el("defs", hatch_pattern(f"{self.id}-hatch"))]
        for v in ticks:  # grid and y labels
            out.append(el("line", x1=L, x2=W - self.RIGHT, y1=y(v), y2=y(v), stroke=COLORS["grid"]))
            out.append(svg_text(L - 6, y(v) + 4, esc(self.fmt(v)), size=11, text_anchor="end"))
        mid = T + plot_h / 2
        out.append(
            svg_text(
                14, mid, esc(self.label), size=11.5, text_anchor="middle", transform=f"rotate(-90 14 {fmt_coord(mid)})"
            )
        )
        for left, right, secs in self.axis.gaps():  # the restarts
            tip = el("title", f"restart: {esc(fmt_duration(secs))} between the attempts")
            out.append(el("rect", tip, x=left, y=T, width=right - left, height=plot_h, fill=f"url(#{self.id}-hatch)"))
            cx = (left + right) / 2
            if right - left < 14:  # many restarts: the hatch and its hover title say it
                continue
            out.append(
                svg_text(
                    cx,
                    mid,
                    f"restart · {esc(fmt_duration(secs))}",
                    color=COLORS["text"],
                    text_anchor="middle",
                    dominant_baseline="middle",
                    transform=f"rotate(-90 {fmt_coord(cx)} {fmt_coord(mid)})",
                )
            )
        for i, (x, w) in enumerate(zip(self.axis.starts, self.axis.px)):  # which attempt each piece is
            if i < len(self.piece_labels) and self.piece_labels[i] and w > 40:
                out.append(svg_text(x + 4, T + 12, esc(self.piece_labels[i], 40)))
        if not self._values:
            out.append(svg_text(W / 2, mid, "no data", size=13, text_anchor="middle"))
        out += [draw(y) for draw in self._layers]
        out.append(left_out_note(self.left_out, W - self.RIGHT, T - 8, text_anchor="end"))
        if self.clipped:  # spikes above the axis: a red caret at the top edge with the value
            last = -1e9
            for t, v in sorted(p for p in self._tops if y(p[1]) <= T + 0.01):
                x = self.axis.x(t)
                if x - last >= 44:
                    last = x
                    value = esc(self.fmt(v))
                    caret = svg_path((x - 5, T + 7), (x, T), (x + 5, T + 7))
                    out.append(el("path", el("title", f"cut off: {value}"), d=caret, fill=COLORS["slow"]))
                    out.append(svg_text(x + 7, T + 8, value, size=10, color=COLORS["slow"]))
        out.append(axis_line(self.axis, base))
        lx = L
        for name, color, kind in self._legend:
            out.append(swatch(kind, color, lx, 12))
            out.append(svg_text(lx + 20, 16, esc(name), size=11.5, color=COLORS["text"]))
            lx += 34 + 7.0 * len(name)
        out.append("</svg>")
        return "".join(out)
