"""H5Loader end to end on real files with real worker processes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from hpctrain.data import H5DataConfig, H5Loader
from hpctrain.data.synth import sample_ids, teacher_labels
from hpctrain.errors import HpctrainError, UsageError


def cfg(files, **kw):
    base = dict(
        files=files, keys=("x", "y"), global_batch_size=40, seed=3, num_workers=2, start_method="fork", window_chunks=4
    )
    base.update(kw)
    return H5DataConfig(**base)


def check_batch(batch):
    idx = batch["index"]
    assert (torch.from_numpy(sample_ids(batch["x"])) == idx).all(), "x does not hold the sample it claims"
    return idx.tolist()


def epoch_ids(loader, limit=None):
    out = []
    for i, batch in enumerate(loader):
        out.append(check_batch(batch))
        if limit is not None and i + 1 == limit:
            break
    return out


@pytest.mark.parametrize("name", ["gzip", "lzf", "contig", "multi", "multicontig"])
def test_reads_the_right_samples_and_covers_the_epoch(files, name):
    n = {"gzip": 1000, "lzf": 700, "contig": 900, "multi": 1000, "multicontig": 900}[name]
    small_blocks = {"block_bytes": 8192} if name == "multicontig" else {}  # many blocks per file, ends mid-block
    with H5Loader(cfg(files[name], tail="exact", **small_blocks), rank=0, world_size=1) as loader:
        batches = []
        for b in loader:
            keep = b["valid"]
            assert (b["y"] == torch.from_numpy(teacher_labels(b["x"])))[keep].all()  # y belongs to this x
            batches.append([i for i, v in zip(check_batch(b), keep.tolist()) if v])
        got = sum(batches, [])
        assert sorted(got) == list(range(n))
        assert loader.epoch == 1 and loader.samples_consumed == 0
        assert len(batches) == len(loader)


def test_labels_follow_samples(files):
    import h5py

    with h5py.File(files["gzip"][0], "r") as f:
        labels = f["y"][:]
    with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as loader:
        for b in loader:
            assert (b["y"].numpy() == labels[b["index"].numpy()]).all()
            assert (b["y"].numpy() == teacher_labels(b["x"])).all()


def test_same_seed_same_order_new_epoch_new_order_workers_do_not_matter(files):
    f = files["multi"]
    with (
        H5Loader(cfg(f, num_workers=0), rank=0, world_size=1) as a,
        H5Loader(cfg(f, num_workers=2), rank=0, world_size=1) as b,
    ):
        e0a, e0b = epoch_ids(a), epoch_ids(b)
        assert e0a == e0b
        e1 = epoch_ids(a)
        assert e1 != e0a and len(set(sum(e1, []))) == len(sum(e0a, []))  # drop: another tail is dropped
    with H5Loader(cfg(f, seed=4, num_workers=0), rank=0, world_size=1) as c:
        assert epoch_ids(c) != e0a


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_split_each_global_batch_equally(files, world):
    f = files["gzip"]
    with H5Loader(cfg(f, num_workers=0), rank=0, world_size=1) as one:
        ref = epoch_ids(one)
    per_rank = []
    for r in range(world):
        with H5Loader(cfg(f, num_workers=1, partitions=1), rank=r, world_size=world) as loader:
            per_rank.append(epoch_ids(loader))
    assert len({len(x) for x in per_rank}) == 1  # equal number of batches
    assert all(len(b) == 40 // world for x in per_rank for b in x)
    joined = [sum((per_rank[r][i] for r in range(world)), []) for i in range(len(ref))]
    assert joined == ref  # same global batches as on one rank (partitions fixed)


def test_resume_audit_other_world_size_and_workers(files):
    """Stop at a random step on 2 ranks x 2 workers, resume on 4 ranks x 1 worker (and 1 x 3): exactly once."""
    f = files["multi"]
    rng = np.random.default_rng(0)
    for before, after, w_before, w_after in [(2, 4, 2, 1), (4, 1, 1, 3)]:
        c = cfg(f, partitions=4, tail="pad", global_batch_size=48)
        loaders = [H5Loader(c, rank=r, world_size=before) for r in range(before)]
        loaders = [
            H5Loader(
                cfg(f, partitions=4, tail="pad", global_batch_size=48, num_workers=w_before), rank=r, world_size=before
            )
            for r in range(before)
        ]
        stop = int(rng.integers(1, len(loaders[0])))
        seen = []
        its = [iter(x) for x in loaders]
        for _ in range(stop):
            for it in its:
                seen += check_batch(next(it))
        states = [x.state_dict() for x in loaders]
        assert all(s == states[0] for s in states)  # global state, identical on every rank
        state = json.loads(json.dumps(states[0]))  # JSON-able
        for x in loaders:
            x.close()
        for r in range(after):
            with H5Loader(
                cfg(f, partitions=None, tail="pad", global_batch_size=48, num_workers=w_after), rank=r, world_size=after
            ) as x:
                x.load_state_dict(state)
                assert x.partitions == 4
                for b in x:
                    seen += check_batch(b)
        total = len(loaders[0]) * 48
        assert len(seen) == total
        counts = np.bincount(seen, minlength=1000)
        assert (counts >= 1).all() and counts.sum() - 1000 == total - 1000  # every sample; only pads repeat


def test_resume_exact_mode_no_duplicates(files):
    f = files["lzf"]
    c = cfg(f, tail="exact", global_batch_size=64, partitions=2)
    seen = []
    with H5Loader(c, rank=0, world_size=2) as a, H5Loader(c, rank=1, world_size=2) as b:
        for ba, bb in zip(a, b):
            for batch in (ba, bb):
                seen += [i for i, v in zip(check_batch(batch), batch["valid"].tolist()) if v]
            if len(seen) >= 300:
                break
        state = a.state_dict()
    with H5Loader(cfg(f, tail="exact", global_batch_size=64, num_workers=1), rank=0, world_size=1) as x:
        x.load_state_dict(state)
        for batch in x:
            seen += [i for i, v in zip(check_batch(batch), batch["valid"].tolist()) if v]
    assert sorted(seen) == list(range(700))


def test_state_at_epoch_end_moves_to_next_epoch(files):
    with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as x:
        first = epoch_ids(x, limit=len(x))  # consume everything but do not finish the generator
        st = x.state_dict()
        assert st["samples_consumed"] == len(x) * 40 and st["epoch"] == 0
    with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as y:
        y.load_state_dict(st)
        assert (y.epoch, y.samples_consumed) == (1, 0)
        y.set_epoch(1)  # same epoch: keeps the position
        assert epoch_ids(y) != first


def test_state_from_another_config_is_refused(files):
    with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as x:
        st = x.state_dict()
    with H5Loader(cfg(files["gzip"], num_workers=0, seed=9), rank=0, world_size=1) as y:
        with pytest.raises(UsageError, match="seed is 3 in the checkpoint but 9 now"):
            y.load_state_dict(st)
    with H5Loader(cfg(files["lzf"], num_workers=0), rank=0, world_size=1) as z:
        with pytest.raises(UsageError, match="num_samples|fingerprint"):
            z.load_state_dict(st)
    with H5Loader(cfg(files["gzip"], num_workers=0, global_batch_size=80), rank=0, world_size=1) as y:
        with pytest.raises(UsageError, match="global_batch_size"):
            y.load_state_dict(st)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_and_forkserver_workers(files, method):
    with H5Loader(cfg(files["multi"], start_method=method, num_workers=2), rank=0, world_size=1) as x:
        ids = epoch_ids(x)
    with H5Loader(cfg(files["multi"], num_workers=0), rank=0, world_size=1) as y:
        assert epoch_ids(y) == ids


def test_close_is_quick_and_leaves_no_worker(files):
    x = H5Loader(cfg(files["gzip"], num_workers=2), rank=0, world_size=1)
    it = iter(x)
    next(it)
    pids = x.worker_pids()
    assert len(pids) == 2
    t0 = time.monotonic()
    x.close()
    assert time.monotonic() - t0 < 3.0
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(HpctrainError, match="closed"):
        iter(x)


def test_workers_ignore_slurm_signals(files):
    with H5Loader(cfg(files["gzip"], num_workers=2), rank=0, world_size=1) as x:
        it = iter(x)
        got = check_batch(next(it))
        for pid in x.worker_pids():
            os.kill(pid, signal.SIGUSR2)
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.2)
        rest = [check_batch(b) for b in it]
        assert len(rest) + 1 == len(x) and got


def _state(pid):
    """The process state letter of ``pid`` (``R``, ``S``, ``Z``, ...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_killed_worker_is_a_clear_error(files):
    with H5Loader(cfg(files["gzip"], num_workers=2, prefetch_depth=1), rank=0, world_size=1) as x:
        it = iter(x)
        next(it)
        pid = x.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        # the precondition is a dead worker: on a loaded machine a SIGKILLed process can stay in its exit path
        # (state R, its socket still open) for seconds, and the loader cannot yet tell it from a live one
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _state(pid) not in ("Z", "X", None):
            time.sleep(0.05)
        with pytest.raises(HpctrainError, match="data worker 0 died"):
            for _ in it:
                pass
            for _ in x:  # the epoch may have been prefetched before the kill: the next one needs worker 0
                pass


def test_abandoned_iterator_and_restart(files):
    with H5Loader(cfg(files["gzip"], num_workers=2), rank=0, world_size=1) as x:
        first = epoch_ids(x, limit=3)
        assert x.samples_consumed == 3 * 40
        rest = epoch_ids(x)  # a new iterator continues where the consumer stopped
        with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as y:
            assert first + rest == epoch_ids(y)


def test_metrics(files):
    with H5Loader(cfg(files["gzip"], num_workers=2), rank=0, world_size=1) as x:
        for _ in x:
            m = x.metrics.last
            assert m.data_wait_s >= 0 and m.queue_depth >= 0 and m.samples == 40 and m.nbytes == 40 * (32 * 4 + 8)
        s = x.metrics.summary()
        json.dumps(s)
        assert s["steps"] == len(x) and s["samples_per_s"] > 0 and 0 <= s["data_wait_frac"] <= 1
        assert 1.0 <= s["read_amplification"] < 3.0


def test_default_rank_from_environment_less_process(files):
    with H5Loader(cfg(files["gzip"], num_workers=0)) as x:
        assert (x.rank, x.world_size) == (0, 1)


def test_cpu_batches_are_tensors(files):
    with H5Loader(cfg(files["contig"], num_workers=0), rank=0, world_size=1, device="cpu") as x:
        b = next(iter(x))
        assert b["x"].dtype == torch.float32 and b["y"].dtype == torch.int64 and b["x"].shape == (40, 3, 8, 8)


@pytest.mark.parametrize("workers", [0, 2])
def test_contiguous_direct_reads_with_padding(files, workers):
    """The preadv path (no staging): every row right, padded repeats included, across ranks."""
    seen = []
    for r in range(2):
        with H5Loader(
            cfg(files["contig"], tail="pad", global_batch_size=128, num_workers=workers), rank=r, world_size=2
        ) as x:
            for b in x:
                seen += check_batch(b)
    assert set(seen) == set(range(900)) and len(seen) == 8 * 128


def test_iterating_again_after_taking_the_last_batch_starts_the_next_epoch(files):
    with H5Loader(cfg(files["gzip"], num_workers=0), rank=0, world_size=1) as x:
        epoch_ids(x, limit=len(x))  # took the last batch but never hit StopIteration
        assert x.epoch == 0
        again = epoch_ids(x)
        assert len(again) == len(x) and x.epoch == 2


def test_dtypes_big_endian_half_and_bytes(tmp_path):
    import h5py

    path = tmp_path / "dtypes.h5"
    n = 100
    with h5py.File(path, "w") as f:
        f.create_dataset("be", data=np.arange(n * 80, dtype=">f4").reshape(n, 80))  # contiguous, big-endian
        f.create_dataset(
            "half", data=np.arange(n, dtype=np.float16)[:, None].repeat(4, 1), chunks=(10, 4), compression="gzip"
        )
        f.create_dataset("img", data=(np.arange(n * 300) % 251).astype(np.uint8).reshape(n, 300))
        f.create_dataset("flag", data=np.arange(n) % 2 == 0)
    c = H5DataConfig(
        files=[str(path)], keys=("be", "half", "img", "flag"), global_batch_size=20, num_workers=1, start_method="fork"
    )
    with H5Loader(c, rank=0, world_size=1) as x:
        for b in x:
            i = b["index"].numpy()
            assert b["be"].dtype == torch.float32 and (b["be"][:, 0].numpy() == i * 80).all()
            assert b["half"].dtype == torch.float16 and (b["half"][:, 3].numpy() == i).all()
            assert b["img"].dtype == torch.uint8 and (b["img"][:, 1].numpy() == (i * 300 + 1) % 251).all()
            assert (b["flag"].numpy() == (i % 2 == 0)).all()


def test_string_and_compound_dtypes_are_refused(tmp_path):
    import h5py

    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f["name"] = np.array([b"a", b"b"])
        f["rec"] = np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")])
    for key in ("name", "rec"):
        with pytest.raises(UsageError, match=f"odd.h5: '{key}' has dtype .* torch tensors cannot hold"):
            H5Loader(H5DataConfig(files=[str(path)], keys=(key,), global_batch_size=1, num_workers=0))


def test_read_ahead_into_the_next_epoch_keeps_every_epoch_exact(files):
    """The pipeline prefetches epoch e+1 while e ends; set_epoch elsewhere discards that read-ahead."""
    f = files["multi"]
    with H5Loader(cfg(f, num_workers=0), rank=0, world_size=1) as ref:
        want = [epoch_ids(ref) for _ in range(3)]
        ref.set_epoch(7)
        want7 = epoch_ids(ref)
    with H5Loader(cfg(f, num_workers=2, global_batch_size=40), rank=0, world_size=1) as x:
        got = [epoch_ids(x) for _ in range(3)]
        assert x._pipe is not None and x._pipe.tasks  # epoch 3 is already being read
        x.set_epoch(7)
        assert epoch_ids(x) == want7
    assert got == want
