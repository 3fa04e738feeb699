"""The listing of a user's runs: :func:`list_runs` (a JSON-able dict) and :func:`render` (the 80-column table).

Where each fact comes from, and why:

- *which* runs: the registry (:mod:`hpctrain.registry`), one line per submission; a run directory submitted
  again (``--resume``) is one row, its newest submission's job;
- *where the job is*: the scheduler, asked ONCE for all runs together (:func:`scheduler_snapshot`): one
  ``squeue`` (:meth:`~hpctrain._slurm.SlurmCommands.queue_states`) and, only for the jobs that left the
  queue, one ``sacct -D`` (:meth:`~hpctrain._slurm.SlurmCommands.job_runs`). A listing of a sweep of a
  thousand tasks is two RPCs, never a thousand: per-job polling is what stalls a site's slurmctld/slurmdbd;
- *everything else* (step, loss, checkpoint, attempts, how the last one ended): the run directory, read by
  the same library as ``status`` (:func:`hpctrain.status.collect`), handed a :class:`Snapshot` that answers
  its Slurm questions from the one batched answer instead of asking again.

Without accounting (``sacct`` missing or failing), a job that left the queue takes its state from its own
ledger (``status``'s fallback), and the listing says so (``accounting.available`` false, one note line). A
run directory moved or deleted since its submission is a row in state ``MISSING``, never a traceback.
Stdlib only; no torch.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
import typing as tp
from pathlib import Path

from hpctrain._human import fmt_local_time, fmt_num
from hpctrain._slurm import TERMINAL_STATES, JobState, SlurmCommandError, SlurmCommands, SlurmRun
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.registry import Registered, read_runs, registry_path
from hpctrain.rundir import RunDir, read_json

__all__ = [
    "SCHEMA",
    "CATEGORIES",
    "Snapshot",
    "scheduler_snapshot",
    "parse_since",
    "list_runs",
    "render",
]

SCHEMA = "hpctrain.runs/1"
"""The shape of ``runs --json``'s object (:func:`list_runs`)."""
CATEGORIES = ("running", "pending", "failed", "done", "missing")
"""What ``--state`` selects: every state (Slurm's or the run directory's) falls in one of these, or ``unknown``."""

_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING", "SUBMITTED"}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# the run directory's own words (hpctrain.status.report's fallback when Slurm does not know the job)
_RUN_DIR_STATES = {
    "COMPLETED": "done",
    "STOPPED": "done",  # the Trainer stopped by its own rule (not Slurm's SIGSTOP state)
    "RUNNING": "running",
    "RUNNING?": "running",
    "SUBMITTED": "pending",
    "MISSING": "missing",
}


class Snapshot(SlurmCommands):
    """The scheduler's view of every run of one listing, asked once (:func:`scheduler_snapshot`); handed to
    :func:`hpctrain.status.collect` as its ``slurm``, it answers ``job_state`` and ``job_runs`` from that one
    answer, and refuses to run any command (a per-run call would break the one-call rule: it shows up as a
    problem of that run, not as load on slurmctld)."""

    def __init__(
        self,
        queue: tp.Mapping[str, JobState],
        runs: tp.Sequence[SlurmRun] = (),
        *,
        queue_error: tp.Optional[str] = None,
        accounting_error: tp.Optional[str] = None,
    ) -> None:
        self.queue = dict(queue)
        self.runs = list(runs)
        self.queue_error = queue_error
        self.accounting_error = accounting_error

    def run(self, argv: tp.Sequence[str], timeout: float = 30.0) -> str:
        raise SlurmCommandError(f"{argv[0]}: not asked per run (the listing asked the scheduler once for all runs)")

    def job_runs(self, job_ids: tp.Sequence[str]) -> tp.List[SlurmRun]:
        if self.accounting_error:
            raise SlurmCommandError(self.accounting_error)
        wanted = {str(j) for j in job_ids}
        return [r for r in self.runs if r.job_id in wanted]

    def job_state(self, job_id: str, runs: tp.Optional[tp.Sequence[SlurmRun]] = None) -> JobState:
        if job_id in self.queue:
            return self.queue[job_id]
        pool = self.runs if runs is None else runs
        mine = [r for r in pool if r.job_id == job_id]
        if not mine:
            return JobState("UNKNOWN", "", "", "")
        return JobState(mine[-1].state, mine[-1].nodes, mine[-1].elapsed, "sacct")


def scheduler_snapshot(queued_ids: tp.Sequence[str], all_ids: tp.Sequence[str], slurm: tp.Any = None) -> Snapshot:
    """Ask the scheduler about every job of a listing: ONE ``squeue`` for ``queued_ids`` (each run's newest job),
    then, if any job is not in the queue, ONE ``sacct -D`` for those of ``all_ids`` that are not (a run's every
    job: its runs' states). A failing squeue or sacct is recorded in the snapshot, never raised."""
    slurm = slurm or SlurmCommands()
    queue: tp.Dict[str, JobState] = {}
    queue_error = accounting_error = None
    if queued_ids:
        try:
            queue = dict(slurm.queue_states(list(dict.fromkeys(queued_ids))))
        except (HpctrainError, OSError, ValueError) as exc:
            queue_error = str(exc) or type(exc).__name__
    runs: tp.List[SlurmRun] = []
    left = [j for j in dict.fromkeys(all_ids) if j not in queue]
    if left:
        try:
            runs = list(slurm.job_runs(left))
        except (HpctrainError, OSError, ValueError) as exc:
            accounting_error = str(exc) or type(exc).__name__
    return Snapshot(queue, runs, queue_error=queue_error, accounting_error=accounting_error)


_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def parse_since(text: str, now: tp.Optional[float] = None) -> float:
    """``--since``: ``90s``, ``30m``, ``12h``, ``2d``, ``1w`` (a bare number is days) ago, or a date
    ``YYYY-MM-DD[THH:MM]`` (local time) -> a Unix time; anything else is a UsageError (exit 2)."""
    now = time.time() if now is None else now
    raw = str(text).strip()
    m = _SINCE.fullmatch(raw.lower())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"):
        try:
            return time.mktime(time.strptime(raw, fmt))
        except (ValueError, OverflowError):
            continue
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    raise UsageError(f"--since {shown!r}: give an age (90s, 30m, 12h, 2d, 1w) or a date (YYYY-MM-DD[THH:MM])")


def _category(state: str, source: str) -> str:
    if state == "MISSING":
        return "missing"
    if source == "run dir":
        if state in _RUN_DIR_STATES:
            return _RUN_DIR_STATES[state]
        if state == "ENDED?":
            return "failed"
        return "unknown" if state.startswith(("ENDED", "UNKNOWN")) else "failed"
    if state in _PENDING:
        return "pending"
    if state in _RUNNING:
        return "running"
    if state == "COMPLETED":
        return "done"
    if state in TERMINAL_STATES or state in ("SPECIAL_EXIT", "ENDED?"):
        return "failed"
    return "unknown"


def _last_attempt(report: tp.Mapping[str, tp.Any]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    rows = report.get("attempts") or []
    return dict(rows[-1]) if rows else None


def _ended_text(last: tp.Optional[tp.Mapping[str, tp.Any]]) -> str:
    """How the newest attempt ended, in a few words: ``finished``, ``time_limit, requeued``, ``failed``."""
    if not last or not last.get("ended"):
        return ""
    why = last.get("cause") or last.get("status") or "ended"
    return f"{why}, requeued" if last.get("requeued") else str(why)


def _started(report: tp.Mapping[str, tp.Any]) -> tp.Optional[float]:
    """When the run's first attempt started (its first ledger start record)."""
    for rec in report.get("ledger") or []:
        t = rec.get("time")
        if rec.get("event") == "start" and isinstance(t, (int, float)) and not isinstance(t, bool):
            return float(t)
    return None


def _nodes(submission: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Optional[int]:
    config = (submission or {}).get("config")
    n = config.get("nodes") if isinstance(config, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _blank_row(entry: Registered, state: str, problems: tp.List[str]) -> tp.Dict[str, tp.Any]:
    return {
        "name": entry.name,
        "job_id": entry.job_id,
        "cluster": entry.cluster,
        "kind": entry.kind,
        "sweep": entry.sweep,
        "run_dir": entry.run_dir,
        "submitted_at": entry.submitted_at,
        "state": state,
        "category": _category(state, "run dir"),
        "source": "run dir",
        "reason": None,
        "nodes": None,
        "node_list": None,
        "step": None,
        "total_steps": None,
        "loss": None,
        "checkpoint_step": None,
        "checkpoint_time": None,
        "started": None,
        "last_attempt": None,
        "last_ended": "",
        "attempts": 0,
        "problems": problems,
    }


def _row(entry: Registered, snapshot: Snapshot) -> tp.Dict[str, tp.Any]:
    """One run's row, from its run directory (through ``status``'s report) and the snapshot."""
    from hpctrain.status import collect

    root = Path(entry.run_dir)
    if not root.is_dir():
        why = "no such directory (moved or deleted since it was submitted)"
        if os.path.lexists(root):
            why = "not a directory"
        return _blank_row(entry, "MISSING", [f"{entry.run_dir}: {why}"])
    try:
        report = collect(root, slurm=snapshot)
    except UsageError as exc:  # it exists but holds no run (emptied, or replaced by something else)
        return _blank_row(entry, "MISSING", [str(exc)])
    except Exception as exc:  # noqa: BLE001 - one damaged run is one row, never the listing's traceback
        return _blank_row(entry, "UNREADABLE", [f"{type(exc).__name__}: {str(exc)[:200]}"])
    problems: tp.List[str] = list(report.get("problems") or [])
    submission = read_json(RunDir(root).submission, problems)
    job = report.get("job") or {}
    state, source = str(job.get("state") or "UNKNOWN"), str(job.get("source") or "")
    reason = job.get("reason") or None
    last = _last_attempt(report)
    on_slurm = job.get("cluster") == "slurm" and job.get("id")
    if on_slurm and source == "run dir" and snapshot.queue_error is None:
        # squeue answered and does not list the job: it has ended, whatever the ledger's last word was
        if state in ("RUNNING", "RUNNING?", "DIED (no end record)"):
            state, reason = "ENDED?", "not in the queue, no end record (killed, or its node failed)"
        elif state == "SUBMITTED":
            state, reason = "ENDED?", "not in the queue, never started (cancelled while pending?)"
    progress = report.get("progress") or {}
    ckpt = report.get("checkpoint") or {}
    interval = report.get("last_interval") or {}
    name = entry.name or str((submission or {}).get("job_name") or "") or root.name
    row = _blank_row(entry, state, problems)
    row.update(
        name=name,
        job_id=str(job.get("id")) if job.get("id") else entry.job_id,
        cluster=str(job.get("cluster") or entry.cluster),
        category=_category(state, source),
        source=source,
        reason=reason,
        nodes=_nodes(submission),
        node_list=job.get("nodes") or None,
        step=progress.get("step"),
        total_steps=progress.get("total_steps"),
        loss=interval.get("loss"),
        checkpoint_step=ckpt.get("step"),
        checkpoint_time=ckpt.get("time"),
        started=_started(report),
        last_attempt=last,
        last_ended=_ended_text(last),
        attempts=len(report.get("attempts") or []),
    )
    return row


def _matches(entry: Registered, pattern: tp.Optional[str]) -> bool:
    if not pattern:
        return True
    return fnmatch.fnmatchcase(entry.name, pattern) or fnmatch.fnmatchcase(os.path.basename(entry.run_dir), pattern)


def list_runs(
    *,
    states: tp.Optional[tp.Collection[str]] = None,
    name: tp.Optional[str] = None,
    since: tp.Optional[float] = None,
    slurm: tp.Any = None,
    registry: tp.Optional[Path] = None,
) -> tp.Dict[str, tp.Any]:
    """The user's runs as a JSON-able dict (``runs --json`` without its ``schema``): ``runs`` (one row each, oldest
    submission first), ``count``, ``registry``, ``scheduler`` (what was asked: ``squeue_calls``, ``sacct_calls``,
    errors), ``accounting`` (``available``, ``unavailable``), ``notes``. ``states``: keep the rows of these
    :data:`CATEGORIES`; ``name``: a glob on the job name or the run directory's name; ``since``: submitted at or
    after this Unix time. ``slurm``: a :class:`~hpctrain._slurm.SlurmCommands` (tests pass a fake)."""
    path = registry if registry is not None else registry_path()
    newest: tp.Dict[str, Registered] = {}
    jobs: tp.Dict[str, tp.List[str]] = {}
    for entry in read_runs(path):
        newest.pop(entry.run_dir, None)  # re-inserted: a resumed run sorts by its newest submission
        newest[entry.run_dir] = entry
        if entry.job_id and entry.cluster == "slurm":
            jobs.setdefault(entry.run_dir, []).append(entry.job_id)
    chosen = [
        e
        for e in newest.values()
        if _matches(e, name) and (since is None or (e.submitted_at is not None and e.submitted_at >= since))
    ]
    queued = [e.job_id for e in chosen if e.cluster == "slurm" and e.job_id]
    every = [j for e in chosen for j in jobs.get(e.run_dir, [])]
    snapshot = scheduler_snapshot(queued, every, slurm)
    asked_sacct = bool([j for j in every if j not in snapshot.queue])
    rows = [_row(e, snapshot) for e in chosen]
    if states:
        rows = [r for r in rows if r["category"] in states]
    notes: tp.List[str] = []
    if snapshot.queue_error:
        notes.append(f"squeue failed ({snapshot.queue_error}): states from accounting and the run directories")
    if snapshot.accounting_error:
        notes.append(
            f"accounting unavailable ({snapshot.accounting_error}): states of jobs no longer in the queue "
            "come from squeue and each run's own ledger"
        )
    return {
        "registry": str(path),
        "count": len(rows),
        "runs": rows,
        "filters": {"states": sorted(states) if states else None, "name": name, "since": since},
        "scheduler": {
            "squeue_calls": 1 if queued else 0,
            "sacct_calls": 1 if asked_sacct else 0,
            "squeue_error": snapshot.queue_error,
        },
        "accounting": {"available": snapshot.accounting_error is None, "unavailable": snapshot.accounting_error},
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------- the table
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
COLUMNS = ("NAME", "JOB", "STATE", "N", "STEP", "LOSS", "CKPT", "STARTED", "ENDED", "RUN DIR")
"""The table's headers: N the nodes, STEP the newest step / total, LOSS the newest interval's, CKPT the newest
committed checkpoint's step, ENDED how the newest attempt ended (``time_limit, requeued``)."""
_RIGHT = {"N", "STEP", "LOSS", "CKPT"}
# the columns that give way, in this order, when the table is wider than the terminal, and how far
_SHRINK = (("STATE", 9), ("RUN DIR", 16), ("NAME", 10), ("ENDED", 8), ("JOB", 6), ("RUN DIR", 7), ("NAME", 4))


def _cell(value: tp.Any) -> str:
    """Recorded text for the screen: one line, control characters as ``?`` (no terminal sequence gets through)."""
    return "" if value is None else _CONTROL.sub("?", str(value))


def _cut(text: str, width: int, *, left: bool = False) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    return "…" + text[-(width - 1) :] if left else text[: width - 1] + "…"


def _where(run_dir: str) -> str:
    """The run directory as short as it reads unambiguously: relative to the working directory when inside
    it, ``~/...`` inside the home directory, else absolute."""
    try:
        here = os.getcwd()
        if run_dir.startswith(here.rstrip(os.sep) + os.sep):
            return os.path.relpath(run_dir, here)
    except OSError:
        pass
    home = os.path.expanduser("~")
    if home not in ("", "/") and run_dir.startswith(home.rstrip(os.sep) + os.sep):
        return "~" + run_dir[len(home.rstrip(os.sep)) :]
    return run_dir


def _when(t: tp.Any, fmt: str) -> str:
    return fmt_local_time(t, fmt, unknown="")


def _cells(row: tp.Mapping[str, tp.Any], time_fmt: str) -> tp.List[str]:
    step, total = row.get("step"), row.get("total_steps")
    progress = "" if step is None and total is None else f"{'?' if step is None else step}/{total or '?'}"
    state = str(row.get("state") or "")
    if row.get("reason") and state == "PENDING":
        state = f"{state} ({row['reason']})"
    return [
        _cell(row.get("name")),
        _cell(row.get("job_id")),
        _cell(state),
        _cell(row.get("nodes")),
        _cell(progress),
        "" if row.get("loss") is None else fmt_num(row["loss"], 3),
        _cell(row.get("checkpoint_step")),
        _when(row.get("started"), time_fmt),
        _cell(row.get("last_ended")),
        _cell(_where(str(row.get("run_dir") or ""))),
    ]


def render(listing: tp.Mapping[str, tp.Any], *, width: int = 80) -> str:
    """The listing as a table that fits ``width`` columns (80 and up): no cell wraps, headers are never cut;
    when it is too wide, the run directory gives way first (cut from its left: its own name stays), then the
    name, how the last attempt ended, the state and the job id (a cut cell ends in ``…``); times and numbers are
    never cut. Started times are ``HH:MM`` when every run started today, else ``MM-DD HH:MM``."""
    rows = listing.get("runs") or []
    lines: tp.List[str] = []
    if not rows:
        lines.append("no runs" + (" match" if any((listing.get("filters") or {}).values()) else " registered yet"))
    else:
        today = time.strftime("%Y-%m-%d")
        days = {_when(r.get("started"), "%Y-%m-%d") for r in rows if r.get("started") is not None}
        time_fmt = "%H:%M" if days <= {today} else "%m-%d %H:%M"
        cells = [_cells(r, time_fmt) for r in rows]
        keep = [i for i, head in enumerate(COLUMNS) if head in ("NAME", "STATE", "RUN DIR") or any(c[i] for c in cells)]
        heads = [COLUMNS[i] for i in keep]
        table = [[c[i] for i in keep] for c in cells]
        widths = [max([len(h)] + [len(r[k]) for r in table]) for k, h in enumerate(heads)]
        gap = 2 if sum(widths) + 2 * (len(widths) - 1) <= width else 1
        for head, floor in _SHRINK:
            excess = sum(widths) + gap * (len(widths) - 1) - width
            if excess <= 0:
                break
            if head in heads:
                k = heads.index(head)
                widths[k] -= min(excess, max(0, widths[k] - max(floor, len(head))))
        sep = " " * gap

        def line(values: tp.Sequence[str]) -> str:
            out = []
            for head, value, w in zip(heads, values, widths):
                if head == "STATE" and len(value) > w:
                    value = value.split(" (")[0]  # "PENDING (Resources)" -> "PENDING" rather than "PENDING …"
                value = _cut(value, w, left=head == "RUN DIR")
                out.append(value.rjust(w) if head in _RIGHT else value.ljust(w))
            return sep.join(out).rstrip()

        lines.append(line(heads))
        lines += [line(r) for r in table]
        counts: tp.Dict[str, int] = {}
        for r in rows:
            counts[r["category"]] = counts.get(r["category"], 0) + 1
        summary = ", ".join(f"{counts[c]} {c}" for c in (*CATEGORIES, "unknown") if counts.get(c))
        lines.append(_cut(f"{len(rows)} run{'s' if len(rows) != 1 else ''}: {summary}", width))
    return "\n".join(lines)
