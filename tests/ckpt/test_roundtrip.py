"""Round trips on real processes (gloo on CPU): bit-exact state, N->M world sizes, async == sync."""

from __future__ import annotations

import pytest

from hpctrain.ckpt._index import digest_dir
from hpctrain.ckpt._reader import read_header
from tests.ckpt import workers as w
from tests.multiproc import run_world


def test_single_process_round_trip_without_process_group(tmp_path):
    assert w.save_steps(0, 1, str(tmp_path), [3]) == ["ok 3"]
    got = w.restore_hash(0, 1, str(tmp_path))
    assert got["step"] == 3 and got["hash"] == w.expected_hash(3)
    assert got["data_state"] == {"epoch": 3, "samples": 300}
    assert got["extra_note"] == "step 3" and got["extra_t"] == list(range(6))
    assert got["run_id"] == "run-abc" and got["rng_restored"]


def test_unusual_tensors_round_trip_by_value_and_sync_writes_what_async_writes(tmp_path):
    """Views whose bytes are not their values (conj/neg bits), non-contiguous, zero-size and large
    tensors between small ones: a sync save writes large CPU tensors straight from their memory and
    copies the rest into the arena, an async save copies everything; both store the values, in the
    same bytes."""
    import torch

    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    z = torch.arange(6, dtype=torch.float32).view(torch.complex64)
    state = {
        "conj": z.conj(),
        "neg": torch._neg_view(torch.arange(4.0)),
        "strided": torch.arange(12.0).view(3, 4).t(),
        "empty": torch.zeros(0, 3),
        "bf16": torch.arange(5, dtype=torch.bfloat16),
        "big": torch.arange(100_003, dtype=torch.float32),
        "small_after_big": torch.arange(3.0),
        "big_strided": torch.arange(300 * 300, dtype=torch.float32).view(300, 300).t(),
        "big_neg": torch._neg_view(torch.arange(70_001, dtype=torch.float64)),
    }
    expect = {k: v.resolve_conj().resolve_neg().clone() for k, v in state.items()}
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=5))
    ck.save(1, extra=state, blocking=True)
    ck.save(2, extra=state, blocking=False)
    ck.close()
    for step in (1, 2):
        got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore(step=step).extra
        assert set(got) == set(expect)
        for k, v in expect.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), (step, k)
    sync, async_ = (tmp_path / f"step-00000000{n}" / "rank-00000-of-00001.shard" for n in (1, 2))
    hs, ha = read_header(sync), read_header(async_)
    assert hs.header["entries"] == ha.header["entries"]
    assert sync.read_bytes()[hs.data_start :] == async_.read_bytes()[ha.data_start :]


@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank_round_trip_is_bit_exact_on_every_rank(tmp_path, world):
    run_world(w.save_steps, world, str(tmp_path), [1, 2])
    shards = sorted(p.name for p in (tmp_path / "step-000000002").iterdir())
    assert shards == ["MANIFEST.json"] + [f"rank-{r:05d}-of-{world:05d}.shard" for r in range(world)]
    sizes = [(tmp_path / "step-000000002" / s).stat().st_size for s in shards[1:]]
    assert max(sizes) < 0.6 * sum(sizes)  # replicated state is split, not written by one rank
    res = run_world(w.restore_hash, world, str(tmp_path)).results
    assert {r["hash"] for r in res} == {w.expected_hash(2)}
    assert all(r["step"] == 2 and r["data_state"] == {"epoch": 2, "samples": 200} and r["rng_restored"] for r in res)


def test_ranks_that_see_different_committed_steps_restore_the_newest_step_they_all_see(tmp_path):
    """The ranks agree on the committed steps by a digest of each rank's list; where the lists differ (a step one
    rank does not see), they gather the lists and restore the newest step every rank sees."""
    import shutil

    src = tmp_path / "src"
    run_world(w.save_steps, 2, str(src), [1, 2])
    for r in (0, 1):
        shutil.copytree(src, tmp_path / f"r{r}")
    shutil.rmtree(tmp_path / "r1" / "step-000000002")
    res = run_world(w.restore_hash_own_dir, 2, str(tmp_path)).results
    assert [(r["step"], r["hash"]) for r in res] == [(1, w.expected_hash(1))] * 2
    assert all(not r["quarantined"] for r in res)


def test_world_size_change_n_to_m_and_digest_is_world_size_independent(tmp_path):
    d4, d1 = tmp_path / "w4", tmp_path / "w1"
    run_world(w.save_steps, 4, str(d4), [7])
    w.save_steps(0, 1, str(d1), [7])
    # the same training state written by 4 ranks and by 1 rank digests equal, entry by entry
    assert digest_dir(d4 / "step-000000007") == digest_dir(d1 / "step-000000007")
    # 4 -> 2 ranks: model/optimizer reassembled; ranks 0,1 get their own RNG back
    res = run_world(w.restore_hash, 2, str(d4)).results
    assert [r["hash"] for r in res] == [w.expected_hash(7)] * 2
    assert all(r["saved_world"] == 4 and r["rng_restored"] for r in res)
    # 1 -> 2 ranks: rank 1 had no counterpart, its RNG is left as is (and says so)
    res = run_world(w.restore_hash, 2, str(d1)).results
    assert [r["hash"] for r in res] == [w.expected_hash(7)] * 2
    assert [r["rng_restored"] for r in res] == [True, False]
    assert all(r["data_state"] == {"epoch": 7, "samples": 700} for r in res)
    # 4 -> 1 (a login node / no process group)
    assert w.restore_hash(0, 1, str(d4))["hash"] == w.expected_hash(7)


def test_async_save_equals_sync_save(tmp_path):
    run_world(w.save_steps, 2, str(tmp_path / "sync"), [4], True)
    run_world(w.save_steps, 2, str(tmp_path / "async"), [4], False)
    assert digest_dir(tmp_path / "sync" / "step-000000004") == digest_dir(tmp_path / "async" / "step-000000004")
    # sync writes straight from the tensors, async from the staging arena: same layout, same bytes
    # (the per-process RNG states differ between the two runs, so compare the training-state entries)
    for shard in sorted((tmp_path / "sync" / "step-000000004").glob("*.shard")):
        other = tmp_path / "async" / "step-000000004" / shard.name
        hs, ha = read_header(shard), read_header(other)
        assert hs.header["entries"] == ha.header["entries"]  # (the header's length varies with the RNG's JSON)
        assert shard.stat().st_size - hs.data_start == other.stat().st_size - ha.data_start
        bs, ba = shard.read_bytes(), other.read_bytes()
        for e in hs.header["entries"]:
            if not e["key"].startswith("local/"):
                at, nb = e["offset"], e["nbytes"]
                assert bs[hs.data_start + at :][:nb] == ba[ha.data_start + at :][:nb], (shard.name, e["key"])
    assert w.restore_hash(0, 1, str(tmp_path / "async"))["hash"] == w.expected_hash(4)


def test_training_continues_bit_exactly_after_restore_ddp(tmp_path):
    first, resumed = run_world(w.train_resume, 2, str(tmp_path), 6, 3).results[0]
    assert first == resumed


def test_training_continues_bit_exactly_after_restore_single(tmp_path):
    first, resumed = w.train_resume(0, 1, str(tmp_path), 6, 3)
    assert first == resumed


def test_resaving_a_committed_step_replaces_it_without_writing_into_it(tmp_path):
    from hpctrain.ckpt import Checkpointer

    ck = Checkpointer(w.cfg(str(tmp_path)))
    m1, o1, _ = w.build(1)
    first = ck.save(5, model=m1, optimizer=o1)
    inode = first.stat().st_ino
    m2, o2, _ = w.build(2)
    second = ck.save(5, model=m2, optimizer=o2)
    ck.join_gc()
    ck.close()
    assert second == first and second.stat().st_ino != inode  # a fresh directory, renamed into place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-000000005"]
    m3, o3, _ = w.build(9, 0)
    assert Checkpointer(w.cfg(str(tmp_path))).restore(model=m3, optimizer=o3).step == 5
    assert w.state_hash(m3, o3) == w.state_hash(m2, o2)


def test_lustre_striping_creates_each_shard_through_the_lfs_seam_when_configured(tmp_path):
    from hpctrain.ckpt import Checkpointer
    from hpctrain.testing import FakeLustre

    lfs = FakeLustre()
    model, opt, _ = w.build(1)
    ck = Checkpointer(w.cfg(str(tmp_path / "ck")), lustre=lfs)
    ck.save(1, model=model)  # off by default: lfs not called
    ck.close()
    assert lfs.calls == []
    ck = Checkpointer(w.cfg(str(tmp_path / "ck"), lustre_stripe=("-c", "-1", "-S", "16M")), lustre=lfs)
    ck.save(2, model=model)
    ck.close()
    [call] = lfs.calls
    assert call[:5] == ["setstripe", "-c", "-1", "-S", "16M"] and ".tmp-" in call[5]
    assert call[5].endswith("rank-00000-of-00001.shard")
    model2, _, _ = w.build(9, 0)
    assert Checkpointer(w.cfg(str(tmp_path / "ck"))).restore(model=model2).step == 2  # the striped shard is whole
    assert w.state_hash(model2) == w.state_hash(model)
    # lfs failing: the save goes on with the default layout
    failing = FakeLustre(fail=True)
    ck = Checkpointer(w.cfg(str(tmp_path / "ck"), lustre_stripe=("-c", "4")), lustre=failing)
    assert ck.save(3, model=model) is not None and len(failing.calls) == 1
    ck.close()
