"""H5DataConfig lives in the public hpctrain.data.config and checks types strictly (issue 17 §3, 18 §4)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from hpctrain.data import H5DataConfig
from hpctrain.errors import UsageError

BASE = dict(files=["a.h5"], keys=("x",), global_batch_size=8)


def test_public_module_and_no_private_one():
    from hpctrain.data import config

    assert config.H5DataConfig is H5DataConfig
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hpctrain.data._config")


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(shuffle="no"), "H5DataConfig.shuffle must be True or False, got 'no'"),
        (dict(pin_memory=1), "H5DataConfig.pin_memory must be True or False"),
        (dict(files=[5]), r"H5DataConfig.files must be HDF5 file paths \(a str or os.PathLike\), got 5"),
        (dict(files=b"a.h5"), "H5DataConfig.files must be an HDF5 file path or a list of them"),
        (dict(files=[b"a.h5"]), "H5DataConfig.files must be HDF5 file paths"),
        (dict(keys=5), "H5DataConfig.keys must be a dataset name or a list of them"),
        (dict(seed=-1), "H5DataConfig.seed must be an integer >= 0, got -1"),
        (dict(seed=True), "H5DataConfig.seed must be an integer >= 0, got True"),
        (dict(partitions=0), "H5DataConfig.partitions must be an integer >= 1 or None"),
        (dict(worker_timeout_s=0), "H5DataConfig.worker_timeout_s must be a number > 0"),
        (dict(worker_timeout_s="10"), "H5DataConfig.worker_timeout_s must be a number > 0"),
    ],
)
def test_types_are_checked_and_named_in_one_line(kw, message):
    with pytest.raises(UsageError, match=message) as e:
        H5DataConfig(**{**BASE, **kw})
    assert "\n" not in str(e.value)


def test_files_and_keys_are_normalised():
    cfg = H5DataConfig(files=(p for p in [Path("a.h5"), "b.h5"]), keys="x", global_batch_size=8)
    assert cfg.files == ("a.h5", "b.h5") and cfg.keys == ("x",)
    assert H5DataConfig(files=Path("a.h5"), keys=["x", "y"], global_batch_size=8).files == ("a.h5",)
