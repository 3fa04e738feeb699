"""Bad input → one clear line naming the file and the key (and what to do)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from hpctrain.data import H5DataConfig, H5Loader
from hpctrain.data.synth import make_dataset
from hpctrain.errors import UsageError


def load(files, keys=("x", "y"), **kw):
    kw.setdefault("global_batch_size", 8)
    kw.setdefault("num_workers", 0)
    return H5Loader(H5DataConfig(files=files, keys=keys, **kw), rank=kw.pop("rank", 0), world_size=1)


def one_line(exc):
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_missing_key(files):
    with pytest.raises(UsageError) as e:
        load(files["gzip"], keys=("x", "label"))
    msg = one_line(e)
    assert "gz.h5" in msg and "'label' not found" in msg and "x, y" in msg and "H5DataConfig.keys" in msg


def test_different_lengths(tmp_path):
    path = tmp_path / "ragged.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((10, 3), np.float32)
        f["y"] = np.zeros(9, np.int64)
    with pytest.raises(UsageError) as e:
        load([str(path)])
    assert "ragged.h5" in one_line(e) and "x=10, y=9" in one_line(e)


def test_files_disagree_on_shape(tmp_path, files):
    path = tmp_path / "other.h5"
    make_dataset(path, 50, shape=(3,))
    with pytest.raises(UsageError, match=r"other.h5: key 'x' is float32\[3\] but .*float32\[2, 4, 4\]"):
        load(files["gzip"] + [str(path)])


def test_zero_samples(tmp_path):
    path = make_dataset(tmp_path / "empty.h5", 0, shape=(2,))
    with pytest.raises(UsageError) as e:
        load([path])
    assert "empty.h5" in one_line(e) and "zero samples" in one_line(e) and "'x'" in one_line(e)


def test_truncated_file(tmp_path, files):
    src = files["contig"][0]
    path = tmp_path / "cut.h5"
    data = open(src, "rb").read()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError) as e:
        load([str(path)])
    assert "cut.h5" in one_line(e) and "truncated" in one_line(e)


def test_not_hdf5(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("this is not HDF5\n")
    with pytest.raises(UsageError) as e:
        load([str(path)])
    assert "notes.h5" in one_line(e) and "not an HDF5 file" in one_line(e)
    with pytest.raises(UsageError, match="no such file"):
        load([str(tmp_path / "missing.h5")])


def test_rank_would_get_no_batches(files, tmp_path):
    small = shutil.copy(files["gzip"][0], tmp_path / "small.h5")
    with pytest.raises(UsageError) as e:
        load([str(small)], global_batch_size=1024)
    msg = one_line(e)
    assert "small.h5" in msg and "no batches" in msg and "tail='pad'" in msg
    assert len(load([str(small)], global_batch_size=1024, tail="pad")) == 1  # pad: one padded batch


def test_world_size_must_divide_global_batch(files):
    with pytest.raises(UsageError, match=r"global_batch_size \(10\) is not divisible by the world size \(4\)"):
        H5Loader(
            H5DataConfig(files=files["gzip"], keys=("x",), global_batch_size=10, num_workers=0), rank=1, world_size=4
        )
    with pytest.raises(UsageError, match="rank 4 is not in"):
        H5Loader(H5DataConfig(files=files["gzip"], keys=("x",), global_batch_size=8), rank=4, world_size=4)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(files=[]), "H5DataConfig.files is empty"),
        (dict(keys=()), "H5DataConfig.keys is empty"),
        (dict(global_batch_size=0), "H5DataConfig.global_batch_size must be an integer >= 1"),
        (dict(tail="wrap"), "H5DataConfig.tail must be one of drop, pad, exact"),
        (dict(start_method="thread"), "H5DataConfig.start_method must be one of"),
        (dict(partitions=3), r"H5DataConfig.partitions \(3\) must divide global_batch_size \(8\)"),
        (dict(num_workers=-1), "H5DataConfig.num_workers must be an integer >= 0"),
        (dict(keys=("x", "index")), "may not contain 'index'"),
    ],
)
def test_config_validation_names_the_option(kw, match):
    base = dict(files=["a.h5"], keys=("x",), global_batch_size=8)
    base.update(kw)
    with pytest.raises(UsageError, match=match):
        H5DataConfig(**base)


def test_state_format_checked(files):
    with load(files["gzip"]) as x:
        with pytest.raises(UsageError, match="format"):
            x.load_state_dict({"epoch": 0})
        x.load_state_dict({})  # empty = fresh start


def test_cuda_device_without_cuda_is_a_clear_error(files):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this node has CUDA")
    with pytest.raises(UsageError, match="CUDA is not available"):
        H5Loader(H5DataConfig(files=files["gzip"], keys=("x",), global_batch_size=8), device="cuda")
