"""The save path's shortcuts keep the format: the layout reused between saves, the crc computed while writing."""

from __future__ import annotations

import json
import zlib

import torch

from hpctrain.ckpt import CheckpointConfig, Checkpointer
from hpctrain.ckpt._reader import read_header
from hpctrain.ckpt._state import LayoutCache, layout


def _shard(root, step):
    return root / f"step-{step:09d}" / "rank-00000-of-00001.shard"


def test_a_state_that_changes_shape_or_dtype_between_saves_is_saved_as_it_is_now(tmp_path):
    """The checkpointer reuses the previous save's tensor metadata while keys, dtypes and shapes are unchanged:
    a tensor that grew, changed dtype or appeared between two saves must be stored with its new layout."""
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    first = {"a": torch.arange(10.0), "b": torch.ones(3, 4)}
    ck.save(1, extra=first)
    ck.save(2, extra={"a": torch.arange(10.0) + 1, "b": torch.ones(3, 4) * 2})  # same layout, new values
    changed = {"a": torch.arange(12.0), "b": torch.ones(3, 4, dtype=torch.float64), "c": torch.zeros(2)}
    ck.save(3, extra=changed, blocking=False)
    ck.close()
    for step, want in ((1, first), (2, {"a": torch.arange(10.0) + 1, "b": torch.ones(3, 4) * 2}), (3, changed)):
        got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=step).extra
        assert set(got) == set(want), step
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), (step, k)


def test_layout_cache_reuses_metadata_only_for_the_same_keys_dtypes_and_shapes():
    cache = LayoutCache()
    t = {"x": torch.zeros(4), "y": torch.zeros(2, 3)}
    fresh = layout(t)
    assert layout(t, cache) == fresh
    t2 = {"x": torch.ones(4), "y": torch.ones(2, 3)}
    again = layout(t2, cache)
    assert again.digest == fresh.digest and all(a[1] is b for a, b in zip(again.items, t2.values()))
    for other in ({"x": torch.zeros(5), "y": torch.zeros(2, 3)}, {"x": torch.zeros(4, dtype=torch.int64), "y": t["y"]}):
        assert layout(other, cache) == layout(other) and layout(other).digest != fresh.digest


def test_the_crc_computed_while_writing_is_the_files_crc_across_slice_boundaries(tmp_path):
    """Tensors larger than the 4 MiB write slice and the 32 MiB write-back kick, between small ones: the
    manifest's crc32 is zlib's crc32 of the whole file, for a sync and an async save."""
    state = {
        "small": torch.arange(7.0),
        "big": torch.arange((9 << 20) // 4 + 3, dtype=torch.float32),
        "mid": torch.arange(70_001, dtype=torch.float64),
        "huge": torch.ones((33 << 20) // 2 + 5, dtype=torch.float16),
    }
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    ck.save(1, extra=state)
    ck.save(2, extra=state, blocking=False)
    ck.close()
    for step in (1, 2):
        data = _shard(tmp_path, step).read_bytes()
        manifest = json.loads((tmp_path / f"step-{step:09d}" / "MANIFEST.json").read_text())
        assert manifest["shards"][0]["crc32"] == zlib.crc32(data) and manifest["shards"][0]["bytes"] == len(data)
        assert read_header(_shard(tmp_path, step)).header["step"] == step
