"""``--follow``: stream the rank-0 log with a live status line until the job ends."""

from __future__ import annotations

import time
import typing as tp
from pathlib import Path

from hpctrain._slurm import JobState

__all__ = ["LogTail", "follow"]


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
    poll_s: float = 1.0,
    console: tp.Any = None,
    clock: tp.Callable[[], float] = time.monotonic,
    sleep: tp.Callable[[float], None] = time.sleep,
) -> JobState:
    """Print new lines of ``log_path`` and a live status until ``state_fn()`` is terminal; returns it."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = console or Console(stderr=False)
    tail = LogTail(log_path)
    start = clock()
    state = JobState("UNKNOWN", "", "", "")

    def status() -> Text:
        where = f" on {state.nodes}" if state.nodes else ""
        return Text(
            f"job {job_id}: {state.state}{where} · {state.elapsed or '0:00'} · "
            f"{clock() - start:.0f}s following {log_path.name}",
            style="bold cyan",
        )

    with Live(status(), console=console, refresh_per_second=4, transient=True) as live:
        while True:
            state = state_fn()
            for line in tail.read_lines():
                console.print(line, markup=False, highlight=False)
            live.update(status())
            if state.terminal:
                for line in tail.read_lines() + tail.flush():
                    console.print(line, markup=False, highlight=False)
                break
            sleep(poll_s)
    return state
