"""Per-rank sharded checkpoints with a two-phase commit, verified restore, async save and retention.

Importing ``hpctrain.ckpt`` is cheap: the torch-based :class:`Checkpointer` loads on first use, so
the login-node CLI (``python -m hpctrain ckpt ls|verify|gc|digest``) never imports torch.
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from hpctrain.ckpt.config import RESTORE_TIERS, CheckpointConfig
from hpctrain.ckpt.metering import digest, meters, replicated_share

__all__ = [
    "CheckpointConfig",
    "RESTORE_TIERS",
    "Checkpointer",
    "RestoreResult",
    "latest_committed",
    "meters",
    "digest",
    "replicated_share",
]


class Committed(tuple):  # type: ignore[type-arg]
    """``(step, path)`` of a committed checkpoint; ``.time`` (its manifest's commit time, None if not a
    finite number) and ``.world_size`` ride along as attributes, so callers never parse manifests."""

    step: int
    path: Path
    time: tp.Optional[float]
    world_size: tp.Optional[int]

    def __new__(cls, step: int, path: Path, time: tp.Optional[float], world_size: tp.Optional[int]) -> "Committed":
        self = super().__new__(cls, (step, path))
        self.step, self.path, self.time, self.world_size = step, path, time, world_size
        return self


if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.ckpt.checkpointer import Checkpointer, RestoreResult


def latest_committed(dir: tp.Union[str, os.PathLike]) -> tp.Optional[Committed]:
    """``(step, path)`` of the newest committed checkpoint under ``dir`` (valid manifest), or None, with
    ``.time`` and ``.world_size`` from its manifest. Stdlib only: the launcher and ``status`` ask this."""
    import math

    from hpctrain.ckpt._scan import scan

    try:
        if not Path(dir).is_dir():
            return None
        committed = [e for e in scan(dir) if e.status == "committed"]
    except (OSError, ValueError):  # unreadable, a name too long, a loop: no checkpoint this caller can use
        return None
    if not committed:
        return None
    newest = committed[-1]
    manifest = newest.manifest or {}
    saved, world = manifest.get("time"), manifest.get("world_size")
    saved = float(saved) if isinstance(saved, (int, float)) and math.isfinite(saved) else None
    world = world if isinstance(world, int) and not isinstance(world, bool) else None
    return Committed(newest.step, newest.path, saved, world)


def __getattr__(name: str) -> tp.Any:
    if name in __all__:
        from hpctrain.ckpt import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module 'hpctrain.ckpt' has no attribute {name!r}")
