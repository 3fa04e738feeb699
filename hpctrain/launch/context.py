"""The public contract between hpctrain and a training entry point: ``entry(ctx: RunContext)``.

hpctrain initialises the default process group *before* calling the entry and destroys it after
the entry returns, so the entry can call collectives and wrap models in DDP at once. Fields are only
ever added, never renamed or removed (the contract is documented in docs/submit.md).
"""

from __future__ import annotations

import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Where this task stands in the run. One per process."""

    rank: int
    """Global rank, 0 .. world_size-1."""
    local_rank: int
    """Rank among the tasks on this node; the GPU index on GPU jobs."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node in the job's node list."""
    num_nodes: int
    """Number of nodes in the job."""
    master_addr: str
    """Rendezvous host (the first node of the job)."""
    master_port: int
    """Rendezvous port (derived from the job id)."""
    run_dir: Path
    """The run directory shared by all nodes: write outputs, checkpoints and records under it."""
    restart_count: int
    """0 on the first run; 1, 2, ... after each Slurm requeue (preemption, time limit)."""
    job_id: str
    """Slurm job id ('' when run without a scheduler)."""
    device: tp.Any
    """``torch.device``: ``cuda:<local_rank>`` on GPU jobs, ``cpu`` otherwise."""
    backend: str
    """The process group's backend: 'nccl' or 'gloo'."""
    hostname: str
    """This node's host name."""
    args: tp.Tuple[str, ...] = field(default=())
    """The entry's own arguments (what followed ``--`` on the submit command line)."""

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes shared records and logs summaries."""
        return self.rank == 0
