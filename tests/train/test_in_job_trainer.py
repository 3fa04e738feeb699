"""``TrainConfig.recovery``: the Trainer's in-job recovery on real processes (gloo on CPU, SIGKILL).

Each process is what the Runner would start: the ranks join a default process group from the launcher's address
and get a RunContext with a stop agreement; the warm spare (``HPCTRAIN_RECOVERY_SPARE``) gets one without a group.
The recovery's TCPStore is served by the test, which outlives every rank (on Slurm: the batch script's process).
HDF5 data, so a spare opens the failed rank's own shard. Nothing here asserts a speed.
"""

from __future__ import annotations

import os
import signal
import types
import typing as tp
from pathlib import Path

import pytest

from hpctrain.train.tensorboard import INTERVAL_TAGS
from tests.train.in_job_workers import QUICK, launch, rank_context, tensorboard_steps

STEPS, KILL_AT, BATCH = 12, 7, 24


def _fit(role, index, world, master_port, run_dir, h5, opts):
    import torch

    from hpctrain.data import H5DataConfig
    from hpctrain.runtime.recovery import RecoveryConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig, Trainer

    ctx = rank_context(role, index, world, master_port, run_dir, job_id="t32")
    calls = [0]

    def loss_fn(model, batch):
        out = model(batch["x"].reshape(len(batch["x"]), -1).float())
        if model.training:
            calls[0] += 1
            if role == "rank" and index == opts.get("victim") and calls[0] == opts.get("kill_at"):
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the forward, before the backward's all-reduce
        return torch.nn.functional.cross_entropy(out, batch["y"].long())

    recovery = RecoveryConfig(**QUICK, spares=opts.get("spares", 0)) if opts.get("recovery") else None
    config = TrainConfig(
        steps=STEPS,
        log_every=4,
        checkpoint=CheckpointPolicy(every_steps=5),
        metrics=MetricsConfig(display=False),
        recovery=recovery,
        tensorboard=bool(opts.get("tensorboard")),
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


def _launch(world: int, spares: int, run_dir: Path, h5: str, opts: tp.Dict[str, tp.Any], timeout: float = 150.0):
    return launch(_fit, world, spares, run_dir, h5, opts, timeout)


def _final_digest(run_dir: Path) -> tp.Dict[str, str]:
    from hpctrain.ckpt import digest

    return digest(run_dir / "checkpoints" / f"step-{STEPS:09d}")


@pytest.fixture(scope="module")
def h5(tmp_path_factory) -> str:
    from hpctrain.data import make_dataset

    return str(make_dataset(tmp_path_factory.mktemp("data") / "d.h5", 480, shape=(3, 4, 4), chunk_samples=16))


@pytest.fixture(scope="module")
def reference(h5, tmp_path_factory) -> tp.Dict[str, str]:
    """The final checkpoint's digests of the same run on 3 ranks, uninterrupted, recovery off: the plain Trainer."""
    ref_dir = tmp_path_factory.mktemp("ref")
    results, codes = _launch(3, 0, ref_dir, h5, {})
    assert set(codes.values()) == {0}, results
    return _final_digest(ref_dir)


@pytest.mark.parametrize("victim", [1, 0])  # rank 0 too: the spare then writes the metrics and commits
def test_a_killed_rank_is_replaced_by_a_warm_spare_and_the_final_checkpoint_is_bit_identical(
    victim, tmp_path, h5, reference
):
    from hpctrain.ledger import Ledger

    opts = {"recovery": True, "spares": 1, "victim": victim, "kill_at": KILL_AT, "tensorboard": True}
    results, codes = _launch(3, 1, tmp_path, h5, opts)
    assert codes.pop(("rank", victim)) == -signal.SIGKILL
    assert set(codes.values()) == {0}, results
    assert results[("spare", 0)][1] == {"step": STEPS, "start_step": KILL_AT - 1}  # it joined after step 6
    assert _final_digest(tmp_path) == reference  # model, optimizer, data position: bit-identical

    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["failed_ranks"] == [victim] and record["agreed_step"] == KILL_AT - 1
    assert record["replaced"] == [{"rank": victim, "was": f"r{victim}", "by": "s0", "spare": 0}]
    assert record["fallback"] is None and record["failure_to_first_step_s"] > 0
    # one end record, by rank 0's process: the spare when it took rank 0 (the dead rank 0 wrote the start)
    ends = Ledger(tmp_path).records("end")
    assert [(e["status"], e["step"], e["committed_step"]) for e in ends] == [("completed", STEPS, STEPS)]
    # the live TensorBoard run goes on (by the spare when it took rank 0): each interval once, in order
    assert tensorboard_steps(tmp_path, INTERVAL_TAGS[0][0]) == [4, 8, 12]


def test_without_a_spare_the_trainer_falls_back_with_one_line_as_a_peer_failure(tmp_path, h5, capfd):
    from hpctrain.ledger import Ledger

    opts = {"recovery": True, "spares": 0, "victim": 1, "kill_at": 4}
    results, codes = _launch(2, 0, tmp_path, h5, opts)
    assert codes == {("rank", 0): 1, ("rank", 1): -signal.SIGKILL}
    status, got = results[("rank", 0)]
    assert status == "error" and got["type"] == "InJobRecoveryFallback" and got["peer_failure"], got
    assert "no warm spare left for rank(s) [1]" in got["message"]
    lines = [x for x in capfd.readouterr().err.splitlines() if "falling back" in x]
    assert len(lines) == 1 and "rank 0" in lines[0], lines
    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["agreed_step"] == 3 and record["fallback"].startswith("no warm spare left")
    (end,) = Ledger(tmp_path).records("end")
    assert end["status"] == "failed" and "InJobRecoveryFallback" in end["error"]


def _trainer(mode="ddp", world=2, rank=0, recovery=True):
    import torch

    from hpctrain.runtime.recovery import RecoveryConfig
    from hpctrain.train import ParallelConfig, TrainConfig

    config = TrainConfig(
        steps=1, parallel=ParallelConfig(mode=mode), recovery=RecoveryConfig(spares=1) if recovery else None
    )
    return types.SimpleNamespace(
        config=config, ctx=types.SimpleNamespace(), rank=rank, world_size=world, device=torch.device("cpu")
    )


@pytest.mark.parametrize(
    ("kwargs", "env", "said"),
    [
        ({"mode": "fsdp"}, {"HPCTRAIN_RECOVERY_STORE": "127.0.0.1:1"}, "TrainConfig.parallel.mode='fsdp' shards"),
        ({"world": 1}, {"HPCTRAIN_RECOVERY_STORE": "127.0.0.1:1"}, "a world of 1 rank"),
        ({}, {}, "no recovery store (HPCTRAIN_RECOVERY_STORE unset"),
        ({"recovery": False}, {"HPCTRAIN_RECOVERY_SPARE": "0"}, "spare 0 idle"),
    ],
)
def test_recovery_that_cannot_work_here_is_off_with_one_line(kwargs, env, said, monkeypatch, capfd):
    from hpctrain.train.in_job import InJob

    for name in ("HPCTRAIN_RECOVERY_STORE", "HPCTRAIN_RECOVERY_SPARE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert InJob.open(_trainer(**kwargs)) is None
    err = [x for x in capfd.readouterr().err.splitlines() if x]
    assert len(err) == 1 and said in err[0], err


def test_a_bad_recovery_option_names_it():
    from hpctrain.errors import UsageError
    from hpctrain.train import TrainConfig

    with pytest.raises(UsageError, match=r"^TrainConfig.recovery must be a RecoveryConfig or None"):
        TrainConfig(steps=1, recovery={"spares": 1})
