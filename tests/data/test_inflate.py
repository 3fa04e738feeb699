"""Deflate-only chunked datasets are read raw (read_direct_chunk) and inflated by hpctrain (ISA-L when
installed): the result must equal libhdf5's, and every odd case must fall back or fail clearly."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpctrain.data._h5 import Reader, scan
from hpctrain.errors import UsageError


def _write(path, n=1000, chunk=64, **kw):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rng.standard_normal((n, 3, 4, 4)).astype(np.float32), chunks=(chunk, 3, 4, 4), **kw)
        f.create_dataset("y", data=np.arange(n, dtype=np.int64), chunks=(chunk,), **kw)


def _read(path, ids):
    lay = scan([str(path)], ["x", "y"])
    outs = [{"x": np.empty((len(i), 3, 4, 4), np.float32), "y": np.empty((len(i),), np.int64)} for i in ids]
    Reader(lay).read(ids, outs)
    return lay, outs


IDS = [np.array([999, 0, 63, 64, 500, 998, 998]), np.arange(100, 260)]  # partial last chunk, a repeat


def test_inflate_path_equals_libhdf5(tmp_path):
    path = tmp_path / "gz.h5"
    _write(path, compression="gzip", compression_opts=4)
    lay, outs = _read(path, IDS)
    assert lay.files[0].keys["x"].inflate and lay.files[0].keys["y"].inflate
    with h5py.File(path, "r", locking=False) as f:
        x, y = f["x"][:], f["y"][:]
    for ids, out in zip(IDS, outs):
        np.testing.assert_array_equal(out["x"], x[ids])
        np.testing.assert_array_equal(out["y"], y[ids])


@pytest.mark.parametrize(
    "kw",
    [{"compression": "gzip", "shuffle": True}, {"compression": "lzf"}, {"compression": "gzip", "fletcher32": True}],
)
def test_other_filter_pipelines_go_through_libhdf5(tmp_path, kw):
    path = tmp_path / "f.h5"
    _write(path, **kw)
    lay, outs = _read(path, IDS)
    assert not lay.files[0].keys["x"].inflate
    np.testing.assert_array_equal(outs[1]["y"], np.arange(100, 260))


def test_unwritten_chunks_fall_back_to_the_fill_value(tmp_path):
    path = tmp_path / "sparse.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=(256, 3, 4, 4), dtype=np.float32, chunks=(64, 3, 4, 4), compression="gzip", fillvalue=7.0
        )
        d[0:64] = 1.0  # chunks 1..3 are never written
        f.create_dataset("y", data=np.arange(256, dtype=np.int64), chunks=(64,), compression="gzip")
    _, outs = _read(path, [np.array([10, 100, 200])])
    assert outs[0]["x"][0].min() == 1.0 and outs[0]["x"][1].min() == 7.0 and outs[0]["x"][2].max() == 7.0


def test_corrupt_chunk_is_a_one_line_error_naming_file_and_key(tmp_path):
    path = tmp_path / "bad.h5"
    _write(path, compression="gzip")
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(2)
    with open(path, "r+b") as fh:  # overwrite the middle of chunk 2's deflate stream
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 64)
    with pytest.raises(UsageError) as err:
        _read(path, [np.array([130])])
    text = str(err.value)
    assert str(path) in text and "'x'" in text and "\n" not in text
