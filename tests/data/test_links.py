"""Links, virtual datasets and files replaced under the loader: read exactly what h5py reads, or refuse clearly."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from hpctrain.data import H5DataConfig, H5Loader
from hpctrain.data.synth import make_dataset
from hpctrain.errors import HpctrainError, UsageError


def loader(path, keys, workers=1, **kw):
    cfg = H5DataConfig(
        files=[str(path)], keys=keys, global_batch_size=16, num_workers=workers, start_method="fork", **kw
    )
    return H5Loader(cfg, rank=0, world_size=1)


def assert_reads_like_h5py(path, keys, workers=1):
    """Every batch of one epoch equals h5py's read of the same sample ids."""
    with h5py.File(path, "r") as f:
        ref = {k: f[k][()] for k in keys}
    seen = 0
    with loader(path, keys, workers) as ld:
        for batch in ld:
            idx = batch["index"].numpy()
            for k in keys:
                np.testing.assert_array_equal(batch[k].numpy(), ref[k][idx])
            seen += len(idx)
    assert seen == len(ld) * 16 > 0


@pytest.fixture()
def linked(tmp_path):
    """main.h5 holds a decoy contiguous dataset first, so an offset taken from the linked file reads the
    wrong bytes if the reader opens main.h5 instead of the link's target."""
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(300 * 96, dtype=np.float32).reshape(300, 96) + 0.5  # 384-byte rows: preadv path
        f["y"] = np.arange(300, dtype=np.int64) * 7
        f.create_dataset("z", data=np.arange(300 * 8, dtype=np.int16).reshape(300, 8), chunks=(32, 8), compression=4)
    main = tmp_path / "main.h5"
    with h5py.File(main, "w") as f:
        f["decoy"] = np.full((4096,), -1.0, np.float32)
        for k in ("x", "y", "z"):
            f[k] = h5py.ExternalLink("src.h5", k)
        f["gone"] = h5py.ExternalLink("missing.h5", "x")
        f["loop"] = h5py.SoftLink("/nowhere")
        f["g/inner"] = h5py.ExternalLink("src.h5", "x")
    return main


def test_external_link_reads_the_target_file(linked):
    assert_reads_like_h5py(linked, ("x", "y", "z"))
    assert_reads_like_h5py(linked, ("g/inner", "y"), workers=0)


@pytest.mark.parametrize(
    "key,match",
    [
        ("gone", r"'gone' is an external link to 'x' in file 'missing.h5' that does not resolve"),
        ("loop", r"'loop' is a soft link to '/nowhere' that does not resolve"),
        ("g/nothing", r"key 'g/nothing' not found \(g entries: inner\)"),
        ("decoy/x", r"'decoy' is not a group"),
    ],
)
def test_dangling_links_are_one_line_usage_errors(linked, key, match):
    with pytest.raises(UsageError, match=match) as e:
        loader(linked, (key,))
    assert "\n" not in str(e.value)


def _vds(tmp_path, source_name):
    src = tmp_path / "part.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(200 * 80, dtype=np.float32).reshape(200, 80)
    path = tmp_path / "vds.h5"
    with h5py.File(path, "w") as f:
        lay = h5py.VirtualLayout((400, 80), "f4")
        lay[:200] = h5py.VirtualSource(source_name, "x", (200, 80))
        lay[200:] = h5py.VirtualSource(".", "local", (200, 80))
        f["local"] = -np.arange(200 * 80, dtype=np.float32).reshape(200, 80)
        f.create_virtual_dataset("x", lay, fillvalue=-7)
    return path


def test_virtual_dataset_with_its_sources_reads_like_h5py(tmp_path):
    assert_reads_like_h5py(_vds(tmp_path, "part.h5"), ("x",))


def test_virtual_dataset_with_a_missing_source_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"maps source file 'absent.h5', which does not exist.*fill values"):
        loader(_vds(tmp_path, "absent.h5"), ("x",))


def test_external_raw_storage_is_refused(tmp_path):
    path = tmp_path / "raw.h5"
    np.arange(100, dtype=np.float32).tofile(tmp_path / "raw.bin")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", (100,), "f4", external=[(str(tmp_path / "raw.bin"), 0, 400)])
    with pytest.raises(UsageError, match="external raw files"):
        loader(path, ("x",))


# ---- a file regenerated between H5Loader() and the first batch --------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_file_changed_after_construction_is_one_clear_error(tmp_path, workers, how):
    path = make_dataset(tmp_path / "d.h5", 512, shape=(96,))  # contiguous: the preadv path
    ld = loader(path, ("x", "y"), workers)
    if how == "replaced":  # a new file at the same name, another layout (chunked, compressed)
        make_dataset(path, 700, shape=(96,), chunk_samples=16, compression="gzip", seed=3)
    else:
        with h5py.File(path, "r+") as f:
            f["x"][0] = 42.0
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse mtime filesystems
    with ld:
        with pytest.raises(HpctrainError) as e:
            next(iter(ld))
    msg = str(e.value)
    assert "d.h5: the file changed after the loader scanned it" in msg and "create the H5Loader again" in msg
    assert "\n" not in msg and "Traceback" not in msg


def test_unchanged_files_still_read(tmp_path):
    path = make_dataset(tmp_path / "same.h5", 300, shape=(96,))
    assert_reads_like_h5py(path, ("x", "y"), workers=2)
