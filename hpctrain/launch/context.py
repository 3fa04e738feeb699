"""The public contract between hpctrain and a training entry point: ``entry(ctx: RunContext)``.

hpctrain initialises the default process group *before* calling the entry and destroys it after
the entry returns, so the entry can call collectives and wrap models in DDP at once. Fields are only
ever added, never renamed or removed (the contract is documented in docs/submit.md).
"""

from __future__ import annotations

import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.runtime.env import DistEnv

__all__ = ["RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext(DistEnv):
    """Where this task stands in the run. One per process.

    Inherits every :class:`~hpctrain.runtime.env.DistEnv` field: ``rank``, ``local_rank``,
    ``world_size``, ``local_world_size``, ``node_rank``, ``num_nodes``, ``master_addr``,
    ``master_port``, ``job_id``, ``restart_count``, ``hostnames``, ``launcher``, ``cpus_per_task``.
    """

    run_dir: Path
    """The run directory shared by all nodes: write outputs, checkpoints and records under it."""
    device: tp.Any
    """``torch.device``: ``cuda:<local_rank>`` on GPU jobs, ``cpu`` otherwise."""
    backend: str
    """The process group's backend: 'nccl' or 'gloo'."""
    hostname: str
    """This node's host name."""
    args: tp.Tuple[str, ...] = field(default=())
    """The entry's own arguments (what followed ``--`` on the submit command line)."""
    signal_lead_s: float = 0.0
    """Seconds between Slurm's warning signal and the end of the job (``--signal-lead``; 0 when unknown)."""
    stop: tp.Any = field(default=None, repr=False, compare=False)
    """The Runner's :class:`~hpctrain.runtime.preemption.StopAgreement` (None outside a Runner)."""

    def should_stop(self, step: tp.Optional[int] = None) -> bool:
        """True on every rank at the same call once any rank received a stop signal (USR2 at the time-limit
        warning or at preemption, SIGTERM): save at this step and return from the entry.

        **Collective**: every rank must call it at the same points (one small gloo all-reduce per call,
        pipelined: a call acts on the previous call's answer, so a stop lands one call later). The
        Trainer calls it after every step and in its evaluation loop; a hand-written loop calls it once per
        step. False when the context has no stop agreement (not started by a Runner). With ``step`` it is also
        the run's progress report: from the first call on, a rank that stops calling it for the hang timeout
        ends the attempt as a hang (docs/preemption.md, "Hangs and stragglers")."""
        if step is not None:  # progress for the hang watchdog (hpctrain.runtime.watchdog): a tuple in memory
            from hpctrain.runtime.watchdog import beat

            beat(step)
        if self.stop is None:
            return False
        return bool(self.stop.should_stop(-1 if step is None else step))

    should_stop.collective = True  # type: ignore[attr-defined]  # the Trainer polls it every step

    def agree(self, value: int, op: str = "max") -> int:
        """The ``max`` (or ``min``) of ``value`` over all ranks: one small all-reduce on the stop agreement's
        gloo group, so it never queues behind (or syncs) the training group's NCCL work. **Collective**:
        every rank calls it at the same point. The Trainer agrees with it on how many evaluation batches
        to poll for a stop and on whether to abandon an in-flight save at a stop. ``value`` itself when
        the context has no stop agreement (not started by a Runner: nothing to agree with)."""
        if op not in ("max", "min"):
            raise ValueError(f"RunContext.agree(op=...) must be 'max' or 'min', got {op!r}")
        if self.stop is None:
            return int(value)
        return int(self.stop.reduce([int(value)], op)[0])

    def stop_time_left(self) -> tp.Optional[float]:
        """Seconds until Slurm kills the job, estimated from the first stop signal this rank recorded
        (signal time + ``signal_lead_s``; Slurm may send it up to 60 s early, so the real margin is larger);
        None when no signal was received or the lead is unknown."""
        first = self.stop.signals.first if self.stop is not None else None
        if first is None or not self.signal_lead_s:
            return None
        import time

        return first[1] + self.signal_lead_s - time.time()

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes shared records and logs summaries."""
        return self.rank == 0
