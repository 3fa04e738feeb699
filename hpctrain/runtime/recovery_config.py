"""The settings of in-job recovery (:mod:`hpctrain.runtime.recovery`), without torch: ``TrainConfig.recovery``
holds one, and the Trainer's configuration is checked on construction before torch is imported. Also the
environment the launcher gives the ranks and the warm spares (the Runner and the Trainer read it)."""

from __future__ import annotations

import os
import typing as tp
from dataclasses import dataclass

from hpctrain._validate import check_bool, check_int, check_number, usage_error
from hpctrain.errors import UsageError

__all__ = [
    "RecoveryConfig",
    "STORE_ENV",
    "SPARE_ENV",
    "SPARES_ENV",
    "WORLD_ENV",
    "spare_from_environ",
    "took_rank",
    "taken_rank",
    "taken_world_size",
]

STORE_ENV = "HPCTRAIN_RECOVERY_STORE"
"""``host:port`` of the recovery's TCPStore server: one that outlives every rank (never rank 0's)."""
SPARE_ENV = "HPCTRAIN_RECOVERY_SPARE"
"""Set on a warm spare process: its spare index (0, 1, ...), or ``task``: the index is its task's ``SLURM_PROCID``
in the spares' own step."""
SPARES_ENV = "HPCTRAIN_RECOVERY_SPARES"
"""How many warm spares the launcher started: overrides ``RecoveryConfig.spares`` (the launcher knows)."""
WORLD_ENV = "HPCTRAIN_RECOVERY_WORLD"
"""On a warm spare: the training world size (its own step's ``SLURM_NTASKS`` counts the spares)."""


_TAKEN: tp.List[int] = []


def took_rank(rank: int, world_size: tp.Optional[int] = None) -> None:
    """This process took ``rank`` (the Trainer calls it): a warm spare that took a failed rank's place, or a
    survivor renumbered in a smaller world (``world_size``, RecoveryConfig.shrink). The Runner then ends it as
    that rank."""
    _TAKEN[:] = [int(rank)] + ([int(world_size)] if world_size is not None else [])


def taken_rank() -> tp.Optional[int]:
    """The rank this process took, or None (not a spare or a renumbered survivor)."""
    return _TAKEN[0] if _TAKEN else None


def taken_world_size() -> tp.Optional[int]:
    """The smaller world's size that :func:`took_rank` was told, or None (the world did not change)."""
    return _TAKEN[1] if len(_TAKEN) > 1 else None


def spare_from_environ(environ: tp.Optional[tp.Mapping[str, str]] = None) -> tp.Optional[int]:
    """This process's warm-spare index from :data:`SPARE_ENV`; None on a training rank."""
    environ = os.environ if environ is None else environ
    value = environ.get(SPARE_ENV, "").strip()
    if not value:
        return None
    if value == "task":
        value = environ.get("SLURM_PROCID", "").strip()
    if not value.isdigit():
        raise UsageError(f"{SPARE_ENV}={environ.get(SPARE_ENV)!r} must be a spare index (0, 1, ...) or 'task'")
    return int(value)


@dataclass(kw_only=True)
class RecoveryConfig:
    """In-job recovery of a DDP run (see the module docstring)."""

    _option_name: tp.ClassVar[str] = "RecoveryConfig.{name}"

    enabled: bool = True
    """Recover in the job; False: every peer failure ends the rank as before (the restart from the last commit)."""
    spares: int = 0
    """Warm spare processes started with the job, each standing by to take one failed rank's place."""
    shrink: bool = False
    """No warm spare left for a failed rank: continue at the smaller world (the survivors renumbered 0..W'-1,
    the same global batch split over them, the same sample order) instead of falling back to the restart from
    the last commit; recorded as an elastic step (``in_job_recovery`` with ``elastic``). The next attempt (a
    requeue) starts at the full size again. Needs a global batch that the smaller world divides."""
    max_recoveries: int = 3
    """In-job recoveries at most in one attempt; the next failure falls back to the restart from the last commit."""
    collective_timeout_s: float = 60.0
    """Bound on one collective of a generation's group: a peer lost without closing its sockets (its node
    failed) is detected after this. Above the slowest step's longest collective."""
    heartbeat_s: float = 0.1
    """How often each process rewrites its heartbeat key (one small store write)."""
    dead_after_s: float = 1.0
    """A rank that has not arrived at the agreement and whose heartbeat did not change for this long is dead.
    Part of every recovery's time; too short under heavy load declares a starved rank dead (it then falls back)."""
    abort_timeout_s: float = 10.0
    """Bound on leaving the broken process group."""
    agree_timeout_s: float = 120.0
    """Bound on the agreement: every rank of the generation arrived or found dead. At least
    ``collective_timeout_s`` (a survivor blocked in a collective arrives only when it times out)."""

    def __post_init__(self) -> None:
        check_bool(self, "enabled", self.enabled)
        check_int(self, "spares", self.spares, min=0)
        check_bool(self, "shrink", self.shrink)
        check_int(self, "max_recoveries", self.max_recoveries, min=0)
        for name in ("collective_timeout_s", "heartbeat_s", "dead_after_s", "abort_timeout_s", "agree_timeout_s"):
            check_number(self, name, getattr(self, name), above=0)
        if self.dead_after_s < 3 * self.heartbeat_s:
            raise usage_error(
                self, "dead_after_s", self.dead_after_s, f"must be at least 3 heartbeats ({3 * self.heartbeat_s:g} s)"
            )
        if self.agree_timeout_s < self.collective_timeout_s:
            raise usage_error(
                self,
                "agree_timeout_s",
                self.agree_timeout_s,
                f"must be at least collective_timeout_s ({self.collective_timeout_s:g} s)",
                "a survivor blocked in a collective reaches the agreement only when that collective times out",
            )
