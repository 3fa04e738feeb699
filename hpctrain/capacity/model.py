"""The capacity model's arithmetic: one small function per formula, no I/O, standard library only.

Units: seconds, bytes, bytes per second, samples. ``n`` is a number of ranks (GPUs, or processes on a CPU
job), ``nodes`` a number of nodes. Sources (docs/capacity.md has the derivations and the checks):

* all-reduce: the bus-bandwidth factor ``2(n-1)/n`` of nccl-tests (doc/PERFORMANCE.md), and the
  latency-bandwidth cost ``2 log2(n) a + 2 (n-1)/n S / B`` of an all-reduce that reaches both lower bounds
  (reduce-scatter by recursive halving, all-gather by recursive doubling: Thakur, Rabenseifner and Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005);
* checkpoint interval: Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
  1974 (``sqrt(2 delta M)``); Daly, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), 2006 (the perturbation form);
* effective training time ratio: Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
  Research Clusters", HPCA 2025 (arXiv 2410.21680): ``E[ETTR] ~ (1 - (u0 + tau/2)/M) / (1 + delta/tau)``
  with the job's failure rate ``1/M = nodes * r_f``.
"""

from __future__ import annotations

import math
import typing as tp

__all__ = [
    "HOUR",
    "DEFAULT_FAILURES_PER_1000_NODE_DAYS",
    "DEFAULT_MTBF_NODE_HOURS",
    "busbw_factor",
    "busbw_from_time",
    "allreduce_latency_steps",
    "allreduce_seconds",
    "overlap_fraction",
    "exposed_comm_seconds",
    "compute_seconds",
    "read_seconds",
    "data_wait_seconds",
    "throughput",
    "scaling_efficiency",
    "train_seconds",
    "gpu_hours",
    "mtbf_node_hours_from_rate",
    "job_mtbf_seconds",
    "young_interval",
    "daly_interval",
    "ettr",
    "failure_loss_seconds",
    "time_limit_segments",
]

HOUR = 3600.0

DEFAULT_FAILURES_PER_1000_NODE_DAYS = 6.50
"""Unplanned failures per 1000 node-days on Meta's RSC-1 (16k A100, 8 per node; Kokolis et al. 2025), the
worse of the two clusters measured there: the default failure rate when none is given."""

DEFAULT_MTBF_NODE_HOURS = 24.0 * 1000.0 / DEFAULT_FAILURES_PER_1000_NODE_DAYS
"""About 3692 hours between unplanned failures of one node (RSC-1's rate): a 64-node job fails every ~58 h,
a 512-node job every ~7.2 h."""


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor ``2(n-1)/n``: the bytes each rank sends (and receives)
    per byte of the reduced array. 0 for one rank, 1 for two, towards 2 for many."""
    if n < 1:
        raise ValueError(f"busbw_factor: n must be >= 1, got {n}")
    return 2.0 * (n - 1) / n


def busbw_from_time(nbytes: float, n: int, seconds: float) -> float:
    """The bus bandwidth an all-reduce of ``nbytes`` over ``n`` ranks reached in ``seconds`` (nccl-tests:
    ``algbw = S / t``, ``busbw = algbw * 2(n-1)/n``)."""
    return nbytes / seconds * busbw_factor(n)


def allreduce_latency_steps(n: int) -> int:
    """Message rounds of an all-reduce on ``n`` ranks: ``2 ceil(log2 n)`` (recursive halving, then doubling;
    a tree's depth), 0 for one rank. A ring takes ``2(n-1)`` rounds: NCCL picks trees for small messages."""
    if n < 1:
        raise ValueError(f"allreduce_latency_steps: n must be >= 1, got {n}")
    return 2 * math.ceil(math.log2(n)) if n > 1 else 0


def allreduce_seconds(
    nbytes: float, n: int, *, busbw: tp.Optional[float], latency: float = 0.0, base: float = 0.0
) -> float:
    """Time of one all-reduce of ``nbytes`` on ``n`` ranks: ``base + 2 ceil(log2 n) latency + 2(n-1)/n
    nbytes / busbw``. ``busbw`` None (or infinite): the bandwidth term is 0. ``base``: a fixed cost per call
    (what a one-rank "all-reduce" costs)."""
    if n == 1:
        return base
    bandwidth = 0.0 if not busbw or math.isinf(busbw) else busbw_factor(n) * nbytes / busbw
    return base + allreduce_latency_steps(n) * latency + bandwidth


def overlap_fraction(exposed_s: float, allreduce_s: float) -> float:
    """The share of an all-reduce hidden behind compute: ``1 - exposed / all-reduce``, in [0, 1]."""
    if allreduce_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - exposed_s / allreduce_s))


def exposed_comm_seconds(allreduce_s: float, overlap: float) -> float:
    """The communication a step waits for: ``(1 - overlap) * all-reduce``."""
    return (1.0 - overlap) * allreduce_s


def compute_seconds(local_batch: float, per_sample_s: float, per_step_s: float = 0.0) -> float:
    """Forward and backward of one rank's batch: ``per_step + per_sample * local_batch`` (the per-step part
    is what does not shrink with the batch: kernel launches, Python)."""
    return per_step_s + per_sample_s * local_batch


def read_seconds(
    local_batch: float,
    *,
    ranks: int,
    bytes_per_sample: tp.Optional[float] = None,
    loader_samples_per_s: tp.Optional[float] = None,
    fs_read_bw: tp.Optional[float] = None,
) -> float:
    """Time to deliver one step's batches: the slower of one rank's loader (``local_batch /
    loader_samples_per_s``) and the filesystem serving every rank (``ranks * local_batch * bytes_per_sample /
    fs_read_bw``). An unknown rate is no bound (0)."""
    t = 0.0
    if loader_samples_per_s:
        t = local_batch / loader_samples_per_s
    if fs_read_bw and bytes_per_sample:
        t = max(t, ranks * local_batch * bytes_per_sample / fs_read_bw)
    return t


def data_wait_seconds(read_s: float, overlapped_s: float, floor_s: float = 0.0) -> float:
    """What a step waits for its batch: the loader prefetches while the step runs, so only the part of the
    read that is longer than the rest of the step (``overlapped_s``) shows, and never less than the
    hand-over cost measured when nothing waited (``floor_s``)."""
    return max(floor_s, read_s - overlapped_s)


def throughput(local_batch: float, ranks: int, step_s: float) -> float:
    """Samples per second of all ranks."""
    return ranks * local_batch / step_s


def scaling_efficiency(throughput_n: float, nodes: float, throughput_1: float) -> float:
    """``E(N) = thr(N) / (N thr(1))``: 1 when N nodes do N times the work of one."""
    return throughput_n / (nodes * throughput_1)


def train_seconds(samples: float, samples_per_s: float) -> float:
    """Time stepping through ``samples`` at ``samples_per_s`` (no failures, no checkpoints)."""
    return samples / samples_per_s


def gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / HOUR


def mtbf_node_hours_from_rate(failures_per_1000_node_days: float) -> float:
    """Kokolis et al.'s failure rate ``r_f`` (failures per 1000 node-days) as one node's MTBF in hours."""
    return 24.0 * 1000.0 / failures_per_1000_node_days


def job_mtbf_seconds(nodes: int, mtbf_node_hours: float) -> float:
    """A job fails when any of its nodes does: ``M = M_node / nodes`` (``MTTF = 1 / (N r_f)``)."""
    return mtbf_node_hours * HOUR / nodes


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974): the compute time between checkpoints that minimises the expected loss, ``sqrt(2 delta M)``
    (``delta`` the time one checkpoint costs, ``M`` the job's MTBF)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006), the higher-order optimum: for ``delta < 2M``,
    ``sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta``; else ``M``.
    (Daly's own checks: M = 24 h, delta = 5 min -> 117 min; M = 6 h -> 57 min.)"""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def ettr(interval: float, delta: float, mtbf: float, restart: float) -> float:
    """Kokolis et al. (2025), the expected effective training time ratio of a job that checkpoints every
    ``interval`` seconds of training, stalling ``delta`` per checkpoint, failing every ``mtbf`` seconds and
    losing ``restart`` seconds per failure (down time, start-up, restore, queue) besides the half interval
    redone on average: ``(1 - (restart + interval/2) / M) / (1 + delta / interval)``, in [0, 1]."""
    value = (1.0 - (restart + interval / 2.0) / mtbf) / (1.0 + delta / interval)
    return min(1.0, max(0.0, value))


def failure_loss_seconds(interval: float, restart: float) -> float:
    """Expected time one failure costs: the half interval of training redone plus the restart."""
    return interval / 2.0 + restart


def time_limit_segments(run_s: float, time_limit_s: float, per_segment_s: float) -> tp.Optional[int]:
    """Jobs (the first and its requeues) a run of ``run_s`` seconds needs under a partition's time limit,
    when every job spends ``per_segment_s`` starting, restoring and saving at its end; None when a job
    cannot make progress at all (the limit is not longer than that)."""
    usable = time_limit_s - per_segment_s
    if usable <= 0:
        return None
    return max(1, math.ceil(run_s / usable))
