"""``python -m hpctrain cancel RUN_DIR [--save [--timeout S]] [--json]``: end a run's job for good (stdlib only).

1. The request: ``RUN_DIR/cancel-request.json`` (job id, user, host, time, ``save``;
   :attr:`hpctrain.rundir.RunDir.cancel_request`) and a ledger ``cancel`` record with the same fields, both
   written **before** Slurm is asked, so that the deciding rank finds them whatever signal reaches the tasks.
2. Plain: ``scancel JOB`` (SIGTERM to every task: they stop at an agreed step and save what they can before
   ``KillWait``). ``--save``: ``scancel --signal=USR2 JOB``, the same signal as a time-limit warning or a
   preemption, so every rank stops at one agreed step and commits its checkpoint (docs/preemption.md); then the
   command waits (``--timeout``) for the attempt's exit record or for the job to leave the queue, and
   ``scancel``s it if it is still there (the job ends ``CANCELLED``).
3. The deciding rank (:func:`hpctrain.launch.ending.finish_attempt`) reads the request: the attempt ends as
   ``cancelled``, is never requeued, and its exit record names who cancelled it (``cancelled_by``).

Why a file and not a signal of its own: USR2 and SIGTERM are the signals the Runner already turns into an agreed
stop; any other one would kill a task that has not installed its handler yet (start-up, a loader worker). The
file says what the signal cannot (who, and "do not requeue"), and Slurm's state cannot either: after USR2 the job
is still RUNNING, which is exactly what a preemption with the user signal looks like.
"""

from __future__ import annotations

import socket
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain import _cli
from hpctrain._atomic import atomic_write_json
from hpctrain._procs import user_name
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["build_parser", "main", "cancel_run"]

SCHEMA = "hpctrain.cancel/1"
DEFAULT_TIMEOUT_S = 120.0


def build_parser() -> _cli.ArgumentParser:
    p = _cli.command_parser(
        "cancel",
        "Cancel a run's Slurm job: recorded in the run's ledger as cancelled by you, and never requeued.\n"
        "--save first stops every rank at one agreed step and commits its checkpoint (the preemption path).",
    )
    _cli.add_run_dir(p)
    p.add_argument(
        "--save", action="store_true", help="stop at an agreed step and commit a checkpoint first, then cancel"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"--save: seconds to wait for the save and the job's end before scancel (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    _cli.add_json_flag(p)
    return p


def _exit_of(run_dir: Path, job_id: str, after: float) -> tp.Optional[tp.Dict[str, tp.Any]]:
    from hpctrain.ledger import Ledger

    for rec in reversed(Ledger(run_dir).records("exit")):
        t = rec.get("time")
        if str(rec.get("job_id")) == job_id and isinstance(t, (int, float)) and t >= after:
            return rec
    return None


def cancel_run(
    run_dir: Path,
    *,
    save: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    slurm: tp.Any = None,
    poll_s: float = 1.0,
    log: tp.Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> tp.Dict[str, tp.Any]:
    """Cancel the run's job (module docstring); what was done, for ``--json``. A job no longer in the queue is an
    :class:`HpctrainError` (exit 1)."""
    from hpctrain.ledger import Ledger
    from hpctrain.rundir import RunDir, read_json

    paths = RunDir(run_dir)
    submission = read_json(paths.submission, [])
    if submission is None:
        raise UsageError(f"{run_dir}: no readable {RunDir.SUBMISSION}: not a submitted run")
    job_id = str(submission.get("job_id") or "")
    if submission.get("cluster") != "slurm" or not job_id:
        raise UsageError(
            f"{run_dir} is not a Slurm run (cluster {submission.get('cluster')!r}): stop a local run with Ctrl-C"
        )
    if slurm is None:
        from hpctrain._slurm import SlurmCommands

        slurm = SlurmCommands()
    state = slurm.job_state(job_id)
    if state.source != "squeue":
        raise HpctrainError(f"job {job_id} has already ended ({state.state}): nothing to cancel")
    now = time.time()
    request = {"job_id": job_id, "user": user_name(), "host": socket.gethostname(), "time": now, "save": save}
    atomic_write_json(paths.cancel_request, request)
    Ledger(run_dir).append({"event": "cancel", "state_before": state.state, **request})
    result: tp.Dict[str, tp.Any] = {
        "run_dir": str(run_dir),
        "job_id": job_id,
        "state_before": state.state,
        "cancelled_by": request,
        "signalled": None,
        "scancel": False,
        "exit": None,
        "waited_s": 0.0,
    }
    running = state.state in ("RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
    if save and running:
        slurm.signal(job_id, "USR2")
        result["signalled"] = "USR2"
        log(
            f"hpctrain cancel: asked job {job_id} to stop at an agreed step and save (USR2); "
            f"waiting up to {timeout_s:.0f}s"
        )
        deadline = time.monotonic() + timeout_s
        while True:
            exit_rec = _exit_of(run_dir, job_id, now)
            if exit_rec is not None:
                result["exit"] = {
                    k: exit_rec.get(k) for k in ("cause", "requeued", "agreed_step", "committed_step", "reason")
                }
                break
            if slurm.job_state(job_id).source != "squeue":
                break
            if time.monotonic() >= deadline:
                log(f"hpctrain cancel: no exit record after {timeout_s:.0f}s: cancelling without waiting for the save")
                break
            time.sleep(poll_s)
        result["waited_s"] = round(time.time() - now, 3)
    elif save:
        log(f"hpctrain cancel: job {job_id} is {state.state}: nothing to save, cancelling")
    if slurm.job_state(job_id).source == "squeue":
        slurm.cancel(job_id)
        result["scancel"] = True
    step = (result["exit"] or {}).get("committed_step")
    result["committed_step"] = step
    return result


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from hpctrain.run import is_run_dir

    run_dir = Path(args.run_dir)
    if not is_run_dir(run_dir):
        raise UsageError(f"{args.run_dir} is not a run directory (made by python -m hpctrain.submit)")
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be more than 0 seconds")
    result = cancel_run(run_dir, save=args.save, timeout_s=args.timeout)
    if args.json:
        _cli.print_json(result, schema=SCHEMA)
        return 0
    who = result["cancelled_by"]
    saved = ""
    if args.save:
        ex = result["exit"] or {}
        saved = (
            f"; stopped at step {ex.get('agreed_step')}, checkpoint {ex.get('committed_step')} committed"
            if ex
            else "; no save was recorded"
        )
    print(
        f"cancelled job {result['job_id']} ({result['state_before']}) as {who['user']} on {who['host']}{saved}"
        + ("" if result["scancel"] else "; it had left the queue")
    )
    return 0
