"""The demo entry: ``python -m hpctrain.submit --entry hpctrain.examples.demo:main``.

A small MLP (an input layer, ``--layers`` residual blocks in an ``nn.ModuleList``, an output layer) trained
by :class:`hpctrain.train.Trainer` under DDP (or ``--parallel fsdp|hsdp|none``: the blocks are sharded one by
one, docs/train.md), on CPU (gloo) or GPU (NCCL). At the end it checks that every rank holds the same
weights (under fsdp/hsdp: the same gathered weights); rank 0 writes ``demo_result.json`` in the run
directory. Metrics go to ``RUN_DIR/train/metrics.jsonl`` (``python -m hpctrain status RUN_DIR``).

* Without ``--data`` it learns a fixed random linear map from synthetic batches; the batch of
  (step, rank) is drawn from its own seed, so a resumed run draws what it would have drawn.
* With ``--data FILE.h5 ...`` it classifies the samples of HDF5 files with datasets ``x`` and ``y``
  (``python -m hpctrain data synth`` writes one: standardised inputs labelled by a fixed linear
  teacher, so the loss falls from ln(10) within 100 steps) through :class:`hpctrain.data.H5Loader`.
* With ``--ckpt-every N`` (or ``--ckpt-minutes M``) it checkpoints (async) and at the end, with the
  loader's position; a run that finds a committed checkpoint in ``--ckpt-dir`` (default
  ``RUN_DIR/checkpoints``) resumes from it, on any number of ranks, mid-epoch.
* With ``--tensorboard [DIR]`` rank 0 writes TensorBoard events while training (``TrainConfig.tensorboard``).
"""

from __future__ import annotations

import argparse
import math
import time
import typing as tp

from hpctrain._atomic import atomic_write_json
from hpctrain.errors import UsageError

__all__ = ["main"]


def _minutes(text: str) -> tp.Union[float, str]:
    """``--ckpt-minutes``: a number of minutes, or ``auto``."""
    return "auto" if text == "auto" else float(text)


def _checkpointing(text: str) -> tp.Union[str, int]:
    """``--activation-checkpoint``: none, full, or k (every k-th block)."""
    return text if text in ("none", "full") else int(text)


def _model(n_in: int, hidden: int, n_out: int, layers: int) -> tp.Any:
    """The demo's network. The input and output layers are drawn first (the RNG draws of the blocks come
    after), and each block's last layer starts at zero, so at initialisation the blocks pass their input
    through: any ``--layers`` starts as the same function, the two-layer MLP."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(hidden, hidden)
            self.down = torch.nn.Linear(hidden, hidden)
            torch.nn.init.zeros_(self.down.weight)
            torch.nn.init.zeros_(self.down.bias)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.down(torch.relu(self.up(h)))

    class DemoNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(n_in, hidden)
            self.out = torch.nn.Linear(hidden, n_out)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.inp(x.flatten(1)))
            for block in self.blocks:
                h = block(h)
            return self.out(h)

    return DemoNet()


def _parse(args: tp.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpctrain.examples.demo")
    p.add_argument("--steps", type=int, default=50, help="total optimizer steps (a resumed run counts from its ckpt)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (all ranks; kept across node counts)")
    p.add_argument("--dim", type=int, default=32, help="input/output width of the synthetic task")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2, help="residual blocks between the input and output layers")
    p.add_argument(
        "--parallel",
        choices=("ddp", "fsdp", "hsdp", "none"),
        default="ddp",
        help="ddp: a replica per rank; fsdp: shard over all ranks; hsdp: shard within a node, replicate across",
    )
    p.add_argument(
        "--activation-checkpoint",
        type=_checkpointing,
        default="none",
        metavar="{none,full,K}",
        help="recompute the blocks' activations in backward: none, full, or every K-th block",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each block; its cache lives in the run directory (a requeue compiles warm)",
    )
    p.add_argument(
        "--lr", type=float, help="SGD learning rate (default: 0.5 with --data, 0.05 for the synthetic regression)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", nargs="+", metavar="FILE", help="HDF5 files with datasets x (samples) and y (int labels)")
    p.add_argument("--eval-data", nargs="+", metavar="FILE", help="HDF5 files to evaluate on (x, y)")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--classes", type=int, default=10, help="label classes in --data")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes per rank (with --data)")
    p.add_argument("--ckpt-every", type=int, default=0, help="save a checkpoint every N steps (0: not by steps)")
    p.add_argument(
        "--ckpt-minutes",
        type=_minutes,
        default=0.0,
        help='save every M minutes (0: not by time; "auto": the Young/Daly interval for the measured save cost)',
    )
    p.add_argument("--ckpt-dir", help="checkpoint directory (default: RUN_DIR/checkpoints); a run resumes from it")
    p.add_argument("--keep", type=int, default=2, help="committed checkpoints to keep")
    p.add_argument(
        "--local-every", type=int, default=0, metavar="STEPS", help="local+partner tier save every STEPS (0: off)"
    )
    p.add_argument("--global-every", type=int, default=5, metavar="K", help="every K-th local save goes global")
    p.add_argument("--local-dir", metavar="PATH", help="node-local tier dir (default: $SLURM_TMPDIR, $TMPDIR, /tmp)")
    p.add_argument("--log-every", type=int, default=10, help="steps per metrics interval")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--clip", type=float, default=0.0, help="gradient-norm clipping (0: off)")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off", help="mixed precision (GPU only)")
    p.add_argument("--no-metrics", action="store_true", help="no per-phase timing (for A/B runs of its cost)")
    p.add_argument("--quiet", action="store_true", help="no per-interval display")
    p.add_argument(
        "--sleep-ms",
        type=float,
        default=0.0,
        help="wait this long in each forward (a GPU's compute that leaves the CPU free: input-path benchmarks)",
    )
    p.add_argument(
        "--tensorboard",
        nargs="?",
        const=True,
        default=None,
        metavar="DIR",
        help="write TensorBoard events while training (rank 0) into DIR (relative: under RUN_DIR; "
        "default RUN_DIR/tensorboard); a requeued attempt continues the same TensorBoard run",
    )
    p.add_argument(
        "--accept-data-change",
        action="store_true",
        help="resume although --data changed since the previous attempt (recorded in the run's identity)",
    )
    opts = p.parse_args(list(args))
    if opts.lr is None:
        # classification on `data synth` files (standardised inputs, a linear teacher's labels): the loss
        # falls visibly within tools/demo's 100 steps at 0.5 (about 2.3 -> 0.5), barely at 0.05
        opts.lr = 0.5 if opts.data else 0.05
    for name in ("steps", "batch_size", "dim", "hidden", "classes"):
        if getattr(opts, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if opts.layers < 0 or (isinstance(opts.activation_checkpoint, int) and opts.activation_checkpoint < 1):
        p.error("--layers must be >= 0, --activation-checkpoint none, full or K >= 1")
    if not (0 <= opts.sleep_ms <= 60_000):
        p.error("--sleep-ms must be from 0 to 60000")
    if opts.ckpt_every < 0 or opts.workers < 0 or opts.keep < 1 or opts.local_every < 0 or opts.global_every < 1:
        p.error("--ckpt-every, --local-every and --workers must be >= 0, --keep and --global-every >= 1")
    return opts


def main(ctx: tp.Any) -> tp.Dict[str, tp.Any]:
    import torch
    import torch.distributed as dist

    from hpctrain.ckpt import CheckpointConfig
    from hpctrain.data import H5DataConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, ParallelConfig, TrainConfig, Trainer

    opts = _parse(ctx.args)
    if opts.batch_size % ctx.world_size:
        raise UsageError(f"demo: --batch-size {opts.batch_size} (global) is not divisible by {ctx.world_size} ranks")
    config = TrainConfig(
        steps=opts.steps,
        seed=opts.seed,
        log_every=opts.log_every,
        eval_every=opts.eval_every,
        grad_accum=opts.grad_accum,
        grad_clip=opts.clip,
        amp=opts.amp,
        checkpoint=CheckpointPolicy(
            every_steps=opts.ckpt_every,
            every_minutes=opts.ckpt_minutes,
            config=CheckpointConfig(
                dir=opts.ckpt_dir,
                keep_last=opts.keep,
                local_every_steps=opts.local_every,
                global_every_local_saves=opts.global_every,
                local_dir=opts.local_dir,
            ),
        ),
        metrics=MetricsConfig(enabled=not opts.no_metrics, display=not opts.quiet),
        accept_data_change=opts.accept_data_change,
        tensorboard=opts.tensorboard,
        parallel=ParallelConfig(
            mode=opts.parallel, activation_checkpoint=opts.activation_checkpoint, compile=opts.compile
        ),
    )
    local_batch = opts.batch_size // ctx.world_size

    def h5(files: tp.Sequence[str], **kw: tp.Any) -> H5DataConfig:
        return H5DataConfig(
            files=tuple(files), keys=("x", "y"), global_batch_size=opts.batch_size, num_workers=opts.workers, **kw
        )

    if opts.data:
        import h5py

        with h5py.File(opts.data[0], "r", locking=False) as f:
            n_in, n_out = math.prod(f["x"].shape[1:]), opts.classes
        data: tp.Any = h5(opts.data, seed=opts.seed)

        def loss(model: tp.Any, b: tp.Any) -> tp.Any:
            if opts.sleep_ms:
                time.sleep(opts.sleep_ms / 1e3)
            return torch.nn.functional.cross_entropy(model(b["x"].float()), b["y"].long())

    else:
        n_in = n_out = opts.dim
        target = torch.randn(opts.dim, opts.dim, generator=torch.Generator().manual_seed(opts.seed)).to(ctx.device)

        def data(start: int) -> tp.Iterator[tp.Tuple[torch.Tensor, torch.Tensor]]:
            gen = torch.Generator()
            for step in range(start + 1, opts.steps + 1):
                for micro in range(opts.grad_accum):
                    gen.manual_seed(((opts.seed * 1_000_003 + step) * 65_537 + ctx.rank) * 31 + micro)
                    x = torch.randn(local_batch, opts.dim, generator=gen).to(ctx.device, non_blocking=True)
                    yield x, x @ target

        loss = lambda model, b: torch.nn.functional.mse_loss(model(b[0]), b[1])

    trainer = Trainer(
        ctx,
        config=config,
        model=lambda: _model(n_in, opts.hidden, n_out, opts.layers),
        optimizer=lambda params: torch.optim.SGD(params, lr=opts.lr),
        loss_fn=loss,
        data=data,
        eval_data=h5(opts.eval_data, shuffle=False, tail="exact") if opts.eval_data else None,
    )
    fit = trainer.fit()

    # All ranks must hold the same weights after DDP steps: compare a checksum across ranks (of the gathered
    # weights under fsdp/hsdp, where each rank holds a shard)
    params = [p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in fit.model.parameters()]
    checksum = torch.stack([p.double().sum() for p in params]).sum().reshape(1).to(ctx.device)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    in_sync = all(torch.equal(g, checksum) for g in gathered)
    result = {
        "final_loss": fit.final_loss,
        "eval_loss": fit.eval_loss,
        "steps": fit.step,
        "steps_run": fit.step - fit.start_step,
        "stopped": fit.stopped,
        "resumed": fit.resumed,
        "world_size": ctx.world_size,
        "seconds": fit.seconds,
        "weights_in_sync": in_sync,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "parallel": opts.parallel,
        "data": list(opts.data or []),
        "weights_checksum": float(checksum.item()),
    }
    if ctx.is_main:
        atomic_write_json(ctx.run_dir / "demo_result.json", result)
    if not in_sync:
        raise RuntimeError("DDP replicas diverged: weights differ across ranks")
    return result
