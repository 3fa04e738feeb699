"""Per-rank sharded checkpoints with a two-phase commit, verified restore, async save and retention.

Importing ``hpctrain.ckpt`` is cheap: the torch-based :class:`Checkpointer` loads on first use, so
the login-node CLI (``python -m hpctrain ckpt ls|verify|gc|digest``) never imports torch.
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

__all__ = ["CheckpointConfig", "Checkpointer", "RestoreResult", "latest_committed"]

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.ckpt.checkpointer import CheckpointConfig, Checkpointer, RestoreResult


def latest_committed(dir: tp.Union[str, os.PathLike]) -> tp.Optional[tp.Tuple[int, Path]]:
    """``(step, path)`` of the newest committed checkpoint under ``dir`` (valid manifest), or None. Stdlib only."""
    from hpctrain.ckpt._scan import scan

    if not Path(dir).is_dir():
        return None
    committed = [e for e in scan(dir) if e.status == "committed"]
    return (committed[-1].step, committed[-1].path) if committed else None


def __getattr__(name: str) -> tp.Any:
    if name in __all__:
        from hpctrain.ckpt import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module 'hpctrain.ckpt' has no attribute {name!r}")
