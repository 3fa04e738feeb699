"""The HTML pieces every section of the report page is built from: :data:`SECTIONS`, cards, tables, pills.

Cells and values passed in are HTML already (escaped by the caller with :func:`~hpctrain._human.esc`);
headings and keys are escaped here. Each section's ``<section>`` carries its stable id from :data:`SECTIONS`.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain._human import esc, fmt_local_time
from hpctrain.charts.elements import COLORS

__all__ = ["SECTIONS", "page_head"]

SECTIONS = (
    ("summary", "Summary"),
    ("loss", "Loss"),
    ("throughput", "Throughput and MFU"),
    ("breakdown", "Step-time breakdown"),
    ("ranks", "Per-rank spread"),
    ("timeline", "Attempts"),
    ("checkpoints", "Checkpoints"),
    ("identity", "Identity and approvals"),
    ("capacity", "Capacity"),
    ("notes", "Notes"),
)
"""``(id, heading)`` of every section, in page order (the browser test looks for each id)."""


def page_head(title: str, css: str) -> str:
    """The start of every hpctrain page, up to ``<body>``: its title (escaped here) and inline CSS. The
    Content-Security-Policy is the pages' one security rule: no script, no fetch, no frame; only the inline
    styles and ``data:`` images of the page itself (a run directory's text can never load anything)."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        f"<title>{esc(title, 160)}</title><style>{css}</style></head><body>"
    )


def _when(t: tp.Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return fmt_local_time(t, fmt)


def _num(v: tp.Any) -> tp.Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pct(v: tp.Optional[float]) -> str:
    """A share as ``12.3 %``; ``?`` when unknown or not finite (a page never shows ``nan`` or ``inf``)."""
    return "?" if v is None or not math.isfinite(100 * v) else f"{100 * v:.1f} %"


def _card(key: str, value: str, detail: str = "") -> str:
    d = f'<div class="d">{detail}</div>' if detail else ""
    return f'<div class="card"><div class="k">{esc(key)}</div><div class="v">{value}</div>{d}</div>'


def _table(head: tp.Sequence[str], rows: tp.Sequence[tp.Sequence[str]], numeric: tp.Container[int] = ()) -> str:
    """A table; the cells are HTML already (escaped by the caller)."""
    out = ["<table><thead><tr>", "".join(f"<th>{esc(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        out.append(
            "<tr>"
            + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
            + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _section(sid: str, body: str) -> str:
    title = dict(SECTIONS)[sid]
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


def _span(cls: str, body: str) -> str:
    return f'<span class="{cls}">{body}</span>'


def _colored(outcome: str) -> str:
    return f'<span style="color:{COLORS.get(outcome, COLORS["unknown"])}">{esc(outcome)}</span>'


def _pill(outcome: str) -> str:
    return f'<span class="pill" style="background:{COLORS.get(outcome, COLORS["unknown"])}">{esc(outcome)}</span>'


def _empty(text: str) -> str:
    return f'<p class="empty">{esc(text)}</p>'
