"""Synthetic HDF5 datasets for demos, tests and the benchmark (numpy + h5py only, no torch).

Sample ``i`` has ``x[i].flat[0] == i`` (exact in float32 below 2**24) so readers can be audited, and
label ``y[i] = i % classes``.
"""

from __future__ import annotations

import os
import tempfile
import typing as tp

import numpy as np

__all__ = ["make_dataset"]


def make_dataset(
    path: tp.Union[str, os.PathLike],
    samples: int,
    *,
    shape: tp.Sequence[int] = (3, 32, 32),
    dtype: str = "float32",
    chunk_samples: tp.Optional[int] = None,
    compression: tp.Optional[str] = None,
    level: int = 4,
    classes: int = 10,
    seed: int = 0,
    fill: str = "random",
    write_rows: int = 8192,
    id_offset: int = 0,
) -> str:
    """Write ``x`` (samples, *shape) and ``y`` (samples,) int64. ``chunk_samples=None`` and no compression
    gives contiguous storage; ``id_offset`` shifts the ids written in ``x[:, 0...]``
    (for multi-file datasets). ``fill='random'`` (compresses like real noisy data) or ``'fast'``."""
    if samples < 0:
        raise ValueError("samples must be >= 0")
    path = os.fspath(path)
    shape = tuple(int(s) for s in shape)
    if compression is not None and chunk_samples is None:
        chunk_samples = 64
    kw: tp.Dict[str, tp.Any] = {}
    if chunk_samples:
        # a chunk may not be longer than a fixed-size dataset: fewer samples than one chunk get one chunk
        chunk_samples = min(chunk_samples, max(1, samples))
        kw["chunks"] = (chunk_samples,) + shape
        if samples == 0:
            kw["maxshape"] = (None,) + shape
    if compression == "gzip":
        kw.update(compression="gzip", compression_opts=level)
    elif compression:
        kw["compression"] = compression
    rng = np.random.default_rng(seed)
    sample_bytes = np.dtype(dtype).itemsize * max(1, int(np.prod(shape, dtype=np.int64)))
    write_rows = max(1, min(write_rows, (64 << 20) // sample_bytes))  # bounded memory for large samples
    # written under a temporary name and renamed: OUT is the complete file or untouched, never half-written
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the dataset gets the mode a new file would have
    try:
        _write(tmp, samples, shape, dtype, kw, chunk_samples, compression, rng, classes, fill, write_rows, id_offset)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _write(
    tmp: str,
    samples: int,
    shape: tp.Tuple[int, ...],
    dtype: str,
    kw: tp.Dict[str, tp.Any],
    chunk_samples: tp.Optional[int],
    compression: tp.Optional[str],
    rng: np.random.Generator,
    classes: int,
    fill: str,
    write_rows: int,
    id_offset: int,
) -> None:
    import h5py

    with h5py.File(tmp, "w", libver="latest") as f:
        x = f.create_dataset("x", (samples,) + shape, dtype=dtype, **kw)
        ykw: tp.Dict[str, tp.Any] = {"chunks": (chunk_samples,)} if chunk_samples else {}
        if "maxshape" in kw:
            ykw["maxshape"] = (None,)
        if compression:
            ykw.update({k: v for k, v in kw.items() if k.startswith("compression")})
        y = f.create_dataset("y", (samples,), dtype="int64", **ykw)
        base = None
        for a in range(0, samples, write_rows):
            b = min(samples, a + write_rows)
            if fill == "random":
                # quantised noise: compresses roughly 2-3x with gzip, like real sensor/image data
                block = (rng.integers(0, 256, size=(b - a,) + shape, dtype=np.uint8) / 255.0).astype(dtype)
            else:
                if base is None:
                    base = np.linspace(0, 1, int(np.prod(shape)) * write_rows, dtype=dtype).reshape((-1,) + shape)
                block = base[: b - a].copy()
            block.reshape(b - a, -1)[:, 0] = np.arange(a, b) + id_offset
            x[a:b] = block
            y[a:b] = np.arange(a, b) % classes
