"""Per-rank functions for tests/train/test_parallel.py: the Trainer under ddp / fsdp / hsdp on CPU (gloo).

The model is a stack of residual blocks in an ``nn.ModuleList`` (what the Trainer shards one by one), with
the awkward cases switched on by flags: a head tied to the input projection, a frozen parameter, a 1-element
parameter (smaller than the world on dim 0: some ranks hold an empty shard) and bf16 weights. Parameters are
compared by a hash of their *global* values (DTensors gathered), so a model restored onto another world size
or mode compares equal only when every element landed in place.
"""

from __future__ import annotations

import hashlib
import typing as tp
from pathlib import Path

import torch

from tests.train.test_trainer import _ctx

DIM = 16


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, layers: int = 2, edges: bool = False) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(DIM, DIM)
        self.blocks = torch.nn.ModuleList(Block(DIM) for _ in range(layers))
        self.out = torch.nn.Linear(DIM, DIM)
        self.edges = edges
        if edges:
            self.out.weight = self.inp.weight  # tied
            self.gain = torch.nn.Parameter(torch.ones(1))  # 1 row: smaller than the world on dim 0
            self.shift = torch.nn.Parameter(torch.linspace(-0.1, 0.1, DIM), requires_grad=False)  # frozen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.edges:
            x = x + self.shift
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        y = self.out(h)
        return y * self.gain.mean() if self.edges else y


def data_for(
    rank: int, world: int, dtype: torch.dtype, at_start: tp.Callable[[], None], batch: int = 24
) -> tp.Callable[..., tp.Any]:
    """y = x @ W; the global batch of a step is the same whatever the world size (each rank takes its slice).
    ``at_start()`` runs when the Trainer asks for the batches: after the restore, before the first step."""
    target = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(7)) / DIM**0.5

    def data(start: int) -> tp.Iterator[tp.Any]:
        at_start()
        gen = torch.Generator()
        step = start
        while True:
            step += 1
            gen.manual_seed(step * 1009)
            x = torch.randn(batch, DIM, generator=gen)
            per = batch // world
            x = x[rank * per : (rank + 1) * per]
            yield x.to(dtype), (x @ target).to(dtype)

    return data


def global_hash(model: torch.nn.Module) -> str:
    """sha256 over the global value of every parameter (DTensors gathered), in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(remove_duplicate=False)):
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        h.update(name.encode())
        h.update(t.float().contiguous().numpy().tobytes())
    return h.hexdigest()


def fit(
    rank: int,
    world: int,
    run_dir: str,
    *,
    steps: int,
    mode: str = "fsdp",
    stop_at: tp.Optional[int] = None,
    ckpt_every: int = 0,
    edges: bool = False,
    dtype: torch.dtype = torch.float32,
    per_node: tp.Optional[int] = None,
    lr: float = 0.05,
    h5: tp.Optional[str] = None,
    **parallel: tp.Any,
) -> tp.Dict[str, tp.Any]:
    """One ``Trainer.fit``; returns the losses of its metrics intervals, the global parameter hash and the
    step it ended at (and whether it resumed). ``h5``: train and evaluate on that HDF5 file (x: 16 features,
    y: labels < 16) through the H5Loader instead of the synthetic regression."""
    from hpctrain.data import H5DataConfig
    from hpctrain.rundir import RunDir, read_jsonl
    from hpctrain.train import CheckpointPolicy, MetricsConfig, ParallelConfig, StopSignal, TrainConfig, Trainer

    stop = StopSignal()

    def should_stop(step: int) -> bool:
        if stop_at is not None and step >= stop_at:
            stop.request()
        return stop(step)

    config = TrainConfig(
        steps=steps,
        log_every=1,
        grad_clip=parallel.pop("grad_clip", 0.0),
        grad_accum=parallel.pop("grad_accum", 1),
        checkpoint=CheckpointPolicy(every_steps=ckpt_every, async_save=False),
        metrics=MetricsConfig(display=False, flops_per_sample=1e3),  # given: no FLOP count on the first step
        parallel=ParallelConfig(mode=mode, **parallel),
    )
    extra = {"local_world_size": per_node} if per_node else {}
    built: tp.List[torch.nn.Module] = []
    restored: tp.List[str] = []

    def model() -> torch.nn.Module:
        built.append(Net(edges=edges).to(dtype))  # sharded in place under fsdp: the object the Trainer trains
        return built[-1]

    at_start = lambda: restored.append(global_hash(built[-1]))  # noqa: E731
    data: tp.Any = data_for(rank, world, dtype, at_start)
    eval_data = None
    loss_fn = lambda m, b: torch.nn.functional.mse_loss(m(b[0]).float(), b[1].float())  # noqa: E731
    if h5 is not None:
        kw = dict(files=(h5,), keys=("x", "y"), global_batch_size=24, num_workers=0)
        data = H5DataConfig(**kw)  # type: ignore[arg-type]
        eval_data = H5DataConfig(**kw, shuffle=False, tail="exact")  # type: ignore[arg-type]
        loss_fn = lambda m, b: torch.nn.functional.cross_entropy(m(b["x"].float()), b["y"].long())  # noqa: E731
        config.eval_every = 3

    res = Trainer(
        _ctx(rank, world, run_dir, **extra),
        config=config,
        model=model,
        optimizer=lambda p: torch.optim.AdamW(p, lr=lr),
        loss_fn=loss_fn,
        data=data,
        eval_data=eval_data,
        should_stop=should_stop,
    ).fit()
    records, _ = read_jsonl(RunDir(run_dir).metrics)
    intervals = [r for r in records if r.get("kind") == "interval"]
    return {
        "step": res.step,
        "stopped": res.stopped,
        "seconds": res.seconds,
        "start": res.start_step,
        "resumed": res.resumed,
        "losses": {r["step"]: r["loss"] for r in intervals},
        "record": intervals[-1] if intervals else None,
        "hash": global_hash(res.model),
        "start_hash": restored[0] if restored else None,  # None with HDF5 data (no factory to call)
        "eval_loss": res.eval_loss,
        "evals": {r["step"]: r["loss"] for r in records if r.get("kind") == "eval"},
        "fsdp": type(res.model).__name__.startswith("FSDP"),
        "dtypes": sorted({str(p.dtype) for p in res.model.parameters()}),
    }


def plan(rank: int, world: int, root: str, jobs: tp.Sequence[tp.Tuple[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """Run several fits in one launch (a launch costs seconds): ``jobs`` = [(result name, fit kwargs)], the
    run directory ``root/<kwargs "dir", default the name>``; ``("copy", (src, dst))`` copies a run directory
    (rank 0, then a barrier) so that another launch can resume from this moment of it."""
    import shutil

    import torch.distributed as dist

    out = {}
    for name, kw in jobs:
        if name == "copy":
            if rank == 0:
                shutil.copytree(Path(root) / kw[0], Path(root) / kw[1])
            dist.barrier()
            continue
        kw = dict(kw)
        out[name] = fit(rank, world, str(Path(root) / kw.pop("dir", name)), **kw)
    return out


def shard_root(model: torch.nn.Module, mesh: tp.Any) -> torch.nn.Module:
    """A ``TrainConfig.parallel.parallelize`` hook: one FSDP group for the whole model (no per-block groups)."""
    from torch.distributed.fsdp import fully_shard

    return fully_shard(model, mesh=mesh)
