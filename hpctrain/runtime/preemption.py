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
import os
import signal
import threading
import time
import typing as tp
from dataclasses import dataclass

from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S

__all__ = [
    "StopSignals",
    "StopAgreement",
    "StopCause",
    "HangDetected",
    "classify_stop",
    "classify_end",
    "is_peer_failure",
    "requeue_decision",
    "DEFAULT_SIGNALS",
]

DEFAULT_SIGNALS: tp.Tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
"""USR2: hpctrain's ``--signal`` (time limit, and preemption where the site sends the user signal);
TERM: preemption without the user signal, ``scancel``, the time limit's final notice;
INT: an interactive user's Ctrl-C (a local run, srun in a terminal): a clean stop like the others, and
a second Ctrl-C ends the process at once."""


class StopCause:
    TIME_LIMIT = "time_limit"
    PREEMPTION = "preemption"
    CANCELLED = "cancelled"
    NODE_FAILURE = "node_failure"
    USER_ERROR = "user_error"
    INTERRUPTED = "interrupted"
    """Ctrl-C (SIGINT): the user's own stop; saved at the agreed step, never requeued."""
    FINISHED = "finished"
    HANG = "hang"
    """A rank made no progress for the hang timeout (hpctrain.runtime.watchdog): stacks dumped, every rank ended."""
    REQUEUE_ON = frozenset({TIME_LIMIT, PREEMPTION, NODE_FAILURE, HANG})
    """Ends after which the job is requeued (within the bound): the work can go on elsewhere or later."""


class HangDetected(RuntimeError):
    """Raised into the end of an attempt (never by user code) when the no-progress watchdog fired on this rank."""


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

    def ignore_from_now(self) -> None:
        """The attempt is over: ignore SIGUSR2 until the process exits. A time-limit warning that lands
        while a finished task exits would otherwise kill it (interpreter shutdown puts handlers back to
        the default, which for USR2 is to die) and Slurm would mark a completed job FAILED. SIGTERM keeps
        its meaning: a cancel or the limit itself."""
        if signal.SIGUSR2 in self.signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    def _record(self, signum: int, frame: tp.Any) -> None:  # noqa: ARG002 - signal handler signature
        if signum == signal.SIGINT and any(s == signal.SIGINT for s, _ in self.received):
            # The second Ctrl-C: the user does not want to wait for the save. One line, exit at once with
            # the shell's code for SIGINT (os._exit: no unwinding through a collective that would block).
            os.write(2, b"hpctrain: second Ctrl-C: exiting now without saving\n")
            os._exit(128 + signal.SIGINT)
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
    it neither syncs a CUDA stream nor queues behind gradient buckets). It is **pipelined**: a poll sends
    its flags without waiting and acts on those of the previous poll, whose all-reduce had a whole step to
    finish. A blocking all-reduce per step cost 1.4 ms of a 4.4 ms step on 2 CPU ranks, and gloo's ring
    grows with the world size; the price is that a stop lands one poll later (Slurm's warning comes a
    minute or more ahead). The first poll waits for its own answer. Without an initialised process group
    it is local and immediate. ``every`` > 1 polls the collective only every N calls (the stop then
    happens up to 2N-1 steps after the signal).
    """

    def __init__(self, signals: StopSignals, *, every: int = 1, timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if every < 1:
            raise ValueError(f"StopAgreement(every=...) must be >= 1, got {every}")
        self.signals, self.every = signals, every
        self._calls = 0
        self.decision: tp.Optional[StopDecision] = None
        self._group = None
        self._in_flight: tp.Optional[tp.Tuple[tp.Any, tp.Any]] = None  # (work, tensor) of the last poll
        self._timeout_s = timeout_s
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    def rejoin(self) -> None:
        """After in-job recovery formed a new default group (:mod:`hpctrain.runtime.recovery`), or on a warm
        spare that just joined one: the agreement's own gloo group anew on it. The poll in flight on the broken
        group is dropped unwaited (its peer may be dead); the next poll waits for its own answer, as a first
        poll does. Every rank of the new group calls it at the same point."""
        import torch.distributed as dist

        self._in_flight, self._calls, self._group = None, 0, None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self._timeout_s))

    def reduce(self, values: tp.Sequence[int], op: str = "max") -> tp.List[int]:
        """All-reduce a few ints (``max`` or ``min``) on the agreement's gloo group; local without one.
        Every rank must call it at the same point. Entries reach it as ``ctx.agree(value, op)``
        (:meth:`hpctrain.launch.context.RunContext.agree`); the Trainer agrees on eval polls and on
        whether to abandon an in-flight save through it."""
        if self._group is None:
            return [int(v) for v in values]
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(v) for v in values], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN, group=self._group)
        return [int(v) for v in t.tolist()]

    def should_stop(self, step: int) -> bool:
        if self.decision is not None:
            return True
        self._calls += 1
        if self._calls % self.every:
            return False
        first = self.signals.first
        mine = [1 if first else 0, first[0] if first else 0]
        agreed = mine if self._group is None else self._exchange(mine)
        if agreed[0]:
            self.decision = StopDecision(step=step, signum=int(agreed[1]))
            return True
        return False

    def _exchange(self, mine: tp.List[int]) -> tp.List[int]:
        """Send this poll's flags (not waited for); return the previous poll's agreed ones (none at the first)."""
        import torch
        import torch.distributed as dist

        first_poll = self._calls == self.every
        previous = self.settle()
        t = torch.tensor(mine, dtype=torch.int64)
        self._in_flight = (dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group, async_op=True), t)
        # The first poll waits for its own answer: the Trainer polls once before the first step, so a signal
        # that came during start-up (restore, loader warm-up) stops the run before any step is taken.
        return self.settle() if first_poll else previous

    def settle(self) -> tp.List[int]:
        """Wait for the poll still in flight and return its agreed flags ([0, 0] when none is). The Runner
        calls it after a clean end, so that no collective is pending when the process group goes."""
        if self._in_flight is None:
            return [0, 0]
        work, t = self._in_flight
        self._in_flight = None
        work.wait()
        return [int(v) for v in t.tolist()]


def classify_stop(signum: int, *, elapsed_s: float, time_limit_s: tp.Optional[float], lead_s: float) -> str:
    """Time limit or preemption? Slurm sends the same signals for both, so the clock decides: a signal
    that comes within the warning lead (plus Slurm's up-to-60 s early delivery, plus a margin) of the time
    limit is the time limit; anything earlier is a preemption."""
    if time_limit_s is not None and elapsed_s >= time_limit_s - lead_s - 90.0:
        return StopCause.TIME_LIMIT
    return StopCause.PREEMPTION


# Exceptions that mean "another rank or its node went away", not "the user's code is wrong": what gloo,
# NCCL and the c10d store raise when a peer's process dies or its connection drops.
_PEER_FAILURE_TYPES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"})
_PEER_FAILURE_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket timeout",
    "timed out",
    "nccl communicator was aborted",
    "ncclremoteerror",
    "no route to host",
)


def is_peer_failure(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) says a peer rank or its node failed."""
    seen: tp.Set[int] = set()
    e: tp.Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ in _PEER_FAILURE_TYPES:
            return True
        text = str(e).lower()
        if isinstance(e, (RuntimeError, OSError)) and any(t in text for t in _PEER_FAILURE_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def classify_end(
    *,
    signum: tp.Optional[int],
    error: tp.Optional[BaseException],
    peer_errors: tp.Sequence[str] = (),
    slurm_state: str = "",
    elapsed_s: float,
    time_limit_s: tp.Optional[float],
    lead_s: float,
) -> str:
    """How this attempt ended, from what rank 0 knows: the agreed stop signal (or None), its own
    exception (or None), the causes the other ranks recorded (``peer_errors``) and Slurm's job state.

    * An exception: a user error unless it is a peer failure *and* no rank recorded a user error (a
      rank whose own code raised makes the others fail in their next collective: that is the user's).
    * A stop: SIGTERM while Slurm says the job is being cancelled is ``scancel``; a SIGTERM at the time
      limit's final notice is the time limit; anything else goes by the clock (:func:`classify_stop`).
    * Neither: finished.
    """
    if error is not None:
        # A hang first: the watchdog ends a rank blocked in a collective too, and its peers then see a peer failure.
        if isinstance(error, HangDetected) or (StopCause.HANG in peer_errors and is_peer_failure(error)):
            return StopCause.HANG
        if StopCause.USER_ERROR in peer_errors:
            return StopCause.USER_ERROR
        return StopCause.NODE_FAILURE if is_peer_failure(error) else StopCause.USER_ERROR
    if signum is None:
        return StopCause.FINISHED
    if signum == signal.SIGINT:
        return StopCause.INTERRUPTED
    state = slurm_state.upper()
    if signum == signal.SIGTERM and state in ("CANCELLED", "COMPLETING"):
        return StopCause.CANCELLED
    if signum == signal.SIGTERM and state == "TIMEOUT":
        return StopCause.TIME_LIMIT
    return classify_stop(signum, elapsed_s=elapsed_s, time_limit_s=time_limit_s, lead_s=lead_s)


def requeue_decision(cause: str, *, restarts: int, max_requeues: int, committed_new_step: bool) -> tp.Tuple[bool, str]:
    """Whether to requeue after an end of this ``cause``, and why (one line for the log and ``status``).

    A time limit or a failure that committed no new step would repeat itself: not requeued. A preemption
    is the cluster's doing, not the run's, so it is requeued even without a new step (a job preempted
    again during its start-up); ``max_requeues`` bounds all three."""
    if cause not in StopCause.REQUEUE_ON:
        return False, f"not requeued: the run ended by {cause.replace('_', ' ')}"
    if restarts >= max_requeues:
        return False, f"not requeued: {restarts} requeues used of --max-requeues {max_requeues}"
    if not committed_new_step and cause != StopCause.PREEMPTION:
        return False, (
            f"not requeued: this attempt committed no new checkpoint step, so another attempt would make no "
            f"progress ({cause.replace('_', ' ')}); fix the cause, then resubmit"
        )
    return True, f"requeued after {cause.replace('_', ' ')} ({restarts + 1} of {max_requeues})"
