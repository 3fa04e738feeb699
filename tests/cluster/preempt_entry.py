"""The entry the preemption tests run on the dev cluster: a tiny Trainer run over an HDF5 file that logs
every sample it consumes, with faults to order (an exception, a rank SIGKILLed during a save or at start).

``--samples``: each rank appends ``{"restart", "call", "index": [...]}`` per batch to
``RUN_DIR/samples/r<restart>-rank<R>.jsonl`` (grad_accum 1: call n of an attempt is step resumed+n).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import typing as tp


def write_data(path: tp.Any, samples: int) -> None:
    """The HDF5 input the cluster tests give this entry: ``samples`` rows of 8 features and a label in 0..3."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rng.standard_normal((samples, 8)).astype("float32"), chunks=(32, 8))
        f.create_dataset("y", data=rng.integers(0, 4, samples), chunks=(32,))


def _parse(args: tp.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="preempt_entry")
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (the clock of the test, not the math)")
    p.add_argument("--ckpt-every", type=int, default=50, help="periodic saves (the stop save is extra)")
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--local-every", type=int, default=0, help="the local tier: a local save every N steps")
    p.add_argument("--global-every", type=int, default=5, help="every K-th local save copied to the global tier")
    p.add_argument("--local-dir", default=None, help="the local tier's directory ({host}: the node's host name)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--fail-at", type=int, default=0, help="rank 1 raises ValueError at this step")
    p.add_argument("--kill-in-save", type=int, default=0, help="attempt 0: rank 1 SIGKILLs itself saving this step")
    p.add_argument("--kill-after", type=int, default=0, help="attempts >= 1: rank 1 SIGKILLs itself after N calls")
    p.add_argument("--hang-at", type=int, default=0, help="attempt 0: rank 1 sleeps for good at this call (a hang)")
    p.add_argument("--recovery", action="store_true", help="TrainConfig.recovery on (with --warm-spares: its spares)")
    p.add_argument("--kill-rank3-at", type=int, default=0, help="attempt 0: rank 3 SIGKILLs itself at this call")
    p.add_argument("--shrink", action="store_true", help="with --recovery: RecoveryConfig(shrink=True)")
    p.add_argument("--collective-timeout", type=float, default=0.0, help="RecoveryConfig.collective_timeout_s")
    p.add_argument("--spare-dies-taking", action="store_true", help="a warm spare SIGKILLs itself taking a rank")
    p.add_argument("--log-loss", action="store_true", help="each call's loss to samples/r<restart>-rank<R>.loss.jsonl")
    return p.parse_args(list(args))


def main(ctx: tp.Any) -> tp.Dict[str, tp.Any]:
    import torch

    from hpctrain.ckpt import CheckpointConfig, Checkpointer
    from hpctrain.data import H5DataConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, RecoveryConfig, TrainConfig, Trainer

    opts = _parse(ctx.args)
    samples_dir = ctx.run_dir / "samples"
    samples_dir.mkdir(exist_ok=True)
    log = open(samples_dir / f"r{ctx.restart_count}-rank{ctx.rank}.jsonl", "a", buffering=1)
    # a separate file: the tests count the records of the samples file as computed steps
    losses = open(samples_dir / f"r{ctx.restart_count}-rank{ctx.rank}.loss.jsonl", "a", buffering=1)
    calls = [0]

    if opts.kill_in_save and ctx.restart_count == 0 and ctx.rank == 1:
        original = Checkpointer.save

        def save(self: tp.Any, step: int, **kw: tp.Any) -> tp.Any:
            if step == opts.kill_in_save:
                os.kill(os.getpid(), signal.SIGKILL)  # rank 0 is inside the same save now
            return original(self, step, **kw)

        Checkpointer.save = save  # type: ignore[method-assign]

    if opts.spare_dies_taking and ctx.rank == -1:  # a warm spare: a second failure in the middle of the recovery
        from hpctrain.runtime.recovery import InJobRecovery

        stand_by = InJobRecovery.stand_by

        def dying(self: tp.Any, on_rank: tp.Any = None) -> tp.Any:
            def die(rank: int) -> None:
                with open(samples_dir / f"spare-died-{rank}.json", "w") as f:
                    f.write(json.dumps({"rank": rank, "t": time.time()}))
                os.kill(os.getpid(), signal.SIGKILL)

            return stand_by(self, on_rank=die)

        InJobRecovery.stand_by = dying  # type: ignore[method-assign]

    def loss_fn(model: tp.Any, batch: tp.Any) -> tp.Any:
        if not model.training:  # the Trainer's DDP bucket warm-up (no step): not a consumed batch
            return torch.nn.functional.cross_entropy(model(batch["x"].float()), batch["y"].long())
        calls[0] += 1
        record = {"restart": ctx.restart_count, "call": calls[0], "t": time.time(), "index": batch["index"].tolist()}
        log.write(json.dumps(record) + "\n")
        if opts.sleep:
            time.sleep(opts.sleep)
        if ctx.rank == 1 and opts.fail_at and calls[0] == opts.fail_at:
            raise ValueError(f"user code failed at call {calls[0]}")
        if ctx.rank == 1 and opts.kill_after and ctx.restart_count >= 1 and calls[0] == opts.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if ctx.rank == 3 and opts.kill_rank3_at and ctx.restart_count == 0 and calls[0] == opts.kill_rank3_at:
            log.write(json.dumps({"killed": time.time()}) + "\n")  # the failure's time, for the measured figure
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: before the forward and the backward's all-reduce
        if ctx.rank == 1 and opts.hang_at and ctx.restart_count == 0 and calls[0] == opts.hang_at:
            log.write(json.dumps({"hang": time.time()}) + "\n")  # when the hang began, for the measured figure
            time.sleep(24 * 3600)
        loss = torch.nn.functional.cross_entropy(model(batch["x"].float()), batch["y"].long())
        if opts.log_loss:
            losses.write(json.dumps({"call": calls[0], "loss": float(loss), "n": len(batch["index"])}) + "\n")
        return loss

    timeout = {"collective_timeout_s": opts.collective_timeout} if opts.collective_timeout else {}
    config = TrainConfig(
        steps=opts.steps,
        seed=1,
        log_every=10,
        checkpoint=CheckpointPolicy(
            every_steps=opts.ckpt_every,
            config=CheckpointConfig(
                keep_last=opts.keep,
                local_every_steps=opts.local_every,
                global_every_local_saves=opts.global_every,
                local_dir=opts.local_dir,
            ),
        ),
        metrics=MetricsConfig(display=True),
        # its spares: what the batch script started
        recovery=RecoveryConfig(shrink=opts.shrink, **timeout) if opts.recovery else None,
    )
    data = H5DataConfig(
        files=(opts.data,), keys=("x", "y"), global_batch_size=opts.batch, num_workers=opts.workers, seed=3
    )
    trainer = Trainer(
        ctx,
        config=config,
        model=lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        loss_fn=loss_fn,
        data=data,
    )
    fit = trainer.fit()
    log.close()
    losses.close()
    return {"step": fit.step, "stopped": fit.stopped}
