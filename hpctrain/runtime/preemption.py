"""Stop requests from Slurm: record the signal, let the loop poll, make every rank agree on the step.

Slurm warns a job before it ends: ``--signal USR2@LEAD`` before the time limit, and at preemption the
user signal (``PreemptParameters=send_user_signal``) or SIGTERM, then SIGKILL after ``GraceTime``
(see docs/preemption.md for what this cluster sends when). Three rules, from what goes wrong elsewhere:

1. **The handler only records** (signal number and time). Saving inside a signal handler runs at an
   arbitrary bytecode boundary (mid-backward, holding a lock) and often never finishes.
2. **The loop polls** :meth:`StopAgreement.should_stop` in every loop it runs (train step, eval, data
   wait), and
3. **all ranks agree** with one small all-reduce (MAX of "I was signalled") on a dedicated gloo group:
   one signalled rank is enough, every rank sees the same answer at the same poll, so they stop at the
   same step and no rank leaves alone (which would deadlock the others in their next collective).

Torch is imported lazily (:class:`StopSignals` and the policy are stdlib-only).
"""

from __future__ import annotations

import datetime
import signal
import threading
import time
import typing as tp
from dataclasses import dataclass

__all__ = ["StopSignals", "StopAgreement", "StopCause", "classify_stop", "requeue_decision", "DEFAULT_SIGNALS"]

DEFAULT_SIGNALS: tp.Tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)
"""USR2: hpctrain's ``--signal`` (time limit, and preemption where the site sends the user signal);
TERM: preemption without the user signal, ``scancel``, the time limit's final notice."""


class StopCause:
    TIME_LIMIT = "time_limit"
    PREEMPTION = "preemption"
    CANCELLED = "cancelled"
    NODE_FAILURE = "node_failure"
    USER_ERROR = "user_error"
    FINISHED = "finished"
    REQUEUE_ON = frozenset({TIME_LIMIT, PREEMPTION, NODE_FAILURE})
    """Ends after which the job is requeued (within the bound): the work can go on elsewhere or later."""


class StopSignals:
    """Record the stop signals this process receives. Nothing else happens in the handler."""

    def __init__(self, signals: tp.Sequence[int] = DEFAULT_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: tp.List[tp.Tuple[int, float]] = []
        self._previous: tp.Dict[int, tp.Any] = {}

    def install(self) -> "StopSignals":
        """Replace the handlers (submitit's included) in the main thread; idempotent."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopSignals.install() must run in the main thread (Python delivers signals there)")
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _record(self, signum: int, frame: tp.Any) -> None:  # noqa: ARG002 - signal handler signature
        self.received.append((signum, time.time()))  # list.append is atomic under the GIL

    @property
    def requested(self) -> bool:
        return bool(self.received)

    @property
    def first(self) -> tp.Optional[tp.Tuple[int, float]]:
        return self.received[0] if self.received else None


@dataclass
class StopDecision:
    step: int
    """The step at which every rank stops (the poll that first saw a signal on any rank)."""
    signum: int
    """The signal recorded (the highest signal number when ranks recorded different ones)."""


class StopAgreement:
    """``should_stop(step)`` on every rank, every poll: True on all ranks at the same poll, or on none.

    The collective is a 2-int all-reduce (MAX) on a gloo group of its own (never the NCCL training group, so
    it neither syncs a CUDA stream nor queues behind gradient buckets). Without an initialised process
    group it is local. ``every`` > 1 polls the collective only every N calls (cheaper for tiny steps;
    the stop then happens up to N-1 steps later).
    """

    def __init__(self, signals: StopSignals, *, every: int = 1, timeout_s: float = 600.0) -> None:
        import torch.distributed as dist

        if every < 1:
            raise ValueError(f"StopAgreement(every=...) must be >= 1, got {every}")
        self.signals, self.every = signals, every
        self._calls = 0
        self.decision: tp.Optional[StopDecision] = None
        self._group = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    def should_stop(self, step: int) -> bool:
        if self.decision is not None:
            return True
        self._calls += 1
        if self._calls % self.every:
            return False
        first = self.signals.first
        mine = [1 if first else 0, first[0] if first else 0]
        if self._group is not None:
            import torch
            import torch.distributed as dist

            t = torch.tensor(mine, dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
            mine = t.tolist()
        if mine[0]:
            self.decision = StopDecision(step=step, signum=int(mine[1]))
            return True
        return False


def classify_stop(signum: int, *, elapsed_s: float, time_limit_s: tp.Optional[float], lead_s: float) -> str:
    """Time limit or preemption? Slurm sends the same signals for both, so the clock decides: a signal
    that comes within the warning lead (plus Slurm's up-to-60 s early delivery, plus a margin) of the time
    limit is the time limit; anything earlier is a preemption."""
    if time_limit_s is not None and elapsed_s >= time_limit_s - lead_s - 90.0:
        return StopCause.TIME_LIMIT
    return StopCause.PREEMPTION


def requeue_decision(cause: str, *, restarts: int, max_requeues: int, committed_new_step: bool) -> tp.Tuple[bool, str]:
    """Whether to requeue after an end of this ``cause``, and why (one line for the log and ``status``)."""
    if cause not in StopCause.REQUEUE_ON:
        return False, f"not requeued: the run ended by {cause.replace('_', ' ')}"
    if not committed_new_step:
        return False, (
            f"not requeued: this attempt committed no new checkpoint step, so another attempt would make no "
            f"progress ({cause.replace('_', ' ')}); fix the cause, then resubmit"
        )
    if restarts >= max_requeues:
        return False, f"not requeued: {restarts} requeues used of --max-requeues {max_requeues}"
    return True, f"requeued after {cause.replace('_', ' ')} ({restarts + 1} of {max_requeues})"
