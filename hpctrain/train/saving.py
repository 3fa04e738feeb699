"""The Trainer's checkpoints during ``fit``: periodic saves by step count or by time, and the final one.

The checkpointer owns "when": its ``should_save(step)`` (:class:`hpctrain.ckpt.config.SaveCadence`) answers
the tier for a step: ``global`` every ``every_steps`` steps (and for an agreed time-based save), ``auto`` every
``CheckpointConfig.local_every_steps`` steps with the local tier on (local, every ``global_every_local_saves``-th
of them also global), None otherwise. The last save (end or stop: the next attempt may get other nodes) is global.

Periodic saves are async by default (the step waits only for the copy to host memory). A time-based save
is asked for by rank 0's clock at a log interval and carried to every rank by that interval's collective
(:attr:`Saver.requested`), so that all ranks save the same step. The last step, whether training ended or
stopped, is saved blocking: it is committed when ``fit`` returns.

``every_minutes="auto"``: the time between saves is Daly's optimum (:func:`hpctrain.reliability.daly_interval`,
the one owner of the formula, shared with the planner) for the save cost measured here, the mean stall of the last
:data:`AUTO_WINDOW` saves (what ``Checkpointer.save`` blocked the step for: the copy to host memory of an
async save, the whole save of a blocking one), and the job's MTBF, ``mtbf_node_hours`` / nodes. Until a save
is measured the cost is taken as :data:`AUTO_FIRST_SAVE_S`, a small guess, so that the first save (which
measures the real cost) comes early rather than late.
"""

from __future__ import annotations

import time
import typing as tp

from hpctrain.reliability import daly_interval, job_mtbf_seconds
from hpctrain.train.ledger_records import AttemptProgress
from hpctrain.train.stopping import Stopping

__all__ = ["Saver", "AUTO_FIRST_SAVE_S", "AUTO_WINDOW"]

AUTO_FIRST_SAVE_S = 1.0
"""The save cost ``every_minutes="auto"`` assumes before one is measured."""
AUTO_WINDOW = 5
"""``every_minutes="auto"`` uses the mean stall of this many most recent saves."""


def _num_nodes() -> int:
    from hpctrain.runtime.env import from_environ

    try:
        return max(1, int(from_environ().num_nodes))
    except Exception:  # noqa: BLE001 - an environment it cannot read: a one-node job
        return 1


class Saver:
    """``Saver(ckpt, policy, state=..., loader=..., progress=...)``; ``ckpt`` None (checkpointing off)
    makes every method a no-op. ``state``: the objects saved (``model`` the bare module, ``optimizer``,
    ``scheduler``, ``scaler``); ``loader``: the H5Loader whose position is saved, or None."""

    def __init__(
        self,
        ckpt: tp.Any,
        policy: tp.Any,
        *,
        state: tp.Mapping[str, tp.Any],
        loader: tp.Any,
        progress: AttemptProgress,
        nodes: tp.Optional[int] = None,
        clock: tp.Callable[[], float] = time.monotonic,
    ) -> None:
        """``nodes``: the job's node count for ``every_minutes="auto"`` (None: from the launcher's environment);
        ``clock``: monotonic seconds (a test's fake clock)."""
        self.ckpt, self.policy, self.state, self.loader, self.progress = ckpt, policy, dict(state), loader, progress
        self.clock = clock
        self.last_step: tp.Optional[int] = None
        """The last step a save was started for (the interval record's ``last_checkpoint_step``)."""
        self.last_time = clock()
        self.requested = False
        """A time-based save agreed at the last log interval, taken at the next step."""
        self.stalls: tp.List[float] = []
        """Seconds each save of this attempt blocked the step for."""
        self.auto = policy.every_minutes == "auto"
        self.job_mtbf_s = (
            job_mtbf_seconds(nodes or _num_nodes(), policy.mtbf_node_hours) if self.auto and ckpt is not None else None
        )

    def save(self, step: int, *, blocking: bool, tier: str = "global") -> None:
        """``tier``: what the checkpointer's ``should_save`` answered (``global``, or ``auto``: the local tier,
        every ``global_every_local_saves``-th of them also global); the last save is ``global``."""
        data_state = {"loader": self.loader.state_dict()} if self.loader is not None else {}
        t0 = self.clock()
        self.ckpt.save(step, data_state=data_state, blocking=blocking, tier=tier, **self.state)
        stall = self.clock() - t0
        self.stalls.append(stall)
        if blocking:  # only a blocking save is known committed here, and only its time is the save's time
            self.progress.last_save_s, self.progress.committed_step = stall, step
        self.last_step, self.last_time = step, self.clock()

    def interval_s(self) -> tp.Optional[float]:
        """Seconds between time-based saves: ``every_minutes``, or Daly's optimum for ``"auto"``; None when
        saves are not by time."""
        minutes = self.policy.every_minutes
        if self.auto:
            recent = self.stalls[-AUTO_WINDOW:]
            cost = sum(recent) / len(recent) if recent else AUTO_FIRST_SAVE_S
            assert self.job_mtbf_s is not None
            return daly_interval(max(cost, 1e-6), self.job_mtbf_s)
        return 60.0 * minutes if minutes else None

    def periodic(self, step: int, total: int) -> bool:
        """Save ``step`` to the tier the checkpointer's ``should_save`` names (its cadence, or the agreed
        time-based request); True when it did. The last step is left to :meth:`finish`, which saves it blocking."""
        if self.ckpt is None or step >= total:
            return False
        tier = self.ckpt.should_save(step, requested=self.requested)
        if tier is None:
            return False
        self.save(step, blocking=not self.policy.async_save, tier=tier)
        self.requested = False
        return True

    def minutes_passed(self) -> bool:
        """``every_minutes`` (or the ``"auto"`` interval) passed since the last save, on this rank's clock
        (rank 0's decides)."""
        if self.ckpt is None:
            return False
        interval = self.interval_s()
        return interval is not None and self.clock() - self.last_time >= interval

    def finish(
        self, step: int, *, start: int, stopped: bool, stopping: Stopping, note: tp.Callable[[str], None]
    ) -> None:
        """Save the last step blocking (nothing when no step ran). At a stop, the in-flight async save is
        settled first (finished, or abandoned when time is short: :meth:`Stopping.settle_in_flight`); when
        the abandoned one was of this very step, this step is saved again, blocking."""
        if self.ckpt is None or step <= start:
            return
        dropped = False
        if stopped:
            dropped, line = stopping.settle_in_flight(
                self.ckpt, last_save_s=self.progress.last_save_s, step_s=self.progress.step_s
            )
            if line:
                note(line)
        if self.last_step == step and not dropped:
            # a periodic save already took this step (the stop came at its log interval or evaluation)
            self.ckpt.wait()
            self.progress.committed_step = step
        else:
            t0 = time.perf_counter()
            self.save(step, blocking=True)
            note(f"hpctrain.train: checkpoint of step {step} committed in {time.perf_counter() - t0:.2f}s")
