"""Shared by the fuzz tests: a hard time bound per case."""

from __future__ import annotations

import contextlib
import signal
import typing as tp


class CaseTimeout(Exception):
    """Not an OSError (unlike TimeoutError), so code under test that catches OSError cannot swallow it."""


@contextlib.contextmanager
def bounded(seconds: int) -> tp.Iterator[None]:
    """Raise :class:`CaseTimeout` in the main thread if the block runs longer than ``seconds`` (SIGALRM)."""

    def on_alarm(*_: tp.Any) -> None:
        raise CaseTimeout(f"did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
