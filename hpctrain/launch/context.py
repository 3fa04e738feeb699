"""The public contract between hpctrain and a training entry point: ``entry(ctx: RunContext)``.

hpctrain initialises the default process group *before* calling the entry and destroys it after
the entry returns, so the entry can call collectives and wrap models in DDP at once. Fields are only
ever added, never renamed or removed (the contract is documented in docs/submit.md).
"""

from __future__ import annotations

import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.runtime.env import DistEnv

__all__ = ["RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext(DistEnv):
    """Where this task stands in the run. One per process.

    Inherits every :class:`~hpctrain.runtime.env.DistEnv` field: ``rank``, ``local_rank``,
    ``world_size``, ``local_world_size``, ``node_rank``, ``num_nodes``, ``master_addr``,
    ``master_port``, ``job_id``, ``restart_count``, ``hostnames``, ``launcher``.
    """

    run_dir: Path
    """The run directory shared by all nodes: write outputs, checkpoints and records under it."""
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
