"""Recorded text made safe to show, and numbers and durations for people (stdlib only).

Shared by the page (:mod:`hpctrain.report.page`), the charts (:mod:`hpctrain.report.svg`) and the command
line (:mod:`hpctrain.report.cli`): every string taken from a run directory goes through :func:`plain` (for a
terminal) or :func:`esc` (for HTML and SVG), so a hostile or damaged record cannot break the page.
"""

from __future__ import annotations

import html
import math
import re
import typing as tp

__all__ = ["plain", "esc", "fmt_seconds", "fmt_num"]

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
