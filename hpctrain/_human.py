"""Numbers for people: durations, rates and counts, sizes (stdlib only). The one place each is formatted.

Every screen and page of the house (``status``, the run report, ``capacity``, ``data``, ``ckpt ls``, the
Trainer's interval line) shows a duration, a rate or a size through this module, so one run's times read
the same everywhere. Anything that is not a finite number (None, NaN, a bool, a string) shows as ``?``.

* :func:`fmt_duration`: compact, at most two units, the second zero-padded: ``850 ms``, ``12.3 s``,
  ``3 min 20 s``, ``2 h 05 min``, ``1 d 3 h``; negative (clock skew) as ``0 s``; beyond 10 000 days as
  ``>10000 d`` (not a 300-digit number).
* :func:`fmt_num`: SI suffixes, ``digits`` significant: ``5.12k``, ``45.6M``, ``3.2G`` (samples/s, FLOP/s,
  losses).
* :func:`fmt_bytes`: binary units: ``512 B``, ``137.2 KiB``, ``11.2 GiB``.
* :func:`fmt_local_time`: a recorded time in local time (``?`` for a damaged one).

And recorded text made safe to show: every string taken from a run directory goes through :func:`plain`
(for a terminal) or :func:`esc` (for HTML and SVG: the run report, the charts of :mod:`hpctrain.charts`), so
a hostile or damaged record cannot break a screen or a page.
"""

from __future__ import annotations

import html
import math
import re
import time
import typing as tp

__all__ = ["fmt_duration", "fmt_num", "fmt_bytes", "fmt_local_time", "real", "plain", "esc"]

_LONGEST_S = 10_000 * 86400.0


def real(value: tp.Any) -> tp.Optional[float]:
    """``value`` as a finite float; None for None, bools, non-numbers, NaN, infinities and ints beyond floats."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def fmt_duration(seconds: tp.Any) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``3 min 20 s``, ``2 h 05 min``, ``1 d 3 h``; ``?``
    when unknown."""
    s = real(seconds)
    if s is None:
        return "?"
    s = max(s, 0.0)
    if s < 1:
        return f"{s * 1e3:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} µs" if s > 0 else "0 s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= _LONGEST_S:
        return f">{_LONGEST_S / 86400:.0f} d"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def fmt_num(value: tp.Any, digits: int = 3) -> str:
    """A number with SI suffixes, ``digits`` significant: ``1.23k``, ``45.6M``; ``?`` when unknown."""
    v = real(value)
    if v is None:
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


def fmt_bytes(value: tp.Any) -> str:
    """``512 B``, ``137.2 KiB``, ``11.2 GiB``; ``?`` when unknown."""
    n = real(value)
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_local_time(t: tp.Any, fmt: str = "%Y-%m-%d %H:%M:%S", unknown: str = "?") -> str:
    """A recorded Unix time in this machine's local time (``time.strftime`` ``fmt``); ``unknown`` for a value
    that is not a time (missing, a bool, a string, out of range): a damaged record never stops a screen."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return unknown
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return unknown


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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
