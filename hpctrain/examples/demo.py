"""The demo entry: ``python -m hpctrain.submit --entry hpctrain.examples.demo:main``.

A small MLP learns a fixed random linear map under DDP, on CPU (gloo) or GPU (NCCL). Every rank
draws a different batch from its own seeded generator; DDP averages the gradients, so all ranks
keep identical weights, which the demo checks at the end. Rank 0 writes ``demo_result.json`` in
the run directory. Later issues grow this into the full showcase (HDF5 data, checkpoints, requeue).
"""

from __future__ import annotations

import argparse
import time
import typing as tp

from hpctrain._atomic import atomic_write_json

__all__ = ["main"]


def _parse(args: tp.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpctrain.examples.demo")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(list(args))


def main(ctx: tp.Any) -> tp.Dict[str, tp.Any]:
    import torch
    import torch.distributed as dist

    from hpctrain.dist.process_group import wrap_ddp

    opts = _parse(ctx.args)
    torch.manual_seed(opts.seed)  # same initial weights on every rank (DDP also broadcasts them)
    target = torch.randn(opts.dim, opts.dim)
    model = torch.nn.Sequential(torch.nn.Linear(opts.dim, opts.hidden), torch.nn.ReLU(), torch.nn.Linear(opts.hidden, opts.dim))
    ddp = wrap_ddp(model, ctx.device)
    optim = torch.optim.SGD(ddp.parameters(), lr=opts.lr)
    gen = torch.Generator().manual_seed(opts.seed * 1000 + ctx.rank)
    target = target.to(ctx.device)
    t0, loss = time.perf_counter(), torch.zeros(())
    for step in range(1, opts.steps + 1):
        x = torch.randn(opts.batch_size, opts.dim, generator=gen).to(ctx.device, non_blocking=True)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if ctx.is_main and (step == 1 or step % 10 == 0 or step == opts.steps):
            print(f"demo: step {step}/{opts.steps} loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    # All ranks must hold the same weights after DDP steps: compare a checksum across ranks.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1).to(ctx.device)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    in_sync = all(torch.equal(g, checksum) for g in gathered)
    result = {
        "final_loss": float(loss.item()), "steps": opts.steps, "world_size": ctx.world_size,
        "seconds": elapsed, "weights_in_sync": in_sync, "device": str(ctx.device), "backend": ctx.backend,
    }
    if ctx.is_main:
        atomic_write_json(ctx.run_dir / "demo_result.json", result)
        print(f"demo: done in {elapsed:.2f}s, final loss {result['final_loss']:.4f}, weights in sync: {in_sync}", flush=True)
    if not in_sync:
        raise RuntimeError("DDP replicas diverged: weights differ across ranks")
    return result
