"""Multi-level checkpoints (docs/checkpoint.md, "Tiers"): node-local copies with a partner replica on the next
node every few steps, the global (shared filesystem) tier every ``global_every_local_saves``-th of them.

:class:`TieredCheckpointer` has the :class:`~hpctrain.ckpt.Checkpointer` interface (``save`` with a ``tier``,
``restore`` preferring the newest complete local step newer than the newest global commit); the local protocol
and its restore are in :mod:`hpctrain.ckpt.tiers._local`, the node layout and local paths in
:mod:`hpctrain.ckpt.tiers._nodes`. Imports torch (it runs on the nodes, never on the login node).
"""

from hpctrain.ckpt.tiers._local import LOCAL_KEEP, TIER_FAULT_POINTS, LocalCheckpointer
from hpctrain.ckpt.tiers._nodes import SIM_NODES_ENV
from hpctrain.ckpt.tiers.tiered import TIERS, TieredCheckpointer

__all__ = ["TieredCheckpointer", "LocalCheckpointer", "TIERS", "LOCAL_KEEP", "TIER_FAULT_POINTS", "SIM_NODES_ENV"]
