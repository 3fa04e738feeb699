"""Per-rank sharded checkpoints with a two-phase commit, verified restore, async save and retention.

Importing ``hpctrain.ckpt`` is cheap: the torch-based :class:`Checkpointer` loads on first use, so
the login-node CLI (``python -m hpctrain ckpt ls|verify|gc|digest``) never imports torch.
"""

from __future__ import annotations

import typing as tp

__all__ = ["CheckpointConfig", "Checkpointer", "RestoreResult"]

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.ckpt.checkpointer import CheckpointConfig, Checkpointer, RestoreResult


def __getattr__(name: str) -> tp.Any:
    if name in __all__:
        from hpctrain.ckpt import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module 'hpctrain.ckpt' has no attribute {name!r}")
