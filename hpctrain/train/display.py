"""Rank 0's view of training: one line per log interval (a live-updating line on a terminal).

Slurm logs are files, not terminals: there each interval prints one plain line, so the log stays
readable with ``tail -f`` and ``--follow``. Other ranks never print.
"""

from __future__ import annotations

import typing as tp

from hpctrain._human import fmt_duration, fmt_num

__all__ = ["IntervalDisplay", "interval_line"]


def interval_line(rec: tp.Mapping[str, tp.Any]) -> str:
    """``step 120/400 · loss 2.3012 · 5.12k samples/s · ETA 1 min 23 s · data wait 3.2% · ckpt @100``"""
    parts = [
        f"step {rec['step']}/{rec['total_steps']}",
        f"loss {rec['loss']:.4f}",
        f"{fmt_num(rec.get('samples_per_s'))} samples/s",
        f"ETA {fmt_duration(rec.get('eta_s'))}",
    ]
    if rec.get("data_wait_frac") is not None:
        parts.append(f"data wait {100 * rec['data_wait_frac']:.1f}%")
    if rec.get("slowest_rank") is not None and rec.get("world_size", 1) > 1:
        parts.append(f"slowest rank {rec['slowest_rank']}")
    if rec.get("mfu") is not None:
        parts.append(f"MFU {100 * rec['mfu']:.1f}%")
    ckpt = rec.get("last_checkpoint_step")
    parts.append(f"ckpt @{ckpt}" if ckpt is not None else "no ckpt yet")
    return " · ".join(parts)


class IntervalDisplay:
    """Print (rank 0) each interval record; on a terminal a rich Live line replaces the previous one."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._console: tp.Any = None
        self._live: tp.Any = None

    def show(self, rec: tp.Mapping[str, tp.Any]) -> None:
        if not self.enabled:
            return
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False)
        line = interval_line(rec)
        if self._console.is_terminal:
            from rich.live import Live
            from rich.text import Text

            if self._live is None:
                self._live = Live(Text(line), console=self._console, auto_refresh=False, transient=False)
                self._live.start()
            self._live.update(Text(line), refresh=True)
        else:
            print(f"hpctrain.train: {line}", flush=True)

    def note(self, text: str) -> None:
        """A line that stays (resume, evaluation, end of training)."""
        if not self.enabled:
            return
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
