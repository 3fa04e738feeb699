"""A requeued task of a job array back in before the tasks that never started (docs/sweeps.md).

Slurm makes a requeued job wait ``cred_expire + 1`` seconds (``BeginTime``) before it may start again, and an
array's pending tasks are eligible at once: the slot the requeued task freed goes to a task that never started,
and the requeued one waits until a later slot frees (the baseline issue 30 measured: 81 s; the sweep cluster test
without this: 34 s, behind all 4 pending tasks). Priority cannot fix that (``scontrol top`` needs the
``enable_user_top`` SchedulerParameter; a user's ``nice`` only lowers priority; neither makes a job eligible
before its BeginTime), and clearing the BeginTime risks the launch being refused on the same node while its old
credential is still revoked. A user may hold and release their own jobs, so rank 0 of the deciding task does:

1. ``scontrol hold ARRAY``: every pending task of the array is held (the running ones run on);
2. ``scontrol requeue ARRAY_TASK`` (this task alone);
3. ``scontrol release ARRAY_TASK``: the requeued task is eligible again at its BeginTime, and takes the next slot;
4. at the task's next start, rank 0 runs ``scontrol release ARRAY``: the others come back.

A task that is requeued and then never starts again (scancel'd while pending) leaves the array's pending tasks
held: ``squeue`` shows them ``JobHeldUser``, ``scontrol release ARRAY`` (or the next requeued task's start) frees
them. Every scontrol here is shielded from the step's SIGTERM; a hold or release that fails is a note, never a
failed requeue.
"""

from __future__ import annotations

import os
import typing as tp

__all__ = ["array_ids", "requeue_task_first", "release_array"]


def array_ids(environ: tp.Mapping[str, str] = os.environ) -> tp.Optional[tp.Tuple[str, str]]:
    """``(array job id, task id)`` of a job array's task, None outside an array."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return (array, task) if array and task else None


def requeue_task_first(slurm: tp.Any, job_id: str, environ: tp.Mapping[str, str] = os.environ) -> str:
    """``scontrol requeue job_id`` (raises SlurmCommandError as :meth:`hpctrain._slurm.SlurmCommands.requeue`);
    for an array task, wrapped in the hold of the array's pending tasks and the release of this one (module
    docstring). Returns a note for the exit record's reason ('' outside an array)."""
    from hpctrain._slurm import SlurmCommandError

    ids = array_ids(environ)
    if ids is None:
        slurm.requeue(job_id)
        return ""
    array = ids[0]
    try:
        slurm.hold(array)
        held = True
    except SlurmCommandError as exc:
        held, note = False, f"the array's pending tasks not held ({exc}): a task that never started may go first"
    try:
        slurm.requeue(job_id)
    except SlurmCommandError:
        if held:
            _quiet_release(slurm, array)
        raise
    if not held:
        return note
    try:
        slurm.release(job_id)
    except SlurmCommandError as exc:
        _quiet_release(slurm, array)
        return f"this task not released after the hold ({exc}); the array's tasks released again"
    return f"array {array}'s pending tasks held until this task starts again (it goes first)"


def _quiet_release(slurm: tp.Any, job_id: str) -> None:
    from hpctrain._slurm import SlurmCommandError

    try:
        slurm.release(job_id)
    except SlurmCommandError:
        pass


def release_array(slurm: tp.Any, environ: tp.Mapping[str, str] = os.environ) -> bool:
    """Rank 0 of a restarted array task: release the array's tasks held by :func:`requeue_task_first`. True when
    scontrol released them (False: not an array task, a first attempt, or nothing to release)."""
    from hpctrain._slurm import SlurmCommandError

    ids = array_ids(environ)
    if ids is None or not int(environ.get("SLURM_RESTART_COUNT") or 0):
        return False
    try:
        slurm.release(ids[0])
    except SlurmCommandError:
        return False  # "Job has already finished" / not held: nothing was held
    return True
