"""The report page: :func:`render` turns :class:`~hpctrain.report.gather.RunData` into one HTML document.

Self-contained by construction: inline CSS, inline SVG (:mod:`hpctrain.charts`), no script, no font,
stylesheet or image fetched from anywhere (the capacity plot, when there is one, is a ``data:`` URI). Every
string taken from the run directory goes through :func:`hpctrain._human.esc`. Each section has a stable
id (:data:`SECTIONS`) and says so plainly when its records are missing.

This module holds the skeleton (head, styles, header, navigation, footer); the sections are drawn by
:mod:`hpctrain.report.page_summary` (summary, identity, capacity, notes), :mod:`hpctrain.report.page_charts`
(loss, throughput, breakdown, ranks) and :mod:`hpctrain.report.page_attempts` (timeline, checkpoints), from
the pieces in :mod:`hpctrain.report.page_html`.
"""

from __future__ import annotations

import time

import hpctrain
from hpctrain._human import esc
from hpctrain.report.gather import RunData
from hpctrain.report.page_attempts import _checkpoints, _timeline
from hpctrain.report.page_charts import PARTS, _breakdown, _loss, _ranks, _spans, _throughput
from hpctrain.report.page_html import SECTIONS, _when, page_head
from hpctrain.report.page_summary import _capacity, _identity, _notes, _summary

__all__ = ["render", "SECTIONS", "PARTS"]

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #eef1f4; color: #263238;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header { background: #263238; color: #eceff1; padding: 18px 28px 14px; }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 650; }
header .sub { color: #b0bec5; font-size: 13px; word-break: break-all; }
nav { background: #37474f; padding: 6px 28px; font-size: 13px; }
nav a { color: #cfd8dc; margin-right: 16px; text-decoration: none; }
main { max-width: 1240px; margin: 0 auto; padding: 14px 20px 40px; }
section { background: #fff; border-radius: 8px; box-shadow: 0 1px 2px rgba(0,0,0,.08);
  margin: 14px 0; padding: 14px 20px 16px; }
h2 { font-size: 17px; margin: 0 0 8px; font-weight: 650; }
h3 { font-size: 14px; margin: 14px 0 6px; font-weight: 650; color: #37474f; }
.caption { color: #607d8b; font-size: 12.5px; margin: 2px 0 10px; }
.empty { color: #78909c; font-style: italic; margin: 8px 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(178px, 1fr)); gap: 10px; }
.card { background: #f6f8f9; border-radius: 6px; padding: 8px 12px; }
.card .k { color: #607d8b; font-size: 11.5px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 18px; font-weight: 600; margin-top: 1px; word-break: break-word; }
.card .d { color: #607d8b; font-size: 12px; }
.banner { background: #fff8e1; border-left: 4px solid #f9a825; padding: 8px 12px; margin: 10px 0 0;
  border-radius: 4px; font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; margin: 4px 0 8px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eceff1; vertical-align: top; }
th { color: #546e7a; font-weight: 600; background: #f6f8f9; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.mono, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px;
  word-break: break-all; }
.pill { display: inline-block; border-radius: 9px; padding: 0 8px; font-size: 11.5px; color: #fff; }
.ok { color: #2e7d32; } .bad { color: #c62828; font-weight: 600; }
ul.notes { margin: 4px 0; padding-left: 20px; font-size: 12.5px; }
ul.notes li { margin: 2px 0; word-break: break-word; }
details summary { cursor: pointer; color: #37474f; font-size: 13px; margin: 6px 0; }
svg { display: block; margin: 4px 0 6px; }
.capacity img { max-width: 100%; height: auto; display: block; }
footer { color: #78909c; font-size: 12px; text-align: center; margin: 10px 0 30px; }
"""


def _tz() -> str:
    off = time.localtime().tm_gmtoff or 0
    sign = "+" if off >= 0 else "-"
    return f"UTC{sign}{abs(off) // 3600:02d}:{abs(off) % 3600 // 60:02d}"


# ------------------------------------------------------------------------------------------------ page
def render(data: RunData) -> str:
    """The whole page as one string."""
    spans, labels = _spans(data.attempts)
    if not spans:
        times = [r["time"] for r in data.intervals + data.evals if r.get("time") is not None]
        spans = [(min(times), max(times))] if times else [(data.generated - 1, data.generated)]
        labels = [""]
    name = data.run_dir.name or str(data.run_dir)
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title in SECTIONS)
    sections = [
        _summary(data),
        _loss(data, spans, labels),
        _throughput(data, spans, labels),
        _breakdown(data, spans, labels),
        _ranks(data, spans, labels),
        _timeline(data),
        _checkpoints(data),
        _identity(data),
        _capacity(data),
        _notes(data),
    ]
    return (
        page_head(f"hpctrain report: {name[:120]}", CSS) + f"<header><h1>Run report: {esc(name, 120)}</h1>"
        f'<div class="sub">{esc(str(data.run_dir), 500)} · generated {esc(_when(data.generated))} ({esc(_tz())}) by '
        f"hpctrain {esc(hpctrain.__version__)} · times are local to the machine that wrote this report</div></header>"
        f"<nav>{nav}</nav><main>{''.join(sections)}</main>"
        "<footer>python -m hpctrain report · one self-contained file: no script, nothing fetched</footer>"
        "</body></html>\n"
    )
