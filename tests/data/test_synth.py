"""``make_dataset`` (``data synth``): learnable labels, inputs at unit scale, the audit id kept in x."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpctrain.data.synth import ID_SCALE, SYNTH_VERSION, make_dataset, sample_ids, teacher, teacher_labels


def _read(path):
    with h5py.File(path, "r") as f:
        return f["x"][:], f["y"][:], dict(f.attrs)


def test_labels_are_a_fixed_function_of_x_whatever_the_seed_or_file(tmp_path):
    a = _read(make_dataset(tmp_path / "a.h5", 3000, shape=(2, 4, 4), chunk_samples=32, compression="gzip", seed=1))
    b = _read(make_dataset(tmp_path / "b.h5", 500, shape=(2, 4, 4), seed=7, id_offset=3000, write_rows=64))
    for x, y, attrs in (a, b):
        assert y.dtype == np.int64 and (teacher_labels(x, 10) == y).all()
        assert attrs["synth_version"] == SYNTH_VERSION
    assert not np.array_equal(a[0][:500], b[0])  # another seed draws other inputs ...
    # ... but one teacher labels every file of a shape: the same x gets the same y
    assert (teacher_labels(b[0]) == b[1]).all() and np.array_equal(teacher(32, 10), teacher(32, 10))
    # the id feature carries no weight: y does not depend on which id a sample has
    shifted = b[0].copy()
    shifted.reshape(len(shifted), -1)[:, 0] = 0
    assert (teacher_labels(shifted) == b[1]).all()
    # every class occurs, none dominates
    counts = np.bincount(a[1], minlength=10)
    assert counts.min() > 0.03 * len(a[1]) and counts.max() < 0.3 * len(a[1])


def test_inputs_are_unit_scale_and_the_id_is_recoverable(tmp_path):
    x, _, _ = _read(make_dataset(tmp_path / "d.h5", 20000, shape=(64,), id_offset=5))
    assert sample_ids(x).tolist() == list(range(5, 20005))
    assert float(np.abs(x[:, 0]).max()) < 0.01  # the id is no raw 20000 in the model's input
    noise = x[:, 1:]
    assert abs(float(noise.mean())) < 0.02 and abs(float(noise.std()) - 1) < 0.02 and np.abs(noise).max() < 1.8
    assert x.reshape(-1)[1] != 0 and ID_SCALE == 2**24


def test_sample_ids_reads_torch_batches_and_other_dtypes(tmp_path):
    torch = pytest.importorskip("torch")
    x, _, _ = _read(make_dataset(tmp_path / "f.h5", 40, shape=(3, 2)))
    assert sample_ids(torch.from_numpy(x)).tolist() == list(range(40))
    for dtype in ("float16", "float64", "int32", "uint16"):
        x, y, _ = _read(make_dataset(tmp_path / f"{dtype}.h5", 300, shape=(4,), dtype=dtype))
        assert x.dtype == np.dtype(dtype) and sample_ids(x).tolist() == list(range(300))
        assert (teacher_labels(x) == y).all()
    x, _, _ = _read(make_dataset(tmp_path / "empty.h5", 0, shape=(4,), chunk_samples=8))
    assert sample_ids(x).shape == (0,) and teacher_labels(x).shape == (0,)


def test_the_labels_are_learnable_by_a_linear_model(tmp_path):
    # 100 full-batch gradient steps of softmax regression on the file beat chance by far
    x, y, _ = _read(make_dataset(tmp_path / "l.h5", 2000, shape=(32,)))
    x = x.astype(np.float64)
    w = np.zeros((32, 10))
    onehot = np.eye(10)[y]
    for _ in range(100):
        z = x @ w
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w -= 1.0 * x.T @ (p - onehot) / len(x)
    assert ((x @ w).argmax(1) == y).mean() > 0.7  # chance: 0.1
