"""Where one restore's time goes: wall and CPU seconds per phase (``RestoreResult.phases``). Stdlib only.

Phases are disjoint: a phase opened inside another is counted in the inner one only (its time is taken out of
the outer one), so the phases of a restore add up to its time, and ``other`` is what no phase claimed."""

from __future__ import annotations

import time
import typing as tp

from hpctrain.ckpt.metering import RESTORE_PHASES as PHASES

__all__ = ["PhaseClock"]


class PhaseClock:
    """Wall (``perf_counter``) and CPU (``thread_time``: the calling thread's, not gloo's) seconds per phase."""

    __slots__ = ("phases", "_stack", "_t0")

    def __init__(self) -> None:
        self.phases: tp.Dict[str, tp.Dict[str, float]] = {}
        self._stack: tp.List[tp.List[tp.Any]] = []  # open phases: [name, wall0, cpu0, inner wall, inner cpu]
        self._t0 = (time.perf_counter(), time.thread_time())

    def __call__(self, name: str) -> "_Phase":
        assert name in PHASES, name
        return _Phase(self, name)

    def _close(self, frame: tp.List[tp.Any]) -> None:
        name, w0, c0, inner_w, inner_c = frame
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        got = self.phases.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0})
        got["wall_s"] += wall - inner_w
        got["cpu_s"] += cpu - inner_c
        if self._stack:  # the enclosing phase does not count this one's time
            self._stack[-1][3] += wall
            self._stack[-1][4] += cpu

    def result(self) -> tp.Dict[str, tp.Dict[str, float]]:
        """The phases so far in :data:`PHASES` order, with ``other``: the time since this clock was made that no
        phase claimed."""
        wall = time.perf_counter() - self._t0[0]
        cpu = time.thread_time() - self._t0[1]
        out = {n: dict(self.phases[n]) for n in PHASES if n in self.phases}
        out["other"] = {
            "wall_s": max(0.0, wall - sum(p["wall_s"] for p in out.values())),
            "cpu_s": max(0.0, cpu - sum(p["cpu_s"] for p in out.values())),
        }
        return out


class _Phase:
    __slots__ = ("clock", "name")

    def __init__(self, clock: PhaseClock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock._stack.append([self.name, time.perf_counter(), time.thread_time(), 0.0, 0.0])

    def __exit__(self, *exc: tp.Any) -> None:
        self.clock._close(self.clock._stack.pop())
