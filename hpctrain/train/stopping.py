"""How the Trainer stops: which hook it polls where, and what happens to an in-flight save at a stop.

Every rank must stop at the same step, or the ones that go on wait forever in their next collective. Two
kinds of hook get there differently (docs/train.md, "Stopping"):

* a **collective** hook (``RunContext.should_stop``, marked ``collective``) agrees across ranks by itself,
  so the loop polls it at points every rank reaches: after every step, before the first one, and at the
  evaluation batches every rank holds;
* any other hook is **local** to its rank: its answer travels in the collective of each log interval
  (``MetricsRecorder.flush(stop=...)``), so one rank's request stops all of them at the same step.

The few decisions the ranks must take together besides (how many eval batches to poll at; abandon an
in-flight save or not) go through the run context's ``agree``; a context without one (a test, a loop
outside a Runner) decides locally, as a single rank would.
"""

from __future__ import annotations

import inspect
import typing as tp

__all__ = ["StopSignal", "Stopping", "as_hook"]


class StopSignal:
    """A local stop request (``Trainer(should_stop=...)`` or your own loop).

    ``request()`` may be called from a signal handler or another thread. A hook like this one is local to
    its rank, so the Trainer agrees on it in the collective of each log interval (any rank's request stops
    all of them at the same step, up to ``log_every`` steps later), saves a checkpoint and returns. The
    Runner's ``ctx.should_stop`` is collective itself and is polled after every step instead.
    """

    def __init__(self) -> None:
        self._requested = False

    def request(self) -> None:
        self._requested = True

    def __call__(self, step: tp.Optional[int] = None) -> bool:
        return self._requested


def as_hook(fn: tp.Optional[tp.Callable[..., bool]]) -> tp.Optional[tp.Callable[[int], bool]]:
    """``fn(step)`` or ``fn()`` as ``hook(step)`` (``StopAgreement.should_stop`` takes the step), keeping
    ``fn``'s ``collective`` mark: a marked hook agrees across ranks by itself and is polled every step and in
    evaluation; any other is agreed at log intervals."""
    if fn is None:
        return None
    try:
        takes_step = any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            for p in inspect.signature(fn).parameters.values()
        )
    except (TypeError, ValueError):
        takes_step = False
    hook = (lambda step: bool(fn(step))) if takes_step else (lambda step: bool(fn()))
    hook.collective = bool(getattr(fn, "collective", False))  # type: ignore[attr-defined]
    return hook


class Stopping:
    """The Trainer's stop policy for one run context: ``Stopping(ctx, should_stop)``.

    ``should_stop`` defaults to ``ctx.should_stop`` when the context has one. Every method that polls or
    agrees is called by every rank at the same point.
    """

    def __init__(self, ctx: tp.Any, should_stop: tp.Optional[tp.Callable[..., bool]] = None) -> None:
        ctx_stop = getattr(ctx, "should_stop", None)  # a duck-typed context may lack any of these three
        self.hook = as_hook(should_stop or (ctx_stop if callable(ctx_stop) else None))
        self.collective = bool(getattr(self.hook, "collective", False))
        agree = getattr(ctx, "agree", None)
        self._agree: tp.Optional[tp.Callable[[int, str], int]] = agree if callable(agree) else None
        time_left = getattr(ctx, "stop_time_left", None)
        self._time_left: tp.Optional[tp.Callable[[], tp.Optional[float]]] = time_left if callable(time_left) else None

    def poll(self, step: int) -> bool:
        """The collective hook's answer (False with a local hook or none). Only where every rank polls."""
        return self.hook is not None and self.collective and self.hook(step)

    def local(self, step: int) -> bool:
        """A local hook's answer, for the log interval's collective (False with a collective hook or none)."""
        return self.hook is not None and not self.collective and self.hook(step)

    def agree(self, value: int, op: str) -> int:
        """``max`` or ``min`` of ``value`` over the ranks (``ctx.agree``); ``value`` without an agreement."""
        return int(self._agree(value, op)) if self._agree is not None else int(value)

    def eval_polls(self, batches: int) -> int:
        """How many of this evaluation's batches to poll the collective hook at: the fewest any rank holds
        (ranks may hold different numbers of eval batches, and a collective poll that one rank skips hangs
        the others). 0, and no collective, without a collective hook."""
        return self.agree(batches, "min") if self.collective else 0

    def settle_in_flight(
        self, ckpt: tp.Any, *, last_save_s: tp.Optional[float], step_s: tp.Optional[float]
    ) -> tp.Tuple[bool, tp.Optional[str]]:
        """At an agreed stop, before the stop save: finish the in-flight async save when the time left
        (``ctx.stop_time_left()``) covers it and the stop save, else abandon it uncommitted so that the stop
        save gets the disk. ``abandon`` is collective, so every rank decides the same: any rank short of
        time decides for all. Returns (whether a save was dropped uncommitted, a line for the display when
        time was short)."""
        left = self._time_left() if self._time_left is not None else None
        need = 2 * (last_save_s or 0.0) + (step_s or 0.0)
        short = self.agree(int(left is not None and left < need + 5.0), "max")
        if not short:
            ckpt.wait()
            return False, None
        dropped = bool(ckpt.abandon())
        return dropped, (
            f"hpctrain.train: {'abandoned' if dropped else 'finished'} the in-flight save "
            f"({left if left is not None else float('nan'):.0f}s left, a save takes {need:.1f}s)"
        )
