"""The rich view of a status report (:func:`hpctrain.status.cli.collect`)."""

from __future__ import annotations

import time
import typing as tp

from hpctrain.train.display import fmt_duration, fmt_rate

__all__ = ["render"]

_PARTS = (
    ("data_wait_s", "data wait"),
    ("forward_backward_s", "fwd+bwd"),
    ("grad_comm_exposed_s", "exposed comm"),
    ("optimizer_s", "optimizer"),
    ("checkpoint_s", "checkpoint"),
)


def _ms(seconds: tp.Optional[float]) -> str:
    return "?" if seconds is None else f"{1e3 * seconds:.1f} ms"


def _ago(t: tp.Any) -> str:
    return f"{fmt_duration(time.time() - t)} ago" if isinstance(t, (int, float)) else "?"


def _job_line(job: tp.Mapping[str, tp.Any]) -> str:
    where = f"job {job.get('id') or '?'} ({job.get('cluster')}): [bold]{job.get('state')}[/]"
    if job.get("nodes"):
        where += f" on {job['nodes']}"
    if job.get("elapsed"):
        where += f", {job['elapsed']}"
    if job.get("reason"):
        where += f" ({job['reason']})"
    return where + f"  [dim]· from {job.get('source') or '?'}[/]"


def render(report: tp.Mapping[str, tp.Any], console: tp.Any = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(highlight=False)
    out = console.print
    out(f"[bold]run[/]        {escape(report['run_dir'])}")
    out(f"[bold]job[/]        {_job_line(report['job'])}")
    out(
        f"[bold]starts[/]     {report['starts']} ({report['restarts']} restart{'s' if report['restarts'] != 1 else ''})"
    )
    prog, last = report["progress"], report.get("last_interval")
    if prog["step"] is not None:
        line = f"step {prog['step']}/{prog['total_steps'] or '?'}"
        if prog.get("fraction") is not None:
            line += f" ({100 * prog['fraction']:.0f}%)"
        if prog.get("ended"):
            line += f" · ended: {prog['ended']}"
        elif prog.get("eta_s") is not None:
            line += f" · ETA {fmt_duration(prog['eta_s'])}"
        if last:
            line += f" · loss {last['loss']:.4f} (interval to step {last['step']}, {_ago(last.get('time'))})"
        out(f"[bold]progress[/]   {line}")
    else:
        out("[bold]progress[/]   no step recorded yet")
    ev = report.get("last_eval")
    if ev:
        out(f"[bold]eval[/]       loss {ev['loss']:.4f} at step {ev['step']} ({ev.get('batches')} batches)")
    if last:
        per_rank = last.get("samples_per_s_per_rank") or {}
        line = f"{fmt_rate(last.get('samples_per_s'))} samples/s on {last.get('world_size')} ranks"
        if per_rank:
            line += (
                f" (per rank min/median/max {fmt_rate(per_rank['min'])}/{fmt_rate(per_rank['median'])}"
                f"/{fmt_rate(per_rank['max'])})"
            )
        if last.get("data_wait_frac") is not None:
            line += f" · data wait {100 * last['data_wait_frac']:.1f}%"
        if last.get("flops_per_s"):
            line += f" · {fmt_rate(last['flops_per_s'])}FLOP/s"
        line += f" · MFU {100 * last['mfu']:.1f}%" if last.get("mfu") is not None else " · MFU n/a"
        out(f"[bold]throughput[/] {line}")
        per_step = last.get("per_step")
        if per_step:
            table = Table(title="step time, last interval (per step, over ranks)", title_justify="left")
            for col in ("part", "min", "median", "max", "max on rank"):
                table.add_column(col, justify="left" if col == "part" else "right")
            for key, label in (("step_s", "whole step"), *_PARTS):
                s = per_step.get(key)
                if s:
                    table.add_row(label, _ms(s["min"]), _ms(s["median"]), _ms(s["max"]), str(s["max_rank"]))
            console.print(table)
            out(f"[bold]slowest[/]    rank {last.get('slowest_rank')}")
        else:
            out("[bold]breakdown[/]  not measured (metrics disabled)")
    ck = report.get("checkpoint")
    if ck is None:
        out("[bold]checkpoint[/] none configured")
    elif ck.get("step") is None:
        out(f"[bold]checkpoint[/] none committed yet in {escape(ck['dir'])}")
    else:
        out(
            f"[bold]checkpoint[/] step {ck['step']} committed {_ago(ck.get('time'))} by {ck.get('world_size')} ranks"
            f" · {escape(ck['dir'])}"
        )
    ex = report.get("last_exit")
    if ex:
        at = f" at step {ex['agreed_step']}" if ex.get("agreed_step") is not None else ""
        colour = "green" if ex.get("requeued") or ex.get("cause") == "finished" else "yellow"
        out(
            f"[bold]last exit[/]  attempt {ex.get('restart_count')}: {escape(str(ex.get('cause')))}{at} · "
            f"[{colour}]{escape(str(ex.get('reason')))}[/]"
        )
    if report["ledger"]:
        table = Table(title="ledger", title_justify="left")
        for col in ("event", "when", "job", "restart", "hosts", "from step", "lost", "down", "startup", "status"):
            table.add_column(col)
        for r in report["ledger"]:
            hosts = r.get("hosts") or []
            table.add_row(
                str(r.get("event")),
                time.strftime("%m-%d %H:%M:%S", time.localtime(r["time"])) if isinstance(r.get("time"), float) else "?",
                str(r.get("job_id") or ""),
                str(r.get("restart_count", "")),
                escape(",".join(hosts[:3]) + (f" +{len(hosts) - 3}" if len(hosts) > 3 else "")),
                str(r.get("resumed_from_step", r.get("step", ""))),
                fmt_duration(r["lost_s"]) if r.get("lost_s") is not None else "",
                fmt_duration(r["down_s"]) if r.get("down_s") is not None else "",
                f"{r['startup_s']:.1f}s" if r.get("startup_s") is not None else "",
                str(r.get("status", r.get("cause", ""))),
            )
        console.print(table)
    for p in report["problems"]:
        out(f"[yellow]warning[/]    {escape(p)}")
