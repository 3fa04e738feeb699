"""The Trainer's checkpoints during ``fit``: periodic saves by step count or by time, and the final one.

Periodic saves are async by default (the step waits only for the copy to host memory). A time-based save
is asked for by rank 0's clock at a log interval and carried to every rank by that interval's collective
(:attr:`Saver.requested`), so that all ranks save the same step. The last step, whether training ended or
stopped, is saved blocking: it is committed when ``fit`` returns.
"""

from __future__ import annotations

import time
import typing as tp

from hpctrain.train.ledger_records import AttemptProgress
from hpctrain.train.stopping import Stopping

__all__ = ["Saver"]


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
    ) -> None:
        self.ckpt, self.policy, self.state, self.loader, self.progress = ckpt, policy, dict(state), loader, progress
        self.last_step: tp.Optional[int] = None
        """The last step a save was started for (the interval record's ``last_checkpoint_step``)."""
        self.last_time = time.monotonic()
        self.requested = False
        """A time-based save agreed at the last log interval, taken at the next step."""

    def save(self, step: int, *, blocking: bool) -> None:
        data_state = {"loader": self.loader.state_dict()} if self.loader is not None else {}
        t0 = time.perf_counter()
        self.ckpt.save(step, data_state=data_state, blocking=blocking, **self.state)
        if blocking:  # only a blocking save is known committed here, and only its time is the save's time
            self.progress.last_save_s, self.progress.committed_step = time.perf_counter() - t0, step
        self.last_step, self.last_time = step, time.monotonic()

    def periodic(self, step: int, total: int) -> bool:
        """Save ``step`` when ``every_steps`` or an agreed time-based request says so; True when it did. The
        last step is left to :meth:`finish`, which saves it blocking."""
        pol = self.policy
        if self.ckpt is None or step >= total:
            return False
        if not ((pol.every_steps and step % pol.every_steps == 0) or self.requested):
            return False
        self.save(step, blocking=not pol.async_save)
        self.requested = False
        return True

    def minutes_passed(self) -> bool:
        """``every_minutes`` passed since the last save, on this rank's clock (rank 0's decides)."""
        minutes = self.policy.every_minutes
        return self.ckpt is not None and bool(minutes) and time.monotonic() - self.last_time >= 60 * minutes

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
