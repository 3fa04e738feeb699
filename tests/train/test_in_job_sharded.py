"""In-job recovery of sharded state (``parallel.mode="fsdp"``) on real processes (gloo on CPU, SIGKILL).

No survivor holds a dead FSDP rank's shards, so the state comes from storage, not from memory: on the new
generation's group every rank (the survivor and the warm spare that took the rank) builds the sharded model anew
and restores the newest commit. Here the local tier saves every 3 steps on simulated nodes of one rank each
(``HPCTRAIN_CKPT_SIM_RANKS_PER_NODE=1``), and the victim wipes its node's local directory before it dies (its node
is lost), so its shards come from their partner copy on the other node. Blocking saves, so which commit is the
newest at the failure is fixed. Nothing here asserts a speed.
"""

from __future__ import annotations

import os
import shutil
import signal
import typing as tp
from pathlib import Path

import pytest

from hpctrain.ckpt.tiers import SIM_NODES_ENV
from tests.train.in_job_workers import QUICK, launch, rank_context

STEPS, KILL_AT, BATCH, EVERY = 12, 8, 24, 3
"""12 steps, the victim killed in step 8 (7 completed), a local save every 3 steps: steps 7 and 8 are redone
from the commit at 6."""


def _fit(role, index, world, master_port, run_dir, h5, opts):
    import torch

    from hpctrain.ckpt import CheckpointConfig
    from hpctrain.data import H5DataConfig
    from hpctrain.runtime.recovery import RecoveryConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, ParallelConfig, TrainConfig, Trainer

    os.environ[SIM_NODES_ENV] = "1"
    ctx = rank_context(role, index, world, master_port, run_dir, job_id="t32s")
    calls = [0]
    local = Path(run_dir) / "local"

    def loss_fn(model, batch):
        out = model(batch["x"].reshape(len(batch["x"]), -1).float())
        if model.training:
            calls[0] += 1
            if role == "rank" and index == opts.get("victim") and calls[0] == opts.get("kill_at"):
                shutil.rmtree(local / f"node-{index}", ignore_errors=True)  # its node's disk goes with it
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the forward, before the backward's collectives
        return torch.nn.functional.cross_entropy(out, batch["y"].long())

    recovery = RecoveryConfig(**QUICK, spares=opts.get("spares", 0)) if opts.get("recovery") else None
    ck = CheckpointConfig(local_every_steps=EVERY, global_every_local_saves=100, local_dir=str(local))
    config = TrainConfig(
        steps=STEPS,
        log_every=4,
        parallel=ParallelConfig(mode="fsdp"),
        checkpoint=CheckpointPolicy(config=ck, async_save=False),
        metrics=MetricsConfig(display=False),
        recovery=recovery,
    )
    result = Trainer(
        ctx,
        config=config,
        model=lambda: torch.nn.Sequential(
            torch.nn.Linear(3 * 4 * 4, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 10)
        ),
        optimizer=lambda p: torch.optim.Adam(p, lr=1e-2),
        loss_fn=loss_fn,
        data=H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0),
    ).fit()
    return {"step": result.step, "start_step": result.start_step}


def _final_digest(run_dir: Path) -> tp.Dict[str, str]:
    from hpctrain.ckpt import digest

    return digest(run_dir / "checkpoints" / f"step-{STEPS:09d}")


@pytest.fixture(scope="module")
def h5(tmp_path_factory) -> str:
    from hpctrain.data import make_dataset

    return str(make_dataset(tmp_path_factory.mktemp("data") / "d.h5", 480, shape=(3, 4, 4), chunk_samples=16))


def test_a_dead_fsdp_rank_is_replaced_by_a_spare_and_the_state_reloaded_from_the_partner_tier(tmp_path, h5, capfd):
    from hpctrain.ledger import Ledger
    from hpctrain.status.report import collect
    from hpctrain.status.view import render

    ref = tmp_path / "ref"
    results, codes = launch(_fit, 2, 0, ref, h5, {})
    assert set(codes.values()) == {0}, results
    reference = _final_digest(ref)

    run = tmp_path / "run"
    opts = {"recovery": True, "spares": 1, "victim": 1, "kill_at": KILL_AT}
    results, codes = launch(_fit, 2, 1, run, h5, opts)
    assert codes.pop(("rank", 1)) == -signal.SIGKILL
    assert set(codes.values()) == {0}, results
    assert results[("spare", 0)][1] == {"step": STEPS, "start_step": 6}  # it joined at the commit of step 6
    assert _final_digest(run) == reference  # model and optimizer shards, data position: as if never interrupted

    (record,) = Ledger(run).records("in_job_recovery")
    assert record["failed_ranks"] == [1] and record["agreed_step"] == KILL_AT - 1
    assert record["replaced"] == [{"rank": 1, "was": "r1", "by": "s0", "spare": 0}]
    assert (record["state_from"], record["resumed_step"], record["steps_redone"]) == ("partner", 6, 2)
    assert record["fallback"] is None and record["failure_to_first_step_s"] > 0
    (end,) = Ledger(run).records("end")
    assert (end["status"], end["step"]) == ("completed", STEPS)
    err = capfd.readouterr().err
    assert "the sharded state reloaded from the partner tier: continuing after step 6" in err, err[-3000:]

    from rich.console import Console

    render(collect(run), Console(width=260, highlight=False))
    out = capfd.readouterr().out
    said = (
        "rank 1 by spare 0 in the job · sharded state reloaded from the partner tier · continued after step 6, 2 steps"
    )
    assert said in out, out


def test_sharded_state_without_checkpoints_has_no_recovery_and_says_so(monkeypatch, capfd):
    import types

    import torch

    from hpctrain.runtime.recovery import RecoveryConfig
    from hpctrain.train import CheckpointPolicy, ParallelConfig, TrainConfig
    from hpctrain.train.in_job import InJob

    monkeypatch.setenv("HPCTRAIN_RECOVERY_STORE", "127.0.0.1:1")
    config = TrainConfig(
        steps=1,
        parallel=ParallelConfig(mode="fsdp"),
        checkpoint=CheckpointPolicy(),  # no save cadence: checkpointing off
        recovery=RecoveryConfig(spares=1),
    )
    trainer = types.SimpleNamespace(
        config=config, ctx=types.SimpleNamespace(), rank=0, world_size=2, device=torch.device("cpu")
    )
    assert InJob.open(trainer) is None
    (line,) = [x for x in capfd.readouterr().err.splitlines() if x]
    assert "mode='fsdp' shards the state" in line and "checkpointing is off" in line, line
