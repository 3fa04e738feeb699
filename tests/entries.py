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


def hangs_on_rank_1(ctx):
    """A hand-written loop (an all-reduce and ``ctx.should_stop`` per step); at step 5 rank 1 sleeps for good
    after the step's all-reduce, before reporting it: the others block in step 6's all-reduce."""
    import torch
    import torch.distributed as dist

    for step in range(1, 1000):
        dist.all_reduce(torch.ones(1))
        if ctx.rank == 1 and step == 5:
            time.sleep(3600)
        if ctx.should_stop(step):
            break
        time.sleep(0.01)
    return ctx.rank


def straggler_fit(ctx):
    """A small Trainer run where rank 1's data read takes 40 ms more per batch: a straggler in ``data wait``."""
    import torch

    from hpctrain.train import MetricsConfig, TrainConfig, Trainer

    def data(start):
        gen = torch.Generator().manual_seed(ctx.rank)
        while True:
            if ctx.rank == 1:
                time.sleep(0.04)
            x = torch.randn(8, 8, generator=gen)
            yield x, x.sum(1, keepdim=True)

    trainer = Trainer(
        ctx,
        config=TrainConfig(
            steps=16,
            log_every=4,
            metrics=MetricsConfig(display=False),
        ),
        model=lambda: torch.nn.Linear(8, 1),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
        data=data,
    )
    return trainer.fit().step


def spare_probe(ctx):
    """What a warm spare's run context says (``HPCTRAIN_RECOVERY_SPARE``): run_dir/spare.json; with
    ``take-rank-0`` in its arguments it says it took rank 0 (the Runner then records the attempt's end)."""
    import torch.distributed as dist

    from hpctrain.runtime.recovery_config import took_rank

    if "take-rank-0" in ctx.args:
        took_rank(0)

    atomic_write_json(
        ctx.run_dir / "spare.json",
        {"rank": ctx.rank, "world_size": ctx.world_size, "group": dist.is_initialized(), "stop": ctx.stop is not None},
    )
    return "not a result"
