"""Public meters of the input pipeline, and the primitives a benchmark's ceiling needs (see docs/data.md).

Benchmarks read what :class:`H5Loader` does through these names only, never through the private modules,
so that a refactor of those cannot silently change what a measured figure means. Torch-free (numpy and
h5py, imported when called).
"""

from __future__ import annotations

import typing as tp

import numpy as np

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.data.config import H5DataConfig

__all__ = ["meters", "open_h5", "Region", "contiguous_regions", "EpochStream", "epoch_order"]


def meters() -> tp.Dict[str, tp.Any]:
    """This process's data-path meters, as a new dict (JSON-able):

    * ``inflater``: which inflate the loader's gzip path uses: ``"isal"`` (``pip install 'hpctrain[fast]'``,
      ISA-L) or ``"zlib"``.

    Per-loader figures (wait time, read amplification, queue depth) are ``H5Loader.metrics``.
    """
    from hpctrain.data._h5 import INFLATER

    return {"inflater": INFLATER}


def open_h5(path: str, rdcc_nbytes: tp.Optional[int] = None) -> tp.Any:
    """Open an HDF5 file read-only the way the loader does (an ``h5py.File``; use it as a context manager):
    HDF5 file locking off, and with ``rdcc_nbytes`` a chunk cache of that many bytes.

    Raises a one-line :class:`hpctrain.errors.UsageError` naming the file for a missing, non-HDF5 or
    truncated file.
    """
    from hpctrain.data._h5 import open_h5 as _open

    return _open(path, rdcc_nbytes)


class Region(tp.NamedTuple):
    """The bytes of one dataset in its file: ``nbytes`` bytes from ``offset``, ``samples`` samples."""

    offset: int
    nbytes: int
    samples: int


def contiguous_regions(path: str, keys: tp.Sequence[str]) -> tp.Dict[str, tp.Optional[Region]]:
    """For each key of ``path``: the byte range the loader reads with plain ``pread`` (bypassing libhdf5)
    when the dataset is contiguous and unfiltered, else None (chunked or compressed: read through h5py).

    The file is validated as the loader validates it (the same errors, naming the file and the key).
    """
    from hpctrain.data._h5 import scan

    info = scan([path], list(keys)).files[0]
    out: tp.Dict[str, tp.Optional[Region]] = {}
    for k in keys:
        ki = info.keys[k]
        out[k] = None if ki.offset is None else Region(int(ki.offset), ki.length * ki.sample_bytes, ki.length)
    return out


class EpochStream(tp.NamedTuple):
    """One epoch's global order as the loader produces it."""

    ids: np.ndarray
    """Global sample ids in stream order (every sample once; int64)."""
    block_starts: np.ndarray
    """Global id of each read block's first sample, then the sample count (int64): the block of sample
    ``i`` is ``np.searchsorted(block_starts, i, side="right") - 1``."""


def epoch_order(config: "H5DataConfig", epoch: int = 0) -> EpochStream:
    """The stream :class:`H5Loader` built from ``config`` draws epoch ``epoch``'s batches from (the stream
    ``S`` of docs/data.md): the files scanned into read blocks (an HDF5 chunk along axis 0, or
    ``config.block_bytes`` of a contiguous dataset), blocks permuted and samples permuted within windows of
    ``config.window_chunks`` blocks, seeded by ``(config.seed, epoch)``; file order when ``config.shuffle``
    is False. The loader cuts it into partitions, and each global batch takes consecutive samples of each.

    Independent of the world size and the worker count. Memory: O(samples) for the returned ids.
    """
    from hpctrain.data._h5 import scan
    from hpctrain.data._order import EpochOrder

    lay = scan(config.files, config.keys, config.block_bytes)
    order = EpochOrder(lay.block_starts, config.seed, epoch, config.window_chunks, config.shuffle)
    return EpochStream(order.ids(np.arange(lay.num_samples, dtype=np.int64)), lay.block_starts.copy())
