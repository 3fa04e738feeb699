"""The loader's configuration: one frozen, keyword-only dataclass, checked on construction (no torch)."""

from __future__ import annotations

import os
import typing as tp
from dataclasses import asdict, dataclass

from hpctrain.errors import UsageError

__all__ = ["H5DataConfig", "TAIL_POLICIES", "START_METHODS"]

TAIL_POLICIES = ("drop", "pad", "exact")
START_METHODS = ("fork", "spawn", "forkserver")


def _bad(name: str, why: str) -> UsageError:
    return UsageError(f"H5DataConfig.{name} {why}")


@dataclass(frozen=True, kw_only=True, slots=True)
class H5DataConfig:
    """What to read and how. Every field is checked in ``__post_init__``; an error names the field."""

    files: tp.Sequence[str]
    """HDF5 files forming one logical dataset, in this order (sample ids run file by file)."""
    keys: tp.Sequence[str]
    """Dataset paths inside each file (e.g. ``("x", "y")``), all indexed by sample along axis 0."""
    global_batch_size: int
    """Samples per optimizer step summed over all ranks; must be divisible by the world size."""
    seed: int = 0
    """Seed of the per-epoch order; the order of epoch ``e`` depends only on (seed, e, dataset, partitions)."""
    shuffle: bool = True
    """Shuffle: permute chunks, then samples within a window of ``window_chunks`` chunks. False = file order."""
    window_chunks: int = 16
    """Chunks (read blocks) mixed together by the within-window shuffle; more mixes better, costs memory."""
    tail: str = "drop"
    """The last incomplete global batch: ``drop`` it, ``pad`` it by repeating samples, or ``exact``
    (pad, and mark padded rows ``valid=False`` so evaluation counts every sample exactly once)."""
    partitions: tp.Optional[int] = None
    """Canonical partitions of the epoch order (Mosaic's canonical nodes). Each partition is read by as few
    ranks as possible; ranks read no more than their share when ``partitions`` is a multiple of the world
    size. Default: the world size of the first run (kept in the resume state)."""
    num_workers: int = 2
    """Reader processes per rank (0 = read in the calling process, for debugging)."""
    prefetch_depth: int = 1
    """Read tasks queued per worker beyond the batches being consumed. A task fills the batches that cover
    about two shuffle windows, so 1 already keeps ``num_workers`` tasks of batches ahead of the consumer."""
    start_method: str = "forkserver"
    """How worker processes start: ``fork``, ``spawn`` or ``forkserver``. Files are opened in each worker."""
    pin_memory: bool = True
    """Stage batches in pinned host memory before a non-blocking copy when the loader has a CUDA device."""
    block_bytes: int = 1 << 20
    """Read unit for contiguous (unchunked) datasets, in bytes; chunked datasets use their chunk."""
    rdcc_nbytes: int = 16 << 20
    """HDF5 chunk cache per dataset in each worker (a whole chunk must fit for efficient reads)."""
    worker_timeout_s: float = 300.0
    """Fail with a clear error when a worker produces nothing for this long."""

    def __post_init__(self) -> None:
        files = (self.files,) if isinstance(self.files, (str, os.PathLike)) else tuple(self.files)
        keys = (self.keys,) if isinstance(self.keys, str) else tuple(self.keys)
        object.__setattr__(self, "files", tuple(os.fspath(f) for f in files))
        object.__setattr__(self, "keys", tuple(str(k) for k in keys))
        if not self.files:
            raise _bad("files", "is empty: give at least one HDF5 file")
        if not self.keys:
            raise _bad("keys", "is empty: give the dataset names to read, e.g. keys=('x', 'y')")
        if len(set(self.keys)) != len(self.keys):
            raise _bad("keys", f"has duplicates: {list(self.keys)}")
        for name in ("index", "valid"):
            if name in self.keys:
                raise _bad("keys", f"may not contain {name!r} (the loader adds that entry to each batch)")
        for name, low in (
            ("global_batch_size", 1),
            ("window_chunks", 1),
            ("num_workers", 0),
            ("prefetch_depth", 1),
            ("block_bytes", 1),
            ("rdcc_nbytes", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise _bad(name, f"must be an integer >= {low}, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise _bad("seed", f"must be a non-negative integer, got {self.seed!r}")
        if self.partitions is not None:
            if not isinstance(self.partitions, int) or self.partitions < 1:
                raise _bad("partitions", f"must be None or an integer >= 1, got {self.partitions!r}")
            if self.global_batch_size % self.partitions:
                raise _bad(
                    "partitions", f"({self.partitions}) must divide global_batch_size ({self.global_batch_size})"
                )
        if self.tail not in TAIL_POLICIES:
            raise _bad("tail", f"must be one of {', '.join(TAIL_POLICIES)}, got {self.tail!r}")
        if self.start_method not in START_METHODS:
            raise _bad("start_method", f"must be one of {', '.join(START_METHODS)}, got {self.start_method!r}")
        if not self.worker_timeout_s > 0:
            raise _bad("worker_timeout_s", f"must be > 0, got {self.worker_timeout_s!r}")

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        out = asdict(self)
        out["files"], out["keys"] = list(self.files), list(self.keys)
        return out
