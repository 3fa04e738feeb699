"""GPU check for hpctrain checkpoints: async save of CUDA-resident state, restore onto the GPU.

    python benchmarks/gpu_check_ckpt.py --out DIR [--size-gb 3]

One process, one GPU. The state (about ``--size-gb`` in total: bf16 parameters, 8 large tensors and
a thousand small ones, plus fp32 Adam moments for the large ones) lives on the GPU. Measured:

* a first save (it also allocates and pins the host staging arena), then a sync save
  (device-to-host copy into the pinned arena + write + fsync + commit);
* two async saves: the time the training loop is blocked (staging into pinned host memory) and the
  time until committed; goal: blocking <= 10% of the sync save;
* restore onto the GPU (read + verify + host-to-device copies), checked bit-exact against the state.

Prints one JSON object (also written to DIR/gpu_check_ckpt.json). Exits 1 with a message when CUDA
is not available. Budget: well under 2 minutes on an H200 at the default size.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_checkpoint import Holder  # noqa: E402  (state_dict holders shared with the CPU benchmark)


def make_state(size_gb: float, device: str) -> tp.Tuple[tp.Dict[str, tp.Any], tp.Dict[str, tp.Any]]:
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    param_bytes = int(size_gb * 2**30 / 4.6)  # bf16 params + fp32 exp_avg/exp_avg_sq for 90% of them
    big = max(1, int(param_bytes * 0.9) // 8 // 2)  # 8 big bf16 tensors hold 90% of the parameters
    small = max(1, (param_bytes - 8 * big * 2) // 2 // 1000)
    model = {f"layers.{i}.weight": torch.randn(big, generator=g, device=device).to(torch.bfloat16) for i in range(8)}
    for i in range(1000):
        model[f"blocks.{i}.norm"] = torch.randn(small, generator=g, device=device).to(torch.bfloat16)
    opt = {
        "state": {
            i: {
                "step": torch.tensor(5.0),
                "exp_avg": torch.randn(t.shape, generator=g, device=device),
                "exp_avg_sq": torch.rand(t.shape, generator=g, device=device),
            }
            for i, t in enumerate(list(model.values())[:8])
        },
        "param_groups": [{"lr": 1e-4, "params": list(range(len(model)))}],
    }
    return model, opt


def state_bytes(obj: tp.Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the checkpoints and the JSON result")
    p.add_argument("--size-gb", type=float, default=3.0, help="total state size on the GPU (GiB)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check_ckpt: torch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("gpu_check_ckpt: CUDA is not available on this machine; run this check on a GPU node", file=sys.stderr)
        return 1
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    args.out.mkdir(parents=True, exist_ok=True)
    ck_dir = args.out / "ckpt"
    shutil.rmtree(ck_dir, ignore_errors=True)
    t_start = time.perf_counter()
    model, opt = make_state(args.size_gb, "cuda")
    torch.cuda.synchronize()
    nbytes = state_bytes(model) + state_bytes(opt)
    ck = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=2))
    mh, oh = Holder(model, True), Holder(opt, False)
    res: tp.Dict[str, tp.Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "state_bytes": nbytes,
    }

    t0 = time.perf_counter()
    ck.save(0, model=mh, optimizer=oh)  # the first save also allocates (pins) the host staging arena
    res["first_save_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ck.save(1, model=mh, optimizer=oh)
    res["sync_save_s"] = time.perf_counter() - t0
    for step, tag in ((2, "async_first"), (3, "async")):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ck.save(step, model=mh, optimizer=oh, blocking=False)
        res[f"{tag}_block_s"] = time.perf_counter() - t0
        ck.wait()
        res[f"{tag}_commit_s"] = time.perf_counter() - t0
    ck.close()

    target = {k: torch.empty_like(v) for k, v in model.items()}
    mh2, oh2 = Holder(target, True), Holder({}, False)
    ck2 = Checkpointer(CheckpointConfig(dir=ck_dir))
    t0 = time.perf_counter()
    r = ck2.restore(model=mh2, optimizer=oh2)
    torch.cuda.synchronize()
    res["restore_s"] = time.perf_counter() - t0
    ck2.close()
    assert r is not None and r.step == 3
    exact = all(torch.equal(target[k], model[k]) for k in model)
    exact = exact and all(
        torch.equal(oh2.sd["state"][i]["exp_avg"].cuda(), s["exp_avg"]) for i, s in opt["state"].items()
    )
    res["restore_bit_exact"] = bool(exact)
    gb = nbytes / 1e9
    res.update(
        {
            "async_block_vs_sync_save": res["async_block_s"] / res["sync_save_s"],
            "async_first_block_vs_sync_save": res["async_first_block_s"] / res["sync_save_s"],
            "d2h_staging_GBps": gb / res["async_block_s"],
            "sync_save_GBps": gb / res["sync_save_s"],
            "restore_GBps": gb / res["restore_s"],
            "goal_async_block_le_10pct": res["async_block_s"] <= 0.1 * res["sync_save_s"],
            "total_s": time.perf_counter() - t_start,
        }
    )
    res = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}
    text = json.dumps(res, indent=2)
    print(text)
    (args.out / "gpu_check_ckpt.json").write_text(text + "\n")
    shutil.rmtree(ck_dir, ignore_errors=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
