"""The Slurm attempts of a run, from its ledger: one per (job id, restart count), in the order they ran.

A ``start`` record opens an attempt; the ``end`` record that follows it (it names no job) closes it; the
Runner's ``exit`` record names its attempt (job id and restart count) and says how it ended and whether it
was requeued. An attempt with an exit but no start (an entry without the Trainer, or one that died before
its first step) is an attempt all the same. The metrics records name their attempt too: the last one is
the attempt's last sign of life when it left no end record (killed).

Slurm's own record of each attempt (:func:`slurm_runs`, one ``sacct -D`` call for the whole run, and
:func:`match_slurm_runs`): the run of the job that was going on when the attempt lived (its start, end or
metrics records fall between the run's Start and End), else, without usable times, the run of its restart
count. ``status`` and the bundle show its state beside hpctrain's cause and say when they disagree
(:attr:`Attempt.slurm_disagrees`): hpctrain decides from inside the job, Slurm knows afterwards whether a
node failed.
"""

from __future__ import annotations

import math
import typing as tp
from dataclasses import dataclass

__all__ = [
    "Attempt",
    "attempts_from_ledger",
    "slurm_job_ids",
    "slurm_runs",
    "match_slurm_runs",
    "SLURM_CAUSES",
    "MATCH_SLACK_S",
]

SLURM_CAUSES = {
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "PREEMPTED": "preemption",
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "CANCELLED": "cancelled",
}
"""Slurm run states that say why a run ended, and hpctrain's cause (:class:`hpctrain.runtime.preemption.StopCause`)
for the same end; a different recorded cause is a disagreement. The other states say nothing of the cause:
``REQUEUED`` is ``scontrol requeue`` (hpctrain's own, after any cause), ``COMPLETED``/``FAILED`` how the batch
script exited, ``RUNNING``/``PENDING`` a run not over."""
MATCH_SLACK_S = 5.0
"""A record's time may fall this far outside a run's Start..End (sacct's whole seconds, node clocks)."""


def _num(value: tp.Any) -> tp.Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _int(value: tp.Any) -> tp.Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Attempt:
    job_id: str
    restart_count: int
    start: tp.Optional[tp.Dict[str, tp.Any]] = None
    end: tp.Optional[tp.Dict[str, tp.Any]] = None
    exit: tp.Optional[tp.Dict[str, tp.Any]] = None
    last_metrics_time: tp.Optional[float] = None
    last_metrics_step: tp.Optional[int] = None
    index: int = 0
    """1-based position among the run's attempts (the crate's action ids use it: keys may repeat)."""
    later_attempt: bool = False
    """Another attempt came after this one (so one without an end record did not merely still run)."""
    slurm: tp.Optional[tp.Dict[str, tp.Any]] = None
    """Slurm's run of this attempt (:func:`match_slurm_runs`): ``state``, ``start``, ``end``, ``nodes``,
    ``exit_code``, ``run`` (0-based among the job's runs), ``runs``, ``matched_by``, ``shared`` (a later
    attempt ran in the same Slurm run: an in-job restart, so the state is not this attempt's)."""
    slurm_unavailable: tp.Optional[str] = None
    """Why Slurm's view could not be had (no sacct, accounting disabled), when it was asked for."""

    @property
    def key(self) -> tp.Tuple[str, int]:
        return self.job_id, self.restart_count

    @property
    def label(self) -> str:
        return f"{self.job_id or 'local'}-r{self.restart_count}"

    @property
    def start_time(self) -> tp.Optional[float]:
        return _num((self.start or {}).get("time"))

    @property
    def end_time(self) -> tp.Tuple[tp.Optional[float], str]:
        """(when it ended, from what): the end record, else the exit record, else its last metrics record."""
        for rec, what in ((self.end, "end record"), (self.exit, "exit record")):
            t = _num((rec or {}).get("time"))
            if t is not None:
                return t, what
        if self.last_metrics_time is not None:
            return self.last_metrics_time, "last metrics record (no end record)"
        return None, ""

    @property
    def hosts(self) -> tp.List[str]:
        hosts = (self.start or {}).get("hosts")
        return [str(h) for h in hosts] if isinstance(hosts, list) else []

    @property
    def world_size(self) -> tp.Optional[int]:
        return _int((self.start or {}).get("world_size"))

    @property
    def resumed_from_step(self) -> tp.Optional[int]:
        for rec in (self.start, self.exit):
            value = _int((rec or {}).get("resumed_from_step"))
            if value is not None:
                return value
        return None

    @property
    def committed_step(self) -> tp.Optional[int]:
        for rec in (self.exit, self.end):
            value = _int((rec or {}).get("committed_step"))
            if value is not None:
                return value
        return None

    @property
    def step(self) -> tp.Optional[int]:
        value = _int((self.end or {}).get("step"))
        return value if value is not None else self.last_metrics_step

    @property
    def status(self) -> str:
        """completed | stopped | failed | killed (no end record, a later attempt exists) | unknown."""
        end = (self.end or {}).get("status")
        cause = (self.exit or {}).get("cause")
        if end == "failed" or cause in ("user_error", "node_failure"):
            return "failed"
        if end in ("completed", "stopped"):
            return str(end)
        if cause == "finished":
            return "completed"
        if cause in ("time_limit", "preemption", "cancelled"):
            return "stopped"
        return "killed" if self.later_attempt else "unknown"

    @property
    def requeued(self) -> bool:
        return bool((self.exit or {}).get("requeued"))

    @property
    def error(self) -> str:
        for rec in (self.end, self.exit):
            text = (rec or {}).get("error")
            if isinstance(text, str) and text:
                return text
        if self.status == "killed":
            return "the attempt left no end or exit record (killed: node failure, time limit, scancel -9)"
        return ""

    @property
    def launcher(self) -> tp.Optional[str]:
        """``slurm``, ``submitit-local``, ``torchrun``, ``single`` (the start record's), else None."""
        value = (self.start or {}).get("launcher")
        return str(value) if value else None

    @property
    def where(self) -> str:
        """``Slurm job 123`` or ``local job 456`` / ``local run`` (what ran it, for people)."""
        if self.launcher == "slurm" or (self.exit or {}).get("slurm_state"):
            return f"Slurm job {self.job_id}"
        return f"local job {self.job_id}" if self.job_id else "local run"

    @property
    def cause(self) -> tp.Optional[str]:
        cause = (self.exit or {}).get("cause")
        return str(cause) if cause else None

    @property
    def lived(self) -> tp.List[float]:
        """Times the attempt itself wrote (start, end, last metrics; its exit when one of its own ranks decided
        it: an exit recorded at the next attempt's start is not a time of this one)."""
        times = [self.start_time, _num((self.end or {}).get("time")), self.last_metrics_time]
        if _int((self.exit or {}).get("decided_by_rank")) is not None:
            times.append(_num((self.exit or {}).get("time")))
        return [t for t in times if t is not None]

    @property
    def slurm_disagrees(self) -> tp.Optional[str]:
        """``attempt 12-r0: hpctrain says preemption, Slurm says NODE_FAIL`` when Slurm's state of this attempt's
        run names another cause than hpctrain recorded (:data:`SLURM_CAUSES`), else None."""
        if not self.slurm or self.slurm.get("shared") or not self.cause:
            return None
        state = str(self.slurm.get("state") or "")
        if state not in SLURM_CAUSES or SLURM_CAUSES[state] == self.cause:
            return None
        return f"attempt {self.label}: hpctrain says {self.cause}, Slurm says {state}"

    def summary(self) -> tp.Dict[str, tp.Any]:
        end, end_from = self.end_time
        return {
            "attempt": self.index,
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "launcher": self.launcher,
            "start_time": self.start_time,
            "end_time": end,
            "end_time_from": end_from,
            "status": self.status,
            "cause": self.cause,
            "requeued": self.requeued,
            "hosts": self.hosts,
            "world_size": self.world_size,
            "resumed_from_step": self.resumed_from_step,
            "step": self.step,
            "committed_step": self.committed_step,
            "slurm": dict(self.slurm) if self.slurm else None,
            "slurm_unavailable": self.slurm_unavailable,
            "slurm_disagrees": self.slurm_disagrees,
        }


def attempts_from_ledger(
    ledger: tp.Sequence[tp.Mapping[str, tp.Any]],
    metrics: tp.Sequence[tp.Mapping[str, tp.Any]] = (),
    *,
    slurm: tp.Any = None,
) -> tp.List[Attempt]:
    """Group ledger records (file order) into attempts; ``metrics`` records fill in the last sign of life.

    Every start record opens an attempt (a local run started twice in one run directory has two attempts
    with the same job id and restart count); an exit record closes the newest attempt of its key that has
    none yet, else it is an attempt of its own. ``slurm`` (a :class:`hpctrain._slurm.SlurmCommands`): Slurm's
    record of each Slurm attempt is added (:func:`slurm_runs`, :func:`match_slurm_runs`); without
    accounting, each says why in ``slurm_unavailable``."""
    out: tp.List[Attempt] = []
    current: tp.Optional[Attempt] = None
    for rec in ledger:
        event = rec.get("event")
        restart = _int(rec.get("restart_count"))
        key = (str(rec.get("job_id") or ""), restart)
        if event == "start" and restart is not None:
            current = Attempt(key[0], restart, start=dict(rec))
            out.append(current)
        elif event == "end" and current is not None and current.end is None:
            current.end = dict(rec)
        elif event == "exit" and restart is not None:
            owner = next((a for a in reversed(out) if a.key == key and a.exit is None), None)
            if owner is None:
                owner = Attempt(key[0], restart)
                out.append(owner)
            owner.exit = dict(rec)
    for rec in metrics:
        t, step = _num(rec.get("time")), _int(rec.get("step"))
        key = (str(rec.get("job_id") or ""), _int(rec.get("restart_count")) or 0)
        if t is None:
            continue
        mine = [a for a in out if a.key == key and (a.start_time is None or a.start_time <= t)]
        if mine and (mine[-1].last_metrics_time is None or t >= mine[-1].last_metrics_time):
            mine[-1].last_metrics_time, mine[-1].last_metrics_step = t, step
    for n, a in enumerate(out, start=1):
        a.index = n
        a.later_attempt = n < len(out)
    if slurm is not None:
        runs, why = slurm_runs(out, slurm)
        match_slurm_runs(out, runs)
        ids = slurm_job_ids(out)
        for a in out:
            if why and a.job_id in ids:
                a.slurm_unavailable = why
    return out


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


def match_slurm_runs(attempts: tp.Sequence[Attempt], runs: tp.Sequence[tp.Any]) -> None:
    """Set each attempt's :attr:`Attempt.slurm` from ``runs`` (:class:`hpctrain._slurm.SlurmRun`, each job's
    oldest first): the run whose Start..End holds the times the attempt wrote (:attr:`Attempt.lived`), the
    nearest within :data:`MATCH_SLACK_S`; an attempt with no such time gets the run of its restart count
    (Slurm's n-th run is the one with ``SLURM_RESTART_COUNT`` n). Several attempts in one run (in-job
    restarts): all but the last are ``shared``. An attempt with times that no run holds stays unmatched."""
    by_job: tp.Dict[str, tp.List[tp.Any]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    owners: tp.Dict[tp.Tuple[str, int], Attempt] = {}
    for a in attempts:
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
        if found is None and (not a.lived or not timed) and 0 <= a.restart_count < len(mine):
            found, how = a.restart_count, "restart count"
        if found is None:
            continue
        run = mine[found]
        a.slurm = {
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
        if earlier is not None and earlier.slurm is not None:
            earlier.slurm["shared"] = True
        owners[(a.job_id, found)] = a
