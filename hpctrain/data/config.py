"""The loader's configuration: one frozen, keyword-only dataclass, checked on construction (no torch).

Errors name the field: ``H5DataConfig.global_batch_size must be an integer >= 1, got 0``.
"""

from __future__ import annotations

import os
import typing as tp
from dataclasses import asdict, dataclass

from hpctrain._validate import check_bool, check_choice, check_int, check_number, check_path, usage_error
from hpctrain.errors import UsageError

__all__ = ["H5DataConfig", "TAIL_POLICIES", "START_METHODS"]

TAIL_POLICIES = ("drop", "pad", "exact")
START_METHODS = ("fork", "spawn", "forkserver")


def _bad(name: str, why: str) -> UsageError:
    return UsageError(f"H5DataConfig.{name} {why}")


def _sequence(owner: tp.Any, name: str, value: tp.Any, one: tp.Tuple[type, ...], what: str) -> tp.Tuple[tp.Any, ...]:
    """``value`` as a tuple: one item of type ``one``, or any iterable of items (bytes are refused)."""
    if isinstance(value, one):
        return (value,)
    if not isinstance(value, (bytes, bytearray)):
        try:
            return tuple(value)
        except TypeError:
            pass
    raise usage_error(owner, name, value, f"must be {what}")


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
    about eight shuffle windows, so 1 already keeps ``num_workers`` tasks of batches ahead of the consumer."""
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
        files = _sequence(self, "files", self.files, (str, os.PathLike), "an HDF5 file path or a list of them")
        keys = _sequence(self, "keys", self.keys, (str,), "a dataset name or a list of them, e.g. ('x', 'y')")
        for f in files:
            check_path(self, "files", f, what="HDF5 file paths")
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
            ("seed", 0),
            ("window_chunks", 1),
            ("num_workers", 0),
            ("prefetch_depth", 1),
            ("block_bytes", 1),
            ("rdcc_nbytes", 0),
        ):
            check_int(self, name, getattr(self, name), min=low)
        check_int(self, "partitions", self.partitions, min=1, none_ok=True, hint="None = the first run's world size")
        if self.partitions is not None and self.global_batch_size % self.partitions:
            raise _bad("partitions", f"({self.partitions}) must divide global_batch_size ({self.global_batch_size})")
        check_bool(self, "shuffle", self.shuffle)
        check_bool(self, "pin_memory", self.pin_memory)
        check_choice(self, "tail", self.tail, TAIL_POLICIES)
        check_choice(self, "start_method", self.start_method, START_METHODS)
        check_number(self, "worker_timeout_s", self.worker_timeout_s, above=0, hint="seconds")

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        out = asdict(self)
        out["files"], out["keys"] = list(self.files), list(self.keys)
        return out
