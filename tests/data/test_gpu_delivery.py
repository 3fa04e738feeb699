"""The GPU delivery path of H5Loader on CPU through a recording fake of the torch.cuda calls: which
stream waits for each copy and is recorded on the batch (``stream=`` or the current one), pinned
buffers reused only after their copy's event, and close() releasing the buffers and the copy stream.
benchmarks/gpu_check_loader.py runs the same path on a real GPU."""

from __future__ import annotations

import sys
import typing as tp

import numpy as np
import pytest
import torch

from hpctrain.data import H5DataConfig, H5Loader, _pinned
from hpctrain.data._pinned import PinnedRing
from hpctrain.testing import FakeCuda, FakeStream


def _views(i: int) -> tp.Dict[str, np.ndarray]:
    return {"x": np.full((4, 3), i, dtype=np.float32), "index": np.arange(4, dtype=np.int64) + 4 * i}


def test_the_given_stream_waits_for_each_copy_and_is_recorded_on_the_batch():
    fake = FakeCuda()
    ring = PinnedRing(torch.device("cuda", 0), depth=2, backend=fake)
    side = FakeStream(fake.log, "side")
    out = ring.deliver(_views(1), side)
    assert torch.equal(out["x"], torch.full((4, 3), 1.0)) and out["index"].tolist() == [4, 5, 6, 7]
    copy_ev = [e for e in fake.log if e[0] == "record"][0]
    assert copy_ev[1] == "copy"
    assert ("wait", "side", copy_ev[2]) in fake.log
    assert [e for e in fake.log if e[0] == "record_stream"] == [("record_stream", "side")] * 2
    assert not any(e[:2] == ("wait", "current") for e in fake.log)
    assert ring.pinned_bytes == 2 * (4 * 3 * 4 + 4 * 8)


def test_without_a_stream_the_current_one_waits_and_buffers_are_reused_after_their_copy():
    fake = FakeCuda()
    ring = PinnedRing(torch.device("cuda", 0), depth=2, backend=fake)
    outs = [ring.deliver(_views(i)) for i in range(3)]
    assert [int(o["x"][0, 0]) for o in outs] == [0, 1, 2]  # each batch owned, not a view of the ring
    records = [e for e in fake.log if e[0] == "record"]
    assert [e[0] for e in fake.log].count("pin") == 2 * 2 and [e[0] for e in fake.log].count("new stream") == 1
    # the third batch refills the first buffer only after the first copy's event
    third_fill = fake.log.index(records[2])
    assert ("sync", records[0][2]) in fake.log[:third_fill]
    assert all(("wait", "current", r[2]) in fake.log for r in records)


def test_close_releases_buffers_waits_for_the_copy_stream_and_empties_the_host_cache():
    fake = FakeCuda()
    ring = PinnedRing(torch.device("cuda", 0), depth=3, backend=fake)
    for i in range(2):
        ring.deliver(_views(i))
    buf = ring._ring[0][0]["x"]
    fake.log.clear()
    ring.close()
    assert fake.log == [("sync stream", "copy"), ("empty_host_cache",)]
    assert sys.getrefcount(buf) == 2  # the ring let go of it (this name and getrefcount's argument)
    assert ring.pinned_bytes == 0 and ring._stream is None
    fake.log.clear()
    ring.close()  # idempotent, and nothing to release
    assert fake.log == []


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_pinned, "CudaRuntime", lambda: fake)
    return fake


def _cfg(files: tp.Dict[str, tp.List[str]]) -> H5DataConfig:
    return H5DataConfig(files=files["gzip"], keys=("x",), global_batch_size=100, seed=1, num_workers=0)


def test_loader_hands_batches_to_its_stream_and_close_releases_the_ring(files, fake_cuda):
    side = FakeStream(fake_cuda.log, "side")
    loader = H5Loader(_cfg(files), rank=0, world_size=1, device="cuda", stream=side)
    with H5Loader(_cfg(files), rank=0, world_size=1) as ref:
        want = [b["x"].clone() for b in ref]
    got = []
    for i, b in enumerate(loader):
        got.append(b["x"])
        if i == 3:
            loader.stream = None  # later batches: the stream current at next()
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    waits = [e[1] for e in fake_cuda.log if e[0] == "wait"]
    assert waits == ["side"] * 4 + ["current"] * (len(want) - 4)
    assert loader.pinned_bytes > 0
    loader.close()
    assert loader.pinned_bytes == 0 and fake_cuda.log[-1] == ("empty_host_cache",)


def test_loader_default_rank_comes_from_the_runtime(files, monkeypatch):
    from hpctrain.runtime import process_group

    monkeypatch.setattr(process_group, "rank_and_world", lambda group=None: (1, 2))
    with H5Loader(_cfg(files)) as loader:
        assert (loader.rank, loader.world_size) == (1, 2)
