"""Committed checkpoints for the tests of other packages, written without torch (as on a login node).

The checkpoint format's names (step directories, shard files, the commit manifest) belong to ``hpctrain.ckpt``;
this module is the one place outside it that spells them, so a test of another package writes a fixture through
:func:`commit` and reads it back through the public readers (:func:`hpctrain.ckpt.committed`,
:func:`hpctrain.ckpt.manifest_sha256`, ...), never through ``hpctrain.ckpt._format``.
"""

from __future__ import annotations

import json
import typing as tp
from pathlib import Path

from hpctrain.ckpt._format import MANIFEST, shard_name, step_name

__all__ = ["commit", "step_dir"]


def step_dir(ckpt_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lies in ``ckpt_dir``."""
    return Path(ckpt_dir) / step_name(step)


def commit(ckpt_dir: Path, step: int, world: int = 1, **fields: tp.Any) -> Path:
    """A committed checkpoint as far as the login-side readers can tell: a valid commit manifest (commit time
    1.0, ``fields`` added to it) naming ``world`` empty shards, which are not written. Its step directory."""
    d = step_dir(ckpt_dir, step)
    d.mkdir(parents=True)
    shards = [{"file": shard_name(r, world), "bytes": 0, "crc32": 0} for r in range(world)]
    manifest = {"format": "hpctrain-ckpt", "format_version": 1, "step": step, "world_size": world, "shards": shards}
    (d / MANIFEST).write_text(json.dumps({**manifest, "time": 1.0, **fields}))
    return d
