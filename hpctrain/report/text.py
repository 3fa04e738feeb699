"""Recorded text made safe to show (stdlib only; numbers, durations and sizes for people are :mod:`hpctrain._human`).

Shared by the page (:mod:`hpctrain.report.page`), the charts (:mod:`hpctrain.report.svg`) and the command
line (:mod:`hpctrain.report.cli`): every string taken from a run directory goes through :func:`plain` (for a
terminal) or :func:`esc` (for HTML and SVG), so a hostile or damaged record cannot break the page.
"""

from __future__ import annotations

import html
import re
import typing as tp

__all__ = ["plain", "esc"]

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
