"""The entry of the sweep cluster test (tests/cluster/test_sweep.py): a tiny Trainer over an HDF5 file whose
learning rate and seed are the sweep's parameters; ``--sleep`` slows each step (the test's clock, not the math).
Each rank appends ``{"restart", "call", "t"}`` per step to ``RUN_DIR/samples/r<restart>-rank<R>.jsonl``."""

from __future__ import annotations

import argparse
import json
import time
import typing as tp


def main(ctx: tp.Any) -> tp.Dict[str, tp.Any]:
    import torch

    from hpctrain.ckpt import CheckpointConfig
    from hpctrain.data import H5DataConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig, Trainer

    p = argparse.ArgumentParser(prog="sweep_entry")
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--ckpt-every", type=int, default=50)
    opts = p.parse_args(list(ctx.args))
    samples = ctx.run_dir / "samples"
    samples.mkdir(exist_ok=True)
    log = open(samples / f"r{ctx.restart_count}-rank{ctx.rank}.jsonl", "a", buffering=1)
    calls = [0]

    def loss_fn(model: tp.Any, batch: tp.Any) -> tp.Any:
        if model.training:
            calls[0] += 1
            log.write(json.dumps({"restart": ctx.restart_count, "call": calls[0], "t": time.time()}) + "\n")
            if opts.sleep:
                time.sleep(opts.sleep)
        return torch.nn.functional.cross_entropy(model(batch["x"].float()), batch["y"].long())

    trainer = Trainer(
        ctx,
        config=TrainConfig(
            steps=opts.steps,
            seed=opts.seed,
            log_every=10,
            checkpoint=CheckpointPolicy(every_steps=opts.ckpt_every, config=CheckpointConfig(keep_last=2)),
            metrics=MetricsConfig(display=True),
        ),
        model=lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)),
        optimizer=lambda params: torch.optim.SGD(params, lr=opts.lr, momentum=0.9),
        loss_fn=loss_fn,
        data=H5DataConfig(files=(opts.data,), keys=("x", "y"), global_batch_size=16, num_workers=1, seed=opts.seed),
    )
    fit = trainer.fit()
    log.close()
    return {"step": fit.step, "stopped": fit.stopped}
