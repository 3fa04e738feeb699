"""Per-rank sharded checkpoints with a two-phase commit, verified restore, async save and retention.

Importing ``hpctrain.ckpt`` is cheap: the torch-based :class:`Checkpointer` loads on first use, so
the login-node CLI (``python -m hpctrain ckpt ls|verify|gc|digest``) never imports torch.
"""

from __future__ import annotations

import typing as tp

__all__ = ["CheckpointConfig", "Checkpointer", "RestoreResult", "FAULT_POINTS"]

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.ckpt._commit import FAULT_POINTS
    from hpctrain.ckpt.checkpointer import CheckpointConfig, Checkpointer, RestoreResult


def __getattr__(name: str) -> tp.Any:
    if name in ("CheckpointConfig", "Checkpointer", "RestoreResult"):
        from hpctrain.ckpt import checkpointer

        return getattr(checkpointer, name)
    if name == "FAULT_POINTS":
        from hpctrain.ckpt._commit import FAULT_POINTS

        return FAULT_POINTS
    raise AttributeError(f"module 'hpctrain.ckpt' has no attribute {name!r}")
