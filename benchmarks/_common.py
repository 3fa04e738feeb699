"""What every benchmark here shares: where the repository is, the environment its child processes get,
and how a whole command is timed (median of repeats: the machines are noisy, so the benchmarks print
ratios of medians measured in the same run)."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
import typing as tp
from pathlib import Path

__all__ = ["ROOT", "ENV", "wall"]

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR")


def wall(argv: tp.Sequence[str], repeats: int, env: tp.Optional[tp.Mapping[str, str]] = None) -> float:
    """Median wall-clock seconds of running ``argv`` to completion ``repeats`` times (it must exit 0)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(list(argv), cwd=ROOT, env=dict(env or ENV), check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
