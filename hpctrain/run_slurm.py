"""Slurm's own record of a run's attempts (stdlib only, login side): one ``sacct -D`` call for the whole run.

:func:`slurm_runs` asks Slurm (through :class:`hpctrain._slurm.SlurmCommands`) for every run of the attempts'
jobs; :func:`match_slurm_runs` gives each :class:`hpctrain.run.Attempt` the run of the job that was going on
when it lived (its start, end or metrics records fall between the run's Start and End), else, without usable
times, the run of its restart count. ``status`` and the bundle show its state beside hpctrain's cause and say
when they disagree (:attr:`hpctrain.run.Attempt.slurm_disagrees`): hpctrain decides from inside the job, Slurm
knows afterwards whether a node failed.
"""

from __future__ import annotations

import dataclasses
import math
import typing as tp

from hpctrain.run import Attempt

__all__ = ["slurm_job_ids", "slurm_runs", "match_slurm_runs", "with_slurm", "MATCH_SLACK_S"]

MATCH_SLACK_S = 5.0
"""A record's time may fall this far outside a run's Start..End (sacct's whole seconds, node clocks)."""


def slurm_job_ids(attempts: tp.Sequence[Attempt], also: tp.Sequence[tp.Any] = ()) -> tp.List[str]:
    """The job ids Slurm ran: of attempts it launched (a local job id may be any pid), and ``also``."""
    ids: tp.List[str] = []
    for job in [a.job_id for a in attempts if a.where.startswith("Slurm ")] + [str(j) for j in also if j]:
        if job and job not in ids:
            ids.append(job)
    return ids


def slurm_runs(
    attempts: tp.Sequence[Attempt], slurm: tp.Any, also: tp.Sequence[tp.Any] = ()
) -> tp.Tuple[tp.List[tp.Any], tp.Optional[str]]:
    """Every Slurm run of the attempts' jobs (and of the jobs ``also``, e.g. the submission's): one ``sacct``
    call (:meth:`hpctrain._slurm.SlurmCommands.job_runs`). ``(runs, None)``, or ``([], why)`` when Slurm's view
    is unavailable (no sacct, accounting disabled, slurmdbd down); ``([], None)`` when no job ran on Slurm."""
    from hpctrain.errors import HpctrainError

    ids = slurm_job_ids(attempts, also)
    if not ids:
        return [], None
    try:
        return list(slurm.job_runs(ids)), None
    except HpctrainError as exc:
        return [], str(exc)
    except (OSError, ValueError) as exc:  # the command could not be run at all
        return [], f"cannot run sacct ({exc})"


def _distance(run: tp.Any, t: float) -> tp.Optional[float]:
    """How far ``t`` lies outside the run's Start..End (0 inside; None beyond the slack, or no Start)."""
    if run.start is None:
        return None
    end = run.end if run.end is not None else math.inf
    gap = max(run.start - t, t - end, 0.0)
    return gap if gap <= MATCH_SLACK_S else None


def match_slurm_runs(attempts: tp.Sequence[Attempt], runs: tp.Sequence[tp.Any]) -> tp.List[Attempt]:
    """The attempts, each with its :attr:`Attempt.slurm` from ``runs`` (:class:`hpctrain._slurm.SlurmRun`, each
    job's oldest first): the run whose Start..End holds the times the attempt wrote (:attr:`Attempt.lived`), the
    nearest within :data:`MATCH_SLACK_S`; an attempt with no such time gets the run of its restart count
    (Slurm's n-th run is the one with ``SLURM_RESTART_COUNT`` n). Several attempts in one run (in-job
    restarts): all but the last are ``shared``. An attempt with times that no run holds stays unmatched."""
    by_job: tp.Dict[str, tp.List[tp.Any]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    got: tp.List[tp.Optional[tp.Dict[str, tp.Any]]] = []
    owners: tp.Dict[tp.Tuple[str, int], int] = {}
    for i, a in enumerate(attempts):
        got.append(None)
        mine = by_job.get(a.job_id)
        if not mine:
            continue
        found: tp.Optional[int] = None
        how = "time"
        best = math.inf
        for t in a.lived:
            for n, run in enumerate(mine):
                gap = _distance(run, t)
                if gap is not None and gap < best:
                    found, best = n, gap
        timed = any(r.start is not None for r in mine)
        restart = a.restart_count
        if found is None and (not a.lived or not timed) and restart is not None and 0 <= restart < len(mine):
            found, how = restart, "restart count"
        if found is None:
            continue
        run = mine[found]
        got[i] = {
            "state": run.state,
            "start": run.start,
            "end": run.end,
            "nodes": run.nodes,
            "exit_code": run.exit_code,
            "run": found,
            "runs": len(mine),
            "matched_by": how,
            "shared": False,
        }
        earlier = owners.get((a.job_id, found))
        if earlier is not None and got[earlier] is not None:
            got[earlier]["shared"] = True  # type: ignore[index]
        owners[(a.job_id, found)] = i
    return [dataclasses.replace(a, slurm=g) for a, g in zip(attempts, got)]


def with_slurm(attempts: tp.Sequence[Attempt], slurm: tp.Any, also: tp.Sequence[tp.Any] = ()) -> tp.List[Attempt]:
    """The attempts with Slurm's record of each (:func:`slurm_runs`, :func:`match_slurm_runs`); without
    accounting, each Slurm attempt says why in ``slurm_unavailable``."""
    runs, why = slurm_runs(attempts, slurm, also)
    out = match_slurm_runs(attempts, runs)
    ids = slurm_job_ids(out, also)
    return [dataclasses.replace(a, slurm_unavailable=why) if why and a.job_id in ids else a for a in out]
