"""The hangs and stragglers of a run, for ``status`` (stdlib only, never torch).

From the ledger: each ``exit`` record with a ``hang`` field (written by :func:`hpctrain.runtime.watchdog.attribute_hang`
through :func:`hpctrain.launch.ending.finish_attempt`) and each ``straggler`` record (rank 0's
:class:`hpctrain.runtime.stragglers.StragglerDetector`). The records were sanitised by :mod:`hpctrain.status.report`;
what is read here is checked for type once more, since the fields inside ``hang`` are not in the schema.
"""

from __future__ import annotations

import typing as tp

__all__ = ["collect_faults", "render_faults"]

SHOWN = 5
"""The newest hangs and stragglers shown (``--json`` has all)."""


def _int(value: tp.Any) -> tp.Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _hang(exit_record: tp.Mapping[str, tp.Any]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    hang = exit_record.get("hang")
    if not isinstance(hang, dict):
        return None
    hung = [r for r in hang.get("hung_ranks") or [] if _int(r) is not None]
    rows = {r.get("rank"): r for r in hang.get("ranks") or [] if isinstance(r, dict)}
    ranks = []
    for n in hung:
        r = rows.get(n) or {}
        ranks.append(
            {
                "rank": n,
                "host": r.get("host") if isinstance(r.get("host"), str) else None,
                "step": _int(r.get("step")),
                "phase": r.get("phase") if isinstance(r.get("phase"), str) else None,
                "part": r.get("part") if isinstance(r.get("part"), str) else None,
                "stacks": [p for p in r.get("stacks") or [] if isinstance(p, str)],
            }
        )
    return {
        "job_id": exit_record.get("job_id"),
        "restart_count": _int(exit_record.get("restart_count")),
        "time": exit_record.get("time"),
        "attributed": bool(hang.get("attributed")),
        "ranks": ranks,
        "world_size": len(rows),
        "stacks_dir": hang.get("stacks_dir") if isinstance(hang.get("stacks_dir"), str) else None,
        "requeued": bool(exit_record.get("requeued")),
    }


def collect_faults(ledger: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.List[tp.Dict[str, tp.Any]]]:
    """``{"hangs": [...], "stragglers": [...]}``, oldest first."""
    hangs = [h for h in (_hang(r) for r in ledger if r.get("event") == "exit") if h is not None]
    stragglers = [
        {k: r.get(k) for k in ("job_id", "restart_count", "time", "step", "rank", "host", "phase", "ratio", "busy_s")}
        for r in ledger
        if r.get("event") == "straggler" and _int(r.get("rank")) is not None
    ]
    return {"hangs": hangs, "stragglers": stragglers}


def _where(r: tp.Mapping[str, tp.Any]) -> str:
    step = r.get("step")
    at = f"step {step + 1}" if isinstance(step, int) and step >= 0 else "start-up"
    part = f"/{r['part']}" if r.get("part") and r.get("part") != r.get("phase") else ""
    return f"{r.get('phase')}{part}, {at}"


def render_faults(faults: tp.Mapping[str, tp.Any], out: tp.Callable[[str], None], text: tp.Callable[..., str]) -> None:
    """Lines for the ``status`` view: ``out(markup)``; ``text(value, keep)`` escapes a recorded value."""
    for h in (faults.get("hangs") or [])[-SHOWN:]:
        if h["attributed"] and h["ranks"]:
            who = ", ".join(f"rank {r['rank']} on {text(r['host'], 80)} ({text(_where(r), 80)})" for r in h["ranks"])
        else:
            who = f"all {h['world_size']} ranks stopped at the same point (no rank behind)"
        stacks = next((s[0] for r in h["ranks"] for s in [r["stacks"]] if s), None) or h["stacks_dir"]
        out(
            f"[bold]hang[/]       attempt {h['restart_count']}: [red]{who}[/]"
            f"{' · requeued' if h['requeued'] else ''} · stacks: {text(stacks, 400)}"
        )
    for s in (faults.get("stragglers") or [])[-SHOWN:]:
        ratio = f"{s['ratio']:.1f}x" if isinstance(s.get("ratio"), (int, float)) else "?"
        out(
            f"[bold]straggler[/]  attempt {text(s.get('restart_count'), 20)} step {text(s.get('step'), 20)}: rank "
            f"{s.get('rank')} on "
            f"{text(s.get('host'), 80)}, {ratio} the others' busy time per step (slow phase: "
            f"{text(s.get('phase'), 40)})"
        )
