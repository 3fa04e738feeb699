"""The bundle's summary of a run's attempts (``record.json``'s ``attempts``): one JSON-able dict per attempt.

Which ledger records make an attempt, its label and Slurm's record of it are :mod:`hpctrain.run`'s
(:func:`hpctrain.run.attempts`) and :mod:`hpctrain.run_slurm`'s; the bundle, ``status`` and ``report`` read the
same attempts.
"""

from __future__ import annotations

import typing as tp

from hpctrain.run import Attempt, attempts
from hpctrain.run_slurm import with_slurm

__all__ = ["summary", "attempts_from_ledger"]


def attempts_from_ledger(
    ledger: tp.Iterable[tp.Mapping[str, tp.Any]],
    metrics: tp.Iterable[tp.Mapping[str, tp.Any]] = (),
    *,
    slurm: tp.Any = None,
) -> tp.List[Attempt]:
    """:func:`hpctrain.run.attempts`, with Slurm's record of each Slurm attempt when ``slurm`` (a
    :class:`hpctrain._slurm.SlurmCommands`) is given (:func:`hpctrain.run_slurm.with_slurm`)."""
    found = attempts(ledger, metrics)
    return with_slurm(found, slurm) if slurm is not None else found


def summary(a: Attempt) -> tp.Dict[str, tp.Any]:
    """One attempt as the bundle records it."""
    end, end_from = a.end_time
    return {
        "attempt": a.index,
        "job_id": a.job_id,
        "restart_count": a.restart_count,
        "launcher": a.launcher,
        "start_time": a.start_time,
        "end_time": end,
        "end_time_from": end_from,
        "status": a.status,
        "cause": a.cause,
        "requeued": a.requeued,
        "hosts": a.hosts,
        "world_size": a.world_size,
        "resumed_from_step": a.resumed_from_step,
        "step": a.step,
        "committed_step": a.committed_step,
        "slurm": dict(a.slurm) if a.slurm else None,
        "slurm_unavailable": a.slurm_unavailable,
        "slurm_disagrees": a.slurm_disagrees,
    }
