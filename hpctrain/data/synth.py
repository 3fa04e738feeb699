"""Synthetic HDF5 datasets for demos, tests and the benchmark (numpy + h5py only, no torch).

* ``x`` (``fill='random'``, float dtypes): quantised noise, standardised (mean 0, std 1 per feature).
* The sample id, for auditing readers, sits in the first feature at unit scale:
  ``x[i].flat[0] == i / ID_SCALE`` (``ID_SCALE = 2**24``: exact in float32 below 2**24 samples, in
  float16 below 2**11). :func:`sample_ids` reads it back from a batch. Integer dtypes hold ``i`` itself.
* ``y[i] = argmax(x[i] @ W)``: a fixed random linear teacher ``W`` (:func:`teacher`), seeded by the
  feature count and the class count only, so every file of one shape shares one labelling, whatever
  its ``seed``; the id feature has weight 0. The labels are learnable from ``x``
  (:func:`teacher_labels` recomputes them).
"""

from __future__ import annotations

import os
import tempfile
import typing as tp

import numpy as np

__all__ = ["ID_SCALE", "SYNTH_VERSION", "make_dataset", "sample_ids", "teacher", "teacher_labels"]

SYNTH_VERSION = 2  # the file attribute ``synth_version``; 1 (no attribute): raw ids in x, y = i % classes
ID_SCALE = 2**24  # float x: x.flat[0] == id / ID_SCALE (a power of two: exact, and below 1 for ids < 2**24)
_TEACHER_SEED = 0x5EED_7EAC  # the teacher depends on this, the feature count and the class count only
_NOISE_MEAN, _NOISE_STD = 127.5, float(np.sqrt((256**2 - 1) / 12))  # of uniform bytes 0..255


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(len(a), int(np.prod(a.shape[1:], dtype=np.int64)))  # (0, F) too: no -1 to infer


def sample_ids(x: tp.Any) -> np.ndarray:
    """The sample ids :func:`make_dataset` wrote into a batch ``x`` of shape (n, *shape): a numpy array
    or a CPU torch tensor (``batch["x"]``); int64 array of n ids."""
    a = np.asarray(x)
    first = _rows(a)[:, 0]
    if a.dtype.kind == "f":
        return (first.astype(np.float64) * ID_SCALE).astype(np.int64)
    return first.astype(np.int64)


def teacher(features: int, classes: int) -> np.ndarray:
    """The labelling weights (features, classes), float64; row 0 (the id feature) is zero."""
    w = np.random.default_rng([_TEACHER_SEED, int(features), int(classes)]).standard_normal((features, classes))
    w[0] = 0.0
    return w


def teacher_labels(x: tp.Any, classes: int = 10) -> np.ndarray:
    """The labels :func:`make_dataset` gives samples ``x`` (n, *shape): ``argmax(x @ teacher)``, int64."""
    flat = _rows(np.asarray(x))
    w = teacher(flat.shape[1], classes)
    out = np.empty(len(flat), dtype=np.int64)
    for i in range(0, len(flat), 1024):  # bounded float64 copies for large samples
        out[i : i + 1024] = np.argmax(flat[i : i + 1024].astype(np.float64) @ w, axis=1)
    return out


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
    """Write ``x`` (samples, *shape) and ``y`` (samples,) int64 (see the module doc). ``chunk_samples=None``
    and no compression gives contiguous storage; ``id_offset`` shifts the ids written in ``x[:, 0...]``
    (for multi-file datasets). ``fill='random'`` (standardised noise that compresses like real noisy
    data; ``seed`` draws it) or ``'fast'`` (a ramp in [0, 1], for benchmarks)."""
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
        f.attrs["synth_version"] = SYNTH_VERSION
        x = f.create_dataset("x", (samples,) + shape, dtype=dtype, **kw)
        ykw: tp.Dict[str, tp.Any] = {"chunks": (chunk_samples,)} if chunk_samples else {}
        if "maxshape" in kw:
            ykw["maxshape"] = (None,)
        if compression:
            ykw.update({k: v for k, v in kw.items() if k.startswith("compression")})
        y = f.create_dataset("y", (samples,), dtype="int64", **ykw)
        base = None
        is_float = np.dtype(dtype).kind == "f"
        for a in range(0, samples, write_rows):
            b = min(samples, a + write_rows)
            if fill == "random":
                # quantised noise: compresses roughly 2-3x with gzip, like real sensor/image data;
                # float: standardised to mean 0, std 1 (integer dtypes keep the old 0/1 values)
                q = rng.integers(0, 256, size=(b - a,) + shape, dtype=np.uint8)
                block = ((q - _NOISE_MEAN) / _NOISE_STD if is_float else q / 255.0).astype(dtype)
            else:
                if base is None:
                    base = np.linspace(0, 1, int(np.prod(shape)) * write_rows, dtype=dtype).reshape((-1,) + shape)
                block = base[: b - a].copy()
            ids = np.arange(a, b) + id_offset
            block.reshape(b - a, -1)[:, 0] = ids / ID_SCALE if is_float else ids
            x[a:b] = block
            y[a:b] = teacher_labels(block, classes)
