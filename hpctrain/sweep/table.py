"""``python -m hpctrain runs --sweep SWEEP_DIR``: one row per task of a sweep (parameters, state, step, final losses,
the best marked), from the sweep's ``sweep.json`` and each task's own run directory; ``--json``: the same rows.

The Slurm state of every task comes from ONE ``squeue`` call for all of them
(:meth:`hpctrain._slurm.SlurmCommands.queue_states`); a task squeue no longer lists has ended, and its run
directory's ledger says how (no ``sacct``: it works with accounting off). A task directory moved or deleted is a
row that says so, never a traceback. Torch-free.
"""

from __future__ import annotations

import math
import typing as tp
from pathlib import Path

from hpctrain.errors import UsageError
from hpctrain.sweep.plan import read_plan

__all__ = ["sweep_table", "task_row", "task_curves", "render", "SCHEMA"]

METRICS_TAIL = 4 << 20  # bytes of each task's metrics.jsonl read (its last intervals and evaluations)
SCHEMA = "hpctrain.runs.sweep/1"
"""The shape of ``runs --sweep SWEEP_DIR --json``: the sweep (dir, array job id, parallelism) and its ``tasks`` rows."""

# how the newest attempt ended (its exit record's cause) -> the task's state once squeue no longer lists it
_ENDED = {
    "finished": "COMPLETED",
    "user_error": "FAILED",
    "node_failure": "FAILED",
    "hang": "FAILED",
    "cancelled": "CANCELLED",
    "time_limit": "STOPPED",
    "preemption": "STOPPED",
}


def _num(value: tp.Any) -> tp.Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def task_row(run_dir: Path, job_id: tp.Optional[str], queued: tp.Optional[tp.Any]) -> tp.Dict[str, tp.Any]:
    """What one task's run directory says: state, step / total, final train and eval loss, attempts, last exit.
    ``queued``: its squeue JobState, None when squeue does not list it."""
    from hpctrain.ledger import Ledger
    from hpctrain.run import attempts
    from hpctrain.rundir import RunDir, read_jsonl

    row: tp.Dict[str, tp.Any] = {
        "job_id": job_id,
        "run_dir": str(run_dir),
        "state": None,
        "state_from": None,
        "reason": None,
        "step": None,
        "total_steps": None,
        "train_loss": None,
        "eval_loss": None,
        "attempts": 0,
        "requeues": 0,
        "last_exit": None,
        "notes": [],
    }
    if not run_dir.is_dir():
        row.update(state="MISSING", state_from="run dir", notes=[f"{run_dir}: moved or deleted"])
        return row
    paths = RunDir(run_dir)
    notes: tp.List[str] = []
    records, problems = Ledger(run_dir).read()
    notes += problems
    metrics, bad = read_jsonl(paths.metrics, tail_bytes=METRICS_TAIL)  # the end of the file: the final values
    notes += bad
    steps_of = [r for r in metrics if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)]
    intervals = [r for r in steps_of if r.get("kind") == "interval"]
    evals = [r for r in steps_of if r.get("kind") == "eval"]
    tries = attempts(records, intervals)
    row["attempts"] = len([a for a in tries if a.started])
    row["requeues"] = sum(1 for a in tries if a.requeued)
    starts = [r for r in records if r.get("event") == "start"]
    if starts and isinstance(starts[-1].get("total_steps"), int):
        row["total_steps"] = starts[-1]["total_steps"]
    steps = [s for s in [*(a.step for a in tries), *(r.get("step") for r in intervals)] if isinstance(s, int)]
    row["step"] = max(steps) if steps else None
    if intervals:
        row["train_loss"] = _num(intervals[-1].get("loss"))
    if evals:
        row["eval_loss"] = _num(evals[-1].get("loss"))
    exits = [r for r in records if r.get("event") == "exit"]
    if exits:
        row["last_exit"] = {k: exits[-1].get(k) for k in ("cause", "requeued", "reason", "restart_count")}
    if queued is not None:
        row.update(state=queued.state, state_from="squeue", reason=queued.reason or None)
    elif not job_id:
        row.update(state="NOT SUBMITTED", state_from="sweep.json")
    elif exits:
        cause = str(exits[-1].get("cause") or "")
        row.update(state=_ENDED.get(cause, cause.upper() or "ENDED"), state_from="ledger")
    elif tries and tries[-1].status == "completed":
        row.update(state="COMPLETED", state_from="ledger")
    else:
        row.update(state="ENDED", state_from="ledger")
        notes.append("not in the queue and no exit record: it ended before training started (see its logs)")
    row["notes"] = notes[:5]
    return row


def task_curves(run_dir: Path) -> tp.Dict[str, tp.List[tp.Tuple[int, float]]]:
    """``{"train": [(step, loss)], "eval": [(step, loss)]}`` of one task, from the end of its metrics (a step redone
    after a requeue counts once: its newest value); {} of each when there is none."""
    from hpctrain.rundir import RunDir, read_jsonl

    out: tp.Dict[str, tp.Dict[int, float]] = {"train": {}, "eval": {}}
    if run_dir.is_dir():
        records, _ = read_jsonl(RunDir(run_dir).metrics, tail_bytes=METRICS_TAIL)
        for r in records:
            step, loss = r.get("step"), _num(r.get("loss"))
            kind = {"interval": "train", "eval": "eval"}.get(str(r.get("kind")))
            if kind and isinstance(step, int) and not isinstance(step, bool) and loss is not None:
                out[kind][step] = loss
    return {k: sorted(v.items()) for k, v in out.items()}


def sweep_table(sweep_dir: tp.Union[str, Path], *, slurm: tp.Any = None) -> tp.Dict[str, tp.Any]:
    """The sweep's record and one row per task (``params`` and ``name`` from the plan, the rest from
    :func:`task_row`); ``best`` marks the task with the lowest final eval loss (train loss where no task has one)."""
    from hpctrain._slurm import SlurmCommandError, SlurmCommands

    root = Path(sweep_dir).expanduser()
    if not root.is_dir():
        raise UsageError(f"--sweep {sweep_dir}: not a directory; name the --run-dir given to submit --sweep")
    plan = read_plan(root)
    tasks = [t for t in plan["tasks"] if isinstance(t, dict)]
    ids = [str(t["job_id"]) for t in tasks if t.get("job_id")]
    queue: tp.Dict[str, tp.Any] = {}
    slurm_note = None
    if ids:
        try:
            queue = (slurm or SlurmCommands()).queue_states(ids)  # one squeue call for every task
        except SlurmCommandError as exc:
            slurm_note = f"squeue did not answer ({exc}); states come from the run directories"
    rows = []
    for t in tasks:
        job_id = str(t["job_id"]) if t.get("job_id") else None
        run_dir = root / str(t.get("run_dir") or t.get("name") or "")
        row = task_row(run_dir, job_id, queue.get(job_id) if job_id else None)
        rows.append({"index": t.get("index"), "name": t.get("name"), "params": t.get("params") or {}, **row})
    metric = "eval_loss" if any(r["eval_loss"] is not None for r in rows) else "train_loss"
    scored = [r for r in rows if r[metric] is not None]
    best = min(scored, key=lambda r: r[metric]) if scored else None
    for r in rows:
        r["best"] = r is best
    return {
        "sweep_dir": str(root.resolve()),
        "array_job_id": plan.get("array_job_id"),
        "state": plan.get("state"),
        "max_parallel": plan.get("max_parallel"),
        "task_count": len(rows),
        "best_by": metric,
        "best": None if best is None else best["index"],
        "slurm": slurm_note or "squeue (one call)",
        "tasks": rows,
    }


def _loss(value: tp.Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def _param_text(value: tp.Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


def render(table: tp.Mapping[str, tp.Any], console: tp.Any = None) -> None:
    """The table on the console: a row per task, the parameters as columns, the best marked ``*``."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False, soft_wrap=True)
    rows = table["tasks"]
    keys: tp.List[str] = []
    for r in rows:
        keys += [k for k in r["params"] if k not in keys]
    out = Table(box=None, pad_edge=False, header_style="bold")
    for col in ["task", "job", *keys, "state", "step", "train loss", "eval loss", "attempts", ""]:
        out.add_column(
            col,
            justify="right" if col in ("step", "train loss", "eval loss", "attempts") else "left",
            no_wrap=col in ("job", "state", "step"),
        )
    for r in rows:
        step = "-" if r["step"] is None else f"{r['step']}" + (f"/{r['total_steps']}" if r["total_steps"] else "")
        state = str(r["state"]) + (f" ({r['reason']})" if r.get("reason") else "")
        out.add_row(
            str(r["index"]),
            str(r["job_id"] or "-"),
            *(_param_text(r["params"][k]) if k in r["params"] else "" for k in keys),
            state,
            step,
            _loss(r["train_loss"]),
            _loss(r["eval_loss"]),
            str(r["attempts"]),
            "* best" if r["best"] else "",
        )
    head = f"sweep {table['sweep_dir']}"
    if table.get("array_job_id"):
        head += f" · job array {table['array_job_id']}, at most {table.get('max_parallel')} at once"
    console.print(head)
    console.print(out)
    by = "final eval loss" if table["best_by"] == "eval_loss" else "final train loss (no task has an eval loss)"
    console.print(f"best: lowest {by}; states from {table['slurm']} and each task's ledger")
