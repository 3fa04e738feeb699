"""``--follow``: stream the rank-0 log with a live status line until the job ends.

The scheduler is asked at most once per :func:`poll_interval` (``HPCTRAIN_POLL_S``, default
:data:`hpctrain.defaults.DEFAULT_POLL_S`, doubled while the job pends, up to :data:`PENDING_MAX_S`):
:class:`PollSchedule` decides when. The log tail and what the run directory says (the newest interval's step
and loss) are read every :data:`TICK_S` in between, from the file system, never from Slurm.
"""

from __future__ import annotations

import math
import os
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._slurm import JobState
from hpctrain.defaults import DEFAULT_POLL_S

__all__ = ["LogTail", "PollSchedule", "poll_interval", "follow", "POLL_ENV", "PENDING_MAX_S", "TICK_S"]

POLL_ENV = "HPCTRAIN_POLL_S"
"""The environment variable that replaces :data:`~hpctrain.defaults.DEFAULT_POLL_S` (seconds, >= 0)."""
PENDING_MAX_S = 60.0
"""The longest wait between two polls of a pending job (the back-off doubles up to here)."""
TICK_S = 1.0
"""How often the log tail and the run directory are read (local files: no load on the scheduler)."""
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})


def poll_interval(environ: tp.Optional[tp.Mapping[str, str]] = None) -> float:
    """Seconds between two polls of the scheduler: ``$HPCTRAIN_POLL_S`` when it is a finite number >= 0, else
    :data:`~hpctrain.defaults.DEFAULT_POLL_S` (a bad value is one warning line, not a failure: the job is
    submitted already when this is read)."""
    text = (os.environ if environ is None else environ).get(POLL_ENV, "").strip()
    if not text:
        return DEFAULT_POLL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        print(
            f"hpctrain: warning: {POLL_ENV}={text[:40]!r} is not a number of seconds >= 0; polling every "
            f"{DEFAULT_POLL_S:g} s",
            file=sys.stderr,
        )
        return DEFAULT_POLL_S
    return value


class PollSchedule:
    """When to ask the scheduler again: every ``every_s`` while the job runs; while it pends, twice as long after
    each pending answer, up to ``max(PENDING_MAX_S, every_s)`` (a job waiting for hours is not asked each 10 s);
    back to ``every_s`` once it runs. ``due(now)`` says whether to poll, ``polled(now, state)`` records it."""

    def __init__(self, every_s: float, pending_max_s: float = PENDING_MAX_S) -> None:
        self.every_s = max(0.0, float(every_s))
        self.pending_max_s = max(self.every_s, pending_max_s)
        self.wait_s = self.every_s
        self.next_at = -math.inf
        self.polls = 0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def polled(self, now: float, state: str) -> None:
        self.polls += 1
        if state in PENDING_STATES:
            self.wait_s = self.every_s if self.polls == 1 else min(self.wait_s * 2, self.pending_max_s)
        else:
            self.wait_s = self.every_s
        self.next_at = now + self.wait_s

    def until_next(self, now: float) -> float:
        return max(0.0, self.next_at - now)


class _RunProgress:
    """The newest interval record of the run's metrics (step, total, loss), re-read only when the file grew."""

    TAIL_BYTES = 16 * 1024

    def __init__(self, run_dir: tp.Optional[Path]) -> None:
        from hpctrain.rundir import RunDir

        self.metrics = RunDir(run_dir).metrics if run_dir is not None else None
        self._seen: tp.Optional[tp.Tuple[int, int]] = None
        self.text = ""

    def read(self) -> str:
        if self.metrics is None:
            return ""
        try:
            st = os.stat(self.metrics)
        except (OSError, ValueError):
            return self.text
        if (st.st_size, st.st_mtime_ns) == self._seen:
            return self.text
        self._seen = (st.st_size, st.st_mtime_ns)
        from hpctrain._human import fmt_num
        from hpctrain.rundir import read_jsonl

        records, _ = read_jsonl(self.metrics, tail_bytes=self.TAIL_BYTES)
        last = next((r for r in reversed(records) if r.get("kind") == "interval"), None)
        if last is not None:
            step, total = last.get("step"), last.get("total_steps")
            self.text = f"step {step if isinstance(step, int) else '?'}/{total if isinstance(total, int) else '?'}"
            self.text += f" · loss {fmt_num(last.get('loss'), 4)}"
        return self.text


def _run_dir_of(log_path: Path) -> tp.Optional[Path]:
    """The run directory of a log in its ``logs/`` folder (``RUN_DIR/logs/<job>_<rank>_log.out``)."""
    from hpctrain.rundir import RunDir

    parent = Path(log_path).parent
    return parent.parent if parent.name == RunDir.LOGS else None


class LogTail:
    """Read what was appended to a file since the last call (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = ""

    def read_lines(self) -> tp.List[str]:
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for its newline
        return lines

    def flush(self) -> tp.List[str]:
        rest, self._partial = self._partial, ""
        return [rest] if rest else []


def follow(
    job_id: str,
    log_path: Path,
    state_fn: tp.Callable[[], JobState],
    *,
    poll_s: tp.Optional[float] = None,
    tick_s: float = TICK_S,
    run_dir: tp.Optional[Path] = None,
    console: tp.Any = None,
    clock: tp.Callable[[], float] = time.monotonic,
    sleep: tp.Callable[[float], None] = time.sleep,
) -> JobState:
    """Print new lines of ``log_path`` and a live status until ``state_fn()`` is terminal; returns it.

    ``state_fn`` (the scheduler) is called at most once per ``poll_s`` (default :func:`poll_interval`; while
    pending with the :class:`PollSchedule` back-off); the log and the run directory's progress (``run_dir``,
    default the folder above the log's ``logs/``) every ``tick_s``."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = console or Console(stderr=False)
    tail = LogTail(log_path)
    schedule = PollSchedule(poll_interval() if poll_s is None else poll_s)
    progress = _RunProgress(run_dir if run_dir is not None else _run_dir_of(log_path))
    start = clock()
    state = JobState("UNKNOWN", "", "", "")

    def status() -> Text:
        where = f" on {state.nodes}" if state.nodes else ""
        seen = progress.read()
        return Text(
            f"job {job_id}: {state.state}{where} · {state.elapsed or '0:00'} · "
            + (f"{seen} · " if seen else "")
            + f"{clock() - start:.0f}s following {log_path.name}",
            style="bold cyan",
        )

    with Live(status(), console=console, refresh_per_second=4, transient=True) as live:
        while True:
            if schedule.due(clock()):
                state = state_fn()
                schedule.polled(clock(), state.state)
            for line in tail.read_lines():
                console.print(line, markup=False, highlight=False)
            live.update(status())
            if state.terminal:
                for line in tail.read_lines() + tail.flush():
                    console.print(line, markup=False, highlight=False)
                break
            sleep(min(tick_s, schedule.until_next(clock())))
    return state
