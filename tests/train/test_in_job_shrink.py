"""``RecoveryConfig(shrink=True)``: no warm spare left, the survivors go on at the smaller world (real processes).

3 ranks on gloo, HDF5 data (global batch 24), rank 2 SIGKILLed mid-step at step 7 (after the forward, before the
backward's all-reduce), no spare: ranks 0 and 1 finish every step at a world of 2, 12 samples each instead of 8.
Compared with the same run on 3 ranks, uninterrupted: the samples of every step, in slot order, are the same
sequence; the global loss of every step after the failure matches within ``LOSS_RTOL`` (not bit-exact: the
float sums run in another order, see docs/preemption.md, "At a smaller world"). The model has no dropout
(a random mask is drawn per rank's local batch, so at another local batch size it differs) and SGD (Adam's
``m / sqrt(v)`` turns the last bits of a near-zero gradient into a visible update). Nothing asserts a speed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import types
import typing as tp
from pathlib import Path

import pytest

from hpctrain.train.tensorboard import INTERVAL_TAGS
from tests.train.in_job_workers import QUICK, launch, rank_context, tensorboard_steps

STEPS, KILL_AT, BATCH, MORE = 12, 7, 24, 3
LOSS_RTOL = 1e-4
"""Relative tolerance on each step's global loss after the failure. Measured: below 1e-6 (docs/preemption.md)."""


def _fit(role, index, world, master_port, run_dir, h5, opts):
    import torch
    import torch.distributed as dist

    from hpctrain.data import H5DataConfig
    from hpctrain.runtime.recovery import RecoveryConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig, Trainer
    from hpctrain.train.in_job import InJob

    ctx = rank_context(role, index, world, master_port, run_dir, job_id="t32s",
                       restart_count=opts.get("restart_count", 0))  # fmt: skip
    calls: tp.List[tp.Tuple[tp.List[int], float, int]] = []  # this rank's training forwards
    steps: tp.List[tp.Dict[str, tp.Any]] = []  # per optimizer step: its last forward, at this rank and world

    def loss_fn(model, batch):
        out = model(batch["x"].reshape(len(batch["x"]), -1).float())
        loss = torch.nn.functional.cross_entropy(out, batch["y"].long())
        if model.training:  # not DDP's bucket warm-up
            calls.append((batch["index"].tolist(), float(loss.detach()), len(batch["index"])))
            if index == opts.get("victim") and len(calls) == opts.get("kill_at"):
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the forward, before the backward's all-reduce
        return loss

    class Recorded(torch.optim.SGD):
        def step(self, closure=None):  # the forward just before an optimizer step is that step's
            ids, loss, n = calls[-1]
            steps.append({"rank": dist.get_rank(), "world": dist.get_world_size(), "ids": ids, "loss": loss, "n": n})
            return super().step(closure)

    if opts.get("die_in_shrink") == index:  # a second failure, in the middle of the shrink
        on_world = InJob._on_world

        def dying(self, rank, world_size):
            os.kill(os.getpid(), signal.SIGKILL)
            on_world(self, rank, world_size)

        InJob._on_world = dying
    recovery = RecoveryConfig(**{**QUICK, **opts.get("config", {})}, shrink=True) if opts.get("recovery") else None
    data = H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0)
    # the whole file, in order, every time: the same samples whatever the world size
    eval_data = dataclasses.replace(data, shuffle=False, tail="exact") if opts.get("eval") else None
    config = TrainConfig(
        steps=opts.get("steps", STEPS),
        eval_every=4 if eval_data is not None else 0,
        log_every=4,
        checkpoint=CheckpointPolicy(every_steps=5),
        metrics=MetricsConfig(display=False),
        recovery=recovery,
        tensorboard=bool(opts.get("tensorboard")),
    )
    result = Trainer(
        ctx,
        config=config,
        model=lambda: torch.nn.Sequential(torch.nn.Linear(3 * 4 * 4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)),
        optimizer=lambda p: Recorded(p, lr=0.05, momentum=0.9),
        loss_fn=loss_fn,
        data=data,
        eval_data=eval_data,
    ).fit()
    return {"step": result.step, "start_step": result.start_step, "steps": steps}


def _launch(world: int, run_dir: Path, h5: str, opts: tp.Dict[str, tp.Any], timeout: float = 150.0):
    return launch(_fit, world, 0, run_dir, h5, opts, timeout)


def _per_step(results: tp.Mapping[tp.Any, tp.Any]) -> tp.Dict[int, tp.Dict[str, tp.Any]]:
    """Step number -> the global batch as the ranks ran it: ids in rank order (the slot order), the global loss
    (each rank's mean weighted by its sample count), the world size. A survivor's steps are counted from its
    own list: steps 1.. of the attempt in order (the interrupted step's forward is superseded by its redo)."""
    by_step: tp.Dict[int, tp.List[tp.Dict[str, tp.Any]]] = {}
    for result in results.values():
        if result is None or result[0] != "ok":  # a killed rank reports nothing
            continue
        got = result[1]
        for k, s in enumerate(got["steps"]):
            by_step.setdefault(got["start_step"] + k + 1, []).append(s)
    out = {}
    for step, parts in sorted(by_step.items()):
        parts.sort(key=lambda s: s["rank"])
        n = sum(s["n"] for s in parts)
        out[step] = {
            "ids": [i for s in parts for i in s["ids"]],
            "loss": sum(s["loss"] * s["n"] for s in parts) / n,
            "world": {s["world"] for s in parts},
            "ranks": [s["rank"] for s in parts],
            "shares": [s["loss"] for s in parts],
        }
    return out


@pytest.fixture(scope="module")
def h5(tmp_path_factory) -> str:
    from hpctrain.data import make_dataset

    return str(make_dataset(tmp_path_factory.mktemp("data") / "d.h5", 480, shape=(3, 4, 4), chunk_samples=16))


@pytest.fixture(scope="module")
def reference(h5, tmp_path_factory) -> tp.Dict[int, tp.Dict[str, tp.Any]]:
    """The same run on 3 ranks, uninterrupted, recovery off: every step's global batch and loss."""
    results, codes = _launch(3, tmp_path_factory.mktemp("ref"), h5, {"steps": STEPS + MORE})
    assert set(codes.values()) == {0}, results
    return _per_step(results)


@pytest.mark.parametrize("victim", [2, 0])  # rank 0 too: old rank 1 is then rank 0 and writes the metrics
def test_no_spare_left_the_survivors_finish_at_the_smaller_world_with_the_same_samples_and_loss(
    victim, tmp_path, h5, reference, capfd
):
    from hpctrain.ckpt import latest_committed
    from hpctrain.ledger import Ledger
    from hpctrain.rundir import RunDir

    opts = {"recovery": True, "victim": victim, "kill_at": KILL_AT, "tensorboard": True}
    results, codes = _launch(3, tmp_path, h5, opts)
    assert codes.pop(("rank", victim)) == -signal.SIGKILL
    assert set(codes.values()) == {0}, results
    survivors = [r for r in range(3) if r != victim]
    for r in survivors:
        assert results[("rank", r)][1]["step"] == STEPS  # every step, each survivor
    got = _per_step(results)
    assert sorted(got) == list(range(1, STEPS + 1))
    local = BATCH // 3
    for step in range(1, KILL_AT):  # before the failure: the same world, its two survivors' parts
        mine = [i for r in survivors for i in reference[step]["ids"][r * local : (r + 1) * local]]
        assert got[step]["world"] == {3} and got[step]["ids"] == mine
    worst = 0.0
    for step in range(KILL_AT, STEPS + 1):  # after it: a world of 2, the whole global batch, in the same order
        assert got[step]["world"] == {2} and got[step]["ranks"] == [0, 1]
        assert got[step]["ids"] == reference[step]["ids"], step
        ref = reference[step]["loss"]
        worst = max(worst, abs(got[step]["loss"] - ref) / abs(ref))
        assert got[step]["loss"] == pytest.approx(ref, rel=LOSS_RTOL), step
    # the tolerance tells a wrong split apart: a share of the global batch left out moves the loss far more
    missed = min(abs(sum(ref["shares"][:2]) / 2 - ref["loss"]) / ref["loss"] for ref in reference.values())
    assert missed > 10 * LOSS_RTOL, missed

    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["fallback"] is None and record["failed_ranks"] == [victim] and record["agreed_step"] == KILL_AT - 1
    ranks = {str(old): new for new, old in enumerate(survivors)}
    assert record["elastic"] == {"world_size_was": 3, "world_size": 2, "dropped": [victim], "ranks": ranks}
    assert record["world_size"] == 2 and record["replaced"] == [] and record["failure_to_first_step_s"] > 0
    # one end record, by the process that is rank 0 at the end (old rank 1 when rank 0 died: it wrote no start)
    (end,) = Ledger(tmp_path).records("end")
    assert (end["status"], end["step"], end["committed_step"]) == ("completed", STEPS, STEPS)
    # the loss curve continues: rank 0 (the new one when rank 0 died) writes every interval, at the new size
    lines = [json.loads(x) for x in RunDir(tmp_path).metrics.read_text().splitlines()]
    intervals = [(x["step"], x["world_size"]) for x in lines if x.get("kind") == "interval"]
    assert intervals == [(4, 3), (8, 2), (12, 2)], intervals
    assert latest_committed(tmp_path / "checkpoints").world_size == 2  # the final commit: by the 2 survivors
    # the live TensorBoard run goes on too (by the new rank 0 when rank 0 died): each interval once, in order
    assert tensorboard_steps(tmp_path, INTERVAL_TAGS[0][0]) == [4, 8, 12]
    err = capfd.readouterr().err
    assert "continuing at a world of 2 (was 3) after step 6, the global batch of 24 split 12 a rank" in err
    print(f"max relative loss difference after the failure: {worst:.3g}; one share left out: >= {missed:.3g}")

    # the next attempt (a requeue) is the full world again: 3 ranks restore the 2-rank commit and go on
    opts = {"steps": STEPS + MORE, "restart_count": 1}
    results, codes = _launch(3, tmp_path, h5, opts)
    assert set(codes.values()) == {0}, results
    again = _per_step(results)
    assert sorted(again) == list(range(STEPS + 1, STEPS + MORE + 1))
    for step, part in again.items():
        assert part["world"] == {3} and part["ids"] == reference[step]["ids"]
        assert part["loss"] == pytest.approx(reference[step]["loss"], rel=LOSS_RTOL)
    later = max(abs(p["loss"] - reference[s]["loss"]) / reference[s]["loss"] for s, p in again.items())
    print(f"max relative loss difference in the next, full-size attempt: {later:.3g}")


def _evals(run_dir: Path) -> tp.Dict[int, float]:
    from hpctrain.rundir import RunDir

    lines = [json.loads(x) for x in RunDir(run_dir).metrics.read_text().splitlines()]
    return {x["step"]: x["loss"] for x in lines if x.get("kind") == "eval" and not x.get("interrupted")}


def test_the_evaluation_after_the_shrink_covers_the_same_samples_at_the_smaller_world(tmp_path, h5):
    """The evaluator's loader is re-sharded at the new rank and size: the evaluations after the failure (step 8,
    and the end's at 12) read the whole eval file at a world of 2 and match the 3-rank run's within LOSS_RTOL (a
    shard left out or read twice would move the mean far more: each rank's share is a third, then a half)."""
    from hpctrain.rundir import RunDir

    ref_dir = tmp_path / "ref"
    results, codes = _launch(3, ref_dir, h5, {"eval": True})
    assert set(codes.values()) == {0}, results
    run_dir = tmp_path / "shrink"
    results, codes = _launch(3, run_dir, h5, {"eval": True, "recovery": True, "victim": 2, "kill_at": KILL_AT})
    assert codes.pop(("rank", 2)) == -signal.SIGKILL and set(codes.values()) == {0}, results
    want, got = _evals(ref_dir), _evals(run_dir)
    assert sorted(want) == sorted(got) == [4, 8, STEPS], (want, got)
    for step in (8, STEPS):  # after the shrink at step 7
        assert got[step] == pytest.approx(want[step], rel=LOSS_RTOL), (step, got[step], want[step])
    assert got[4] == want[4]  # before the failure: the same 3 ranks, the same sums
    lines = [json.loads(x) for x in RunDir(run_dir).metrics.read_text().splitlines()]
    batches = {x["step"]: x["batches"] for x in lines if x.get("kind") == "eval"}
    assert batches == {4: 480 // BATCH, 8: 480 // BATCH, STEPS: 480 // BATCH}, batches  # a batch is global


def test_a_second_failure_during_the_shrink_falls_back_with_one_line(tmp_path, h5, capfd):
    from hpctrain.ledger import Ledger

    config = {"collective_timeout_s": 8.0, "agree_timeout_s": 20.0}
    opts = {"recovery": True, "victim": 2, "kill_at": 4, "die_in_shrink": 1, "config": config}
    results, codes = _launch(3, tmp_path, h5, opts)
    assert codes == {("rank", 0): 1, ("rank", 1): -signal.SIGKILL, ("rank", 2): -signal.SIGKILL}
    status, got = results[("rank", 0)]
    assert status == "error" and got["type"] == "InJobRecoveryFallback" and got["peer_failure"], got
    assert "a second failure during the recovery at the smaller world" in got["message"]
    lines = [x for x in capfd.readouterr().err.splitlines() if "falling back" in x]
    assert len(lines) == 1 and "rank 0" in lines[0], lines
    (record,) = Ledger(tmp_path).records("in_job_recovery")
    assert record["fallback"].startswith("a second failure during the recovery at the smaller world")
    assert record["elastic"]["world_size"] == 2


def _trainer(data: tp.Any, eval_data: tp.Any = None) -> tp.Any:
    return types.SimpleNamespace(data=data, eval_data=eval_data)


def test_a_world_that_cannot_take_the_run_is_named_in_the_fallback():
    from hpctrain.train.in_job import InJob

    job = InJob.__new__(InJob)
    job.trainer, job.sharded = _trainer(types.SimpleNamespace(global_batch_size=24)), False
    assert job._can_shrink(2) is None and job._can_shrink(3) is None
    assert job._can_shrink(5) == "the data's H5DataConfig.global_batch_size=24 is not divisible by 5"
    job.trainer = _trainer(types.SimpleNamespace(global_batch_size=24), types.SimpleNamespace(global_batch_size=9))
    assert job._can_shrink(2) == "the eval_data's H5DataConfig.global_batch_size=9 is not divisible by 2"
    job.trainer = _trainer(lambda start: iter(()))
    assert "a data factory, which cannot be split over fewer ranks" in job._can_shrink(2)
    job.sharded = True  # fsdp/hsdp: its state is recovered from storage at the run's own size only
    job.trainer = _trainer(types.SimpleNamespace(global_batch_size=24))
    job.trainer.config = types.SimpleNamespace(parallel=types.SimpleNamespace(mode="fsdp"))
    assert (
        job._can_shrink(2)
        == "TrainConfig.parallel.mode='fsdp': the sharded state is recovered at the run's own world size only"
    )


def test_the_smaller_world_renumbers_the_survivors_in_rank_order():
    from hpctrain.runtime.shrink import renumbered, smaller_world

    got = smaller_world({0: "r0", 2: "s0", 3: "r3"}, [1])  # rank 2 taken by spare 0, no spare for rank 1
    assert got == {"world_size_was": 4, "world_size": 3, "dropped": [1], "ranks": {"0": 0, "2": 1, "3": 2}}
    assert renumbered(got, 3) == 2
    with pytest.raises(KeyError):
        renumbered(got, 1)


def test_the_plan_at_a_smaller_world_renumbers_or_falls_back_naming_why():
    from hpctrain.runtime.recovery import InJobRecovery, RecoveryConfig

    rec = InJobRecovery.__new__(InJobRecovery)  # the plan only: no store, no heartbeat (no spare to look up)
    rec.config, rec.members, rec.spares_used = RecoveryConfig(shrink=True), {0: "r0", 1: "r1", 2: "r2"}, []
    rec._can_shrink = lambda n: f"the data's H5DataConfig.global_batch_size=21 is not divisible by {n}"
    arrived = {0: {"step": 6, "detected_at": 1.0}, 1: {"step": 6, "detected_at": 1.0}}
    plan = rec._plan(0, arrived, [2], {"r2"}, {"r2": (b"0.5", 0.0)})
    assert plan["fallback"] == (
        "no warm spare left for rank(s) [2] (0 configured, 0 used); the smaller world of 2 rank(s) cannot take "
        "the run: the data's H5DataConfig.global_batch_size=21 is not divisible by 2"
    )
    rec._can_shrink = lambda n: None
    arrived = {0: {"step": 5, "detected_at": 1.0}, 2: {"step": 6, "detected_at": 1.0}}
    plan = rec._plan(0, arrived, [1], {"r1"}, {"r1": (b"0.5", 0.0)})
    assert plan["fallback"] is None and plan["members"] == {"0": "r0", "1": "r2"}
    assert plan["agreed_step"] == 6 and plan["source_rank"] == 1  # old rank 2, the one at the agreed step
    assert plan["elastic"]["ranks"] == {"0": 0, "2": 1} and plan["failed_at"] == 0.5


def test_the_runner_ends_a_renumbered_rank_as_its_new_rank(monkeypatch):
    import dataclasses

    from hpctrain.launch.runner import _renumbered
    from hpctrain.runtime import recovery_config

    @dataclasses.dataclass
    class Env:
        rank: int
        world_size: int

    monkeypatch.setattr(recovery_config, "_TAKEN", [])
    assert _renumbered(Env(2, 3)) == Env(2, 3)  # nothing taken: its own rank
    recovery_config.took_rank(1)  # a warm spare's (its world is the training world's): not a renumbering
    assert _renumbered(Env(2, 3)) == Env(2, 3)
    recovery_config.took_rank(1, 2)  # a survivor renumbered at a smaller world
    assert _renumbered(Env(2, 3)) == Env(1, 2)
