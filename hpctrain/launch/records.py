"""What an attempt's ranks leave in the run directory for whoever decides its end (stdlib only).

Three modules end attempts: every rank through :func:`hpctrain.launch.ending.finish_attempt`, rank 0 of a
restart for an attempt nobody recorded (:func:`hpctrain.launch.exclusion.record_unseen_end`), and the spare-node
loop in the batch script when a step's ranks all died with it (:mod:`hpctrain.launch.spares`). They share the
pieces here, and this module imports none of them:

* each rank's end record (:meth:`RunDir.rank_end <hpctrain.rundir.RunDir.rank_end>`) and waiting for the others';
* the claim of an attempt's decision (:meth:`RunDir.attempt_exit <hpctrain.rundir.RunDir.attempt_exit>`, created
  exclusively: exactly one decider per attempt);
* the attempt's checkpoint progress (the ledger's start record against the newest committed step).
"""

from __future__ import annotations

import json
import os
import time
import typing as tp
from pathlib import Path

from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, read_json

__all__ = ["rank_end_path", "end_causes", "claim_decision", "committed_progress"]


def rank_end_path(run_dir: Path, job_id: str, restart_count: int, rank: int) -> Path:
    return RunDir(run_dir).rank_end(job_id, restart_count, rank)


def end_causes(
    run_dir: Path, job_id: str, restart_count: int, ranks: tp.Iterable[int], wait_s: float, *, any_one: bool = False
) -> tp.Dict[int, str]:
    """The recorded causes of ``ranks``, waiting up to ``wait_s`` for those still unwinding (a dead rank
    never writes one); with ``any_one``, returns as soon as one of them has written its record."""
    wanted = list(ranks)
    deadline = time.monotonic() + wait_s
    causes: tp.Dict[int, str] = {}
    paths = RunDir(run_dir)
    while True:
        for rank in wanted:
            if rank in causes:
                continue
            record = read_json(paths.rank_end(job_id, restart_count, rank), [])
            if record is not None and isinstance(record.get("cause"), str):
                causes[rank] = record["cause"]
        if len(causes) == len(wanted) or (any_one and causes) or time.monotonic() >= deadline:
            return causes
        time.sleep(0.1)


def claim_decision(run_dir: Path, job_id: str, restart_count: int, rank: int) -> bool:
    """Create the attempt's exit marker exclusively: True for the one rank that may decide and requeue
    (``rank`` -1: rank 0 of a later attempt, recording an end nobody recorded)."""
    path = RunDir(run_dir).attempt_exit(job_id, restart_count)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        # Another rank decided this attempt already. Rank 0 yields only to a survivor's claim (a rank 0
        # deciding the same attempt twice is a rerun of the decision, as the unit tests do).
        claim = read_json(path, [])
        return rank == 0 and (claim or {}).get("rank") == 0
    except OSError:
        return rank == 0  # an unwritable run dir: rank 0 decides as before, a survivor stays quiet
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"rank": rank, "time": time.time()}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def committed_progress(run_dir: Path, job_id: str, restart_count: int) -> tp.Tuple[tp.Optional[int], tp.Optional[int]]:
    """``(step this attempt resumed from, newest committed step now)``; None where unknown (an entry that
    does not use the Trainer writes no ledger start record)."""
    from hpctrain.ckpt import latest_committed  # as before: loaded only when an end is decided

    start = Ledger(run_dir).attempt_start(job_id, restart_count)
    if start is None:
        return None, None
    ckpt_dir = start.get("checkpoint_dir")
    newest = latest_committed(ckpt_dir) if isinstance(ckpt_dir, str) and ckpt_dir else None
    return start.get("resumed_from_step"), newest.step if newest is not None else None
