"""What to predict for: :class:`Targets` (node counts, batch policy, samples, the cluster's rates and limits).

Checked when made (a bad value is a :class:`~hpctrain.errors.UsageError` naming the field); the CLI takes
GB/s and converts. Stdlib only.
"""

from __future__ import annotations

import typing as tp
from dataclasses import dataclass

from hpctrain._validate import check_int, check_number, usage_error
from hpctrain.errors import UsageError

__all__ = ["Targets", "DEFAULT_NODES"]

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(kw_only=True)
class Targets:
    """What to predict for. Rates are bytes or FLOP per second; the CLI takes GB/s and converts."""

    nodes: tp.Tuple[int, ...] = DEFAULT_NODES
    """Node counts to predict (one table row each)."""
    gpus_per_node: tp.Optional[int] = None
    """Ranks (GPUs) per node; None = the calibration's ranks per node."""
    samples: tp.Optional[float] = None
    """Samples to train on; None = ``epochs`` x the dataset, else the calibration run's own length."""
    epochs: tp.Optional[float] = None
    """Passes over the dataset (its size from the loader's checkpoint record or the data fingerprint)."""
    global_batch: tp.Optional[float] = None
    """Samples per optimizer step over all ranks, kept at every node count (strong scaling); None = the
    calibration's global batch, unless ``local_batch`` is given."""
    local_batch: tp.Optional[float] = None
    """Samples per rank per step, kept at every node count (weak scaling: the global batch grows)."""
    peak_flops: tp.Optional[float] = None
    """Peak FLOP/s of one GPU, for MFU (None: no MFU)."""
    busbw: tp.Optional[float] = None
    """All-reduce bus bandwidth between nodes in bytes/s (nccl-tests' busbw); None = measured."""
    latency_s: tp.Optional[float] = None
    """All-reduce latency per message round in seconds; None = measured (probe) or 0."""
    read_bw: tp.Optional[float] = None
    """The filesystem's aggregate read bandwidth in bytes/s (None: no filesystem bound)."""
    local_read_bw: tp.Optional[float] = None
    """A node's read rate from its node-local storage in bytes/s, for when staging pays off (None: a staged
    calibration's measured rate, else the node's measured read rate)."""
    write_bw: tp.Optional[float] = None
    """The filesystem's aggregate write bandwidth in bytes/s (None: saves as fast as measured)."""
    mtbf_node_hours: tp.Optional[float] = None
    """Hours between unplanned failures of one node; None = ``failure_rate``, else the default."""
    failure_rate: tp.Optional[float] = None
    """Unplanned failures per 1000 node-days (Kokolis et al.'s r_f); the default is RSC-1's 6.50."""
    time_limit_s: tp.Optional[float] = None
    """The partition's time limit per job; None = no limit (a calibration's own ``--time`` is not used)."""
    queue_wait_s: tp.Optional[float] = None
    """Queue wait per job and per requeue; None = measured down time between attempts, else 0."""

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, (tuple, list)) or not self.nodes:
            raise usage_error(self, "nodes", self.nodes, "must be a non-empty tuple of node counts")
        for n in self.nodes:
            check_int(self, "nodes", n, min=1, max=10_000_000)
        self.nodes = tuple(self.nodes)
        check_int(self, "gpus_per_node", self.gpus_per_node, min=1, max=1024, none_ok=True)
        for name in ("samples", "epochs", "global_batch", "local_batch", "peak_flops", "busbw"):
            check_number(self, name, getattr(self, name), above=0, none_ok=True)
        for name in ("read_bw", "local_read_bw", "write_bw", "mtbf_node_hours", "failure_rate", "time_limit_s"):
            check_number(self, name, getattr(self, name), above=0, none_ok=True)
        check_number(self, "latency_s", self.latency_s, min=0, none_ok=True)
        check_number(self, "queue_wait_s", self.queue_wait_s, min=0, none_ok=True)
        for a, b in (("samples", "epochs"), ("global_batch", "local_batch"), ("mtbf_node_hours", "failure_rate")):
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise UsageError(f"Targets: give {a} or {b}, not both")
