"""The Slurm attempts of a run, from its ledger: one per (job id, restart count), in the order they ran.

A ``start`` record opens an attempt; the ``end`` record that follows it (it names no job) closes it; the
Runner's ``exit`` record names its attempt (job id and restart count) and says how it ended and whether it
was requeued. An attempt with an exit but no start (an entry without the Trainer, or one that died before
its first step) is an attempt all the same. The metrics records name their attempt too: the last one is
the attempt's last sign of life when it left no end record (killed).
"""

from __future__ import annotations

import math
import typing as tp
from dataclasses import dataclass

__all__ = ["Attempt", "attempts_from_ledger"]


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
        }


def attempts_from_ledger(
    ledger: tp.Sequence[tp.Mapping[str, tp.Any]], metrics: tp.Sequence[tp.Mapping[str, tp.Any]] = ()
) -> tp.List[Attempt]:
    """Group ledger records (file order) into attempts; ``metrics`` records fill in the last sign of life.

    Every start record opens an attempt (a local run started twice in one run directory has two attempts
    with the same job id and restart count); an exit record closes the newest attempt of its key that has
    none yet, else it is an attempt of its own."""
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
    return out
