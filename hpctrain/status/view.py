"""The rich view of a status report (:func:`hpctrain.status.report.collect`).

The report's values have their schema's types (or None, shown as ``?``), but recorded text is whatever the
run directory held: every string taken from a record is cut, its control characters shown as escapes (no
terminal sequences reach the screen) and its rich markup escaped before it is printed; table cells are
plain :class:`rich.text.Text`, never parsed as markup.
"""

from __future__ import annotations

import re
import time
import typing as tp

from hpctrain._files import shorten
from hpctrain._human import fmt_bytes, fmt_duration, fmt_local_time, fmt_num
from hpctrain.ckpt.config import RESTORE_TIERS
from hpctrain.rundir import attempt_label
from hpctrain.runtime.startup import line as startup_line
from hpctrain.status.faults import render_faults
from hpctrain.status.nodes import render_nodes

__all__ = ["render", "LEDGER_ROWS"]

LEDGER_ROWS = 100
"""Ledger records shown as table rows (the newest); ``--json`` holds them all."""

_PARTS = (
    ("data_wait_s", "data wait"),
    ("forward_backward_s", "fwd+bwd"),
    ("grad_comm_exposed_s", "exposed comm"),
    ("optimizer_s", "optimizer"),
    ("checkpoint_s", "checkpoint"),
)
# C0 and C1 controls, DEL, line/paragraph separators and the bidirectional overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _plain(value: tp.Any, keep: int = 200) -> str:
    """Recorded text for the screen: ``?`` for None, cut to ``keep`` characters, controls as ``\\xNN``."""
    if value is None:
        return "?"
    text = shorten(value if isinstance(value, str) else str(value), keep)
    return _CONTROL.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", text
    )


def _t(value: tp.Any, keep: int = 200) -> str:
    """Recorded text for a markup string: :func:`_plain`, then rich's markup escaped."""
    from rich.markup import escape

    return escape(_plain(value, keep))


def _n(value: tp.Any, spec: str = "") -> str:
    """A number of the report (already validated) formatted with ``spec``; ``?`` when unknown."""
    return "?" if value is None else format(value, spec)


def _ms(seconds: tp.Optional[float]) -> str:
    return "?" if seconds is None else f"{1e3 * seconds:.1f} ms"


def _ago(t: tp.Any) -> str:
    return f"{fmt_duration(time.time() - t)} ago" if isinstance(t, (int, float)) else "?"


def _when(t: tp.Any, fmt: str = "%m-%d %H:%M:%S") -> str:
    return fmt_local_time(t, fmt)


def _clock(times: tp.Iterable[tp.Any]) -> tp.Tuple[str, str]:
    """``(strftime format, title note)`` for a column of record times: ``HH:MM:SS`` and the day in the title
    when they all fell on one day (the common case: a table that fits 80 columns), else ``MM-DD HH:MM``."""
    days = {_when(t, "%m-%d") for t in times}
    if len(days) == 1 and "?" not in days:
        return "%H:%M:%S", f" ({days.pop()})"
    return "%m-%d %H:%M", ""


def _table(
    title: str,
    columns: tp.Sequence[str],
    rows: tp.Sequence[tp.Sequence[str]],
    width: int,
    right: tp.Container[str] = (),
    shrink: tp.Sequence[str] = (),
    compact: bool = False,
) -> tp.Any:
    """A rich table that reads in a ``width``-column terminal (80 and up): columns with no value in any row
    are left out, no cell wraps, a header is never cut. When the cells are wider than the terminal, the
    columns named in ``shrink`` give way, in that order, down to their header's width (a cut cell ends in
    ``…``); times are never cut. ``compact`` (a table of many columns, the ledger): one space between columns
    and a rule under the headers instead of a box."""
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    keep = [i for i in range(len(columns)) if any(row[i] for row in rows)]
    heads = [columns[i] for i in keep]
    widths = [max([cell_len(h)] + [cell_len(row[i]) for row in rows]) for h, i in zip(heads, keep)]
    overhead = len(keep) - 1 if compact else 3 * len(keep) + 1
    for name in shrink:
        excess = sum(widths) + overhead - width
        if excess <= 0:
            break
        if name in heads:
            k = heads.index(name)
            widths[k] -= min(excess, widths[k] - cell_len(name))
    style = {"box": box.SIMPLE_HEAD, "padding": (0, 0), "show_edge": False} if compact else {}
    table = Table(title=title, title_justify="left", **style)
    for head, w in zip(heads, widths):
        table.add_column(head, justify="right" if head in right else "left", no_wrap=True, overflow="ellipsis", width=w)
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    return table


def _job_line(job: tp.Mapping[str, tp.Any]) -> str:
    where = f"job {_t(job.get('id') or '?')} ({_t(job.get('cluster'))}): [bold]{_t(job.get('state'))}[/]"
    if job.get("nodes"):
        where += f" on {_t(job['nodes'])}"
    if job.get("elapsed"):
        where += f", {_t(job['elapsed'])}"
    if job.get("reason"):
        where += f" ({_t(job['reason'])})"
    return where + f"  [dim]· from {_t(job.get('source') or '?')}[/]"


SLURM_ROWS = 10
"""Attempts shown with Slurm's state (the newest); ``--json`` has all."""


def _slowest_line(slowest: tp.Any, last: tp.Mapping[str, tp.Any]) -> str:
    """The slowest rank and its own slow phase (the straggler rule, :func:`hpctrain.status.report._slowest`)."""
    if not isinstance(slowest, dict):
        return f"rank {_n(last.get('slowest_rank'))}"
    line = f"rank {_n(slowest.get('rank'))}"
    if slowest.get("phase"):
        line += f" · slow phase: {_t(slowest['phase'], 40)}"
        if slowest.get("busy_s") is not None and slowest.get("reference_s") is not None:
            line += (
                f" (its own work {_ms(slowest['busy_s'])} a step, the others' {_ms(slowest['reference_s'])},"
                f" {slowest['ratio']:.1f}x)"
            )
    elif (last.get("per_step") or {}).get("busy_s"):
        from hpctrain.runtime.stragglers import MIN_EXCESS_S

        line += f" · no phase stands out: its own work is within {_ms(MIN_EXCESS_S)} a step of the others'"
    return line


def _render_slurm_view(view: tp.Any, out: tp.Callable[[str], None]) -> None:
    """Slurm's state of each attempt (sacct) beside hpctrain's cause, and a line for each disagreement."""
    if not isinstance(view, dict):
        return
    if not view.get("available"):
        out(f"[bold]slurm[/]      [yellow]Slurm's view is unavailable[/]: {_t(view.get('unavailable'), 300)}")
        return
    rows = view.get("attempts") or []
    for n, r in enumerate(rows[-SLURM_ROWS:]):
        said = _t(r.get("cause"), 40) if r.get("cause") else "running" if not r.get("ended") else "no exit record"
        said += " (requeued)" if r.get("requeued") else ""
        if r.get("slurm_state"):
            slurm = f"{_t(r['slurm_state'], 40)} on {_t(r.get('slurm_nodes'), 200)}"
            run = r.get("slurm_run")
            slurm += f", run {'?' if run is None else run + 1} of {_n(r.get('slurm_runs'))} in sacct"
            slurm += " (a later attempt ran in the same Slurm run)" if r.get("shared") else ""
        else:
            slurm = "no record of this attempt"
        head = "[bold]slurm[/]      " if n == 0 else "           "
        out(f"{head}attempt {_t(r.get('attempt'), 80)}: hpctrain {said} · Slurm {slurm}")
    if len(rows) > SLURM_ROWS:
        out(f"[dim]slurm: the {len(rows) - SLURM_ROWS} earlier attempts are not shown (--json has all)[/]")
    for line in view.get("disagreements") or []:
        out(f"[bold]disagree[/]   [red]{_t(line, 300)}[/]")


def render(report: tp.Mapping[str, tp.Any], console: tp.Any = None) -> None:
    from rich.console import Console

    console = console or Console(highlight=False, emoji=False)

    def out(line: str) -> None:
        console.print(line, highlight=False, emoji=False)

    out(f"[bold]run[/]        {_t(report['run_dir'], 400)}")
    out(f"[bold]job[/]        {_job_line(report['job'])}")
    restarts = report["restarts"]
    out(f"[bold]starts[/]     {report['starts']} ({restarts} restart{'s' if restarts != 1 else ''})")
    boot = report.get("startup")
    if boot:  # where the newest recorded start-up went (hpctrain.runtime.startup)
        out(f"[bold]start-up[/]   attempt {_t(boot.get('attempt'), 80)}: {_t(startup_line(boot), 1000)}")
    prog, last = report["progress"], report.get("last_interval")
    if prog.get("step") is None and not last and not prog.get("ended"):
        out("[bold]progress[/]   no step recorded yet")
    else:
        line = f"step {_n(prog.get('step'))}/{prog.get('total_steps') or '?'}"
        if prog.get("fraction") is not None:
            line += f" ({100 * prog['fraction']:.0f}%)"
        if prog.get("ended"):
            line += f" · ended: {_t(prog['ended'])}"
        elif prog.get("eta_s") is not None:
            line += f" · ETA {fmt_duration(prog['eta_s'])}"
        if last:
            line += (
                f" · loss {_n(last.get('loss'), '.4f')} (interval to step {_n(last.get('step'))},"
                f" {_ago(last.get('time'))})"
            )
        out(f"[bold]progress[/]   {line}")
    ev = report.get("last_eval")
    if ev:
        out(
            f"[bold]eval[/]       loss {_n(ev.get('loss'), '.4f')} at step {_n(ev.get('step'))}"
            f" ({_n(ev.get('batches'))} batches{', cut short by a stop' if ev.get('interrupted') else ''})"
        )
    if last:
        per_rank = last.get("samples_per_s_per_rank") or {}
        line = f"{fmt_num(last.get('samples_per_s'))} samples/s on {_n(last.get('world_size'))} ranks"
        if per_rank:
            line += (
                f" (per rank min/median/max {fmt_num(per_rank.get('min'))}/{fmt_num(per_rank.get('median'))}"
                f"/{fmt_num(per_rank.get('max'))})"
            )
        if last.get("data_wait_frac") is not None:
            line += f" · data wait {100 * last['data_wait_frac']:.1f}%"
        if last.get("flops_per_s"):
            line += f" · {fmt_num(last['flops_per_s'])}FLOP/s"
        line += f" · MFU {100 * last['mfu']:.1f}%" if last.get("mfu") is not None else " · MFU n/a"
        out(f"[bold]throughput[/] {line}")
        per_step = last.get("per_step")
        if per_step:
            parts = [
                (label, _ms(s.get("min")), _ms(s.get("median")), _ms(s.get("max")), _n(s.get("max_rank")))
                for key, label in (("step_s", "whole step"), *_PARTS)
                if isinstance(s := per_step.get(key), dict)
            ]
            columns = ("part", "min", "median", "max", "max on rank")
            console.print(
                _table(
                    "step time, last interval (per step, over ranks)", columns, parts, console.width, right=columns[1:]
                )
            )
            how = {"fsdp_waits": "FSDP all-gather/reduce-scatter waits", "ddp_last_bucket": "after DDP's last bucket"}
            measure = how.get(last.get("comm_measure") or "")
            if measure:  # how the table's column was measured; not a statement about the slowest rank
                out(f"[dim]           exposed comm: {measure}[/]")
            out(f"[bold]slowest[/]    {_slowest_line(report.get('slowest'), last)}")
        mem = last.get("memory") or {}
        parts = [
            f"{label} {fmt_bytes(mem[key].get('max'))}"
            for key, label in (
                ("state_bytes", "model+optimizer state"),
                ("peak_allocated_bytes", "peak allocated"),
                ("peak_reserved_bytes", "peak reserved"),
                ("rss_bytes", "host RSS"),
            )
            if isinstance(mem.get(key), dict)
        ]
        if parts:
            out(f"[bold]memory[/]     per rank, max over ranks: {' · '.join(parts)}")
        else:
            out("[bold]breakdown[/]  not measured (metrics disabled)")
    ck = report.get("checkpoint")
    if ck is None:
        out("[bold]checkpoint[/] none configured")
    elif ck.get("step") is None:
        out(f"[bold]checkpoint[/] none committed yet in {_t(ck.get('dir'), 400)}")
    else:
        out(
            f"[bold]checkpoint[/] step {ck['step']} committed {_ago(ck.get('time'))} by {_n(ck.get('world_size'))}"
            f" ranks · {_t(ck.get('dir'), 400)}"
        )
    ident = report.get("identity")
    if ident:
        shown = (
            _t(ident["short"]) if ident.get("short") else _t(ident.get("current"), 12)
        )  # damage: cut, with its length
        line = f"{shown} ({len(ident.get('attempts') or [])} attempt(s) recorded)"
        for row in ident.get("attempts") or []:
            if row.get("changed"):
                accepted = ", data change accepted" if row.get("data_change_accepted") else ""
                line += (
                    f" · [yellow]changed at {_t(row.get('attempt'), 80)}: {_t(', '.join(row['changed']))}{accepted}[/]"
                )
        out(f"[bold]identity[/]   {line}")
    approvals = report.get("approvals")
    if approvals:
        chain = "chain intact" if approvals.get("ok") else "[red]chain broken[/] (see warnings)"
        noun = "entry" if approvals.get("count") == 1 else "entries"
        out(f"[bold]approvals[/]  {_n(approvals.get('count'))} {noun}, {chain}")
        for entry in (approvals.get("entries") or [])[-5:]:
            if isinstance(entry, dict):
                out(
                    f"             step {_n(entry.get('step'))}: {_t(entry.get('decision'), 20)} by"
                    f" {_t(entry.get('by'), 80)} {_ago(entry.get('time'))}: {_t(entry.get('reason'), 200)}"
                )
    ex = report.get("last_exit")
    if ex:
        at = f" at step {ex['agreed_step']}" if ex.get("agreed_step") is not None else ""
        colour = "green" if ex.get("requeued") or ex.get("cause") == "finished" else "yellow"
        out(
            f"[bold]last exit[/]  attempt {_n(ex.get('restart_count'))}: {_t(ex.get('cause'))}{at} · "
            f"[{colour}]{_t(ex.get('reason'), 400)}[/]"
        )
    _render_slurm_view(report.get("slurm_view"), out)
    render_faults(report, out, _t)  # hangs and stragglers (hpctrain.status.faults)
    render_nodes(report, out, _t)  # node failures, in-job restarts, excluded hosts (hpctrain.status.nodes)
    # a startup record (the whole profile, after the first step) is the start-up line above, not a row
    ledger = [r for r in report["ledger"] if r.get("event") != "startup"]
    if ledger:
        shown = ledger[-LEDGER_ROWS:]
        clock, day = _clock(r.get("time") for r in shown)
        rows = []
        for r in shown:
            hosts = r.get("hosts") or []
            from_step = r.get("resumed_from_step")
            from_step = r.get("step") if from_step is None else from_step
            status = r.get("status") if r.get("status") is not None else r.get("cause")
            attempt = "" if r.get("job_id") is None else _plain(r["job_id"], 40)
            if isinstance(r.get("restart_count"), int):  # the attempt as the Slurm lines name it: JOB-rRESTART
                attempt = attempt_label(attempt, r["restart_count"])
            rows.append(
                (
                    _plain(r.get("event"), 40),
                    _when(r.get("time"), clock),
                    attempt,
                    _plain(",".join(hosts[:3]) + (f" +{len(hosts) - 3}" if len(hosts) > 3 else ""), 120),
                    ("" if from_step is None else str(from_step))
                    + (
                        f" ({r['restored_tier']} +{r['local_tier_saved_steps']})"
                        if r.get("restored_tier") in RESTORE_TIERS[1:] and r.get("local_tier_saved_steps") is not None
                        else ""
                    ),
                    fmt_duration(r["lost_s"]) if r.get("lost_s") is not None else "",
                    fmt_duration(r["down_s"]) if r.get("down_s") is not None else "",
                    fmt_duration(r["startup_s"]) if r.get("startup_s") is not None else "",
                    "" if status is None else _plain(status, 60),
                )
            )
        columns = ("event", "when", "attempt", "hosts", "from step", "lost", "down", "startup", "status")
        console.print(
            _table(
                f"ledger{day}",
                columns,
                rows,
                console.width,
                right=("lost", "down", "startup"),
                shrink=("hosts", "from step", "attempt", "event", "status"),
                compact=True,
            )
        )
        if len(ledger) > LEDGER_ROWS:
            out(f"[dim]ledger: the {len(ledger) - LEDGER_ROWS} earlier records are not shown (--json has all)[/]")
    for p in report["problems"]:
        out(f"[yellow]warning[/]    {_t(p, 1000)}")
