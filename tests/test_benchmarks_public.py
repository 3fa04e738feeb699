"""Benchmarks are users of the library: whatever they measure or report comes through public names
(``hpctrain.ckpt.meters()``, ``hpctrain.data.meters()`` and the ceiling primitives next to them), never
through a private module, so a refactor of those cannot silently change what a benchmark means.

The first test parses every ``benchmarks/*.py`` and fails naming each import of a private hpctrain module
(a dotted path with a component starting with ``_``); the others pin the public surface the benchmarks use."""

from __future__ import annotations

import ast
import subprocess
import sys
import typing as tp
from pathlib import Path

import numpy as np
import pytest

import hpctrain.ckpt
import hpctrain.data
from hpctrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def _private(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "hpctrain" and any(p.startswith("_") for p in parts[1:])


def private_imports(source: str, filename: str = "<src>") -> tp.List[str]:
    """``file:line: module`` for every import of a private hpctrain module in ``source``: ``import
    hpctrain.x._y``, ``from hpctrain.x._y import z``, ``from hpctrain.x import _y`` and a string naming one
    (``importlib.import_module("hpctrain._x")``, an entry ``"hpctrain._x:fn"``). Benchmarks' own
    ``_common`` is not hpctrain's, so it is allowed."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: tp.List[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.split(":")[0]
            names = [text] if text.isascii() and all(p.isidentifier() for p in text.split(".")) else []
        for name in names:
            if _private(name):
                found.append(f"{filename}:{node.lineno}: {name}")
                break
    return found


def test_benchmarks_import_no_private_hpctrain_module():
    assert len(BENCHMARKS) >= 5 and (ROOT / "benchmarks" / "_common.py") in BENCHMARKS
    bad = [hit for f in BENCHMARKS for hit in private_imports(f.read_text(), str(f.relative_to(ROOT)))]
    assert not bad, "benchmarks must use public hpctrain names (add a public meter instead):\n" + "\n".join(bad)


def test_the_detector_catches_every_form_and_allows_public_names():
    bad = """
import hpctrain._atomic
from hpctrain.ckpt._reader import bytes_read
def f():
    from hpctrain.ckpt import _state
    import importlib; importlib.import_module("hpctrain.data._h5")
"""
    assert [h.split(": ")[1] for h in private_imports(bad)] == [
        "hpctrain._atomic",
        "hpctrain.ckpt._reader",
        "hpctrain.ckpt._state",
        "hpctrain.data._h5",
    ]
    good = """
from _common import ENV, wall
from hpctrain.ckpt import CheckpointConfig, meters
from hpctrain.data import epoch_order
import hpctrain.runtime.process_group
x = "gpu_check_ddp:uuid_probe"
__all__ = ["main"]
"""
    assert private_imports(good) == []


def test_public_meters_are_exported_documented_and_torch_free():
    public = {
        hpctrain.ckpt: ("meters", "digest", "replicated_share"),
        hpctrain.data: ("meters", "open_h5", "contiguous_regions", "epoch_order"),
    }
    for pkg, names in public.items():
        for name in names:
            assert name in pkg.__all__ and getattr(pkg, name).__doc__, f"{pkg.__name__}.{name}"
    code = (
        "import sys, hpctrain.ckpt, hpctrain.data\n"
        "m, d = hpctrain.ckpt.meters(), hpctrain.data.meters()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert isinstance(m['bytes_read'], int) and m['crc32_impl'] in ('isal', 'zlib'), m\n"
        "assert d['inflater'] in ('isal', 'zlib'), d\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_ckpt_digest_meters_bytes_read_and_replicated_share_covers_every_byte_once(tmp_path):
    import torch

    from hpctrain.ckpt import CheckpointConfig, Checkpointer, digest, meters, replicated_share
    from hpctrain.ckpt._index import digest_dir

    class Holder:
        def __init__(self, sd: tp.Dict[str, torch.Tensor]) -> None:
            self.sd = sd

        def state_dict(self) -> tp.Dict[str, torch.Tensor]:
            return self.sd

    model = {"a": torch.arange(10, dtype=torch.float32), "b": torch.arange(7, dtype=torch.int64), "c": torch.ones(0)}
    ck = Checkpointer(CheckpointConfig(dir=tmp_path))
    step_dir = ck.save(1, model=Holder(model))
    ck.close()
    before = meters()["bytes_read"]
    got = digest(step_dir)
    assert meters()["bytes_read"] - before == 10 * 4 + 7 * 8  # every tensor byte once
    assert got == digest_dir(step_dir) and "model" in got

    whole = b"".join(t.numpy().tobytes() for t in model.values())
    for world in (1, 2, 3, 5):
        shares = [replicated_share({"model": model}, r, world) for r in range(world)]
        assert b"".join(t.numpy().tobytes() for s in shares for t in s) == whole
        assert all(t.dim() == 1 for s in shares for t in s)
    with pytest.raises(UsageError, match="rank"):
        replicated_share({"model": model}, 2, 2)


def test_data_regions_are_the_datasets_bytes_and_epoch_order_is_what_the_loader_delivers(tmp_path):
    from hpctrain.data import H5DataConfig, H5Loader, contiguous_regions, epoch_order, make_dataset, open_h5

    plain = str(make_dataset(tmp_path / "plain.h5", 300, shape=(2, 4, 4)))
    gz = str(make_dataset(tmp_path / "gz.h5", 300, shape=(2, 4, 4), chunk_samples=16, compression="gzip"))
    regions = contiguous_regions(plain, ["x", "y"])
    with open_h5(plain) as f, open(plain, "rb") as raw:
        for k, reg in regions.items():
            assert reg is not None and reg.samples == 300
            raw.seek(reg.offset)
            assert raw.read(reg.nbytes) == f[k][:].tobytes()
    assert contiguous_regions(gz, ["x"]) == {"x": None}

    cfg = H5DataConfig(files=[gz], keys=("x", "y"), global_batch_size=32, seed=5, num_workers=0, window_chunks=4)
    ids, block_starts = epoch_order(cfg, epoch=1)
    assert sorted(ids.tolist()) == list(range(300)) and block_starts.tolist() == list(range(0, 300, 16)) + [300]
    with H5Loader(cfg, rank=0, world_size=1) as loader:
        loader.set_epoch(1)
        got = [i for b in loader for i in b["index"].tolist()]
    assert got == ids[: len(got)].tolist() and len(got) == 300 // 32 * 32
    assert not np.array_equal(epoch_order(cfg, epoch=2).ids, ids)
