"""The report page: :func:`render` turns :class:`~hpctrain.report.gather.RunData` into one HTML document.

Self-contained by construction: inline CSS, inline SVG (:mod:`hpctrain.report.svg`), no script, no font,
stylesheet or image fetched from anywhere (the capacity plot, when there is one, is a ``data:`` URI). Every
string taken from the run directory goes through :func:`hpctrain.report.svg.esc`. Each section has a stable
id (:data:`SECTIONS`) and says so plainly when its records are missing.
"""

from __future__ import annotations

import base64
import collections
import time
import typing as tp

import hpctrain
from hpctrain.report.gather import Attempt, RunData
from hpctrain.report.svg import (
    COLORS,
    Row,
    TimeChart,
    esc,
    fmt_num,
    fmt_seconds,
    range_bars,
    stats_ok,
    timeline,
)

__all__ = ["render", "SECTIONS", "PARTS"]

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

PARTS = (
    ("data_wait_s", "data wait"),
    ("forward_backward_s", "compute (fwd+bwd)"),
    ("grad_comm_exposed_s", "exposed comm"),
    ("optimizer_s", "optimizer"),
    ("checkpoint_s", "checkpoint"),
)
"""The parts of a step, as the interval records' ``per_step`` names them, bottom of the stack first."""
TIMELINE_ROWS = 60
"""Attempts drawn on the timeline (the newest); the attempts table lists them all."""
CHART_WINDOWS = 800
"""Beyond twice this many interval records, the charts draw a few per window of consecutive records."""
"""Attempts drawn on the timeline (the newest); the attempts table lists them all."""

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


# --------------------------------------------------------------------------------------------- helpers
def _when(t: tp.Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return "?"
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return "?"


def _tz() -> str:
    off = time.localtime().tm_gmtoff or 0
    sign = "+" if off >= 0 else "-"
    return f"UTC{sign}{abs(off) // 3600:02d}:{abs(off) % 3600 // 60:02d}"


def _num(v: tp.Any) -> tp.Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pct(v: tp.Optional[float]) -> str:
    return "?" if v is None else f"{100 * v:.1f} %"


def _ms(v: float) -> str:
    return f"{v:.3g}"


_CUT = (
    " The y axis leaves out rare spikes (typically the first interval of an attempt: warm-up, first batches): "
    '<span class="bad">▲</span> marks them at the top with their value.'
)


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


def _spans(attempts: tp.Sequence[Attempt]) -> tp.Tuple[tp.List[tp.Tuple[float, float]], tp.List[str]]:
    """The pieces of the curves' time axis: each attempt that left timed metrics, from its first step to its
    last record; and their labels."""
    spans, labels = [], []
    for a in attempts:
        times = [r["time"] for r in a.intervals + a.evals if r.get("time") is not None]
        if not times:
            continue
        first = a.first_step_time
        t0 = min([first] + times) if first is not None else min(times)
        end_t = (a.end or {}).get("time")
        t1 = max(times + ([end_t] if end_t is not None else []))
        spans.append((t0, t1))
        labels.append(f"#{a.index} {a.label}")
    return spans, labels


def _timed(records: tp.Iterable[tp.Dict[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    return sorted((r for r in records if r.get("time") is not None), key=lambda r: r["time"])


def _step_median(r: tp.Dict[str, tp.Any]) -> float:
    s = r.get("per_step", {}).get("step_s") if isinstance(r.get("per_step"), dict) else None
    return s["median"] if stats_ok(s) else -1.0


def _drawn(records: tp.Sequence[tp.Dict[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The interval records a chart draws: all of them up to :data:`CHART_WINDOWS` x 2; beyond, in each of
    about CHART_WINDOWS windows of consecutive records the first, the highest loss, the slowest step and
    every non-finite loss (a chart is about a thousand pixels wide: the spikes stay, the cost does not grow)."""
    if len(records) <= 2 * CHART_WINDOWS:
        return list(records)
    k = -(-len(records) // CHART_WINDOWS)
    out: tp.List[tp.Dict[str, tp.Any]] = []
    for i in range(0, len(records), k):
        window = records[i : i + k]
        losses = [r for r in window if r.get("loss") is not None]
        keep = [window[0], max(window, key=_step_median)]
        keep += [max(losses, key=lambda r: r["loss"])] if losses else []
        keep += [r for r in window if r.get("loss") is None]
        seen: tp.Set[int] = set()
        out += [r for r in sorted(keep, key=lambda r: r["time"]) if not (id(r) in seen or seen.add(id(r)))]
    return out


# -------------------------------------------------------------------------------------------- sections
def _summary(data: RunData) -> str:
    st = data.status
    job = st.get("job") or {}
    prog = st.get("progress") or {}
    last = st.get("last_interval") or {}
    last_eval = st.get("last_eval") or {}
    ck = st.get("checkpoint") or {}
    state = esc(job.get("state"))
    job_detail = f"job {esc(job.get('id') or '–')} · {esc(job.get('cluster'))} · from {esc(job.get('source'))}"
    if job.get("nodes"):
        job_detail += f" · {esc(job['nodes'])}"
    step, total = prog.get("step"), prog.get("total_steps")
    frac = prog.get("fraction")
    progress = f"{esc(step)} / {esc(total)}"
    prog_detail = (_pct(frac) if frac is not None else "") + (
        f" · ended: {esc(prog['ended'])}" if prog.get("ended") else ""
    )
    if prog.get("eta_s") is not None:
        prog_detail += f" · ETA {esc(fmt_seconds(prog['eta_s']))}"
    atts = data.attempts
    lost = sum(a.lost_after_s or 0.0 for a in atts)
    startup = sum((a.start or {}).get("startup_s") or 0.0 for a in atts)
    loss = _num(last.get("loss"))
    eval_loss = _num(last_eval.get("loss"))
    restarts = f"{max(len(atts) - 1, 0)} restart(s)"
    cards = [
        _card("job state", state, job_detail),
        _card("progress (steps)", progress, prog_detail),
        _card(
            "attempts",
            f"{len(atts)}",
            f"{restarts} · start-up {esc(fmt_seconds(startup))} · lost {esc(fmt_seconds(lost))}",
        ),
        _card(
            "last loss",
            "?" if loss is None else f"{loss:.4g}",
            f"interval to step {esc(last.get('step'))}" if last else "",
        ),
        _card(
            "last eval loss",
            "?" if eval_loss is None else f"{eval_loss:.4g}",
            f"step {esc(last_eval.get('step'))}" + (" · interrupted" if last_eval.get("interrupted") else "")
            if last_eval
            else "",
        ),
        _card(
            "samples/s",
            esc(fmt_num(_num(last.get("samples_per_s")))),
            f"{esc(last.get('world_size'))} ranks · data wait {_pct(_num(last.get('data_wait_frac')))}" if last else "",
        ),
        _card(
            "MFU",
            _pct(_num(last.get("mfu"))) if last.get("mfu") is not None else "n/a",
            f"{esc(fmt_num(_num(last.get('flops_per_s'))))} FLOP/s achieved"
            if last.get("flops_per_s") is not None
            else "",
        ),
        _card(
            "newest checkpoint",
            f"step {esc(ck.get('step'))}" if ck.get("step") is not None else "none",
            f"{esc(_when(ck.get('time')))} · {esc(ck.get('world_size'))} ranks" if ck.get("step") is not None else "",
        ),
    ]
    body = f'<div class="cards">{"".join(cards)}</div>'
    if data.notes:
        body += (
            f'<div class="banner">{len(data.notes)} note(s) about missing or damaged records: '
            f'<a href="#notes">see Notes</a>. What could be read is shown.</div>'
        )
    return _section("summary", body)


def _loss(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals, evals = _drawn(_timed(data.intervals)), _timed(data.evals)
    if not intervals and not evals:
        return _section("loss", _empty("No interval or eval records with a time: nothing to draw yet."))
    chart = TimeChart(spans, label="loss", zero=False, piece_labels=labels, height=280)
    chart.line("train loss (interval mean)", COLORS["loss"], [(r["time"], r.get("loss")) for r in intervals])
    if 0 < len(intervals) <= 300:
        chart.markers(
            "train loss",
            COLORS["loss"],
            [
                (r["time"], r["loss"], f"step {r['step']} · loss {r['loss']:.5g} · {_when(r['time'], '%H:%M:%S')}")
                for r in intervals
                if r.get("loss") is not None
            ],
            legend=False,
        )
    bad = [r for r in intervals if r.get("loss") is None]
    if bad:
        chart.markers(
            "non-finite loss",
            COLORS["nan"],
            [(r["time"], None, f"step {r['step']}: loss not finite (recorded null)") for r in bad],
            shape="cross",
        )
    if evals:
        chart.line("eval loss", COLORS["eval"], [(r["time"], r.get("loss")) for r in evals], dash="5 4")
        chart.markers(
            "eval",
            COLORS["eval"],
            [
                (
                    r["time"],
                    r.get("loss"),
                    f"eval at step {r['step']}: loss {fmt_num(r.get('loss'), 5)}"
                    + (" (interrupted: fewer batches)" if r.get("interrupted") else ""),
                )
                for r in evals
            ],
            legend=False,
        )
    t_lo, t_hi = spans[0][0] - 1, spans[-1][1] + 1
    commits = [
        (c["time"], f"checkpoint step {c['step']} committed {_when(c['time'], '%H:%M:%S')}")
        for c in data.checkpoints
        if c["status"] == "committed" and c["time"] is not None and t_lo <= c["time"] <= t_hi
    ]
    chart.events("checkpoint committed", COLORS["ckpt"], commits)
    caption = (
        "Mean training loss of each log interval (all ranks) and the evaluation loss, over wall time. "
        "Each attempt of the run is one piece of the time axis; the hatched gap between two pieces is a restart "
        "(its width is fixed; the label says how long the run was down). Hover a point for its step."
    )
    body = f'<p class="caption">{caption}</p>{chart.svg(aria="loss over time")}'
    if bad:
        body += (
            f'<p class="caption"><span class="bad">{len(bad)} interval(s) recorded a non-finite loss</span> '
            f"(NaN or infinite, written as null): drawn as ✕ at the top, the line is broken there.</p>"
        )
    return _section("loss", body)


def _throughput(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals = _drawn(_timed(data.intervals))
    if not intervals:
        return _section("throughput", _empty("No interval records with a time: nothing to draw yet."))
    rate = TimeChart(spans, label="samples/s", piece_labels=labels, height=220)
    rate.line("samples/s (all ranks)", COLORS["rate"], [(r["time"], r.get("samples_per_s")) for r in intervals])
    body = (
        '<p class="caption">Samples per second of all ranks in each interval (samples / the slowest rank\'s '
        "interval time).</p>" + rate.svg(aria="samples per second over time")
    )
    if any(r.get("mfu") is not None for r in intervals):
        mfu = TimeChart(spans, label="MFU %", piece_labels=labels, height=200, fmt=lambda v: f"{v:g}")
        mfu.line(
            "MFU (model FLOP/s ÷ peak)",
            COLORS["mfu"],
            [(r["time"], 100 * r["mfu"] if r.get("mfu") is not None else None) for r in intervals],
        )
        body += '<p class="caption">Model FLOPs utilisation: achieved FLOP/s per device ÷ the device\'s peak.</p>'
        body += mfu.svg(aria="MFU over time")
    elif any(r.get("flops_per_s") is not None for r in intervals):
        fl = TimeChart(spans, label="FLOP/s", piece_labels=labels, height=200)
        fl.line("achieved FLOP/s (all ranks)", COLORS["mfu"], [(r["time"], r.get("flops_per_s")) for r in intervals])
        body += (
            '<p class="caption">MFU is unknown for this run: no peak FLOP/s for its device (a CPU, or a GPU '
            'hpctrain does not list; set <span class="mono">metrics.peak_flops_per_device</span>). '
            "The achieved FLOP/s instead:</p>" + fl.svg(aria="FLOP/s over time")
        )
    else:
        body += _empty("MFU and FLOP/s were not recorded.")
    return _section("throughput", body)


def _breakdown(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals = _drawn([r for r in _timed(data.intervals) if isinstance(r.get("per_step"), dict)])
    if not intervals:
        why = (
            "The step was not measured (metrics.enabled=False): no per-part times."
            if any(r.get("measured") is False for r in data.intervals)
            else "No interval record holds per-step times yet."
        )
        return _section("breakdown", _empty(why))
    chart = TimeChart(spans, label="ms per step", piece_labels=labels, height=280, fmt=_ms, clip=True)

    def med(r: tp.Dict[str, tp.Any], part: str) -> tp.Optional[float]:
        s = r["per_step"].get(part)
        return 1e3 * s["median"] if stats_ok(s) else None

    chart.stack([(name, COLORS[part], [(r["time"], med(r, part)) for r in intervals]) for part, name in PARTS])
    chart.line(
        "whole step (median)", "#263238", [(r["time"], med(r, "step_s")) for r in intervals], dash="4 3", width=1.4
    )
    frac = [_num(r.get("data_wait_frac")) for r in intervals]
    known = [f for f in frac if f is not None]
    text = (
        "Each interval's median over ranks of the time a step spends in each part (the interval records' "
        '<span class="mono">per_step</span> medians), stacked; the dashed line is the median whole step, whose '
        "rest (between the marks) is not charged to a part. Data wait on CUDA is GPU idle time waiting for the batch."
    )
    if known:
        text += f" Data wait share over the run: median {_pct(sorted(known)[len(known) // 2])}, last {_pct(known[-1])}."
    svg = chart.svg(aria="step-time breakdown")
    return _section("breakdown", f'<p class="caption">{text}{_CUT if chart.clipped else ""}</p>{svg}')


def _ranks(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    every = [r for r in _timed(data.intervals) if isinstance(r.get("per_step"), dict)]
    intervals = _drawn(every)
    body = ""
    if intervals:
        chart = TimeChart(spans, label="ms per step", piece_labels=labels, height=240, fmt=_ms, clip=True)
        rows = [(r, r["per_step"].get("step_s")) for r in intervals]
        rows = [(r, s) for r, s in rows if stats_ok(s)]
        chart.band(
            "min..max over ranks", COLORS["band"], [(r["time"], 1e3 * s["min"], 1e3 * s["max"]) for r, s in rows]
        )
        chart.line("median rank", COLORS["median"], [(r["time"], 1e3 * s["median"]) for r, s in rows], width=1.5)
        slow_pts = [
            (
                r["time"],
                1e3 * s["max"],
                f"step {r['step']}: slowest rank {_rank(r, s)} ({1e3 * s['max']:.2f} ms per step)",
            )
            for r, s in rows
        ]
        labels_at = []
        prev = object()
        for r, s in rows:
            who = _rank(r, s)
            if who != prev:
                labels_at.append((r["time"], 1e3 * s["max"], f"r{who}"))
                prev = who
        chart.markers("slowest rank (max)", COLORS["slow"], slow_pts, labels=labels_at[:30])
        counted = [(r, r["per_step"].get("step_s")) for r in every]
        counts = collections.Counter(str(_rank(r, s)) for r, s in counted if stats_ok(s))
        summary = ", ".join(f"rank {esc(k)} in {v}" for k, v in counts.most_common(5))
        svg = chart.svg(aria="per-rank step time")
        body += (
            '<p class="caption">Mean step time of each rank in each interval: the band spans the fastest to the '
            "slowest rank, the red dots are the slowest rank (labelled where it changes). "
            f"Slowest rank by interval: {summary} of {sum(counts.values())} intervals."
            f"{_CUT if chart.clipped else ''}</p>" + svg
        )
        rated = [r for r in intervals if stats_ok(r.get("samples_per_s_per_rank"))]
        if rated:
            rc = TimeChart(spans, label="samples/s per rank", piece_labels=labels, height=200)
            pr = [(r, r["samples_per_s_per_rank"]) for r in rated]
            rc.band("min..max over ranks", COLORS["band"], [(r["time"], s["min"], s["max"]) for r, s in pr])
            rc.line("median rank", COLORS["rate"], [(r["time"], s["median"]) for r, s in pr], width=1.5)
            body += rc.svg(aria="samples per second per rank")
        last = intervals[-1]
        bars = [("whole step", last["per_step"].get("step_s"))] + [(n, last["per_step"].get(p)) for p, n in PARTS]
        body += f"<h3>Last interval (to step {esc(last['step'])}): each part per step, over ranks</h3>" + range_bars(
            bars
        )
    else:
        body += _empty("No per-rank measurements (interval records with per_step) yet.")
    return _section("ranks", body)


def _rank(r: tp.Dict[str, tp.Any], s: tp.Dict[str, tp.Any]) -> tp.Any:
    who = r.get("slowest_rank")
    return who if who is not None else s.get("max_rank", "?")


def _timeline(data: RunData) -> str:
    atts = data.attempts
    if not atts:
        return _section("timeline", _empty("The ledger holds no attempt yet (train/ledger.jsonl is missing or empty)."))
    commits = [c for c in data.checkpoints if c["status"] == "committed" and c["time"] is not None]
    rows = []
    for a in atts[-TIMELINE_ROWS:]:
        start = a.start or {}
        p0, end = a.process_start, a.last_time
        mine = [
            (c["time"], f"checkpoint step {c['step']} committed")
            for c in commits
            if p0 is not None and end is not None and p0 <= c["time"] <= end + 1
        ]
        frm, to = start.get("resumed_from_step"), a.last_step
        text = f"steps {frm if frm is not None else '?'}→{to if to is not None else '?'}"
        if start.get("startup_s") is not None:
            text += f" · start-up {fmt_seconds(start['startup_s'])}"
        if a.lost_after_s:
            text += f" · lost {fmt_seconds(a.lost_after_s)}"
        text += f" · {a.why_ended}"
        title = f"attempt {a.index} ({a.label}): {a.outcome}; {a.why_ended}"
        rows.append(
            Row(f"#{a.index} {a.label}", p0, a.first_step_time, end, a.outcome, text, a.lost_after_s, title, mine)
        )
    body = (
        '<p class="caption">One row per attempt (start of the job or of a requeue), from the ledger. Hatched grey: '
        "start-up (process start to the first step: imports, rendezvous, restore); coloured: training, by how it ended "
        f"({_colored('completed')}, {_colored('stopped')}, {_colored('failed')}, {_colored('died')}: no end record); "
        "red stripes: progress the next attempt had to redo (after the last committed checkpoint); ◆ checkpoint "
        "commits. Gaps (hatched) are time with nothing running; their width is compressed."
        + (
            f" The newest {TIMELINE_ROWS} of {len(atts)} attempts are drawn; the table lists all."
            if len(atts) > TIMELINE_ROWS
            else ""
        )
        + "</p>"
    )
    body += timeline(rows)
    # totals
    known = [a for a in atts if a.process_start is not None and a.last_time is not None]
    if known:
        wall = max(a.last_time for a in known) - min(a.process_start for a in known)  # type: ignore[type-var,operator]
        training = sum(max(a.last_time - a.first_step_time, 0.0) for a in known if a.first_step_time is not None)  # type: ignore[operator]
        startup = sum((a.start or {}).get("startup_s") or 0.0 for a in known)
        lost = sum(a.lost_after_s or 0.0 for a in atts)
        idle = max(wall - training - startup, 0.0)
        useful = max(training - lost, 0.0)
        body += (
            '<div class="cards">'
            + "".join(
                [
                    _card("wall time", esc(fmt_seconds(wall)), "first process start to the last record"),
                    _card("training", esc(fmt_seconds(training)), "first step to last record, all attempts"),
                    _card("start-up", esc(fmt_seconds(startup)), f"over {len(known)} attempt(s)"),
                    _card("down / queued", esc(fmt_seconds(idle)), "between attempts, nothing running"),
                    _card("progress redone", esc(fmt_seconds(lost)), "after restarts (ledger lost_s)"),
                    _card("useful share", _pct(useful / wall if wall > 0 else None), "training not redone ÷ wall time"),
                ]
            )
            + "</div>"
        )
    # the attempts table
    table_rows = []
    for a in atts:
        s = a.start or {}
        hosts = s.get("hosts") or []
        shown_hosts = ", ".join(hosts[:3]) + (f" (+{len(hosts) - 3})" if len(hosts) > 3 else "")
        down = s.get("down_s")
        changed = s.get("identity_changed")
        table_rows.append(
            [
                f"{a.index}",
                esc(a.label, 60),
                esc(_when(a.process_start)),
                esc(shown_hosts or "?", 200),
                esc(s.get("world_size")),
                esc(s.get("resumed_from_step")),
                esc(a.last_step),
                esc((a.end or {}).get("committed_step", (a.exit or {}).get("committed_step"))),
                esc(fmt_seconds(s.get("startup_s"))) if s.get("startup_s") is not None else "",
                esc(fmt_seconds(down)) if down is not None else "",
                esc(fmt_seconds(a.lost_after_s)) if a.lost_after_s is not None else "",
                _pill(a.outcome),
                esc(a.why_ended, 400)
                + (
                    f'<br><span class="bad">changed: {esc(", ".join(str(c) for c in changed), 120)}</span>'
                    if isinstance(changed, list) and changed
                    else ""
                )
                + (f'<br><span class="bad">warning: {esc(s.get("warning"), 300)}</span>' if s.get("warning") else ""),
            ]
        )
    body += "<h3>Attempts</h3>" + _table(
        [
            "#",
            "attempt",
            "started",
            "hosts",
            "ranks",
            "from step",
            "to step",
            "committed",
            "start-up",
            "down before",
            "lost after",
            "ended",
            "why",
        ],
        table_rows,
        numeric=(0, 4, 5, 6, 7, 8, 9, 10),
    )
    ledger = data.status.get("ledger") or []
    lrows = []
    for r in ledger[-200:]:
        detail = []
        for key in ("status", "cause", "requeued", "reason", "error", "resumed_from_step", "committed_step", "warning"):
            if r.get(key) is not None:
                detail.append(f"{key}={r[key]}")
        lrows.append(
            [
                esc(r.get("event")),
                esc(_when(r.get("time"))),
                esc(r.get("job_id") or ""),
                esc(r.get("restart_count") if r.get("restart_count") is not None else ""),
                esc(r.get("step") if r.get("step") is not None else ""),
                esc("; ".join(detail), 500),
            ]
        )
    body += (
        f"<details><summary>The ledger's {len(ledger)} record(s)"
        + (" (the newest 200)" if len(ledger) > 200 else "")
        + "</summary>"
        + _table(["event", "time", "job", "restart", "step", "detail"], lrows)
        + "</details>"
    )
    return _section("timeline", body)


def _checkpoints(data: RunData) -> str:
    rows = data.checkpoints
    if not rows:
        return _section(
            "checkpoints", _empty("No checkpoint directory with entries (none saved yet, or checkpointing off).")
        )
    latest = (
        ((data.status.get("approvals") or {}).get("latest") or {})
        if isinstance(data.status.get("approvals"), dict)
        else {}
    )
    dirs = sorted({r["dir"] for r in rows})
    out = []
    for r in reversed(rows):
        appr = latest.get(str(r["step"])) if isinstance(latest, dict) else None
        appr_text = ""
        if isinstance(appr, dict):
            appr_text = f"{esc(appr.get('decision'))} by {esc(appr.get('by'), 80)}"
        status = r["status"]
        cls = "ok" if status == "committed" else "bad"
        cells = [
            esc(r["step"]),
            f'<span class="{cls}">{esc(status)}</span>',
            esc(_when(r["time"])) if r["time"] is not None else "",
            esc(r["world_size"]) if r["world_size"] is not None else "",
            esc(_bytes(r["bytes"])),
            appr_text,
            esc(r["name"], 80) + (f"<br>{esc(r['error'], 200)}" if r["error"] else ""),
        ]
        if len(dirs) > 1:
            cells.append(esc(r["dir"], 200))
        out.append(cells)
    head = ["step", "status", "committed", "ranks", "size", "approval", "entry"] + (
        ["directory"] if len(dirs) > 1 else []
    )
    caption = (
        f"Every entry of the checkpoint director{'ies' if len(dirs) > 1 else 'y'} "
        f"{', '.join(esc(d, 200) for d in dirs)}, newest first, as the checkpoint package sees them "
        "(committed = a valid manifest). ◆ on the loss chart and the timeline mark the commits."
    )
    return _section("checkpoints", f'<p class="caption">{caption}</p>' + _table(head, out, numeric=(0, 3, 4)))


def _bytes(n: tp.Optional[int]) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "?"  # pragma: no cover


def _identity(data: RunData) -> str:
    ident = data.status.get("identity")
    appr = data.status.get("approvals")
    body = ""
    if isinstance(ident, dict) and ident.get("attempts"):
        rows = []
        for a in ident["attempts"]:
            changed = a.get("changed") or []
            rows.append(
                [
                    esc(a.get("attempt"), 80),
                    f'<span class="mono">{esc(a.get("identity"), 64)}</span>',
                    f'<span class="bad">{esc(", ".join(changed))}</span>'
                    if changed
                    else '<span class="ok">unchanged</span>',
                    "yes" if a.get("data_change_accepted") else "",
                ]
            )
        body += (
            f'<p class="caption">What each attempt ran with (hpctrain.identity): the run identity hashes code, '
            f"config, data and environment; a restart that ran with something else is marked. Current: "
            f'<span class="mono">{esc(ident.get("current"), 64)}</span>.</p>'
            + _table(["attempt", "identity", "changed since the previous attempt", "data change accepted"], rows)
        )
    else:
        body += _empty(
            "No identity records (identity/ is missing: a run from before identity capture, or none started)."
        )
    body += "<h3>Approvals</h3>"
    if isinstance(appr, dict) and (appr.get("count") or appr.get("problems")):
        chain = (
            '<span class="ok">the chain verifies</span>'
            if appr.get("ok")
            else '<span class="bad">the chain does NOT verify</span>'
        )
        rows = []
        for e in appr.get("entries") or []:
            if not isinstance(e, dict):
                continue
            rows.append(
                [
                    esc(e.get("seq")),
                    esc(e["time"] if isinstance(e.get("time"), str) else _when(e.get("time")), 40),
                    _span("ok" if e.get("decision") == "approved" else "bad", esc(e.get("decision"), 40)),
                    esc(e.get("step")),
                    esc(e.get("by"), 120),
                    esc(e.get("reason"), 400),
                    f'<span class="mono">{esc(str(e.get("entry_hash"))[:16])}</span>',
                ]
            )
        omitted = appr.get("omitted")
        body += (
            f'<p class="caption">{esc(appr.get("count"))} entr(y/ies) in approvals.jsonl; {chain}'
            + (f"; {esc(omitted)} older entries not shown" if omitted else "")
            + ".</p>"
            + _table(["seq", "time", "decision", "step", "by", "reason", "entry"], rows, numeric=(0, 3))
        )
        if appr.get("problems"):
            body += '<ul class="notes">' + "".join(f"<li>{esc(p, 400)}</li>" for p in appr["problems"][:50]) + "</ul>"
    else:
        body += _empty("No approvals recorded (python -m hpctrain approve RUN_DIR --step N ...).")
    return _section("identity", body)


def _capacity(data: RunData) -> str:
    cap = data.capacity
    if cap is None:
        return _section(
            "capacity",
            _empty("No capacity estimate: this hpctrain has no capacity package (python -m hpctrain capacity)."),
        )
    body = (
        '<p class="caption">What this run\'s own measurements predict at other node counts (hpctrain.capacity, '
        'the same as <span class="mono">python -m hpctrain capacity RUN_DIR</span>, with its default targets).'
    )
    if cap.get("summary"):
        body += f" {esc(cap['summary'], 2000)}"
    body += "</p>"
    if "image" in cap:
        uri = f"data:{cap['mime']};base64,{base64.b64encode(cap['image']).decode('ascii')}"
        body += f'<div class="capacity"><img alt="capacity plot" src="{uri}"></div>'
    if cap.get("note"):
        body += _empty(str(cap["note"]))
    return _section("capacity", body)


def _notes(data: RunData) -> str:
    if not data.notes:
        return _section("notes", '<p class="caption">No problems found in the records read.</p>')
    items = "".join(f"<li>{esc(n, 600)}</li>" for n in data.notes)
    return _section(
        "notes",
        '<p class="caption">Records that could not be read or held a bad value; the value is shown as unknown '
        f'and the rest is drawn.</p><ul class="notes">{items}</ul>',
    )


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
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # no script, no fetch, no frame: only the inline styles and data: images of this page
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        f"<title>hpctrain report: {esc(name, 120)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>Run report: {esc(name, 120)}</h1>"
        f'<div class="sub">{esc(str(data.run_dir), 500)} · generated {esc(_when(data.generated))} ({esc(_tz())}) by '
        f"hpctrain {esc(hpctrain.__version__)} · times are local to the machine that wrote this report</div></header>"
        f"<nav>{nav}</nav><main>{''.join(sections)}</main>"
        "<footer>python -m hpctrain report · one self-contained file: no script, nothing fetched</footer>"
        "</body></html>\n"
    )
