"""The axes of the charts: the broken time axis (:class:`TimeAxis`) and the value scales (stdlib only).

:class:`TimeAxis` is a *broken* time axis whose pieces are the attempts of the run, each as wide as its share
of the time (with a minimum), separated by a hatched gap of fixed width that says how long the run was down
there. A long queue wait between two attempts does not squash the curves, and a restart is visible as a gap
in every curve. The y scales pick tick values (linear or log) and a top that leaves out rare spikes.
"""

from __future__ import annotations

import math
import time
import typing as tp

from hpctrain._human import esc
from hpctrain.charts.elements import COLORS, el, svg_text

__all__ = ["TimeAxis", "axis_line", "nice_ticks", "log_ticks", "robust_top"]

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


def axis_line(axis: TimeAxis, base: float) -> str:
    """The broken x axis at ``base``: one line per piece, clock-time ticks, labels where they do not overlap."""
    out = [el("line", x1=x, x2=x + w, y1=base, y2=base, stroke=COLORS["axis"]) for x, w in zip(axis.starts, axis.px)]
    last = -1e9
    for x, text in axis.ticks():
        out.append(el("line", x1=x, x2=x, y1=base, y2=base + 4, stroke=COLORS["axis"]))
        if x - last >= 12 + 6.2 * len(text):  # no two labels overlap
            out.append(svg_text(x, base + 16, esc(text), text_anchor="middle"))
            last = x
    return "".join(out)


# ------------------------------------------------------------------------------------------ value scales
def nice_ticks(lo: float, hi: float, n: int = 5) -> tp.List[float]:
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


def log_ticks(tlo: float, thi: float) -> tp.List[float]:
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


def robust_top(values: tp.Sequence[float]) -> tp.Optional[float]:
    """A y-axis top that leaves out rare spikes (an attempt's first interval: warm-up; a blocking save):
    twice the 75th percentile when the maximum is more than three times that, else None (no clipping)."""
    if len(values) < 8:
        return None
    ordered = sorted(values)
    p75 = ordered[int(0.75 * (len(ordered) - 1))]
    if p75 <= 0 or ordered[-1] <= 3.0 * p75:
        return None
    return 2.0 * p75
