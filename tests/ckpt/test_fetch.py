"""The restore read path (``_fetch``): whole tensors read by file region, shared with one all_gather, checked
together; and the reader's field-at-a-time entry check and byte-level JSON depth check.

A flipped byte anywhere in a shard (inside a tensor, at the end of a shard's data, in alignment padding, in
header padding, in another rank's RNG state, in a tensor the restore does not want) fails its step in both
restore modes, on 2 ranks restoring a 3-rank checkpoint (read shares cut across shard files) and on one
process; an injected read error on one rank makes both ranks fall back together.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain.ckpt import CheckpointConfig, Checkpointer
from hpctrain.ckpt._entries import _entry_problem, _ranges_ok
from hpctrain.ckpt._format import HEADER_PREFIX
from hpctrain.ckpt._index import verify_dir
from hpctrain.ckpt._reader import MAX_JSON_DEPTH, _check_depth, _loads, _shallow, read_header
from hpctrain.ckpt._restore import resolve_mode
from hpctrain.errors import CheckpointFormatError
from tests.ckpt import fetch_workers as fw
from tests.multiproc import run_world

STEPS = list(range(1, 9))
MODES = ("read_once", "read_all", "read_once+device", "read_once+node")
"""restore_mode, and "+device": the exchange through device buffers on the training group (CPU and gloo here);
"+node": through a shared-memory buffer of the node (every rank here is on one host)."""


def _shard(step_dir: Path, i: int) -> Path:
    return step_dir / f"rank-{i:05d}-of-00003.shard"


def _entries(path: Path) -> tp.Tuple[int, int, tp.List[tp.Dict[str, tp.Any]]]:
    """(header JSON length, data start, entries) of a shard."""
    hlen = HEADER_PREFIX.unpack(path.read_bytes()[: HEADER_PREFIX.size])[1]
    h = read_header(path)
    return hlen, h.data_start, h.header["entries"]


def _where(step_dir: Path, kind: str) -> tp.Tuple[Path, int]:
    """A byte position of ``kind`` in one of the step's shards."""
    if kind == "inside a tensor":
        _, ds, es = _entries(_shard(step_dir, 1))
        return _shard(step_dir, 1), ds + es[0]["offset"] + es[0]["nbytes"] // 2
    if kind == "first data byte":
        _, ds, _ = _entries(_shard(step_dir, 0))
        return _shard(step_dir, 0), ds
    if kind == "last byte of a shard's state":
        _, ds, es = _entries(_shard(step_dir, 0))
        e = [e for e in es if not e["key"].startswith("local/")][-1]
        return _shard(step_dir, 0), ds + e["offset"] + e["nbytes"] - 1
    if kind == "alignment padding":
        for i in range(3):
            _, ds, es = _entries(_shard(step_dir, i))
            for e, nxt in zip(es, es[1:]):
                if e["nbytes"] % 64:
                    assert e["offset"] + e["nbytes"] < nxt["offset"]
                    return _shard(step_dir, i), ds + e["offset"] + e["nbytes"]
    if kind == "header padding":
        for i in range(3):
            hlen, ds, _ = _entries(_shard(step_dir, i))
            if HEADER_PREFIX.size + hlen < ds:
                return _shard(step_dir, i), HEADER_PREFIX.size + hlen
        return _where(step_dir, "first data byte")  # 1 in 64**3: every header ends on an aligned byte
    if kind == "RNG of a rank not restored":
        _, ds, es = _entries(_shard(step_dir, 2))
        e = next(e for e in es if e["key"].startswith("local/"))
        return _shard(step_dir, 2), ds + e["offset"] + e["nbytes"] // 2
    if kind == "a tensor not restored":
        for i in range(3):
            _, ds, es = _entries(_shard(step_dir, i))
            for e in es:
                if e["key"].startswith("scaler/") and e["nbytes"] > 1024:
                    return _shard(step_dir, i), ds + e["offset"] + e["nbytes"] // 2
    raise AssertionError(kind)


KINDS = [
    "inside a tensor",
    "first data byte",
    "last byte of a shard's state",
    "alignment padding",
    "header padding",
    "RNG of a rank not restored",
    "a tensor not restored",
]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Steps 1..8 saved by 3 ranks; in ``flipped``, steps 2..8 each carry one flipped byte (one kind each)."""
    root = tmp_path_factory.mktemp("fetch")
    run_world(fw.save, 3, str(root / "ck"), STEPS)
    shutil.copytree(root / "ck", root / "intact")
    where = {}
    for step, kind in zip(STEPS[1:], KINDS):
        step_dir = root / "ck" / f"step-{step:09d}"
        path, pos = _where(step_dir, kind)
        raw = bytearray(path.read_bytes())
        raw[pos] ^= 0x5A
        path.write_bytes(bytes(raw))
        where[kind] = step
        with pytest.raises(CheckpointFormatError, match="checksum mismatch"):
            verify_dir(step_dir)
    for mode in (*MODES, "one"):
        shutil.copytree(root / "ck", root / mode)
    shutil.copytree(root / "intact", root / "fault")
    jobs = [(str(root / m), m, "") for m in MODES]
    jobs.append((str(root / "fault"), "read_once", "restore_read:1:raiseonce"))
    shutil.copytree(root / "intact", root / "fault-node")
    jobs.append((str(root / "fault-node"), "read_once+node", "restore_read:1:raiseonce"))
    shutil.copytree(root / "intact", root / "no-node-buffer")
    jobs.append((str(root / "no-node-buffer"), "read_once+node", "node_buffer:1:raise"))
    shutil.copytree(root / "intact", root / "node-memory")
    jobs.append((str(root / "node-memory"), "read_once+node", "node_memory:1:efault"))
    two = run_world(fw.restore, 2, jobs).results
    return root, where, two


def _outcome(r: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    return {k: v for k, v in r.items() if k in ("step", "quarantined", "exact")}


def test_a_flipped_byte_anywhere_fails_its_step_in_every_mode_and_exchange_on_two_ranks(damaged):
    _, where, two = damaged
    assert set(where) == set(KINDS)
    for job in range(len(MODES)):  # every damaged step quarantined, newest first, then step 1 exact
        assert [_outcome(r[job]) for r in two] == [{"step": 1, "quarantined": STEPS[:0:-1], "exact": True}] * 2


def test_the_node_exchange_leaves_no_buffer_file_behind(damaged):
    _, _, two = damaged
    node_jobs = [j for j, m in enumerate(MODES) if m.endswith("+node")] + [len(MODES) + 1, len(MODES) + 2]
    for job in node_jobs:
        assert [r[job]["node_files_left"] for r in two] == [[], []]
    # one node buffer per step read: 8 steps (7 quarantined); with the injected read error, 2 (one quarantined)
    assert [r[node_jobs[0]]["exchanges"] for r in two] == [len(STEPS)] * 2
    assert [r[len(MODES) + 1]["exchanges"] for r in two] == [2, 2]


def test_a_rank_without_a_node_buffer_makes_every_rank_exchange_over_gloo(damaged):
    _, _, two = damaged  # node_buffer:1:raise: rank 1 cannot have the buffer; both fall back, nothing quarantined
    assert [_outcome(r[len(MODES) + 2]) for r in two] == [{"step": STEPS[-1], "quarantined": [], "exact": True}] * 2


def test_a_node_buffer_whose_memory_runs_out_is_not_damage_the_ranks_read_again_over_gloo(damaged):
    # node_memory:1:efault: rank 1's reads into the node buffer fail as into a full tmpfs (EFAULT): no step is
    # quarantined, both ranks read the newest step again over gloo, bit-exact, and no buffer file is left
    _, _, two = damaged
    got = [r[len(MODES) + 3] for r in two]
    assert [_outcome(r) for r in got] == [{"step": STEPS[-1], "quarantined": [], "exact": True}] * 2
    assert [r["node_files_left"] for r in got] == [[], []]
    assert [r["exchanges"] for r in got] == [1, 1]  # one node buffer tried, then gloo
    assert [r["read_again_over_gloo"] for r in got] == [True, True]
    # a rank that could not have the buffer: the others read into it, the reports make every rank read again
    assert all(r[len(MODES) + 2]["read_again_over_gloo"] for r in two)
    assert not any(r[j]["read_again_over_gloo"] for r in two for j, m in enumerate(MODES) if m.endswith("+node"))


def test_tensors_restored_through_the_node_buffer_are_each_ranks_own(tmp_path):
    run_world(fw.save, 3, str(tmp_path / "ck"), [1, 2])
    assert run_world(fw.node_private, 3, str(tmp_path / "ck")).results == [{"exact": True, "own_writes_only": True}] * 3


def test_the_node_exchange_removes_stale_buffer_files_of_dead_ranks(tmp_path):
    from hpctrain.ckpt._nodebuf import NODE_DIR, NODE_PREFIX

    run_world(fw.save, 2, str(tmp_path / "ck"), [1])
    stale, fresh = f"{NODE_PREFIX}test-stale-{os.getpid()}", f"{NODE_PREFIX}test-fresh-{os.getpid()}"
    for name in (stale, fresh):
        Path(NODE_DIR, name).write_bytes(b"x")
    old = time.time() - 3 * 3600
    os.utime(Path(NODE_DIR, stale), (old, old))
    try:
        res = run_world(fw.restore, 2, [(str(tmp_path / "ck"), "read_once+node", "")]).results
        assert [_outcome(r[0]) for r in res] == [{"step": 1, "quarantined": [], "exact": True}] * 2
        assert not Path(NODE_DIR, stale).exists() and Path(NODE_DIR, fresh).exists()
    finally:
        for name in (stale, fresh):
            Path(NODE_DIR, name).unlink(missing_ok=True)


def test_a_flipped_byte_anywhere_fails_its_step_on_one_process(damaged):
    root, _, _ = damaged
    model, opt, _ = fw.state(999)
    res = Checkpointer(CheckpointConfig(dir=root / "one")).restore(model=fw.Holder(model), optimizer=fw.Holder(opt))
    assert res is not None and res.step == 1 and res.quarantined == STEPS[:0:-1]
    assert all(v.equal(fw.state(1)[0][k]) for k, v in model.items())


def test_a_read_error_on_one_rank_makes_both_fall_back_together(damaged):
    _, _, two = damaged
    for job in (len(MODES), len(MODES) + 1):  # gloo exchange, node exchange
        assert [_outcome(r[job]) for r in two] == [{"step": STEPS[-2], "quarantined": [STEPS[-1]], "exact": True}] * 2


def test_an_intact_checkpoint_restores_bit_exact_across_world_sizes(damaged):
    root, _, _ = damaged
    model, opt, _ = fw.state(999)
    res = Checkpointer(CheckpointConfig(dir=root / "intact")).restore(model=fw.Holder(model), optimizer=fw.Holder(opt))
    assert res is not None and res.step == STEPS[-1] and res.quarantined == []
    want_model, want_opt, _ = fw.state(STEPS[-1])
    assert all(model[k].equal(v) for k, v in want_model.items()) and all(opt[k].equal(v) for k, v in want_opt.items())


# ------------------------------------------------------------------------------------------ reader fast paths
ODD = [None, True, -1, 2**70, 1.5, "x", [], {}, [1, [2]], "float32", [3, -1], 63, 64]


def test_the_field_at_a_time_entry_check_agrees_with_the_entry_by_entry_check(tmp_path):
    d = tmp_path / "ck"
    fw.save(0, 1, str(d), [1])
    path = d / "step-000000001" / "rank-00000-of-00001.shard"
    h = read_header(path)
    size = path.stat().st_size
    base = [e for e in h.header["entries"] if "box" not in e]
    assert _ranges_ok(base, h.data_start, size)
    rng = random.Random(0)
    disagreements = []
    for case in range(400):
        entries = copy.deepcopy(base)
        for _ in range(rng.choice([1, 1, 2])):
            e = rng.choice(entries)
            field = rng.choice(["key", "dtype", "shape", "start", "stop", "offset", "nbytes", "extra"])
            if rng.random() < 0.15:
                e.pop(field, None)
            else:
                e[field] = copy.deepcopy(rng.choice(ODD))
        slow = all(not _entry_problem(e, h.data_start, size) for e in entries)
        if _ranges_ok(entries, h.data_start, size) != slow:
            disagreements.append((case, entries))
    assert disagreements == []


def _nest(depth: int, rng: random.Random) -> tp.Any:
    out: tp.Any = rng.choice([0, "a]", '[\\"{', None])
    for _ in range(depth):
        out = [out] if rng.random() < 0.5 else {rng.choice(["k", "}\\\\", '"[']): out}
    return out


def test_the_json_depth_from_bytes_agrees_with_the_tree_walk():
    rng = random.Random(1)
    for case in range(300):
        obj = _nest(rng.randint(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3), rng)
        raw = json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode()
        try:
            _check_depth(obj, "x", "header")
            deep = False
        except CheckpointFormatError:
            deep = True
        assert not (_shallow(raw) and deep), case
        if deep:
            with pytest.raises(CheckpointFormatError, match="nested deeper"):
                _loads(raw, "x", "header")
        else:
            assert _loads(raw, "x", "header") == obj


def test_auto_mode_reads_once_across_hosts_and_all_on_one_host():
    assert resolve_mode("auto", hosts=1) == "read_all"
    assert resolve_mode("auto", hosts=2) == "read_once"
    assert resolve_mode("auto", hosts=1, node=True) == "read_once"  # one host, its shared memory: read once
    assert resolve_mode("read_all", hosts=1, node=True) == "read_all"
    assert [resolve_mode(m, hosts=h) for m in ("read_once", "read_all") for h in (1, 3)] == ["read_once"] * 2 + [
        "read_all"
    ] * 2


class _Comm:
    def __init__(self, hosts: int) -> None:
        self.hosts, self.group = hosts, "ckpt-gloo"


def test_auto_exchanges_through_the_node_on_one_host_and_over_gloo_across_hosts():
    from hpctrain.ckpt._fetch import Route, route

    assert route("auto", _Comm(1)) == Route("ckpt-gloo", None, node=True)
    assert route("node", _Comm(1)) == Route("ckpt-gloo", None, node=True)
    assert route("auto", _Comm(2)) == Route("ckpt-gloo", None)  # no process group here: gloo, host memory
    assert route("node", _Comm(2)) == Route("ckpt-gloo", None)  # several hosts: the host route
    assert route("host", _Comm(1)) == Route("ckpt-gloo", None)


@pytest.mark.parametrize("round_bytes", [200, 1 << 30])  # 4 rounds (the last one short), and one
def test_the_exchange_through_device_buffers_puts_every_byte_in_place(round_bytes):
    assert run_world(fw.device_gather, 3, 7 * 64, round_bytes).results == [True] * 3


def test_ranks_behind_one_host_name_without_a_shared_dev_shm_fall_back_to_gloo(tmp_path):
    run_world(fw.save, 3, str(tmp_path / "ck"), [1, 2])
    got = run_world(fw.separate_node_dirs, 3, str(tmp_path / "ck"), str(tmp_path / "shm")).results
    assert got == [{"step": 2, "exact": True, "left": []}] * 3


def test_a_tensor_split_over_shards_end_to_end_in_the_buffer_is_a_view_and_an_unaligned_one_a_copy():
    """``_Views``: a tensor stored in range pieces that lie end to end in the packed buffer (the save's aligned cut)
    becomes a view of the buffer, with no copy; pieces with bytes between them (an older save's unaligned cut)
    are assembled. Both give the stored values."""
    import torch

    from hpctrain.ckpt._fetch import _Views, pack
    from hpctrain.ckpt._index import PieceRef, StoredTensor

    values = torch.arange(40, dtype=torch.float32)
    # 16 elements (64 bytes) at the end of shard 0's data, 24 at the start of shard 1's: end to end once packed
    aligned = StoredTensor("float32", (40,), [PieceRef(0, 16, 0, 128, 64), PieceRef(16, 40, 1, 192, 96)])
    # 10 elements (40 bytes: not a multiple of 64): the next region starts 64-byte aligned, 24 bytes later
    unaligned = StoredTensor("float32", (40,), [PieceRef(0, 10, 2, 128, 40), PieceRef(10, 40, 3, 192, 120)])
    stored = {"a": aligned, "u": unaligned}
    regions, at, total = pack(stored, ["a", "u"])
    buf = torch.zeros(total, dtype=torch.uint8)
    for st in stored.values():
        for p in st.pieces:
            o = at[(p.shard, p.pos)]
            buf[o : o + p.nbytes] = values[p.start : p.stop].view(torch.uint8)
    views = _Views(buf, at)
    out, rest = views.views(stored, ["a", "u"])
    assert list(out) == ["a"] and rest == ["u"]
    assert out["a"].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()  # a view, not a copy
    assert torch.equal(out["a"], values) and torch.equal(views.assemble(unaligned), values)


def test_evenly_spaced_tensors_become_rows_of_one_view_with_each_tensor_its_own_values():
    """``_Views``: same-shaped tensors laid out evenly spaced, also interleaved with another run (an optimizer's
    ``exp_avg`` / ``exp_avg_sq`` of same-shaped parameters) or among tensors at irregular offsets, come out as
    the same values as one ``as_strided`` each, views of the buffer, in the caller's key order."""
    import torch

    from hpctrain.ckpt._fetch import _Views
    from hpctrain.ckpt._index import PieceRef, StoredTensor

    shape, nbytes = (2, 3), 24
    # a run of 4 at a 64-byte spacing; two runs of 3 at 192 bytes interleaved (neighbours 64 and 128 bytes apart);
    # 2 at odd spacings
    offsets = [0, 64, 128, 192] + [256, 320, 448, 512, 640, 704] + [800, 960]
    keys = [f"t{i}" for i in range(len(offsets))]
    order = keys[4:10] + keys[10:] + keys[:4]  # the runs not first: found by offset, not by list position
    buf = torch.arange(1024, dtype=torch.uint8)
    stored = {k: StoredTensor("float32", shape, [PieceRef(0, 6, 0, o, nbytes)]) for k, o in zip(keys, offsets)}
    scalars = {f"s{i}": StoredTensor("int64", (), [PieceRef(0, 1, 1, 64 * i, 8)]) for i in range(5)}
    views = _Views(buf, {(p.shard, p.pos): p.pos for st in (*stored.values(), *scalars.values()) for p in st.pieces})
    out, rest = views.views({**stored, **scalars}, order + list(scalars))
    assert rest == [] and sorted(out) == sorted(order + list(scalars))
    typed, longs = buf.view(torch.float32), buf.view(torch.int64)
    for k, o in zip(keys, offsets):
        want = typed.as_strided(shape, (3, 1), o // 4)
        assert out[k].shape == shape and out[k].stride() == (3, 1) and torch.equal(out[k], want), k
        assert out[k].data_ptr() == buf.data_ptr() + o  # a view of the buffer at the tensor's own offset
    for i in range(5):
        assert out[f"s{i}"].shape == () and out[f"s{i}"].item() == longs[8 * i].item()
