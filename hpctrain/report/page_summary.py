"""The report's sections in cards and words: the summary at the top, identity and approvals, the capacity
estimate (its plot a ``data:`` URI), and the notes about unreadable records at the bottom."""

from __future__ import annotations

import base64

from hpctrain._human import esc, fmt_duration, fmt_num
from hpctrain.report.gather import RunData
from hpctrain.report.page_html import _card, _empty, _num, _pct, _section, _span, _table, _when


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
        prog_detail += f" · ETA {esc(fmt_duration(prog['eta_s']))}"
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
            f"{restarts} · start-up {esc(fmt_duration(startup))} · lost {esc(fmt_duration(lost))}",
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
