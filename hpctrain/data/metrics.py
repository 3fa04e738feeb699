"""Per-step input metrics for the training loop's step-time breakdown (no torch).

``data_wait_s`` is host wall time the consumer spent blocked in ``next(loader)``; ``queue_depth`` is how
many batches were ready at that moment (0 = the step was starved). On a GPU the copy is issued
non-blocking after the wait, so GPU idle caused by input is measured with CUDA events in
``benchmarks/gpu_check_loader.py``.
"""

from __future__ import annotations

import collections
import time
import typing as tp
from dataclasses import asdict, dataclass

__all__ = ["StepMetrics", "LoaderMetrics"]


@dataclass(frozen=True)
class StepMetrics:
    step: int
    """Global batch index within the epoch."""
    data_wait_s: float
    """Seconds ``next()`` blocked waiting for this batch."""
    queue_depth: int
    """Batches already prefetched when ``next()`` was called."""
    samples: int
    """Samples in this rank's batch (padding included)."""
    nbytes: int
    """Bytes in this rank's batch."""


class LoaderMetrics:
    """Running totals plus the last ``history`` steps; ``summary()`` is a JSON-able dict."""

    def __init__(self, history: int = 1024) -> None:
        self.steps: tp.Deque[StepMetrics] = collections.deque(maxlen=history)
        self.reset()

    def reset(self) -> None:
        self.steps.clear()
        self.t0: tp.Optional[float] = None
        self.t_last = 0.0
        self.total_wait_s = 0.0
        self.total_samples = 0
        self.total_bytes = 0
        self.bytes_read = 0
        self.read_s = 0.0
        self.num_steps = 0
        self._depth_sum = 0
        self._mark = (0, 0, 0, 0, 0.0, 0.0)

    @property
    def last(self) -> tp.Optional[StepMetrics]:
        return self.steps[-1] if self.steps else None

    def start(self) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def record(self, m: StepMetrics) -> None:
        self.steps.append(m)
        self.num_steps += 1
        self.total_wait_s += m.data_wait_s
        self.total_samples += m.samples
        self.total_bytes += m.nbytes
        self._depth_sum += m.queue_depth
        self.t_last = time.perf_counter()

    def add_read(self, nbytes: int, seconds: float) -> None:
        self.bytes_read += nbytes
        self.read_s += seconds

    def interval(self, readers: int = 1) -> tp.Dict[str, tp.Any]:
        """What this loader did since the previous call (JSON-able; the Trainer's interval records carry it as
        ``input``, the capacity planner reads it): ``steps``, ``samples`` and ``bytes`` delivered, ``bytes_read``
        by the readers (decoded size), ``read_s`` (reader seconds, summed over ``readers`` that read in
        parallel: worker processes, or 1 inline) and ``wait_s`` (the consumer blocked)."""
        now = (self.num_steps, self.total_samples, self.total_bytes, self.bytes_read, self.read_s, self.total_wait_s)
        d = [a - b for a, b in zip(now, self._mark)]
        self._mark = now
        return {
            "steps": int(d[0]),
            "samples": int(d[1]),
            "bytes": int(d[2]),
            "bytes_read": int(d[3]),
            "read_s": float(d[4]),
            "wait_s": float(d[5]),
            "readers": int(readers),
        }

    def summary(self) -> tp.Dict[str, tp.Any]:
        elapsed = (self.t_last - self.t0) if self.t0 is not None else 0.0
        return {
            "steps": self.num_steps,
            "elapsed_s": elapsed,
            "samples_per_s": self.total_samples / elapsed if elapsed > 0 else 0.0,
            "bytes_per_s": self.total_bytes / elapsed if elapsed > 0 else 0.0,
            "data_wait_s": self.total_wait_s,
            "data_wait_frac": self.total_wait_s / elapsed if elapsed > 0 else 0.0,
            "mean_queue_depth": self._depth_sum / self.num_steps if self.num_steps else 0.0,
            "read_amplification": self.bytes_read / self.total_bytes if self.total_bytes else 0.0,
            "worker_read_s": self.read_s,
            "last": asdict(self.last) if self.last else None,
        }
