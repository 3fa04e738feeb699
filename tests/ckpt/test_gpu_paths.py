"""The GPU paths of checkpoints, on CPU through seams: staging synchronises every GPU that holds state
(before and after the copies), the arena is pinned exactly its size and unpinned on growth and close,
and the CUDA RNG is the current device's, whatever the device count. benchmarks/gpu_check_ckpt.py
runs the same paths on a real GPU."""

from __future__ import annotations

import types
import typing as tp

import pytest
import torch

from hpctrain import testing
from hpctrain.ckpt import _staging as _staging_module
from hpctrain.ckpt._staging import Stager, cuda_devices
from hpctrain.ckpt._state import Piece, capture_rng, plan_offsets, restore_rng, whole


class FakeCuda(testing.FakeCuda):
    """Records pin/unpin/synchronize; ``snapshot`` sees the arena's bytes at each synchronize."""

    def __init__(self, pin_ok: bool = True) -> None:
        super().__init__(pin_ok=pin_ok)
        self.stager: tp.Optional[Stager] = None

    def synchronize(self, device: int) -> None:
        a = self.stager._arena if self.stager is not None else None
        self.log.append(("sync", device, bytes(a.tensor[:8].numpy()) if a is not None else None))


def _staged(stager: Stager, tensors: tp.Dict[str, torch.Tensor]) -> tp.Tuple[bytes, int]:
    pieces = whole(tensors)
    entries, size = plan_offsets(pieces)
    chunks = stager.stage(pieces, entries, size)
    return b"".join(bytes(c) for _, c in chunks), size


def test_cuda_devices_are_every_gpu_that_holds_a_piece():
    def piece(dev: str) -> Piece:
        return Piece("k", types.SimpleNamespace(device=torch.device(dev)), 0, 1, "float32", 4)  # type: ignore[arg-type]

    assert cuda_devices([piece("cuda:1"), piece("cpu"), piece("cuda:0"), piece("cuda:1")]) == [0, 1]
    assert cuda_devices([piece("cpu")]) == []


def test_every_gpu_is_synchronised_before_and_after_the_copies_and_the_arena_is_pinned(monkeypatch):
    fake = FakeCuda()
    stager = fake.stager = Stager(fake)
    monkeypatch.setattr(_staging_module, "cuda_devices", lambda pieces: [0, 2])  # as if the state sat on GPUs 0 and 2
    first = torch.arange(2, 10, dtype=torch.uint8)
    data, size = _staged(stager, {"a": first, "b": torch.arange(7.0).view(7, 1).t()})
    ops = [e[0] for e in fake.log]
    assert ops == ["pin", "sync", "sync", "sync", "sync"]
    assert [e[1] for e in fake.log[1:]] == [0, 2, 0, 2]
    pin = fake.log[0]
    assert pin[2] == size and pin[1] == stager._arena.ptr  # exactly the state's size, not a power of two
    assert pin[1] % 4096 == 0  # its own pages: registering never touches a neighbour's allocation
    before, after = fake.log[1][2], fake.log[3][2]
    assert before != bytes(first.numpy()) and after == bytes(first.numpy())  # copies between the two syncs
    assert data[:8] == bytes(first.numpy())
    assert stager.pinned_bytes == size


def test_a_grown_arena_unpins_the_old_one_first_and_release_unpins(monkeypatch):
    fake = FakeCuda()
    stager = Stager(fake)
    monkeypatch.setattr(_staging_module, "cuda_devices", lambda pieces: [0])
    _, small = _staged(stager, {"a": torch.zeros(100)})
    old = stager._arena.ptr
    _staged(stager, {"a": torch.zeros(10)})  # fits: reused, no new pin
    assert [e[0] for e in fake.log].count("pin") == 1
    fake.log.clear()
    _, big = _staged(stager, {"a": torch.zeros(100_000)})
    assert [e[:2] for e in fake.log[:2]] == [("unpin", old), ("pin", stager._arena.ptr)]
    assert stager.pinned_bytes == big > small
    fake.log.clear()
    ptr = stager._arena.ptr
    stager.release()
    assert fake.log == [("unpin", ptr)] and stager.pinned_bytes == 0
    stager.release()  # idempotent
    assert fake.log == [("unpin", ptr)]


def test_cpu_state_is_neither_pinned_nor_synchronised():
    fake = FakeCuda()
    stager = Stager(fake)
    t = torch.arange(50.0)
    data, _ = _staged(stager, {"a": t})
    assert fake.log == [] and stager.pinned_bytes == 0
    assert data[: t.nbytes] == t.numpy().tobytes()


def test_a_failed_pin_still_stages_correctly(monkeypatch):
    fake = FakeCuda(pin_ok=False)
    stager = Stager(fake)
    monkeypatch.setattr(_staging_module, "cuda_devices", lambda pieces: [0])
    t = torch.arange(12.0).view(3, 4).t()
    data, _ = _staged(stager, {"a": t})
    assert stager.pinned_bytes == 0
    assert data[: t.nbytes] == t.contiguous().numpy().tobytes()
    stager.release()
    assert [e[0] for e in fake.log] == ["pin", "sync", "sync"]  # never pinned: nothing to unpin


def test_checkpointer_close_unpins_the_arena(tmp_path, monkeypatch):
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    fake = FakeCuda()
    monkeypatch.setattr(_staging_module, "cuda_devices", lambda pieces: [0])
    ck = Checkpointer(CheckpointConfig(dir=tmp_path))
    ck._stager = Stager(fake)
    ck.save(1, extra={"w": torch.arange(1000.0)}, blocking=False)
    ptr = ck._stager._arena.ptr
    ck.close()
    assert fake.log[-1] == ("unpin", ptr) and ck._stager.pinned_bytes == 0
    got = Checkpointer(CheckpointConfig(dir=tmp_path)).restore().extra
    assert torch.equal(got["w"], torch.arange(1000.0))


class FakeCudaRng:
    """torch.cuda's RNG calls for ``count`` GPUs, the current one ``current``; every state distinct."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int, current: int) -> None:
        self.states = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(count)]
        self.current = current
        for name, fn in {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "device_count": lambda: count,
            "current_device": lambda: self.current,
            "get_rng_state": self.get,
            "get_rng_state_all": lambda: [s.clone() for s in self.states],
            "set_rng_state": self.set,
            "set_rng_state_all": self.set_all,
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)

    def get(self, device: tp.Any = "cuda") -> torch.Tensor:
        idx = torch.device(device).index if not isinstance(device, int) else device
        return self.states[self.current if idx is None else idx].clone()

    def set(self, state: torch.Tensor, device: tp.Any = "cuda") -> None:
        idx = torch.device(device).index if not isinstance(device, int) else device
        if state.numel() != 16:
            raise RuntimeError("RNG state is wrong size")
        self.states[self.current if idx is None else idx] = state.clone()

    def set_all(self, states: tp.List[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]


@pytest.mark.parametrize("count,current", [(4, 2), (1, 0)])
def test_cuda_rng_is_the_current_devices_and_restores_under_another_binding(monkeypatch, count, current):
    saved_on = FakeCudaRng(monkeypatch, count, current)
    state = capture_rng()
    assert isinstance(state["cuda"], torch.Tensor) and torch.equal(state["cuda"], saved_on.states[current])
    # resume with the other binding: all 4 GPUs visible (this rank on GPU 3) or one GPU per task
    resumed_on = FakeCudaRng(monkeypatch, 1 if count == 4 else 4, 0 if count == 4 else 3)
    assert restore_rng(state) == []
    assert torch.equal(resumed_on.states[resumed_on.current], state["cuda"])
    others = [int(s[0]) - 10 for i, s in enumerate(resumed_on.states) if i != resumed_on.current]
    assert others == [i for i in range(len(resumed_on.states)) if i != resumed_on.current]  # untouched


def test_old_checkpoints_with_every_gpus_rng_restore_on_the_same_count_and_are_named_otherwise(monkeypatch):
    old = {"cuda": [torch.full((16,), 50 + i, dtype=torch.uint8) for i in range(2)]}
    fake = FakeCudaRng(monkeypatch, 2, 1)
    assert restore_rng(old) == []
    assert [int(s[0]) for s in fake.states] == [50, 51]
    fake = FakeCudaRng(monkeypatch, 4, 1)
    assert restore_rng(old) == ["cuda (saved with 2 devices, 4 here)"]
    assert [int(s[0]) for s in fake.states] == [10, 11, 12, 13]


def test_malformed_or_unusable_cuda_rng_is_named_not_raised(monkeypatch):
    fake = FakeCudaRng(monkeypatch, 2, 1)
    assert restore_rng({"cuda": torch.zeros(3, dtype=torch.uint8)}) == ["cuda (malformed state)"]
    assert restore_rng({"cuda": "nonsense"}) == ["cuda (malformed state)"]
    assert [int(s[0]) for s in fake.states] == [10, 11]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert restore_rng({"cuda": torch.zeros(16, dtype=torch.uint8)}) == ["cuda (no GPU here)"]


def test_cuda_rng_round_trips_through_a_checkpoint(tmp_path, monkeypatch):
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    saved_on = FakeCudaRng(monkeypatch, 4, 2)
    ck = Checkpointer(CheckpointConfig(dir=tmp_path))
    ck.save(1, extra={"x": 1})
    ck.close()
    resumed_on = FakeCudaRng(monkeypatch, 1, 0)
    r = Checkpointer(CheckpointConfig(dir=tmp_path)).restore()
    assert r is not None and r.rng_restored
    assert torch.equal(resumed_on.states[0], saved_on.states[2])
