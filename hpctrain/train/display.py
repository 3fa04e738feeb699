"""Rank 0's view of training: one line per log interval (a live-updating line on a terminal).

Slurm logs are files, not terminals: there each interval prints one plain line, so the log stays
readable with ``tail -f`` and ``--follow``. Other ranks never print.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain._files import fmt_bytes  # the house's one size format, shown here too

__all__ = ["IntervalDisplay", "interval_line", "fmt_duration", "fmt_rate", "fmt_bytes"]


def _real(value: tp.Any) -> tp.Optional[float]:
    """``value`` as a finite float; None for None, bools, non-numbers, NaN, infinities and ints beyond floats."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


_LONGEST_S = 360_000_000.0  # 100 000 hours: beyond it a duration is shown as a bound, not 300 digits


def fmt_duration(seconds: tp.Optional[float]) -> str:
    """``H:MM:SS``; negative durations (clock skew) show as 0, anything that is not a finite number as ``?``."""
    value = _real(seconds)
    if value is None:
        return "?"
    if value >= _LONGEST_S:
        return ">100000:00:00"
    total = int(round(max(value, 0.0)))
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def fmt_rate(value: tp.Optional[float]) -> str:
    """``5.1k``, ``3.2G``, ...; anything that is not a finite number as ``?``."""
    rate = _real(value)
    if rate is None:
        return "?"
    if abs(rate) >= 1e21:  # beyond any machine: a short exponent, not a 290-digit number of G
        return f"{rate:.3g}"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(rate) >= div:
            return f"{rate / div:.1f}{suffix}"
    return f"{rate:.1f}"


def interval_line(rec: tp.Mapping[str, tp.Any]) -> str:
    """``step 120/400 · loss 2.3012 · 5.1k samples/s · ETA 0:01:23 · data wait 3.2% · ckpt @100``"""
    parts = [
        f"step {rec['step']}/{rec['total_steps']}",
        f"loss {rec['loss']:.4f}",
        f"{fmt_rate(rec.get('samples_per_s'))} samples/s",
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
