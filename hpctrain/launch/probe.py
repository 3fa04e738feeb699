"""The calibration entry: time the all-reduce of a few message sizes, then run the user's entry.

``python -m hpctrain.submit --nodes 2 --entry hpctrain.launch.probe:main -- --entry mypkg.train:main --
--steps 200`` (what ``python -m hpctrain capacity --calibrate`` submits): on every rank, before the user's
entry, a handful of all-reduces of 4 B to 32 MiB on the training process group (NCCL on GPUs, gloo on CPUs),
each timed on every rank; rank 0 writes the slowest rank's median per size to
``RUN_DIR/capacity/allreduce.json`` (:attr:`hpctrain.rundir.RunDir.capacity_probe`, schema
:data:`hpctrain.rundir.PROBE_SCHEMA`). The capacity model fits latency and bus bandwidth to it. Then the
user's entry runs with its own arguments (what follows the second ``--``), so the run directory holds a
normal training run as well. Runs on the compute nodes: imports torch. The login-side planner
(:mod:`hpctrain.capacity`) submits it by its ``module:function`` string and never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import typing as tp

from hpctrain._atomic import atomic_write_json
from hpctrain.rundir import PROBE_SCHEMA, RunDir

__all__ = ["main", "DEFAULT_SIZES", "measure"]

DEFAULT_SIZES = (4, 1 << 16, 1 << 20, 1 << 23, 1 << 25)
"""Bytes per all-reduce: latency-bound (4 B, 64 KiB) to bandwidth-bound (8 and 32 MiB)."""


def _parse(args: tp.Sequence[str]) -> tp.Tuple[argparse.Namespace, tp.List[str]]:
    args = list(args)
    rest: tp.List[str] = []
    if "--" in args:
        i = args.index("--")
        args, rest = args[:i], args[i + 1 :]
    p = argparse.ArgumentParser(prog="hpctrain.launch.probe")
    p.add_argument("--entry", help="the training entry (package.module:function) to run after the probe")
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="bytes per all-reduce")
    p.add_argument("--reps", type=int, default=10, help="timed all-reduces per size (after 2 warm-ups)")
    ns = p.parse_args(args)
    ns.sizes = [int(s) for s in ns.sizes.split(",") if s]
    return ns, rest


def measure(sizes: tp.Sequence[int], reps: int, device: tp.Any) -> tp.List[tp.Dict[str, float]]:
    """``[{"bytes", "seconds"}]``: per size, the median of ``reps`` timed all-reduces of float32 on the default
    process group, the slowest rank's (a MAX all-reduce of the medians)."""
    import torch
    import torch.distributed as dist

    cuda = torch.device(device).type == "cuda"
    out = []
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(reps + 2):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        out.append({"bytes": float(t.numel() * 4), "seconds": float(worst.item())})
    return out


def main(ctx: tp.Any) -> tp.Any:
    import torch.distributed as dist

    from hpctrain._entry import load_entry

    opts, rest = _parse(ctx.args)
    if dist.is_available() and dist.is_initialized() and ctx.world_size > 1:
        t0 = time.perf_counter()
        sizes = measure(opts.sizes, opts.reps, ctx.device)
        if ctx.rank == 0:
            path = RunDir(ctx.run_dir).capacity_probe
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(
                path,
                {
                    "schema": PROBE_SCHEMA,
                    "world_size": ctx.world_size,
                    "nodes": int(getattr(ctx, "num_nodes", 1) or 1),
                    "backend": ctx.backend,
                    "device": str(ctx.device),
                    "reps": opts.reps,
                    "seconds": time.perf_counter() - t0,
                    "sizes": sizes,
                },
            )
    if not opts.entry:
        return None
    return load_entry(opts.entry)(dataclasses.replace(ctx, args=tuple(rest)))
