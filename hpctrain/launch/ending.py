"""How an attempt ends: classify it, decide whether to requeue, requeue, and record why (stdlib only).

Every rank writes :meth:`RunDir.rank_end <hpctrain.rundir.RunDir.rank_end>` (its own view: finished,
stopped, user error or peer failure). One rank then decides for the job (one ``scontrol requeue`` per
attempt, never one per rank): rank 0, or, when rank 0 died (a SIGKILL, its node), the lowest surviving rank,
which finds no end record of any lower rank within ``takeover_wait_s``. The decision is claimed by creating
:meth:`RunDir.attempt_exit <hpctrain.rundir.RunDir.attempt_exit>` exclusively, so a slow rank 0 and a
survivor never both requeue:

1. cause: :func:`hpctrain.runtime.preemption.classify_end` (the agreed signal, its own exception, the
   other ranks' end files, Slurm's view of the job);
2. progress: did this attempt commit a checkpoint step newer than the one it resumed from (the ledger's
   start record of this attempt against the newest committed ``step-N`` directory);
3. decision: :func:`~hpctrain.runtime.preemption.requeue_decision` (cause, ``SLURM_RESTART_COUNT``
   against ``--max-requeues``, progress);
4. ``scontrol requeue`` through :class:`~hpctrain._slurm.SlurmCommands`, one line on stderr, and an
   ``exit`` record in the run's :class:`~hpctrain.ledger.Ledger` (``python -m hpctrain status`` shows it).

Stdlib only, and below ``train/`` and ``status/`` in the house. The end records, the claim and the progress
it shares with :mod:`~hpctrain.launch.exclusion` and :mod:`~hpctrain.launch.spares` are in
:mod:`hpctrain.launch.records`.
"""

from __future__ import annotations

import os
import sys
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain.launch.exclusion import CHECKED_CAUSES, Failure, attribute_end, exclude_after
from hpctrain.launch.records import claim_decision, committed_progress, end_causes, rank_end_path
from hpctrain.ledger import Ledger
from hpctrain.runtime.preemption import HangDetected, StopCause, classify_end, is_peer_failure, requeue_decision

__all__ = [
    "AttemptEnd",
    "finish_attempt",
    "requeue_job_id",
    "resume_command",
    "cancel_request_path",
    "cancel_request",
    "cancelled_by_text",
]


def cancel_request_path(run_dir: tp.Union[str, "os.PathLike[str]"]) -> Path:
    """:attr:`hpctrain.rundir.RunDir.cancel_request` of ``run_dir`` (the node side's name for it)."""
    from hpctrain.rundir import RunDir

    return RunDir(run_dir).cancel_request


def cancel_request(run_dir: tp.Union[str, "os.PathLike[str]"], job_id: str) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The cancel request for ``job_id`` (None: none, or one for another job of the run)."""
    from hpctrain.rundir import read_json

    record = read_json(cancel_request_path(run_dir), [])
    if record is None or str(record.get("job_id") or "") != str(job_id):
        return None
    return record


def cancelled_by_text(request: tp.Mapping[str, tp.Any]) -> str:
    """``cancelled by alice on login1 at 2026-12-03 15:04:05 (python -m hpctrain cancel --save)``."""
    when = request.get("time")
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    how = "python -m hpctrain cancel" + (" --save" if request.get("save") else "")
    return f"cancelled by {request.get('user') or '?'} on {request.get('host') or '?'} at {shown} ({how})"


@dataclass
class AttemptEnd:
    cause: str
    requeued: bool
    reason: str
    record: tp.Dict[str, tp.Any]


def resume_command(run_dir: Path) -> str:
    """What a user types to continue a run that was not requeued (a local run, a Ctrl-C)."""
    import shlex

    return f"python -m hpctrain.submit --resume {shlex.quote(str(run_dir))}"


def requeue_job_id(job_id: str, environ: tp.Mapping[str, str] = os.environ) -> str:
    """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` for an array task (requeueing the array's
    own id would requeue every task of the array), else the job id."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else job_id


def finish_attempt(
    *,
    run_dir: Path,
    rank: int,
    world_size: int,
    job_id: str,
    restart_count: int,
    launcher: str,
    stop: tp.Optional[tp.Tuple[int, float]],
    agreed_step: tp.Optional[int],
    error: tp.Optional[BaseException],
    started: float,
    time_limit_s: tp.Optional[float],
    lead_s: float,
    max_requeues: int,
    slurm: tp.Any = None,
    peer_wait_s: float = 5.0,
    takeover_wait_s: float = 10.0,
) -> tp.Optional[AttemptEnd]:
    """Record this rank's end; on the deciding rank (rank 0, or the lowest survivor when rank 0 died) also
    classify, decide, requeue and record the job's. ``stop`` is the agreed ``(signal, time this rank
    recorded it)``, or None when no stop was agreed."""
    run_dir = Path(run_dir)
    local = (
        StopCause.FINISHED
        if error is None and stop is None
        else "stopped"
        if error is None
        else StopCause.HANG
        if isinstance(error, HangDetected)
        else StopCause.NODE_FAILURE
        if is_peer_failure(error)
        else StopCause.USER_ERROR
    )
    try:
        path = rank_end_path(run_dir, job_id, restart_count, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"rank": rank, "cause": local, "time": time.time(), "error": _short(error)})
    except OSError:
        pass  # the record helps rank 0 classify; its absence only makes the classification coarser
    # One line per rank on stderr: where this attempt's stderr ends in the rank's log file, which Slurm appends
    # every attempt to (``python -m hpctrain logs`` splits the attempts there; docs/logs.md).
    print(f"hpctrain: rank {rank} ends attempt {restart_count} ({local})", file=sys.stderr, flush=True)
    if rank != 0:
        # A survivor of a failure decides only when no lower rank wrote its end record in time: they died.
        if local not in (StopCause.NODE_FAILURE, StopCause.HANG):
            return None
        if end_causes(run_dir, job_id, restart_count, range(rank), takeover_wait_s, any_one=True):
            return None
    if not claim_decision(run_dir, job_id, restart_count, rank):
        return None

    on_slurm = launcher == "slurm" and bool(job_id)
    slurm_state, limit = "", time_limit_s
    if on_slurm and (stop is not None or error is not None):
        if slurm is None:
            from hpctrain._slurm import SlurmCommands

            slurm = SlurmCommands()
        slurm_state, squeue_limit = slurm.running_job(job_id)
        limit = limit if limit is not None else squeue_limit
    others = [r for r in range(world_size) if r != rank]
    peers = list(end_causes(run_dir, job_id, restart_count, others, peer_wait_s).values()) if error is not None else []
    signum, signal_time = stop if stop is not None else (None, None)
    cause = classify_end(
        signum=signum,
        error=error,
        peer_errors=peers,
        slurm_state=slurm_state,
        elapsed_s=(signal_time or time.time()) - started,
        time_limit_s=limit,
        lead_s=lead_s,
    )
    hang = None
    if cause == StopCause.HANG:  # before a requeue ends the tasks: which ranks hung, on which hosts (one line)
        from hpctrain.runtime.watchdog import attribute_hang

        hang = attribute_hang(run_dir, job_id, restart_count, world_size, wait_s=peer_wait_s)
    failure = None
    if on_slurm and cause in CHECKED_CAUSES:
        # Slurm's own view decides a node failure: its survivors only saw a SIGTERM or a dropped peer.
        try:
            failure = attribute_end(slurm, run_dir, job_id, restart_count, world_size, cause, environ=os.environ)
            cause = failure.cause
        except Exception as exc:  # noqa: BLE001 - attribution sharpens the decision; it must never prevent it
            print(f"hpctrain: warning: no node attribution: {type(exc).__name__}: {exc}", file=sys.stderr)
    resumed, committed = committed_progress(run_dir, job_id, restart_count)
    if resumed is None:
        progress = True  # no ledger: the bound alone limits requeues
        progress_note = "progress unknown (no Trainer ledger start)"
    else:
        progress = committed is not None and committed > resumed
        progress_note = f"resumed from step {resumed}, newest committed step {committed}"
    cancel = cancel_request(run_dir, job_id) if on_slurm and cause != StopCause.FINISHED else None
    if cancel is not None:  # `python -m hpctrain cancel`: the user's stop, whatever signal carried it
        cause = StopCause.CANCELLED
    requeued = False
    if cause == StopCause.FINISHED:
        reason = "finished"
    elif cause == StopCause.INTERRUPTED:
        reason = f"not requeued: interrupted (Ctrl-C); resume with: {resume_command(run_dir)}"
    elif cause in StopCause.REQUEUE_ON and not on_slurm:
        reason = f"not requeued: not a Slurm job; resume with: {resume_command(run_dir)}"
    else:
        requeued, reason = requeue_decision(
            cause, restarts=restart_count, max_requeues=max_requeues, committed_new_step=progress
        )
        if cancel is not None:
            reason = f"not requeued: {cancelled_by_text(cancel)}"
        elif cause == StopCause.CANCELLED:
            reason += " (scancel: no node of the job failed, and Slurm did not requeue it as it does a preemption)"
        if failure is not None and cancel is None:
            requeued, reason = failure.decide(requeued, reason)
    if requeued and not (failure is not None and failure.requeued_by_slurm):
        from hpctrain._slurm import SlurmCommandError
        from hpctrain.launch.array import requeue_task_first

        try:
            # an array task: ahead of the array's tasks that never started (hpctrain.launch.array)
            ahead = requeue_task_first(slurm, requeue_job_id(job_id), os.environ)
            if ahead:
                reason += f"; {ahead}"
        except SlurmCommandError as exc:
            requeued, reason = False, f"not requeued: {exc}"
    hosts: tp.Dict[str, tp.Any] = {}
    if failure is not None or requeued:  # a requeue leaves out the hosts a failure, hang or straggler names
        failure = failure or Failure(cause=cause)
        try:
            hosts = exclude_after(failure, slurm, run_dir, job_id, restart_count, requeued=requeued)
        except Exception as exc:  # noqa: BLE001 - the job is requeued already; only the exclusion is lost
            hosts = {"exclusion": f"not excluded: {type(exc).__name__}: {exc}"}
        if hosts.get("exclusion"):
            reason += f"; {hosts['exclusion']}"
    record = {
        "event": "exit",
        "time": time.time(),
        "job_id": job_id,
        "restart_count": restart_count,
        "cause": cause,
        "requeued": requeued,
        "reason": reason,
        "signal": signum,
        "signal_time": signal_time,
        "agreed_step": agreed_step,
        "resumed_from_step": resumed,
        "committed_step": committed,
        "progress": progress_note,
        "slurm_state": slurm_state or None,
        "error": _short(error),
        "decided_by_rank": rank,
        **hosts,
    }
    if hang is not None:
        record["hang"] = hang
    if cancel is not None:
        record["cancelled_by"] = {k: cancel.get(k) for k in ("user", "host", "time", "save")}
    try:
        Ledger(run_dir).append(record)
    except OSError as exc:
        print(f"hpctrain: could not write the ledger exit record: {exc}", file=sys.stderr, flush=True)
    where = f" at step {agreed_step}" if agreed_step is not None else ""
    if rank != 0:
        where += f" (rank 0 left no end record; rank {rank} decided)"
    print(
        f"hpctrain: attempt {restart_count} ended by {cause.replace('_', ' ')}{where}: {reason}",
        file=sys.stderr,
        flush=True,
    )
    return AttemptEnd(cause, requeued, reason, record)


def _short(error: tp.Optional[BaseException]) -> tp.Optional[str]:
    return None if error is None else f"{type(error).__name__}: {error}"[:500]
