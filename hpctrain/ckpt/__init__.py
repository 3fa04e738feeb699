"""Per-rank sharded checkpoints with a two-phase commit, verified restore, async save and retention.

Importing ``hpctrain.ckpt`` is cheap: the torch-based :class:`Checkpointer` loads on first use, so
the login-node CLI (``python -m hpctrain ckpt ls|verify|gc|digest``) never imports torch.

The login-side readers below are stdlib only (they never import torch), and they are how every other package
reads a checkpoint directory; the private modules (``_reader``, ``_index``, ``_scan``, ``_format``) are this
package's own:

- :func:`scan` -- every entry of a checkpoint directory (:class:`Entry`: committed, incomplete, in-progress ...);
- :func:`committed` -- the committed ones only, ``[]`` for a directory that is missing or unreadable;
- :func:`latest_committed` -- the newest committed one, with its commit time and world size;
- :func:`read_manifest` -- one checkpoint's validated ``MANIFEST.json`` (no shard is read);
- :func:`manifest_sha256` -- the sha256 of that manifest's bytes: the identity of a committed checkpoint;
- :func:`verify` -- everything restore checks (structure and every shard's crc32), the manifest on success;
- :func:`read_index` -- its tensors (dtype, shape, where each piece lies), read from headers, no tensor bytes;
- :func:`digest` -- sha256 per state entry, independent of the world size that wrote it.

Every reader raises :class:`hpctrain.errors.CheckpointFormatError` naming what is wrong with a damaged checkpoint.
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from hpctrain.ckpt.config import RESTORE_TIERS, CheckpointConfig
from hpctrain.ckpt.metering import RESTORE_PHASES, digest, meters, replicated_share

__all__ = [
    "CheckpointConfig",
    "RESTORE_TIERS",
    "Checkpointer",
    "RestoreResult",
    "Entry",
    "scan",
    "committed",
    "latest_committed",
    "read_manifest",
    "manifest_sha256",
    "verify",
    "read_index",
    "meters",
    "RESTORE_PHASES",
    "digest",
    "replicated_share",
]

PathLike = tp.Union[str, os.PathLike]


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
    from hpctrain.ckpt._index import Index
    from hpctrain.ckpt._scan import Entry
    from hpctrain.ckpt.checkpointer import Checkpointer, RestoreResult


# ---------------------------------------------------------------------------------------------- login side
def scan(dir: PathLike) -> tp.List["Entry"]:
    """Every entry of the checkpoint directory ``dir``, oldest step first: an :class:`Entry` each (``name``,
    ``step``, ``status``, ``path``, ``manifest`` when committed, ``error``, ``bytes``, ``mtime``). ``status`` is
    ``committed`` (a valid manifest), ``incomplete``, ``in-progress``, ``abandoned``, ``replaced``, ``quarantined``
    or ``deleting``. Raises OSError for a directory that cannot be listed. Stdlib only."""
    from hpctrain.ckpt._scan import scan as _scan_dir

    return _scan_dir(dir)


def committed(dir: PathLike) -> tp.List["Entry"]:
    """The committed checkpoints of ``dir`` (:func:`scan`'s entries with a valid manifest, oldest first); none
    when ``dir`` is not a readable directory. Stdlib only."""
    try:
        if not Path(dir).is_dir():
            return []
        return [e for e in scan(dir) if e.status == "committed"]
    except (OSError, ValueError):  # unreadable, a name too long, a loop: no checkpoint this caller can use
        return []


def latest_committed(dir: PathLike) -> tp.Optional[Committed]:
    """``(step, path)`` of the newest committed checkpoint under ``dir`` (valid manifest), or None, with
    ``.time`` and ``.world_size`` from its manifest. Stdlib only: the launcher and ``status`` ask this."""
    import math

    steps = committed(dir)
    if not steps:
        return None
    newest = steps[-1]
    manifest = newest.manifest or {}
    saved, world = manifest.get("time"), manifest.get("world_size")
    saved = float(saved) if isinstance(saved, (int, float)) and math.isfinite(saved) else None
    world = world if isinstance(world, int) and not isinstance(world, bool) else None
    return Committed(newest.step, newest.path, saved, world)


def read_manifest(step_dir: PathLike) -> tp.Dict[str, tp.Any]:
    """The validated ``MANIFEST.json`` of one checkpoint directory (``.../step-NNNNNNNNN``), read as a bounded
    regular file; no shard is opened. Raises :class:`hpctrain.errors.CheckpointFormatError` naming what is
    wrong (missing: never committed; too large; malformed). Stdlib only."""
    from hpctrain.ckpt._reader import read_manifest as _read

    return _read(step_dir)


def manifest_sha256(step_dir: PathLike) -> str:
    """sha256 of one committed checkpoint's ``MANIFEST.json`` bytes: the identity approvals and bundles record.
    The manifest is validated first (:func:`read_manifest`), then its bytes are hashed through the same bounded,
    regular-file read; raises :class:`hpctrain.errors.CheckpointFormatError` for a damaged one. Stdlib only."""
    import hashlib

    from hpctrain.ckpt._format import MANIFEST
    from hpctrain.ckpt._reader import MAX_MANIFEST_BYTES, open_regular
    from hpctrain.errors import CheckpointFormatError

    read_manifest(step_dir)  # the reader's own checks first: a malformed manifest is no checkpoint
    with open_regular(Path(step_dir) / MANIFEST) as f:
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CheckpointFormatError(f"{Path(step_dir).name}/{MANIFEST}: over the manifest bound")
    return hashlib.sha256(raw).hexdigest()


def verify(
    step_dir: PathLike, *, checksums: bool = True, only: tp.Optional[tp.Sequence[int]] = None
) -> tp.Dict[str, tp.Any]:
    """Everything restore checks of one checkpoint directory: its manifest, every shard's size and header, the
    piece index and state trees, and (``checksums``) the crc32 of every shard (or of the shards ``only``).
    Returns the manifest; raises :class:`hpctrain.errors.CheckpointFormatError` naming the first bad file, the
    same checks ``python -m hpctrain ckpt verify`` runs. Stdlib only."""
    from hpctrain.ckpt._index import verify_dir

    return verify_dir(step_dir, checksums=checksums, only=only)


def read_index(step_dir: PathLike) -> "Index":
    """The structure of one checkpoint directory without its tensor bytes: ``.manifest``, ``.shards`` and
    ``.tensors`` (key such as ``model/w`` -> a record with ``dtype`` and ``shape``), after every check but the
    crc32s (:func:`verify` adds those). Raises :class:`hpctrain.errors.CheckpointFormatError`. Stdlib only."""
    from hpctrain.ckpt._index import build_index

    return build_index(step_dir)


def __getattr__(name: str) -> tp.Any:
    # loaded on first use: the checkpointer imports torch; the scan's record is its reader's
    if name in ("Checkpointer", "RestoreResult"):
        from hpctrain.ckpt import checkpointer

        return getattr(checkpointer, name)
    if name == "Entry":
        from hpctrain.ckpt._scan import Entry

        return Entry
    raise AttributeError(f"module 'hpctrain.ckpt' has no attribute {name!r}")
