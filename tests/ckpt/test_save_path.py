"""The save path's shortcuts keep the format: the layout and shard plan reused between saves, the header's entries
encoded once, the crc of the bytes written."""

from __future__ import annotations

import json
import typing as tp
import zlib

import torch

from hpctrain.ckpt import CheckpointConfig, Checkpointer
from hpctrain.ckpt._format import encode_header, entries_json, header_json
from hpctrain.ckpt._reader import read_header
from hpctrain.ckpt._state import LayoutCache, Piece, flatten, layout, plan_offsets, split_replicated, whole


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
    """Tensors larger than the 256 KiB write batch and the 4 MiB writeback kick, between small ones: the
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


def test_write_summed_writes_every_view_in_order_and_sums_them_as_one_crc(tmp_path, monkeypatch):
    """Small views batched, views larger than a batch in slices, a 2-D float view cast to bytes: the file is their
    concatenation, the crc32 is zlib's of it, and the writeback is started in consecutive ranges of at least the
    kick from the file's start, through the real ``sync_file_range`` (which accepts them: 0)."""
    import array
    import os

    import numpy as np

    from hpctrain.ckpt import _commit

    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, size=_commit._KICK + 12_345, dtype=np.uint8)
    views = [
        memoryview(b"head"),
        *(memoryview(bytes([k]) * (k * 1000 + 1)) for k in range(1, 60)),  # ~1.8 MB of small views
        memoryview(big),
        memoryview(np.arange(3 * 100_003, dtype=np.float32).reshape(3, 100_003)),  # > a batch, not bytes
        memoryview(array.array("d", range(5))),
        memoryview(rng.integers(0, 255, size=2 * _commit._KICK, dtype=np.uint8)),
    ]
    want = b"".join(v.tobytes() for v in views)
    kicks: tp.List[tp.Tuple[int, int, int]] = []
    real = _commit._start_writeback

    def record(fd: int, offset: int, nbytes: int) -> None:
        kicks.append((offset, nbytes, _commit._sync_file_range()(fd, offset, nbytes, _commit._SYNC_FILE_RANGE_WRITE)))
        real(fd, offset, nbytes)

    monkeypatch.setattr(_commit, "_start_writeback", record)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        crc = _commit._write_summed(fd, views)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == want and crc == zlib.crc32(want)
    assert len(kicks) >= 3 and kicks[0][0] == 0 and all(r == 0 for *_, r in kicks)
    assert all(a + n == b for (a, n, _), (b, _, _) in zip(kicks, kicks[1:]))
    assert all(n >= _commit._KICK for _, n, _ in kicks) and kicks[-1][0] + kicks[-1][1] <= len(want)


def _fresh_plan(lay, others, rank, world):
    mine = split_replicated(lay, rank, world)
    return mine + list(others), *plan_offsets(mine + list(others))


def test_the_shard_plan_is_reused_only_while_layout_rank_world_and_other_pieces_repeat():
    """LayoutCache.shard hands back the previous save's split, offsets and entries' JSON; any change of the
    keys, dtypes, shapes, the rank or world, or of a sharded/local piece must give the plan computed anew."""
    cache = LayoutCache()

    def state(n=10, dtype=torch.float32, name="b"):
        return {"a": torch.arange(n, dtype=dtype), name: torch.ones(3, 4), "c": torch.zeros(100_000)}

    def plan(tensors, others, rank, world):
        lay = layout(tensors, cache)
        got = cache.shard(lay, others, rank, world)
        hit = got is not None
        if got is None:
            mine = split_replicated(lay, rank, world)
            got = cache.remember(lay, mine, others, *plan_offsets(mine + list(others)))
        pieces, entries, size = _fresh_plan(layout(tensors), others, rank, world)
        assert got.entries == entries and got.size == size and json.loads(got.entries_json) == entries
        assert [(p.key, p.start, p.stop) for p in got.pieces] == [(p.key, p.start, p.stop) for p in pieces]
        # the tensors are this call's, never a previous save's
        assert all(g.tensor is p.tensor for g, p in zip(got.pieces, pieces))
        return hit

    rng = whole({"local/rng/torch": torch.zeros(5056, dtype=torch.uint8)})
    assert not plan(state(), rng, 1, 4)
    assert plan(state(), rng, 1, 4)  # new tensors, same layout: reused
    for changed in (state(n=11), state(dtype=torch.float64), state(name="b2")):
        assert not plan(changed, rng, 1, 4)
        assert plan(changed, rng, 1, 4)
    assert not plan(state(), rng, 1, 4) and not plan(state(), rng, 2, 4) and not plan(state(), rng, 2, 3)
    assert not plan(state(), whole({"local/rng/torch": torch.zeros(5057, dtype=torch.uint8)}), 2, 3)
    box = Piece("s", torch.ones(2, 3), 0, 6, "float32", 4, ((2, 0), (2, 3)), (8, 3))
    assert not plan(state(), [box] + rng, 2, 3) and plan(state(), [box] + rng, 2, 3)
    moved = box._replace(box=((4, 0), (2, 3)))
    assert not plan(state(), [moved] + rng, 2, 3)


def test_header_with_pre_encoded_fields_is_byte_identical():
    header = {"rank": 1, "world_size": 2, "step": 7, "entries": [{"key": "é", "offset": 0}], "local": {"x": 1.5}}
    assert encode_header(header, {"entries": header_json(header["entries"])}) == encode_header(header)
    header["trees"] = {"m": [float("nan"), None, True]}
    assert encode_header(header, {"entries": header_json(header["entries"])}) == encode_header(header)


def test_entries_text_from_the_template_is_exactly_the_json_encoders():
    """The save writes its entries' JSON from a template (entries_json): the text must be header_json's, byte for
    byte, for any key (escapes, non-ASCII, a lone surrogate), shape and number, and for entries it does not
    template (a box, fields in another order, a bool or float where an int belongs)."""
    keys = ["model/w", 'q"uote\\back', "tab\tnl\n\x00\x1f", "é€😀", "\ud800lone", "", "/" * 300]
    entries = []
    for i, key in enumerate(keys):
        for shape in ([], [7], [3, 4], [0, 2, 1]):
            entries.append(
                {
                    "key": key,
                    "dtype": "bfloat16",
                    "shape": shape,
                    "start": i,
                    "stop": 2**40 + i,
                    "offset": 64 * i,
                    "nbytes": 0,
                }
            )
    entries += [
        {"key": "s", "dtype": "float32", "shape": [8, 3], "box": [[2, 0], [2, 3]], "offset": 0, "nbytes": 24},
        {"dtype": "float32", "key": "order", "shape": [1], "start": 0, "stop": 1, "offset": 0, "nbytes": 4},
        {"key": "b", "dtype": "bool", "shape": [1], "start": True, "stop": 1, "offset": 0, "nbytes": 1},
        {"key": "f", "dtype": "float32", "shape": [1], "start": 0, "stop": 1, "offset": 0.0, "nbytes": 4},
    ]
    assert entries_json(entries) == header_json(entries)
    assert entries_json([]) == header_json([]) == "[]"
    assert json.loads(entries_json(entries)) == entries


def test_a_save_leaves_the_collector_on_without_a_deferred_scan_and_a_frozen_heap_frozen(tmp_path):
    """No collection runs inside a save: the objects the pause let accumulate (a first save's thousands of
    entries) go to the oldest generation when it ends, not to a scan of the youngest inside the save. The
    collector is on after it; a process that froze objects itself (gc.freeze() before forking) keeps them
    frozen; a collector the caller turned off stays off."""
    import gc

    state = {f"t{i}": torch.full((4,), float(i)) for i in range(3000)}
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    runs: tp.List[int] = []

    def seen(phase: str, info: tp.Dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        ck.save(1, extra=state)
    finally:
        gc.callbacks.remove(seen)
    assert runs == [] and gc.isenabled()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        ck.save(2, extra=state)
        assert gc.get_freeze_count() > frozen // 2 and gc.isenabled()  # unfreeze() would have thawed them all
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        ck.save(3, extra=state)
        assert not gc.isenabled()
    finally:
        gc.enable()
    ck.close()
    assert torch.equal(Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=3).extra["t7"], state["t7"])


def test_repeated_saves_of_a_changing_state_restore_each_exactly_and_keep_gc_on(tmp_path):
    """Saves 2..4 reuse the shard plan; values, then a shape, then a key change between them. Each step restores
    its own bytes, and the cyclic collector paused during a save is on again afterwards, also after a failed save."""
    import gc

    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    states = {
        1: {"w": torch.arange(1000.0), "s": {0: {"m": torch.ones(5)}, 1: {"m": torch.zeros(5)}}, "lr": 0.1},
        2: {"w": torch.arange(1000.0) * 2, "s": {0: {"m": torch.ones(5) * 3}, 1: {"m": torch.zeros(5)}}, "lr": 0.05},
        3: {"w": torch.arange(1001.0), "s": {0: {"m": torch.ones(5)}, 1: {"m": torch.zeros(5)}}, "lr": 0.05},
        4: {"w2": torch.arange(1001.0), "s": {0: {"m": torch.ones(5)}, 1: {"m": torch.full((5,), 7.0)}}, "lr": 0.0},
    }
    for step, st in states.items():
        ck.save(step, extra=st, blocking=step % 2 == 0)
        ck.wait()
        assert gc.isenabled()
    try:
        ck.save(5, extra={"bad": object()})
    except Exception:  # noqa: BLE001 - a UsageError: the state holds something that is not JSON
        pass
    assert gc.isenabled()
    ck.close()
    for step, want in states.items():
        got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=step).extra
        assert got["lr"] == want["lr"] and set(got) == set(want), step
        wkey = "w" if "w" in want else "w2"
        assert torch.equal(got[wkey], want[wkey]), step
        for i in (0, 1):
            assert torch.equal(got["s"][i]["m"], want["s"][i]["m"]), (step, i)


def test_flatten_keeps_its_tree_for_every_kind_of_node():
    p = torch.nn.Parameter(torch.ones(2))
    tensors = {}
    tree = flatten({"a": {1: p, (2, 3): 4.0, "x": [torch.zeros(1), (5, "s")]}, "b": p, "n": None}, "m", tensors)
    assert tree == {
        "a": {
            "__dict__": [
                [1, {"__tensor__": "m/a/1"}],
                [{"__tuple__": [2, 3]}, 4.0],
                ["x", [{"__tensor__": "m/a/x/0"}, {"__tuple__": [5, "s"]}]],
            ]
        },
        "b": {"__tensor__": "m/b"},
        "n": None,
    }
    assert list(tensors) == ["m/a/1", "m/a/x/0", "m/b"] and not tensors["m/b"].requires_grad


def _expected_data(pieces, entries, size):
    out = bytearray(size)
    for p, e in zip(pieces, entries):
        out[e["offset"] : e["offset"] + e["nbytes"]] = p.tensor.reshape(-1)[p.start : p.stop].numpy().tobytes()
    return bytes(out)


def test_staging_reuses_zeroed_padding_only_for_the_same_entries_in_the_same_arena():
    """The stager skips the padding memsets when it stages the same entries into the same arena again. Another
    layout staged in between writes its pieces over that padding: the next stage must zero it again."""
    from hpctrain.ckpt._staging import Stager

    def plan(sizes, fill):
        pieces = whole({f"t{i}": torch.full((n,), float(fill + i)) for i, n in enumerate(sizes)})
        return pieces, *plan_offsets(pieces)

    st = Stager()
    a_pieces, a_entries, a_size = plan([3, 5, 1, 7], 1)
    b_pieces, b_entries, b_size = plan([16, 16, 16], 50)  # no padding: its bytes land on a's padding
    assert b_size <= a_size
    for pieces, entries, size in ((a_pieces, a_entries, a_size), (b_pieces, b_entries, b_size)) * 2:
        for direct in (None, 0, 8, 16, 1 << 20):
            chunks = st.stage(pieces, entries, size, direct_min=direct)
            assert b"".join(bytes(v) for _, v in chunks) == _expected_data(pieces, entries, size)
    # the same entries again, new values: padding still zero, the values are the new ones
    st.stage(a_pieces, a_entries, a_size)
    a2 = [p._replace(tensor=p.tensor * -1) for p in a_pieces]
    chunks = st.stage(a2, a_entries, a_size)
    assert b"".join(bytes(v) for _, v in chunks) == _expected_data(a2, a_entries, a_size)
    st.release()


def test_a_blocking_save_writes_tensors_only_the_save_holds_and_every_kind_of_piece(tmp_path):
    """A blocking save writes CPU tensors straight from their memory: also those only the save itself references
    (a numpy array turned into a tensor, the RNG states), which must live until the shard is written. Strided,
    conj and neg views, zero-size and small tensors between large ones: the same bytes as an async save's
    (staged in the arena), and each restores exactly."""
    import numpy as np

    big = np.arange(300_000, dtype=np.float64)  # 2.4 MB: its tensor exists only inside save()
    c = torch.complex(torch.arange(6.0), torch.ones(6))
    state = {
        "np": big,
        "t": torch.arange(12.0).reshape(3, 4).t(),
        "conj": c.conj(),
        "neg": torch._neg_view(torch.arange(5.0)),
        "empty": torch.zeros(0),
        "small": [torch.full((k,), float(k)) for k in (1, 3, 17, 64, 1000)],
        "large": torch.arange(70_000, dtype=torch.int32),
        "b": torch.tensor([True, False, True]),
    }
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    torch.manual_seed(3)
    ck.save(1, extra=state)
    torch.manual_seed(3)
    ck.save(2, extra=state, blocking=False)
    ck.close()
    data = [_shard(tmp_path, s).read_bytes() for s in (1, 2)]
    h1, h2 = read_header(_shard(tmp_path, 1)), read_header(_shard(tmp_path, 2))
    assert h1.header["entries"] == h2.header["entries"] and data[0][h1.data_start :] == data[1][h2.data_start :]
    for step in (1, 2):
        manifest = json.loads((tmp_path / f"step-{step:09d}" / "MANIFEST.json").read_text())
        assert manifest["shards"][0]["crc32"] == zlib.crc32(data[step - 1])
        got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=step).extra
        assert isinstance(got["np"], np.ndarray) and np.array_equal(got["np"], big)
        for k in ("t", "conj", "neg", "empty", "large", "b"):
            assert torch.equal(got[k], state[k].resolve_conj().resolve_neg()), (step, k)
        assert all(torch.equal(a, b) for a, b in zip(got["small"], state["small"]))


def test_short_writes_resume_where_the_kernel_stopped(tmp_path, monkeypatch):
    """writev may write less than asked (a signal, a quota, over 2 GiB): the writer resumes mid-buffer, and the file
    is the same bytes with the same crc32 as written in one go."""
    import os

    from hpctrain.ckpt import _commit

    state = {"a": torch.arange(100_000.0), "s": [torch.full((k,), float(k)) for k in range(1, 40)]}
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    ck.save(1, extra=state)
    real = os.writev

    def short(fd, buffers):  # at most 777 bytes a call, often ending inside a buffer
        out, left = [], 777
        for b in buffers:
            b = memoryview(b).cast("B")
            out.append(b[:left])
            left -= out[-1].nbytes
            if not left:
                break
        return real(fd, out)

    monkeypatch.setattr(_commit.os, "writev", short)
    ck.save(2, extra=state)
    ck.close()
    one, two = (_shard(tmp_path, s).read_bytes() for s in (1, 2))
    h1, h2 = read_header(_shard(tmp_path, 1)), read_header(_shard(tmp_path, 2))
    assert one[h1.data_start :] == two[h2.data_start :]
    manifest = json.loads((tmp_path / "step-000000002" / "MANIFEST.json").read_text())
    assert manifest["shards"][0]["crc32"] == zlib.crc32(two)


def test_rank0_trees_text_is_reused_only_for_trees_of_the_same_values_and_types(tmp_path):
    """Rank 0 reuses the previous save's trees JSON while the trees are the same; 1, 1.0 and True (and 0.0 and
    -0.0) are equal in Python but not in JSON: each save restores its own value with its own type."""
    import math

    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=0))
    values = [1, 1, 1.0, True, True, 0.0, -0.0, -0.0, 0, False, float("nan"), "1", [1], 2**70, float(2**70)]
    for step, v in enumerate(values, 1):
        ck.save(step, extra={"w": torch.ones(3), "v": v, "nested": {"lr": v, 0: [v, {"x": v}]}})
    ck.close()
    for step, v in enumerate(values, 1):
        got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=step).extra
        for g in (got["v"], got["nested"]["lr"], got["nested"][0][0], got["nested"][0][1]["x"]):
            assert type(g) is type(v), (step, v, g)
            if isinstance(v, float):
                assert math.copysign(1, g) == math.copysign(1, v) and (g == v or (math.isnan(g) and math.isnan(v)))
            else:
                assert g == v, (step, v, g)


def test_the_replicated_split_tiles_every_tensor_and_cuts_inside_one_at_an_aligned_byte():
    """``split_replicated`` over every rank tiles each tensor exactly (no gap, no overlap), whatever the sizes,
    dtypes and world; a cut inside a tensor lies a multiple of 64 bytes from its start, so the restore can view
    a tensor split over two shards instead of copying it (``_fetch._Views``). A boundary that falls past a
    tensor's last 64-byte multiple but inside the tensor leaves the tail to the next rank, never to nobody."""
    import random

    rng = random.Random(0)
    dtypes = [torch.float32, torch.float64, torch.uint8, torch.float16, torch.complex128]
    for _ in range(400):
        state = {
            f"t{i}": torch.zeros(rng.choice([0, rng.randint(1, 40), rng.randint(1, 3000)]), dtype=rng.choice(dtypes))
            for i in range(rng.randint(1, 8))
        }
        lay = layout(state)
        for world in range(1, 7):
            got: dict = {k: [] for k in state}
            for rank in range(world):
                for p in split_replicated(lay, rank, world):
                    got[p.key].append((p.start, p.stop))
            for key, spans in got.items():
                t = state[key]
                spans.sort()
                assert spans and spans[0][0] == 0 and spans[-1][1] == t.numel(), (key, spans, t.numel())
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (key, spans)
                assert all(a * t.element_size() % 64 == 0 for a, _ in spans), (key, spans, t.dtype)
