"""The Trainer's two records of each attempt in the run's ledger (:class:`hpctrain.ledger.Ledger`).

``start``, written by rank 0 just before the first step: who runs, from which step, and what the restart
cost (start-up with every rank's phases, progress redone, time down, why the previous attempt ended).
``startup``, written by rank 0 once the first step is done: the whole start-up profile of every rank
(:mod:`hpctrain.runtime.startup`), the first step included. ``end``, written when
``fit`` returns or raises: the step reached, how it ended, the last blocking save and the mean step, which
the next attempt compares with the signal lead. The schemas are in docs/train.md.
"""

from __future__ import annotations

import os
import sys
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain.ckpt.config import RESTORE_TIERS
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, read_jsonl
from hpctrain.runtime import startup

__all__ = ["AttemptProgress", "AttemptRecords"]


@dataclass
class AttemptProgress:
    """What the loop and its saves have done so far in this attempt (the ``end`` record reads it)."""

    step: int = 0
    """The last step taken (the start step before the first)."""
    committed_step: tp.Optional[int] = None
    """The last step known committed: the restored one, then each blocking save's."""
    last_save_s: tp.Optional[float] = None
    """Seconds of the last blocking save."""
    step_s: tp.Optional[float] = None
    """Mean seconds per step of this attempt (set when the loop ends)."""
    restored_tier: tp.Optional[str] = None
    """The checkpoint tier the start restored from (``local`` or ``global``; None on a fresh start)."""
    restored_global_step: tp.Optional[int] = None
    """The newest global commit at that restore (less than the restored step when the local tier served)."""


class AttemptRecords:
    """Rank 0's ``start`` and ``end`` records of one attempt; a no-op on the other ranks."""

    def __init__(self, ctx: tp.Any, run_dir: Path, *, rank: int, world_size: int, config: tp.Any) -> None:
        self.ctx, self.run_dir, self.world_size, self.config = ctx, run_dir, world_size, config
        self.ledger = Ledger(run_dir) if rank == 0 else None
        self.started = False
        """True once the start record is written: only an attempt that recorded a start records an end."""

    def start(
        self,
        *,
        start_step: int,
        total: int,
        ckpt_dir: tp.Optional[Path],
        committed_at: tp.Optional[float],
        identity: tp.Optional[tp.Mapping[str, tp.Any]] = None,
        progress: tp.Optional[AttemptProgress] = None,
    ) -> None:
        """``committed_at``: when the restored checkpoint was committed (``RestoreResult.committed_at``);
        ``identity``: the attempt's identity fields (``RunIdentity.as_record``), carried as they are;
        ``progress``: its ``restored_tier`` and the steps the local tier saved over the newest global commit.
        Every rank calls it: the ranks' start-up phases are gathered here (a collective)."""
        ctx, now = self.ctx, time.time()  # before the gather: startup_s stays rank 0's own start-up
        profile = startup.gather(str(getattr(ctx, "hostname", "") or ""))
        startup.mark("wait")  # what this rank waited in the gather for the slowest one
        if self.ledger is None:
            return
        previous, _ = read_jsonl(RunDir(self.run_dir).metrics, tail_bytes=1 << 20)
        last_seen = max((r["time"] for r in previous if isinstance(r.get("time"), (int, float))), default=None)
        lead_s = getattr(ctx, "signal_lead_s", None)  # a duck-typed context may not know the lead
        after, warning = self._previous_attempt(lead_s or 0.0)
        record: tp.Dict[str, tp.Any] = {
            "event": "start",
            "time": now,
            "job_id": ctx.job_id,
            "restart_count": ctx.restart_count,
            "hosts": list(ctx.hostnames or [ctx.hostname]),
            "world_size": self.world_size,
            "launcher": getattr(ctx, "launcher", None),
            "pid": os.getpid(),
            "hostname": ctx.hostname,
            "resumed_from_step": start_step,
            "total_steps": total,
            "checkpoint_dir": str(ckpt_dir) if ckpt_dir is not None else None,
            # start-up: interpreter, imports, rendezvous, model build and restore, until the first step
            "startup_s": now - startup.process_start_time(),
            # every rank's phases until here (max over ranks, the slowest named); the first step: the startup record
            "startup": profile,
            # progress made after the restored checkpoint was committed and seen in the last interval
            # record of an earlier start: redone now (a lower bound: steps after that record are unseen)
            "lost_s": (
                max(0.0, last_seen - committed_at) if last_seen and committed_at else (0.0 if start_step else None)
            ),
            "down_s": now - last_seen if last_seen else None,
            # why the previous attempt ended (its Runner's exit record), when this is a restart
            "after": after,
            "signal_lead_s": lead_s,
            "warning": warning,
            "config": self.config.to_dict(),
            **dict(identity or {}),
        }
        if progress is not None and progress.restored_tier in RESTORE_TIERS[1:]:  # a local tier, and what it saved
            record["restored_tier"] = progress.restored_tier
            record["local_tier_saved_steps"] = start_step - (progress.restored_global_step or 0)
        elif progress is not None and progress.restored_tier:
            record["restored_tier"] = progress.restored_tier
        self.ledger.append(record)
        self.started = True

    def became_rank_0(self) -> None:
        """This process became rank 0 inside the job (a warm spare took rank 0's place, or the smaller world
        renumbered it): the dead rank 0 wrote the attempt's ``start``, so this one writes its ``end``."""
        if self.ledger is None:
            self.ledger = Ledger(self.run_dir)
            self.started = True

    def first_step(self) -> None:
        """After the first step of the attempt, on every rank (a collective): rank 0's ``startup`` record, the
        whole start-up profile (the wait for the slowest rank and the first step added)."""
        startup.mark("first_step")
        profile = startup.gather(str(getattr(self.ctx, "hostname", "") or ""))
        if self.ledger is None or not self.started:
            return
        ctx = self.ctx
        self.ledger.append(
            {
                "event": "startup",
                "time": time.time(),
                "job_id": ctx.job_id,
                "restart_count": ctx.restart_count,
                "startup": profile,
            }
        )

    def end(self, *, status: str, progress: AttemptProgress, error: str = "") -> None:
        """``status``: ``completed``, ``stopped`` or ``failed`` (then ``error``, cut to 500 characters)."""
        if self.ledger is None or not self.started:
            return
        record: tp.Dict[str, tp.Any] = {
            "event": "end",
            "time": time.time(),
            "step": progress.step,
            "status": status,
            "committed_step": progress.committed_step,
            "last_save_s": progress.last_save_s,
            "step_s": progress.step_s,
        }
        if error:
            record["error"] = error[:500]
        self.ledger.append(record)

    def _previous_attempt(self, lead_s: float) -> tp.Tuple[tp.Optional[str], tp.Optional[str]]:
        """The previous attempt's end cause, and a warning when the signal lead is shorter than its last
        measured save plus one step (the stop save would not be committed before the kill)."""
        assert self.ledger is not None
        restarts = int(getattr(self.ctx, "restart_count", 0) or 0)
        after, save_s, step_s = self.ledger.previous_attempt(restarts)
        warning = None
        if save_s is not None and step_s is not None and lead_s and lead_s < save_s + step_s:
            warning = (
                f"the signal lead ({lead_s:.0f}s) is shorter than the last save ({save_s:.1f}s) plus one step "
                f"({step_s:.1f}s): a stop save may not commit before the kill; raise --signal-lead"
            )
            print(f"hpctrain.train: warning: {warning}", file=sys.stderr, flush=True)
        return after, warning
