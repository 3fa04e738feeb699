"""GPU check for sharded checkpoints: FSDP2 on GPUs saves its chunks, a reshard restore is exact, digests agree.

    python benchmarks/gpu_check_sharded.py --out DIR [--hidden 1024]

With G GPUs (G = min(2, visible)): G ranks on NCCL (plus the checkpointer's own gloo group) train an
FSDP2 (``fully_shard``) model for 2 steps with AdamW and save it; the same state saved as plain
(replicated) tensors by one process must digest equal; then the FSDP2 checkpoint is restored (a) into
FSDP2 on the G GPUs (same layout), (b) into 2 CPU ranks on gloo (G -> 2 reshard; 1 -> 2 on one GPU) and
(c) into a plain model on one GPU, and every restore must equal the saved global values bit for bit. With 2
GPUs, the replicated checkpoint is also restored read-once on both, its bytes exchanged over NCCL through device
buffers (``restore_exchange="device"``) and over gloo in host memory (``"host"``); both must be exact.

Prints one JSON object (also DIR/gpu_check_sharded.json); exit 0 when every check held, 1 when one failed,
2 (one line on stderr) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone without installing

from hpctrain.runtime.ports import free_port  # noqa: E402


def _model(hidden: int) -> tp.Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden, hidden + 3), torch.nn.ReLU(), torch.nn.Linear(hidden + 3, 7))


def _hash(model: tp.Any, opt: tp.Any) -> str:
    import torch

    h = hashlib.sha256()
    for sd in (model.state_dict(), opt.state_dict()["state"]):
        for k in sorted(sd, key=str):
            vals = sd[k].values() if isinstance(sd[k], dict) else [sd[k]]
            for v in vals:
                v = v.full_tensor() if hasattr(v, "full_tensor") else v
                if isinstance(v, torch.Tensor):
                    h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _fsdp(model: tp.Any, mesh: tp.Any) -> tp.Any:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _rank(rank: int, world: int, port: int, phase: str, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    gpu = phase != "cpu"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    dev = f"cuda:{rank}" if gpu else "cpu"
    if phase == "replicated":  # the plain checkpoint, read once: the exchange over NCCL (device) and gloo (host)
        hashes = {}
        for exchange in ("device", "host"):
            model = _model(args.hidden).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            cfg = CheckpointConfig(dir=Path(args.out) / "plain", restore_mode="read_once", restore_exchange=exchange)
            ck = Checkpointer(cfg)
            ck.restore(model=model, optimizer=opt)
            ck.close()
            hashes[exchange] = _hash(model, opt)
        if rank == 0:
            Path(out).write_text(json.dumps(hashes))
        dist.barrier()
        dist.destroy_process_group()
        return
    mesh = init_device_mesh("cuda" if gpu else "cpu", (world,))
    ck = Checkpointer(CheckpointConfig(dir=Path(args.out) / "fsdp", keep_last=0))
    model = _fsdp(_model(args.hidden).to(dev), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    res: tp.Dict[str, tp.Any] = {}
    if phase == "save":
        for s in range(2):
            g = torch.Generator(device=dev).manual_seed(s * 10 + rank)
            model(torch.randn(8, args.hidden, device=dev, generator=g)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        t0 = time.perf_counter()
        ck.save(2, model=model, optimizer=opt)
        res["save_s"] = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        r = ck.restore(model=model, optimizer=opt)
        res["restore_s"] = time.perf_counter() - t0
        res["step"] = r.step if r else None
    res["hash"] = _hash(model, opt)
    ck.close()
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def _spawn(world: int, phase: str, args: argparse.Namespace) -> tp.Dict[str, tp.Any]:
    port = free_port()
    out = Path(args.out) / f"{phase}.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, phase, args, str(out))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
    if any(p.exitcode for p in procs) or not out.exists():
        raise RuntimeError(f"phase {phase}: ranks exited with {[p.exitcode for p in procs]}")
    return tp.cast(tp.Dict[str, tp.Any], json.loads(out.read_text()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--hidden", type=int, default=1024)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_sharded: CUDA is not available", file=sys.stderr)
        return 2
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    gpus = min(2, torch.cuda.device_count())
    result: tp.Dict[str, tp.Any] = {"gpus": gpus}
    saved = _spawn(gpus, "save", args)
    result["save_s"] = round(saved["save_s"], 4)
    same = _spawn(gpus, "restore", args)
    cpu2 = _spawn(2, "cpu", args)
    from hpctrain.ckpt import CheckpointConfig, Checkpointer, digest

    model = _model(args.hidden).to("cuda:0")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ck = Checkpointer(CheckpointConfig(dir=args.out / "fsdp"))
    ck.restore(model=model, optimizer=opt)
    plain_hash = _hash(model, opt)
    plain = Checkpointer(CheckpointConfig(dir=args.out / "plain"))
    plain.save(2, model=model, optimizer=opt)  # the same state, replicated: the digest must not change
    plain.close()
    digest_equal = digest(args.out / "fsdp" / "step-000000002") == digest(args.out / "plain" / "step-000000002")
    result.update(
        restore_same_layout_s=round(same["restore_s"], 4),
        same_layout_exact=same["hash"] == saved["hash"],
        reshard_to_2_cpu_ranks_exact=cpu2["hash"] == saved["hash"],
        into_plain_gpu_model_exact=plain_hash == saved["hash"],
        digest_fsdp_equals_plain=digest_equal,
    )
    if gpus >= 2:  # NCCL needs a GPU per rank: with one GPU there is no exchange to check
        rep = _spawn(gpus, "replicated", args)
        result["replicated_read_once_nccl_exchange_exact"] = rep["device"] == saved["hash"]
        result["replicated_read_once_gloo_exchange_exact"] = rep["host"] == saved["hash"]
    ok = all(v for k, v in result.items() if k.endswith(("_exact", "_plain")))
    result["ok"] = ok
    text = json.dumps(result, indent=2)
    print(text)
    (args.out / "gpu_check_sharded.json").write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
