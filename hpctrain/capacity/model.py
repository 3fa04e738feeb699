"""The capacity model's arithmetic: one small function per formula, no I/O, standard library only; each
called by the planner's live path (:mod:`hpctrain.capacity.fit`, :mod:`hpctrain.capacity.rows`).

Units: seconds, bytes, bytes per second, samples. ``n`` is a number of ranks (GPUs, or processes on a CPU
job), ``nodes`` a number of nodes. Sources (docs/capacity.md has the derivations and the checks):

* all-reduce: the bus-bandwidth factor ``2(n-1)/n`` of nccl-tests (doc/PERFORMANCE.md), and the
  latency-bandwidth cost ``2 log2(n) a + 2 (n-1)/n S / B`` of an all-reduce that reaches both lower bounds
  (reduce-scatter by recursive halving, all-gather by recursive doubling: Thakur, Rabenseifner and Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005);
* the reliability formulas (MTBF, Young/Daly, ETTR, failure loss) are :mod:`hpctrain.reliability`, shared
  with the Trainer's ``every_minutes="auto"``; the default node MTBF is in :mod:`hpctrain.defaults`.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain.reliability import HOUR

__all__ = [
    "busbw_factor",
    "allreduce_latency_steps",
    "allreduce_seconds",
    "overlap_fraction",
    "compute_seconds",
    "node_bytes_per_step",
    "read_demand",
    "node_read_need",
    "node_read_rate",
    "node_read_seconds",
    "storage_bound",
    "data_wait_seconds",
    "staging_seconds",
    "staging_payoff_steps",
    "throughput",
    "scaling_efficiency",
    "gpu_hours",
    "time_limit_segments",
]


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor ``2(n-1)/n``: the bytes each rank sends (and receives)
    per byte of the reduced array. 0 for one rank, 1 for two, towards 2 for many."""
    if n < 1:
        raise ValueError(f"busbw_factor: n must be >= 1, got {n}")
    return 2.0 * (n - 1) / n


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


def compute_seconds(local_batch: float, per_sample_s: float, per_step_s: float = 0.0) -> float:
    """Forward and backward of one rank's batch: ``per_step + per_sample * local_batch`` (the per-step part
    is what does not shrink with the batch: kernel launches, Python)."""
    return per_step_s + per_sample_s * local_batch


def node_bytes_per_step(local_batch: float, ranks_per_node: float, bytes_per_sample: float) -> float:
    """Bytes one node's loaders read per step: ``ranks per node x local batch x bytes per sample``. Measured:
    bytes per sample (the loader's bytes read / samples delivered, read amplification included) and the ranks
    per node of the calibration; the local batch is the row's. Assumed: every rank reads alike (rank 0's
    loader stands for all)."""
    return ranks_per_node * local_batch * bytes_per_sample


def read_demand(nodes: int, node_bytes: float, step_s: float) -> float:
    """The aggregate read bandwidth ``N`` nodes ask of the shared file system: ``N x bytes per node per step /
    step time`` (bytes/s). ``step_s`` is the predicted step (measured compute and the rest, fitted per node
    count); 0 for a step of no time."""
    return nodes * node_bytes / step_s if step_s > 0 else 0.0


def node_read_need(node_bytes: float, overlapped_s: float) -> float:
    """The read rate a node needs for its reads to hide behind the rest of the step (prefetch): ``bytes per node
    per step / the rest of the step`` (bytes/s; infinite when nothing overlaps). The rest of the step is the
    predicted compute, communication, optimizer and other of that node count."""
    return node_bytes / overlapped_s if overlapped_s > 0 else math.inf


def node_read_rate(
    nodes: int, *, node_rate: tp.Optional[float] = None, aggregate_bw: tp.Optional[float] = None
) -> float:
    """The read rate one node gets at ``N`` nodes: ``min(node rate, aggregate bandwidth / N)`` (bytes/s).
    ``node_rate``: what a node's loaders read when storage does not limit them (measured: reader bytes / reader
    seconds x readers x ranks per node; or a loader-bound calibration's delivered rate). ``aggregate_bw``: the
    file system's aggregate read bandwidth (given, ``--read-bw``). Assumed: the file system shares its bandwidth
    evenly between the nodes and a node's readers do not slow each other. An unknown rate is no bound (inf)."""
    rate = node_rate if node_rate else math.inf
    if aggregate_bw:
        rate = min(rate, aggregate_bw / nodes)
    return rate


def node_read_seconds(node_bytes: float, rate: float) -> float:
    """Time a node's loaders take to read one step's bytes at ``rate``: ``bytes / rate`` (0 at an infinite rate)."""
    return 0.0 if math.isinf(rate) else node_bytes / rate


def storage_bound(nodes: int, aggregate_bw: tp.Optional[float], need: float) -> bool:
    """Storage is the bound at ``N`` nodes when its share of a node, ``aggregate bandwidth / N``, is below what
    the node needs (:func:`node_read_need`). No aggregate bandwidth known: never."""
    return bool(aggregate_bw) and aggregate_bw / nodes < need  # type: ignore[operator]


def staging_seconds(
    dataset_bytes: float,
    nodes: int,
    *,
    copy_rate: tp.Optional[float] = None,
    aggregate_bw: tp.Optional[float] = None,
) -> tp.Optional[float]:
    """What staging costs each node at ``N`` nodes: every node copies the whole input at once, so a node gets
    ``min(copy rate, aggregate bandwidth / N)``: ``dataset bytes / that``. ``copy_rate``: a node's measured copy
    rate (the stage records' bytes copied / copy seconds), else unknown; ``aggregate_bw`` given. None when neither
    rate is known."""
    rate = node_read_rate(nodes, node_rate=copy_rate, aggregate_bw=aggregate_bw)
    return None if math.isinf(rate) else dataset_bytes / rate


def staging_payoff_steps(copy_s: float, saved_per_step_s: float) -> tp.Optional[int]:
    """Steps after which staging has paid for its copy: ``ceil(copy seconds / data wait removed per step)``;
    None when it removes none (it never pays off)."""
    if saved_per_step_s <= 0:
        return None
    return max(1, math.ceil(copy_s / saved_per_step_s))


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


def gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / HOUR


def time_limit_segments(run_s: float, time_limit_s: float, per_segment_s: float) -> tp.Optional[int]:
    """Jobs (the first and its requeues) a run of ``run_s`` seconds needs under a partition's time limit,
    when every job spends ``per_segment_s`` starting, restoring and saving at its end; None when a job
    cannot make progress at all (the limit is not longer than that)."""
    usable = time_limit_s - per_segment_s
    if usable <= 0:
        return None
    return max(1, math.ceil(run_s / usable))
