"""Which node each rank is on, its partner, and where a node keeps its local copies (pure stdlib).

Nodes come from the ranks' host names (gathered once): node ``n`` is the n-th distinct host in rank order,
whatever the launcher. :data:`SIM_NODES_ENV` is the one override, for single-machine tests: with it set to
``K``, ranks ``[nK, (n+1)K)`` form simulated node ``n``, each with its own local directory
(``<local root>/node-<n>``), so that a test can wipe one "node".
"""

from __future__ import annotations

import hashlib
import os
import socket
import typing as tp
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOST_FIELD", "SIM_NODES_ENV", "Nodes", "layout", "base_dir", "tier_key"]

HOST_FIELD = "{host}"
"""In ``CheckpointConfig.local_dir``: replaced by the node's host name."""
SIM_NODES_ENV = "HPCTRAIN_CKPT_SIM_RANKS_PER_NODE"
"""Tests only: ranks per simulated node on one machine (each simulated node gets its own local directory)."""


@dataclass(frozen=True)
class Nodes:
    node_of: tp.Tuple[int, ...]
    """The node index of every rank."""
    simulated: bool
    host_of: tp.Tuple[str, ...] = ()
    """The host name of every rank (``sim-node-<n>`` on a simulated node): which node wrote a shard, so that a
    restore can tell a node's own copy from a partner's."""

    @property
    def count(self) -> int:
        return max(self.node_of) + 1 if self.node_of else 1

    def ranks(self, node: int) -> tp.List[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def leader(self, node: int) -> int:
        """The lowest rank of ``node``: the one that publishes the node's local step directory."""
        return self.ranks(node)[0]

    def partner(self, rank: int) -> tp.Optional[int]:
        """The rank that holds ``rank``'s replica: the same local index on the previous node (ring by node; the
        last local index there when that node has fewer ranks); None on a single node (no replica). Previous,
        not next: a node then holds the next node's shards, and a restore's share of the bytes (cut at aligned
        offsets, at or past each shard's end) crosses from a node's last rank into the next node's first shard,
        so that a healthy restore sends no shard between nodes."""
        if self.count < 2:
            return None
        node = self.node_of[rank]
        mine = self.ranks(node)
        there = self.ranks((node - 1) % self.count)
        return there[min(mine.index(rank), len(there) - 1)]

    def replicas_of(self, rank: int) -> tp.List[int]:
        """The ranks whose shard ``rank`` holds as their partner."""
        return [r for r in range(len(self.node_of)) if self.partner(r) == rank]


def layout(rank: int, hosts: tp.Sequence[str]) -> Nodes:
    """The node layout from every rank's host name (``hosts[r]``), or the simulated one (:data:`SIM_NODES_ENV`)."""
    sim = os.environ.get(SIM_NODES_ENV, "")
    if sim:
        k = max(1, int(sim))
        node_of = tuple(r // k for r in range(len(hosts)))
        return Nodes(node_of, True, tuple(f"sim-node-{n}" for n in node_of))
    order: tp.Dict[str, int] = {}
    for h in hosts:
        order.setdefault(h, len(order))
    return Nodes(tuple(order[h] for h in hosts), False, tuple(hosts))


def base_dir(configured: tp.Optional[tp.Union[str, os.PathLike]], nodes: Nodes, rank: int) -> Path:
    """This rank's node-local root: the configured ``local_dir`` (``{host}`` in it: this node's host name), else
    ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``; ``node-<n>`` inside it on a simulated node."""
    path = os.fspath(configured) if configured else ""
    if HOST_FIELD in path:
        path = path.replace(HOST_FIELD, nodes.host_of[rank] if nodes.host_of else socket.gethostname())
    root = Path(path or os.environ.get("SLURM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp")
    return root / f"node-{nodes.node_of[rank]}" if nodes.simulated else root


def tier_key(global_dir: tp.Union[str, os.PathLike], identity: str) -> str:
    """The local tier's directory name: a hash of the global checkpoint directory and the run identity, so that
    a node's copies of another run or another checkpoint directory are never seen (a requeue, or a new
    submission of the same run resuming the same directory, finds them)."""
    real = os.path.realpath(os.fspath(global_dir))
    return "hpctrain-local-" + hashlib.sha256(f"{real}\0{identity}".encode()).hexdigest()[:16]
