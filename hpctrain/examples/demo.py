"""The demo entry: ``python -m hpctrain.submit --entry hpctrain.examples.demo:main``.

A small MLP trains under DDP, on CPU (gloo) or GPU (NCCL), and checks at the end that every rank
holds the same weights. Rank 0 writes ``demo_result.json`` in the run directory.

* Without ``--data`` it learns a fixed random linear map from synthetic batches; the batch of
  (step, rank) is drawn from its own seed, so a resumed run draws what it would have drawn.
* With ``--data FILE.h5 ...`` it classifies the samples of HDF5 files with datasets ``x`` and ``y``
  (``python -m hpctrain data synth`` writes one) through :class:`hpctrain.data.H5Loader`.
* With ``--ckpt-every N`` it saves a sharded checkpoint every N steps (async) and at the end, with
  the loader's position; a run that finds a committed checkpoint in ``--ckpt-dir`` resumes from it,
  on any number of ranks, and the loader continues mid-epoch where the checkpoint was taken.
"""

from __future__ import annotations

import argparse
import math
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain.errors import UsageError

__all__ = ["main"]


def _parse(args: tp.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpctrain.examples.demo")
    p.add_argument(
        "--steps", type=int, default=50, help="total optimizer steps (a resumed run counts from its checkpoint)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="global batch (all ranks together; kept when a run resumes on another number of ranks)",
    )
    p.add_argument("--dim", type=int, default=32, help="input/output width of the synthetic task")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", nargs="+", metavar="FILE", help="HDF5 files with datasets x (samples) and y (int labels)")
    p.add_argument("--classes", type=int, default=10, help="label classes in --data")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes per rank (with --data)")
    p.add_argument("--ckpt-every", type=int, default=0, help="save a checkpoint every N steps (0: no checkpoints)")
    p.add_argument("--ckpt-dir", help="checkpoint directory (default: RUN_DIR/checkpoints); a run resumes from it")
    p.add_argument("--keep", type=int, default=2, help="committed checkpoints to keep")
    opts = p.parse_args(list(args))
    for name in ("steps", "batch_size", "dim", "hidden", "classes"):
        if getattr(opts, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if opts.ckpt_every < 0 or opts.workers < 0 or opts.keep < 1:
        p.error("--ckpt-every and --workers must be >= 0, --keep >= 1")
    return opts


def main(ctx: tp.Any) -> tp.Dict[str, tp.Any]:
    import torch
    import torch.distributed as dist

    from hpctrain.runtime.process_group import wrap_ddp

    opts = _parse(ctx.args)
    if opts.batch_size % ctx.world_size:
        raise UsageError(
            f"demo: --batch-size {opts.batch_size} (global) is not divisible by the {ctx.world_size} ranks"
        )
    local_batch = opts.batch_size // ctx.world_size
    torch.manual_seed(opts.seed)  # same initial weights on every rank (DDP also broadcasts them)
    loader = None
    if opts.data:
        from hpctrain.data import H5DataConfig, H5Loader

        loader = H5Loader(
            H5DataConfig(
                files=tuple(opts.data),
                keys=("x", "y"),
                seed=opts.seed,
                global_batch_size=opts.batch_size,
                num_workers=opts.workers,
            ),
            rank=ctx.rank,
            world_size=ctx.world_size,
            device=ctx.device,
        )
        n_in, n_out = math.prod(loader.layout.files[0].keys["x"].sample_shape), opts.classes
    else:
        n_in = n_out = opts.dim
    target = torch.randn(opts.dim, opts.dim).to(ctx.device)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(n_in, opts.hidden), torch.nn.ReLU(), torch.nn.Linear(opts.hidden, n_out)
    )
    ddp = wrap_ddp(model, ctx.device)
    optim = torch.optim.SGD(ddp.parameters(), lr=opts.lr)

    ckpt, start, resumed = None, 0, None
    if opts.ckpt_every:
        from hpctrain.ckpt import CheckpointConfig, Checkpointer

        ckpt = Checkpointer(
            CheckpointConfig(dir=Path(opts.ckpt_dir or ctx.run_dir / "checkpoints"), keep_last=opts.keep),
            run_id=ctx.job_id,
        )
        got = ckpt.restore(model=model, optimizer=optim, map_location=ctx.device)
        if got is not None:
            start = got.step
            resumed = {"step": got.step, "saved_world_size": got.saved_world_size, "path": str(got.path)}
            if loader is not None:
                loader.load_state_dict((got.data_state or {}).get("loader", {}))
            if ctx.is_main:
                print(
                    f"demo: resumed from step {got.step} (saved by {got.saved_world_size} ranks): {got.path}",
                    flush=True,
                )

    def batches() -> tp.Iterator[tp.Tuple[tp.Any, tp.Any]]:
        if loader is None:
            gen = torch.Generator()
            for step in range(start + 1, opts.steps + 1):
                gen.manual_seed((opts.seed * 1_000_003 + step) * 65_537 + ctx.rank)
                x = torch.randn(local_batch, opts.dim, generator=gen).to(ctx.device, non_blocking=True)
                yield x, x @ target
        else:
            while True:  # epochs follow each other; the loader starts the next one by itself
                for b in loader:
                    yield b["x"].float(), b["y"].long()

    loss_fn = torch.nn.functional.cross_entropy if loader is not None else torch.nn.functional.mse_loss
    t0, loss, step = time.perf_counter(), torch.zeros(()), start
    try:
        it = batches()
        while step < opts.steps:
            x, y = next(it)
            loss = loss_fn(ddp(x), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            step += 1
            if ckpt is not None and (step % opts.ckpt_every == 0 or step == opts.steps):
                data_state = {"loader": loader.state_dict()} if loader is not None else {}
                ckpt.save(step, model=model, optimizer=optim, data_state=data_state, blocking=step == opts.steps)
            if ctx.is_main and (step == start + 1 or step % 10 == 0 or step == opts.steps):
                print(f"demo: step {step}/{opts.steps} loss {loss.item():.4f}", flush=True)
    finally:
        if loader is not None:
            loader.close()
        if ckpt is not None:
            ckpt.close()
    elapsed = time.perf_counter() - t0
    # All ranks must hold the same weights after DDP steps: compare a checksum across ranks.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1).to(ctx.device)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    in_sync = all(torch.equal(g, checksum) for g in gathered)
    result = {
        "final_loss": float(loss.item()),
        "steps": step,
        "steps_run": step - start,
        "resumed": resumed,
        "world_size": ctx.world_size,
        "seconds": elapsed,
        "weights_in_sync": in_sync,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "data": list(opts.data or []),
        "weights_checksum": float(checksum.item()),
    }
    if ctx.is_main:
        atomic_write_json(ctx.run_dir / "demo_result.json", result)
        print(
            f"demo: done in {elapsed:.2f}s, final loss {result['final_loss']:.4f}, weights in sync: {in_sync}",
            flush=True,
        )
    if not in_sync:
        raise RuntimeError("DDP replicas diverged: weights differ across ranks")
    return result
