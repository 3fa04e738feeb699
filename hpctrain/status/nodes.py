"""Node failures, excluded hosts, in-job restarts and in-job recoveries of a run, for ``status`` (stdlib only).

From the ledger (sanitised by :mod:`hpctrain.status.report`): ``exit`` records with ``failed_nodes`` or an
exclusion (:mod:`hpctrain.launch.exclusion`), ``in_job_restart`` records (:mod:`hpctrain.launch.spares`) and
``in_job_recovery`` records (:mod:`hpctrain.runtime.recovery`: a rank replaced by a warm spare, the run gone on at
a smaller world, or the fallback) and ``node_lost`` records (:mod:`hpctrain.launch.spares`: a failed node's own
training step ended while the other nodes' ranks recovered in the job).
"""

from __future__ import annotations

import typing as tp

__all__ = ["collect_nodes", "describe_nodes", "render_nodes"]

SHOWN = 5
"""The newest node failures and in-job restarts shown (``--json`` has all)."""


def _strs(value: tp.Any) -> tp.List[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _num(value: tp.Any) -> tp.Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def collect_nodes(ledger: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """``{"node_failures": [...], "in_job_restarts": [...], "excluded_nodes": [...]}``, oldest first.
    An in-job restart's ``failure_to_start_s``: from the failure to the next attempt's ledger start record
    (written when its first step is near)."""
    failures, excluded = [], []
    for r in ledger:
        if r.get("event") != "exit":
            continue
        # every exclusion counts (a hang's host too), but only a failed node is a node failure: a hang's own
        # line comes from hpctrain.status.faults
        excluded += [h for h in _strs(r.get("excluded_nodes")) if h not in excluded]
        if not _strs(r.get("failed_nodes")):
            continue
        failures.append(
            {
                "job_id": r.get("job_id"),
                "restart_count": r.get("restart_count"),
                "time": r.get("time"),
                "cause": r.get("cause"),
                "failed_nodes": _strs(r.get("failed_nodes")),
                "excluded_nodes": _strs(r.get("excluded_nodes")),
                "not_excluded": _strs(r.get("not_excluded")),
                "requeued": bool(r.get("requeued")),
                "in_job_restart": bool(r.get("in_job_restart")),
            }
        )
    starts = [r for r in ledger if r.get("event") == "start"]
    restarts = []
    for r in ledger:
        if r.get("event") != "in_job_restart":
            continue
        nxt = next(
            (
                s
                for s in starts
                if s.get("job_id") == r.get("job_id") and s.get("restart_count") == r.get("next_restart_count")
            ),
            None,
        )
        failed_at, started = _num(r.get("failed_at")), _num((nxt or {}).get("time"))
        restarts.append(
            {
                "job_id": r.get("job_id"),
                "restart_count": r.get("restart_count"),
                "next_restart_count": r.get("next_restart_count"),
                "failed_nodes": _strs(r.get("failed_nodes")),
                "spares_used": r.get("spares_used"),
                "spares": r.get("spares"),
                "failure_to_start_s": started - failed_at if failed_at is not None and started is not None else None,
            }
        )
    recoveries = [_recovery(r) for r in ledger if r.get("event") == "in_job_recovery"]
    lost = []
    for r in ledger:
        if r.get("event") == "node_lost" and isinstance(r.get("node"), str):  # its ranks as the loop recorded them
            lost.append({"job_id": r.get("job_id"), "restart_count": r.get("restart_count"), "node": r["node"],
                         "time": r.get("time"), "ranks": _ints(r.get("ranks"))})  # fmt: skip
    return {
        "nodes_lost": lost,
        "node_failures": failures,
        "in_job_restarts": restarts,
        "in_job_recoveries": recoveries,
        "excluded_nodes": excluded,
    }


def _ints(value: tp.Any) -> tp.List[int]:
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def _elastic(value: tp.Any) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """A record's ``elastic`` (the smaller world, RecoveryConfig.shrink) as status shows it; None: not one (or
    damaged: the line then says no more than the failed ranks)."""
    if not isinstance(value, dict):
        return None
    sizes = [value.get("world_size_was"), value.get("world_size")]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        return None
    return {"world_size_was": sizes[0], "world_size": sizes[1], "dropped": _ints(value.get("dropped"))}


def _recovery(r: tp.Mapping[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    """One ``in_job_recovery`` record as status shows it: who was replaced by which spare, the smaller world the
    run went on at, or why it fell back."""
    replaced = r.get("replaced") if isinstance(r.get("replaced"), list) else []
    pairs = [
        {"rank": x.get("rank"), "spare": x.get("spare")}
        for x in replaced
        if isinstance(x, dict) and isinstance(x.get("rank"), int) and isinstance(x.get("spare"), int)
    ]
    return {
        "job_id": r.get("job_id"),
        "restart_count": r.get("restart_count"),
        "generation": r.get("generation"),
        "failed_ranks": _ints(r.get("failed_ranks")),
        "replaced": pairs,
        "elastic": _elastic(r.get("elastic")),
        "agreed_step": r.get("agreed_step"),
        # the step it continued after: from memory the agreed one (records before sharded recovery: no field)
        "resumed_step": r.get("resumed_step") if r.get("resumed_step") is not None else r.get("agreed_step"),
        "state_from": r.get("state_from") or "memory",
        "steps_redone": r.get("steps_redone"),
        "failure_to_first_step_s": r.get("failure_to_first_step_s"),
        "fallback": r.get("fallback"),
    }


def describe_nodes(report: tp.Mapping[str, tp.Any], text: tp.Callable[..., str]) -> tp.List[tp.Tuple[str, str]]:
    """``(label, line)`` for each node failure, in-job restart, in-job recovery and the excluded hosts, oldest
    first, the newest :data:`SHOWN` of each kind: the one wording of ``status`` and ``report``. ``text(value,
    keep)`` makes a recorded value safe for the reader's medium (rich markup escaped, or plain)."""
    lines: tp.List[tp.Tuple[str, str]] = []
    for f in (report.get("node_failures") or [])[-SHOWN:]:
        then = (
            "restarted inside the allocation"
            if f["in_job_restart"]
            else "requeued"
            if f["requeued"]
            else "not requeued"
        )
        kept = f" (kept {text(','.join(f['not_excluded']), 200)}: bound)" if f["not_excluded"] else ""
        lines.append(
            (
                "node fail",
                f"attempt {text(f['restart_count'])}: {text(f['cause'])} on "
                f"{text(','.join(f['failed_nodes']) or '?', 200)} · {then}{kept}",
            )
        )
    for r in (report.get("in_job_restarts") or [])[-SHOWN:]:
        took = r["failure_to_start_s"]
        lines.append(
            (
                "spare",
                f"attempt {text(r['restart_count'])} -> {text(r['next_restart_count'])} without "
                f"{text(','.join(r['failed_nodes']), 200)} (spare {text(r['spares_used'])} of {text(r['spares'])})"
                + (f" · next attempt started {took:.1f}s after the failure" if took is not None else ""),
            )
        )
    for n in (report.get("nodes_lost") or [])[-SHOWN:]:
        ranks = ",".join(str(x) for x in n["ranks"]) or "?"
        lines.append(
            (
                "node lost",
                f"attempt {text(n['restart_count'])}: {text(n['node'], 200)} failed, its step (rank(s) {ranks}) "
                "ended · the other nodes' ranks went on (in-job recovery)",
            )
        )
    for r in (report.get("in_job_recoveries") or [])[-SHOWN:]:
        ranks = ",".join(str(x) for x in r["failed_ranks"]) or "?"
        if r["fallback"]:
            lines.append(
                (
                    "recovery",
                    f"attempt {text(r['restart_count'])}: rank(s) {ranks} lost, in-job recovery fell back: "
                    f"{text(r['fallback'], 200)} · the restart from the last commit takes over",
                )
            )
            continue
        by = ", ".join(f"rank {p['rank']} by spare {p['spare']}" for p in r["replaced"])
        if r.get("elastic"):
            e = r["elastic"]
            dropped = ",".join(str(x) for x in e["dropped"]) or ranks
            by = (f"rank(s) {dropped} dropped (no spare left), the run went on at a smaller world of "
                  f"{e['world_size']} (was {e['world_size_was']}; the next attempt is full size)")  # fmt: skip
        took, source = r["failure_to_first_step_s"], r["state_from"]
        reloaded = f" · sharded state reloaded from the {text(source)} tier" if source != "memory" else ""
        redone = r["steps_redone"]
        lines.append(
            (
                "recovered",
                f"attempt {text(r['restart_count'])}, generation {text(r['generation'])}: {by or ranks} in the job"
                f"{reloaded} · continued after step {text(r['resumed_step'])}, {text(redone)} "
                f"step{'' if redone == 1 else 's'} redone"
                + (f" · first step {took:.1f}s after the failure" if isinstance(took, (int, float)) else ""),
            )
        )
    if report.get("excluded_nodes"):
        lines.append(("excluded", f"{text(','.join(report['excluded_nodes']), 400)} (scontrol ExcNodeList of the job)"))
    return lines


def render_nodes(report: tp.Mapping[str, tp.Any], out: tp.Callable[[str], None], text: tp.Callable[..., str]) -> None:
    """Lines for the ``status`` view: ``out(markup)``; ``text(value, keep)`` escapes a recorded value."""
    for label, line in describe_nodes(report, text):
        out(f"[bold]{label:<10}[/] {line}")
