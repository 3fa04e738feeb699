"""Entry points the tests submit (``tests.entries:NAME``); importable from the repository root."""

from __future__ import annotations

import time

from hpctrain._atomic import atomic_write_json


def allreduce_probe(ctx):
    """One all-reduce + one DDP step on ``ctx.device`` (gloo on CPU, NCCL on GPU); each rank writes what it saw
    to run_dir/probe/rank-N.json."""
    import torch
    import torch.distributed as dist

    from hpctrain.launch.runner import _local_address
    from hpctrain.runtime.process_group import wrap_ddp

    value = torch.tensor([float(ctx.rank + 1)], device=ctx.device)  # NCCL reduces device tensors only
    dist.all_reduce(value)
    torch.manual_seed(0)
    model = wrap_ddp(torch.nn.Linear(4, 2), ctx.device)
    x = torch.full((3, 4), float(ctx.rank), device=ctx.device)  # a different batch per rank: DDP must average the grads
    model(x).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    record = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "hostname": ctx.hostname,
        "address": _local_address(ctx.master_addr, ctx.master_port),
        "reduced": value.item(),
        "weights": weights,
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
        "backend": ctx.backend,
        "device": str(ctx.device),
        "args": list(ctx.args),
        "cpu_threads": torch.get_num_threads(),
        "job_id": ctx.job_id,
        "master": f"{ctx.master_addr}:{ctx.master_port}",
        "time": time.time(),
    }
    (ctx.run_dir / "probe").mkdir(exist_ok=True)
    atomic_write_json(ctx.run_dir / "probe" / f"rank-{ctx.rank}.json", record)
    return record


def fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return ctx.rank


def rank0_killed_after_a_collective(ctx):
    """Every rank joins one all-reduce; then rank 0 SIGKILLs itself and the others enter the next one."""
    import os
    import signal

    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    if ctx.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    dist.all_reduce(torch.ones(1))
    return ctx.rank
