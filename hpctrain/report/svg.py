"""Inline SVG charts drawn from numbers, for a page without scripts (stdlib only).

Every chart is one ``<svg>`` string with a ``viewBox`` (it scales with the page) and its own id prefix for
the patterns it defines (many charts share one HTML document). Text that came from a run directory goes
through :func:`esc` (cut, control characters shown as escapes, HTML-escaped); numbers are formatted here.

Time charts share :class:`TimeAxis`: a *broken* time axis whose pieces are the attempts of the run, each
as wide as its share of the time (with a minimum), separated by a hatched gap of fixed width that says how
long the run was down there. A long queue wait between two attempts does not squash the curves, and a
restart is visible as a gap in every curve.
"""

from __future__ import annotations

import html
import itertools
import math
import re
import time
import typing as tp

__all__ = [
    "esc",
    "plain",
    "TimeAxis",
    "TimeChart",
    "Row",
    "timeline",
    "range_bars",
    "stats_ok",
    "fmt_seconds",
    "fmt_num",
    "COLORS",
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

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ids = itertools.count(1)


def plain(value: tp.Any, keep: int = 300) -> str:
    """Recorded text made safe to show (not yet HTML-escaped): ``?`` for None, cut to ``keep`` characters,
    control characters and bidirectional overrides as ``\\xNN``/``\\uNNNN``, lone surrogates as U+FFFD."""
    if value is None:
        return "?"
    text = value if isinstance(value, str) else str(value)
    if len(text) > keep:
        text = f"{text[:keep]}… ({len(text)} characters)"
    text = _SURROGATE.sub("\ufffd", text)
    return _CONTROL.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", text
    )


def esc(value: tp.Any, keep: int = 300) -> str:
    """Recorded text for HTML or SVG: :func:`plain`, then ``html.escape`` (quotes too: safe in attributes)."""
    return html.escape(plain(value, keep), quote=True)


def fmt_seconds(s: tp.Optional[float]) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``3 h 12 min``, ``2 d 4 h``."""
    if s is None or not math.isfinite(s):
        return "?"
    if s < 0:
        s = 0.0
    if s < 1:
        return f"{s * 1e3:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} µs" if s > 0 else "0 s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def fmt_num(v: tp.Optional[float], digits: int = 3) -> str:
    """A number with SI suffixes: ``1.23k``, ``45.6M``; ``?`` when unknown."""
    if v is None or not math.isfinite(v):
        return "?"
    a = abs(v)
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.{digits}g}{suffix}"
    if a == 0:
        return "0"
    if a < 1e-3:
        return f"{v:.2e}"
    return f"{v:.{digits}g}"


def _g(v: float) -> str:
    """A measured value with three significant digits (``0.123``, ``12.3``, ``456``)."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _f(x: float) -> str:
    """A coordinate: one decimal, no trailing zeros."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


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


# ------------------------------------------------------------------------------------------- the time axis
_TICK_STEPS = (
    [1, 2, 5, 10, 15, 30]
    + [60 * m for m in (1, 2, 5, 10, 15, 30)]
    + [3600 * h for h in (1, 2, 3, 6, 12)]
    + [86400 * d for d in (1, 2, 7, 14, 30, 91, 365)]
)


class TimeAxis:
    """Wall time -> x for the pieces ``spans`` (``(t0, t1)``, one per attempt), laid side by side over
    ``width`` pixels from ``x0`` with a ``gap``-pixel break between pieces. Overlapping spans are merged.
    A time outside every piece maps to the nearest piece edge."""

    def __init__(self, spans: tp.Sequence[tp.Tuple[float, float]], x0: float, width: float, gap: float = 30.0) -> None:
        merged: tp.List[tp.List[float]] = []
        for t0, t1 in sorted((min(a, b), max(a, b)) for a, b in spans):
            if merged and t0 <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], t1)
            else:
                merged.append([t0, t1])
        if not merged:
            merged = [[0.0, 1.0]]
        self.spans = [(a, b) for a, b in merged]
        self.x0, self.width = x0, width
        n = len(self.spans)
        self.gap = min(gap, 0.25 * width / (n - 1)) if n > 1 else 0.0  # the gaps take at most a quarter
        avail = width - self.gap * (n - 1)
        durations = [max(b - a, 0.0) for a, b in self.spans]
        self.px = _widths(durations, avail, min_w=min(max(28.0, 0.05 * avail), avail / n))
        self.starts = []
        x = x0
        for w in self.px:
            self.starts.append(x)
            x += w + self.gap

    def x(self, t: float) -> float:
        for (a, b), x, w in zip(self.spans, self.starts, self.px):
            if t < a:
                return x  # in the gap before this piece (or before the first): its left edge
            if t <= b:
                return x + w * ((t - a) / (b - a) if b > a else 0.5)
        return self.starts[-1] + self.px[-1]

    def piece(self, t: float) -> int:
        """The index of the piece ``t`` belongs to (the next one for a time in a gap)."""
        for i, (_, b) in enumerate(self.spans):
            if t <= b:
                return i
        return len(self.spans) - 1

    def gaps(self) -> tp.List[tp.Tuple[float, float, float]]:
        """``(x_left, x_right, seconds)`` of each break."""
        out = []
        for i in range(1, len(self.spans)):
            left = self.starts[i - 1] + self.px[i - 1]
            out.append((left, self.starts[i], self.spans[i][0] - self.spans[i - 1][1]))
        return out

    def ticks(self) -> tp.List[tp.Tuple[float, str]]:
        """Aligned clock-time ticks inside each piece (at least its start), in local time."""
        first, last = self.spans[0][0], self.spans[-1][1]
        long_run = last - first > 86400
        fmt = "%m-%d %H:%M" if long_run else "%H:%M:%S"
        min_px = 110.0 if long_run else 84.0
        out = []
        for (a, b), w in zip(self.spans, self.px):
            dur = b - a
            step = next((s for s in _TICK_STEPS if dur <= 0 or w * s / dur >= min_px), _TICK_STEPS[-1])
            off = _utc_offset(a)
            t = math.ceil((a + off) / step) * step - off
            here = []
            while t <= b and len(here) < 50:
                here.append(t)
                t += step
            if not here:
                here = [a]
            for t in here:
                out.append((self.x(t), _clock(t, fmt)))
        return out


def _widths(durations: tp.Sequence[float], avail: float, min_w: float) -> tp.List[float]:
    """Pixel widths proportional to ``durations``, none under ``min_w``, summing to ``avail``."""
    n = len(durations)
    fixed: tp.Set[int] = set()
    while True:
        free = avail - min_w * len(fixed)
        total = sum(d for i, d in enumerate(durations) if i not in fixed)
        widths = [
            min_w if i in fixed else (free * d / total if total > 0 else free / (n - len(fixed)))
            for i, d in enumerate(durations)
        ]
        small = {i for i, w in enumerate(widths) if i not in fixed and w < min_w}
        if not small or len(fixed) + len(small) >= n:
            if small:
                return [avail / n] * n
            return widths
        fixed |= small


def _utc_offset(t: float) -> float:
    try:
        return float(time.localtime(t).tm_gmtoff or 0)
    except (OverflowError, ValueError, OSError):
        return 0.0


def _clock(t: float, fmt: str = "%H:%M:%S") -> str:
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return "?"


# ---------------------------------------------------------------------------------------------- y scales
def _nice_ticks(lo: float, hi: float, n: int = 5) -> tp.List[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.5 and len(ticks) < 20:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _log_ticks(tlo: float, thi: float) -> tp.List[float]:
    """Ticks (as log10 values) of a log axis over ``tlo..thi``: the decades, and 2 and 5 times them when
    fewer than three decades fit."""
    decades = list(range(math.ceil(tlo - 1e-9), math.floor(thi + 1e-9) + 1))
    if len(decades) >= 3:
        return [float(d) for d in decades][:12]
    out = []
    for d in range(math.floor(tlo), math.ceil(thi) + 1):
        for m in (1, 2, 5):
            t = d + math.log10(m)
            if tlo - 1e-9 <= t <= thi + 1e-9:
                out.append(t)
    return out or [tlo, thi]


def _robust_top(values: tp.Sequence[float]) -> tp.Optional[float]:
    """A y-axis top that leaves out rare spikes (an attempt's first interval: warm-up; a blocking save):
    twice the 75th percentile when the maximum is more than three times that, else None (no clipping)."""
    if len(values) < 8:
        return None
    ordered = sorted(values)
    p75 = ordered[int(0.75 * (len(ordered) - 1))]
    if p75 <= 0 or ordered[-1] <= 3.0 * p75:
        return None
    return 2.0 * p75


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


# ------------------------------------------------------------------------------------------------ charts
Point = tp.Tuple[float, tp.Optional[float]]
Draw = tp.Callable[[tp.Callable[[float], float]], str]


class TimeChart:
    """A chart over a :class:`TimeAxis`: lines, min..max bands, a stacked area, markers, event ticks.

    ``TimeChart(spans, label=..., fmt=...)``, then ``line``/``band``/``stack``/``markers``/``events``, then
    :meth:`svg`. Lines break across the gaps between attempts and at unknown (None) values. Names, titles
    and labels are recorded or plain text: escaped here.
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
        self.id = f"c{next(_ids)}"
        self._layers: tp.List[Draw] = []
        self._values: tp.List[float] = []
        self._tops: tp.List[tp.Tuple[float, float]] = []
        self._legend: tp.List[tp.Tuple[str, str, str]] = []  # (name, color, kind)
        self.clipped = False
        """Set by :meth:`svg` when a spike was cut off (the caller may say so in its caption)."""

    # ---- what to draw ------------------------------------------------------------------------------
    def _note(self, values: tp.Iterable[tp.Optional[float]]) -> None:
        self._values += [v for v in values if v is not None and math.isfinite(v)]

    def _peaks(self, points: tp.Iterable[tp.Tuple[float, tp.Optional[float]]]) -> None:
        """Values that may be cut by a clipped y axis (marked at the top edge with their value)."""
        self._tops += [(t, v) for t, v in points if v is not None and math.isfinite(v)]

    def line(self, name: str, color: str, points: tp.Sequence[Point], *, dash: str = "", width: float = 1.8) -> None:
        pts = list(points)
        self._note(v for _, v in pts)
        self._peaks(pts)
        self._legend.append((name, color, "dash" if dash else "line"))

        def draw(y: tp.Callable[[float], float]) -> str:
            out = []
            for run in self._runs(pts):
                xy = _thin([(self.axis.x(t), y(v)) for t, v in run])
                if len(xy) == 1:
                    out.append(_el("circle", cx=xy[0][0], cy=xy[0][1], r=2.2, fill=color))
                    continue
                out.append(
                    _el(
                        "polyline",
                        points=" ".join(f"{_f(a)},{_f(b)}" for a, b in xy),
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
        pts = [(t, (lo, hi)) for t, lo, hi in points if lo is not None and hi is not None]
        self._note(v for _, pair in pts for v in pair)
        self._peaks((t, pair[1]) for t, pair in pts)
        self._legend.append((name, color, "band"))
        self._layers.append(lambda y: self._areas(pts, y, color, 0.35, ""))

    def stack(self, parts: tp.Sequence[tp.Tuple[str, str, tp.Sequence[Point]]]) -> None:
        """A stacked area: ``parts`` share their times; an unknown value counts as 0 in the stack."""
        if not parts:
            return
        times = [t for t, _ in parts[0][2]]
        totals = [0.0] * len(times)
        layers = []
        for name, color, pts in parts:
            lower = list(totals)
            for i, (_, v) in enumerate(pts):
                totals[i] += v or 0.0
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
            d = " ".join(f"{_f(a)},{_f(b)}" for a, b in _thin(top) + _thin(bottom[::-1])[::-1])
            body = _el("title", esc(title)) if title else ""
            out.append(
                _el("polygon", body, points=d, fill=color, fill_opacity=opacity, stroke="#fff", stroke_width=0.3)
            )
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
        pts = list(points)
        self._note(v for _, v, _ in pts)
        self._peaks((t, v) for t, v, _ in pts)
        if legend:
            self._legend.append((name, color, shape))

        def draw(y: tp.Callable[[float], float]) -> str:
            out = []
            for t, v, title in pts[:: max(1, math.ceil(len(pts) / 400))]:
                x, yy = self.axis.x(t), self.TOP + 6 if v is None else y(v)
                tip = _el("title", esc(title))
                if shape == "cross":
                    out.append(_el("path", tip, d=_cross(x, yy), stroke=color, stroke_width=2))
                elif shape == "diamond":
                    out.append(_el("path", tip, d=_diamond(x, yy), fill=color))
                else:
                    out.append(_el("circle", tip, cx=x, cy=yy, r=3.0, fill=color, stroke="#fff", stroke_width=0.8))
            last = -1e9
            for t, v, text in labels:
                x = self.axis.x(t)
                if abs(x - last) >= 28:
                    out.append(_text(x, y(v) - 7, esc(text, 40), color=color, text_anchor="middle", font_weight=600))
                    last = x
            return "".join(out)

        self._layers.append(draw)

    def events(self, name: str, color: str, points: tp.Sequence[tp.Tuple[float, str]]) -> None:
        """Small diamonds on the time axis (checkpoint commits), with a hover title each."""
        pts = list(points)[-400:]
        if not pts:
            return
        self._legend.append((name, color, "diamond"))
        base = self.H - self.BOTTOM
        self._layers.append(
            lambda y: "".join(
                _el("path", _el("title", esc(title)), d=_diamond(self.axis.x(t), base - 6), fill=color)
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
        cut = _robust_top(self._values) if self.clip else None
        if cut is not None and cut < hi:
            hi, self.clipped = cut, True
        log = self.log if self.log is not None else (not self.zero and lo > 0 and hi / lo >= 30)
        if log and lo > 0:
            pad = 0.05 * (math.log10(hi) - math.log10(lo) or 1.0)
            tlo, thi = math.log10(lo) - pad, math.log10(hi) + pad
            ticks = [10**t for t in _log_ticks(tlo, thi)]

            def tr(v: float) -> float:
                return math.log10(v) if v > 0 else tlo

        else:

            def tr(v: float) -> float:
                return v

            if self.zero:
                lo = min(lo, 0.0)
                hi = hi + 0.08 * (hi - lo)  # headroom for labels above the highest point
                ticks = _nice_ticks(lo, hi)
                tlo, thi = min(ticks[0], lo), max(ticks[-1], hi)
            else:
                pad = (hi - lo) * 0.06 or abs(hi) * 0.05 or 1.0
                tlo, thi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
                ticks = [v for v in _nice_ticks(tlo, thi) if tlo - 1e-12 <= v <= thi + 1e-12] or [tlo, thi]

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
        out = [_svg_open(W, H, aria or self.label), _el("defs", _hatch(f"{self.id}-hatch"))]
        for v in ticks:  # grid and y labels
            out.append(_el("line", x1=L, x2=W - self.RIGHT, y1=y(v), y2=y(v), stroke=COLORS["grid"]))
            out.append(_text(L - 6, y(v) + 4, esc(self.fmt(v)), size=11, text_anchor="end"))
        mid = T + plot_h / 2
        out.append(
            _text(14, mid, esc(self.label), size=11.5, text_anchor="middle", transform=f"rotate(-90 14 {_f(mid)})")
        )
        for left, right, secs in self.axis.gaps():  # the restarts
            tip = _el("title", f"restart: {esc(fmt_seconds(secs))} between the attempts")
            out.append(_el("rect", tip, x=left, y=T, width=right - left, height=plot_h, fill=f"url(#{self.id}-hatch)"))
            cx = (left + right) / 2
            if right - left < 14:  # many restarts: the hatch and its hover title say it
                continue
            out.append(
                _text(
                    cx,
                    mid,
                    f"restart · {esc(fmt_seconds(secs))}",
                    color=COLORS["text"],
                    text_anchor="middle",
                    dominant_baseline="middle",
                    transform=f"rotate(-90 {_f(cx)} {_f(mid)})",
                )
            )
        for i, (x, w) in enumerate(zip(self.axis.starts, self.axis.px)):  # which attempt each piece is
            if i < len(self.piece_labels) and self.piece_labels[i] and w > 40:
                out.append(_text(x + 4, T + 12, esc(self.piece_labels[i], 40)))
        if not self._values:
            out.append(_text(W / 2, mid, "no data", size=13, text_anchor="middle"))
        out += [draw(y) for draw in self._layers]
        if self.clipped:  # spikes above the axis: a red caret at the top edge with the value
            last = -1e9
            for t, v in sorted(p for p in self._tops if y(p[1]) <= T + 0.01):
                x = self.axis.x(t)
                if x - last >= 44:
                    last = x
                    value = esc(self.fmt(v))
                    caret = _path((x - 5, T + 7), (x, T), (x + 5, T + 7))
                    out.append(_el("path", _el("title", f"cut off: {value}"), d=caret, fill=COLORS["slow"]))
                    out.append(_text(x + 7, T + 8, value, size=10, color=COLORS["slow"]))
        out.append(_axis_line(self.axis, base))
        lx = L
        for name, color, kind in self._legend:
            out.append(_swatch(kind, color, lx, 12))
            out.append(_text(lx + 20, 16, esc(name), size=11.5, color=COLORS["text"]))
            lx += 34 + 7.0 * len(name)
        out.append("</svg>")
        return "".join(out)


def _axis_line(axis: TimeAxis, base: float) -> str:
    """The broken x axis at ``base``: one line per piece, clock-time ticks, labels where they do not overlap."""
    out = [_el("line", x1=x, x2=x + w, y1=base, y2=base, stroke=COLORS["axis"]) for x, w in zip(axis.starts, axis.px)]
    last = -1e9
    for x, text in axis.ticks():
        out.append(_el("line", x1=x, x2=x, y1=base, y2=base + 4, stroke=COLORS["axis"]))
        if x - last >= 12 + 6.2 * len(text):  # no two labels overlap
            out.append(_text(x, base + 16, esc(text), text_anchor="middle"))
            last = x
    return "".join(out)


def _swatch(kind: str, color: str, x: float, y: float) -> str:
    if kind in ("line", "dash"):
        dash = "4 3" if kind == "dash" else None
        return _el("line", x1=x, x2=x + 16, y1=y, y2=y, stroke=color, stroke_width=2.5, stroke_dasharray=dash)
    if kind in ("band", "area"):
        return _el("rect", x=x, y=y - 6, width=16, height=10, fill=color, fill_opacity=0.35 if kind == "band" else 0.85)
    if kind == "cross":
        return _el("path", d=_cross(x + 8, y), stroke=color, stroke_width=2)
    if kind == "diamond":
        return _el("path", d=_diamond(x + 8, y), fill=color)
    return _el("circle", cx=x + 8, cy=y, r=3.5, fill=color)


# ----------------------------------------------------------------------------------------- the timeline
class Row(tp.NamedTuple):
    """One attempt on the timeline: times are Unix seconds (None where unknown); text is plain (escaped when
    drawn)."""

    label: str
    process_start: tp.Optional[float]
    first_step: tp.Optional[float]
    end: tp.Optional[float]
    outcome: str
    text: str
    lost_s: tp.Optional[float]
    title: str
    checkpoints: tp.Sequence[tp.Tuple[float, str]] = ()


def timeline(rows: tp.Sequence[Row]) -> str:
    """The attempts as a Gantt chart over a broken time axis: start-up hatched, training coloured by how it
    ended, the progress redone after it (lost) striped red at its end, checkpoint commits as diamonds."""
    W, L, R, T, B, RH = 1160.0, 150.0, 18.0, 10.0, 34.0, 40.0
    spans = []
    for r in rows:
        a = r.process_start if r.process_start is not None else r.first_step
        if a is not None:
            spans.append((a, max(x for x in (r.end, r.first_step, a) if x is not None)))
    H = T + RH * max(len(rows), 1) + B
    bottom = H - B
    axis = TimeAxis(spans or [(0.0, 1.0)], L, W - L - R, gap=26.0)
    cid = f"c{next(_ids)}"
    defs = _hatch(f"{cid}-hatch") + _hatch(
        f"{cid}-startup", size=5.0, fill=COLORS["startup"], stroke="#90a4ae", angle=-45
    )
    defs += _hatch(f"{cid}-lost", size=5.0, fill="#ffcdd2", stroke=COLORS["lost"])
    out = [_svg_open(W, H, "attempts timeline"), _el("defs", defs)]
    for left, right, secs in axis.gaps() if spans else []:
        tip = _el("title", f"{esc(fmt_seconds(secs))} with nothing running (queue wait, requeue)")
        out.append(_el("rect", tip, x=left, y=T, width=right - left, height=bottom - T, fill=f"url(#{cid}-hatch)"))
    for i, r in enumerate(rows):
        top = T + RH * i
        if i % 2:
            out.append(_el("rect", x=0.0, y=top, width=W, height=RH, fill="#fafbfc"))
        color = COLORS.get(r.outcome, COLORS["unknown"])
        out.append(_text(8, top + 16, esc(r.label, 22), size=12, color=COLORS["text"], font_weight=600))
        out.append(_text(8, top + 31, esc(r.outcome), color=color))
        a = r.process_start if r.process_start is not None else r.first_step
        if a is None:
            out.append(_text(L, top + 16, f"no time recorded · {esc(r.text, 160)}", size=11))
            continue
        first = r.first_step if r.first_step is not None else a
        end = max(x for x in (r.end, first) if x is not None)
        xa, xf, xe = axis.x(a), axis.x(first), axis.x(end)
        bar_y, bar_h = top + 5, 14.0
        if xf > xa:
            tip = _el("title", f"start-up {esc(fmt_seconds(first - a))}")
            out.append(_el("rect", tip, x=xa, y=bar_y, width=xf - xa, height=bar_h, fill=f"url(#{cid}-startup)"))
        tip = _el("title", esc(r.title, 600))
        out.append(_el("rect", tip, x=xf, y=bar_y, width=max(xe - xf, 2.0), height=bar_h, fill=color, rx=2))
        if r.lost_s:
            xl = axis.x(end - r.lost_s)
            lost = esc(fmt_seconds(r.lost_s))
            tip = _el("title", f"{lost} of progress redone by the next attempt (after its last committed checkpoint)")
            out.append(
                _el(
                    "rect",
                    tip,
                    x=min(xl, xe - 2),
                    y=bar_y,
                    width=max(xe - xl, 2.0),
                    height=bar_h,
                    fill=f"url(#{cid}-lost)",
                )
            )
        for t, title in list(r.checkpoints)[-60:]:
            d = _diamond(axis.x(t), bar_y + 2)
            out.append(_el("path", _el("title", esc(title)), d=d, fill=COLORS["ckpt"], stroke="#fff", stroke_width=0.8))
        right = xa > L + 0.55 * (W - L - R)  # anchored at the bar's end, else at its start
        room = int(((xe - L) if right else (W - R - xa)) / 6.0)  # characters of 10.5 px text that fit
        raw = r.text if len(r.text) <= room else r.text[: max(room - 1, 12)] + "…"  # the table has it whole
        anchor = "end" if right else None
        out.append(_text(xe if right else xa, top + 32, esc(raw, 400), color=COLORS["text"], text_anchor=anchor))
    if spans:
        out.append(_axis_line(axis, bottom))
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------------------------------- range bars
def stats_ok(s: tp.Any) -> bool:
    """Whether ``s`` is a usable ``{min, median, max, max_rank}`` (the sanitiser leaves None for a bad one)."""
    return isinstance(s, dict) and all(s.get(k) is not None for k in ("min", "median", "max"))


def range_bars(rows: tp.Sequence[tp.Tuple[str, tp.Optional[tp.Dict[str, tp.Any]]]], *, unit: float = 1e3) -> str:
    """One horizontal min..max bar per row (``(name, {min, median, max, max_rank})``, seconds), the median a
    tick, the max a red dot labelled with the rank that holds it. Values are shown in ms."""
    W, L, R, T, RH = 1160.0, 150.0, 240.0, 24.0, 26.0
    H = T + RH * len(rows) + 24
    hi = max((s["max"] for _, s in rows if stats_ok(s)), default=0.0) * unit or 1.0  # type: ignore[index]
    ticks = _nice_ticks(0.0, hi)
    hi = max(ticks[-1], hi)

    def x(v: float) -> float:
        return L + (W - L - R) * v / hi

    out = [_svg_open(W, H, "per-rank spread of the last interval")]
    for v in ticks:
        out.append(_el("line", x1=x(v), x2=x(v), y1=T - 6, y2=H - 20, stroke=COLORS["grid"]))
        out.append(_text(x(v), H - 6, f"{esc(fmt_num(v))} ms", text_anchor="middle"))
    key = "per step, over ranks: bar min..max · tick median · " + _el(
        "tspan", "● max, on the rank named", fill=COLORS["slow"]
    )
    out.append(_text(L, 12, key, size=11.5, color=COLORS["text"]))
    for i, (name, s) in enumerate(rows):
        cy = T + RH * i + RH / 2
        out.append(_text(L - 10, cy + 4, esc(name), size=12, color=COLORS["text"], text_anchor="end"))
        if not stats_ok(s):
            out.append(_text(L, cy + 4, "not measured", size=11))
            continue
        assert s is not None
        lo, med, top = (unit * s[k] for k in ("min", "median", "max"))
        rank = esc(s.get("max_rank"))
        out.append(_el("rect", x=x(lo), y=cy - 5, width=max(x(top) - x(lo), 1.5), height=10, fill=COLORS["band"], rx=3))
        out.append(_el("line", x1=x(med), x2=x(med), y1=cy - 8, y2=cy + 8, stroke=COLORS["median"], stroke_width=2.5))
        tip = _el("title", f"{esc(name)}: min {_g(lo)} ms, median {_g(med)} ms, max {_g(top)} ms on rank {rank}")
        out.append(_el("circle", tip, cx=x(top), cy=cy, r=4.5, fill=COLORS["slow"]))
        label = f"median {_g(med)} ms · max {_g(top)} on rank {rank}"
        out.append(_text(x(top) + 9, cy + 4, label, size=11, color=COLORS["text"]))
    out.append("</svg>")
    return "".join(out)
