"""GPU check for checkpoints: an async save of GPU state that is being changed around it is exact.

    python benchmarks/gpu_check_ckpt.py --out DIR [--size-mb 512] [--rounds 3]

Each round: slow work and an update are queued on the GPU (some on a side stream, some on a second
GPU when there is one), the expected values are cloned behind them, ``save(blocking=False)`` is
called, and every tensor is overwritten at once (some on the side stream). After ``wait()`` the
restored state must equal the clones bit for bit: a save that did not wait for the queued updates,
or returned before its device-to-host copies ended, fails here. The state holds non-contiguous and
bf16 tensors. The pinned staging arena must be about the state's size (not a power of two), outside
torch's caching host allocator, and released by ``close()``.

Prints one JSON object (also DIR/gpu_check_ckpt.json); exit 0 when every assertion held, 1 when one
failed, 2 (one line on stderr) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone without installing

SLEEP_CYCLES = 200_000_000  # about 0.1 s of GPU time: the queued update is surely not done at save()


def make_state(size_mb: float, devices: tp.List[str]) -> tp.Dict[str, tp.Any]:
    import torch

    n = max(1024, int(size_mb * 2**20 / 4 / 4))  # four big float32-sized tensors hold the state
    state: tp.Dict[str, tp.Any] = {}
    for i, dev in enumerate(devices):
        g = torch.Generator(device=dev).manual_seed(i)
        side = int(n**0.5)
        state[f"g{i}.big"] = torch.randn(n // len(devices), generator=g, device=dev)
        state[f"g{i}.transposed"] = torch.randn(side, side, generator=g, device=dev).t()  # non-contiguous
        state[f"g{i}.strided"] = torch.randn(2 * (n // len(devices) // 2), generator=g, device=dev)[::2]
        state[f"g{i}.bf16"] = torch.randn(n // len(devices), generator=g, device=dev).to(torch.bfloat16)
        for j in range(200):
            state[f"g{i}.small.{j}"] = torch.randn(97, generator=g, device=dev)
    return state


def one_round(ck: tp.Any, step: int, state: tp.Dict[str, tp.Any], sides: tp.Dict[str, tp.Any]) -> tp.List[str]:
    """Queue updates, clone behind them, save async, overwrite, wait, restore: the keys that differ."""
    import torch

    expected = {}
    for i, (k, t) in enumerate(state.items()):
        dev = t.device
        on_side = i % 2 == 1
        with torch.cuda.device(dev), torch.cuda.stream(sides[str(dev)] if on_side else torch.cuda.current_stream(dev)):
            if i % 25 == 0:  # alternately on the current and the side stream
                torch.cuda._sleep(SLEEP_CYCLES)  # slow work ahead of the update on this stream
            t.add_(step)
            expected[k] = t.clone()  # on the same stream: the value the save must hold
    ck.save(step, extra=state, blocking=False)
    for i, t in enumerate(state.values()):  # the training loop goes on at once
        dev = t.device
        with (
            torch.cuda.device(dev),
            torch.cuda.stream(sides[str(dev)] if i % 3 == 0 else torch.cuda.current_stream(dev)),
        ):
            t.fill_(-7.0)
    ck.wait()
    for d in sides:
        torch.cuda.synchronize(d)
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    reader = Checkpointer(CheckpointConfig(dir=ck.config.dir))
    got = reader.restore(step=step).extra
    reader.close()
    bad = [k for k, v in expected.items() if not torch.equal(got[k].cpu(), v.cpu())]
    for k, v in expected.items():  # the next round starts from the saved values
        state[k].copy_(v)
    return bad


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the checkpoints and the JSON result")
    p.add_argument("--size-mb", type=float, default=512.0, help="state size (MiB), split over up to 2 GPUs")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_ckpt: CUDA is not available on this machine; run this check on a GPU node", file=sys.stderr)
        return 2
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    args.out.mkdir(parents=True, exist_ok=True)
    ck_dir = args.out / "ckpt"
    shutil.rmtree(ck_dir, ignore_errors=True)
    devices = [f"cuda:{i}" for i in range(min(2, torch.cuda.device_count()))]
    state = make_state(args.size_mb, devices)
    sides = {d: torch.cuda.Stream(device=d) for d in devices}
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    host_before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    res: tp.Dict[str, tp.Any] = {"devices": [torch.cuda.get_device_name(d) for d in devices], "state_bytes": nbytes}
    failures: tp.List[str] = []
    ck = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=2))
    t0 = time.perf_counter()
    for r in range(args.rounds):
        bad = one_round(ck, r + 1, state, sides)
        if bad:
            failures.append(f"round {r + 1}: {len(bad)} tensors differ from the values at save(), e.g. {bad[:3]}")
    res["rounds_s"] = round(time.perf_counter() - t0, 3)
    pinned = ck._stager.pinned_bytes
    host_growth = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) - host_before
    res.update(pinned_bytes=pinned, torch_host_cache_growth=host_growth)
    if not nbytes <= pinned <= nbytes * 1.05 + (4 << 20):  # the state + headers/RNG/alignment
        failures.append(f"pinned staging arena is {pinned} bytes for {nbytes} bytes of state")
    if host_growth >= nbytes // 2:
        failures.append(f"torch's caching host allocator grew by {host_growth} bytes: the arena is in its cache")
    ck.close()
    res["pinned_bytes_after_close"] = ck._stager.pinned_bytes
    if ck._stager.pinned_bytes:
        failures.append("close() left the staging arena pinned")
    res["failures"] = failures
    res["ok"] = not failures
    text = json.dumps(res, indent=2)
    print(text)
    (args.out / "gpu_check_ckpt.json").write_text(text + "\n")
    shutil.rmtree(ck_dir, ignore_errors=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
