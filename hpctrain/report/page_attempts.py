"""The report's history sections: the attempts (timeline, totals, table, ledger) and the checkpoints."""

from __future__ import annotations

import typing as tp

from hpctrain._human import esc, fmt_bytes, fmt_duration, plain
from hpctrain.charts.timeline import Row, timeline
from hpctrain.report.gather import RunData
from hpctrain.report.page_html import _card, _colored, _empty, _pct, _pill, _section, _table, _when
from hpctrain.runtime.startup import line as startup_line
from hpctrain.runtime.startup import recorded
from hpctrain.status.nodes import describe_nodes

TIMELINE_ROWS = 60
"""Attempts drawn on the timeline (the newest); the attempts table lists them all."""


def _startup_cell(a: tp.Any) -> str:
    """The attempts table's start-up: ``startup_s``, and under it where it went (:mod:`hpctrain.runtime.startup`)."""
    s = a.start or {}
    text = esc(fmt_duration(s.get("startup_s"))) if s.get("startup_s") is not None else ""
    profile = recorded(a.start, a.attempt.startup)
    if profile is not None:
        text += f'<br><span class="sub">{esc(startup_line(profile), 1000)}</span>'
    return text


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
            text += f" · start-up {fmt_duration(start['startup_s'])}"
        if a.lost_after_s:
            text += f" · lost {fmt_duration(a.lost_after_s)}"
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
                    _card("wall time", esc(fmt_duration(wall)), "first process start to the last record"),
                    _card("training", esc(fmt_duration(training)), "first step to last record, all attempts"),
                    _card("start-up", esc(fmt_duration(startup)), f"over {len(known)} attempt(s)"),
                    _card("down / queued", esc(fmt_duration(idle)), "between attempts, nothing running"),
                    _card("progress redone", esc(fmt_duration(lost)), "after restarts (ledger lost_s)"),
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
                _startup_cell(a),
                esc(fmt_duration(down)) if down is not None else "",
                esc(fmt_duration(a.lost_after_s)) if a.lost_after_s is not None else "",
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
    body += _failures(data)
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


def _failures(data: RunData) -> str:
    """Node failures, restarts on spare nodes, in-job recoveries (a rank replaced by a warm spare, the smaller world,
    a fallback) and excluded hosts, worded as ``status`` words them (:func:`hpctrain.status.nodes.describe_nodes`)."""
    lines = describe_nodes(data.status, plain)
    if not lines:
        return ""
    rows = [[esc(label), esc(line, 2000)] for label, line in lines]
    return "<h3>Failures and recoveries</h3>" + _table(["what", "detail"], rows)


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
            esc(fmt_bytes(r["bytes"])),
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
