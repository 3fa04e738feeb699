"""The Trainer on real processes (gloo on CPU): it learns, measures every phase, stops together, runs epochs
with accumulation and evaluation, and refuses what it cannot do with one clear error."""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir, read_jsonl
from tests.multiproc import run_world

DIM, BATCH = 16, 32
PARTS = ("data_wait_s", "forward_backward_s", "grad_comm_exposed_s", "optimizer_s", "checkpoint_s")


def _ctx(rank, world, run_dir, **extra):
    """A duck-typed run context on CPU (what the Trainer reads of a RunContext); ``extra`` adds attributes."""
    import torch

    return types.SimpleNamespace(
        rank=rank,
        world_size=world,
        device=torch.device("cpu"),
        run_dir=Path(run_dir),
        job_id="t1",
        restart_count=0,
        hostname="host",
        hostnames=("host",),
        launcher="single",
        **extra,
    )


def _regression(rank, world, seed=0):
    """A learnable task: y = x @ W, the batch of (step, rank) drawn from its own seed."""
    import torch

    target = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(seed)) / DIM**0.5

    def data(start):
        gen = torch.Generator()
        step = start
        while True:
            step += 1
            gen.manual_seed(step * 1009 + rank)
            x = torch.randn(BATCH // world, DIM, generator=gen)
            yield x, x @ target

    return data


def _fit(rank, world, run_dir, cfg_kwargs, stop_at=None, stop_rank=None, h5=None):
    import torch

    from hpctrain.data import H5DataConfig
    from hpctrain.train import MetricsConfig, StopSignal, TrainConfig, Trainer

    cfg_kwargs = dict(cfg_kwargs)
    metrics = cfg_kwargs.pop("metrics", {})
    config = TrainConfig(**cfg_kwargs, metrics=MetricsConfig(display=False, **metrics))
    stop = StopSignal()
    if h5 is not None:
        data = H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=1)
        eval_data = H5DataConfig(
            files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0, shuffle=False, tail="exact"
        )
        loss_fn = lambda m, b: torch.nn.functional.cross_entropy(m(b["x"].float()), b["y"].long())
        model = lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))
    else:
        data, eval_data = _regression(rank, world), None
        loss_fn = lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1])
        model = lambda: torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, DIM))

    def should_stop(step):
        if stop_at is not None and step >= stop_at and rank == stop_rank:
            stop.request()  # only one rank is asked: all of them must stop at the same step
        return stop(step)

    fit = Trainer(
        _ctx(rank, world, run_dir),
        config=config,
        model=model,
        optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.7),
        loss_fn=loss_fn,
        data=data,
        eval_data=eval_data,
        should_stop=should_stop,
    ).fit()
    return {"step": fit.step, "stopped": fit.stopped, "total": fit.total_steps, "eval_loss": fit.eval_loss}


def _intervals(run_dir):
    records, problems = read_jsonl(RunDir(run_dir).metrics)
    assert problems == []
    return [r for r in records if r["kind"] == "interval"], [r for r in records if r["kind"] == "eval"]


@pytest.mark.parametrize("world", [1, 2])
def test_loss_decreases_and_every_phase_is_measured_and_adds_up(tmp_path, world):
    results = run_world(_fit, world, str(tmp_path), {"steps": 40, "log_every": 10}).results
    assert [r["step"] for r in results] == [40] * world and not any(r["stopped"] for r in results)
    intervals, _ = _intervals(tmp_path)
    assert [r["step"] for r in intervals] == [10, 20, 30, 40]
    assert intervals[-1]["loss"] < 0.5 * intervals[0]["loss"]
    for rec in intervals:
        assert rec["world_size"] == world and rec["samples"] == 10 * BATCH and rec["samples_per_s"] > 0
        assert rec["measured"] and rec["mfu"] is None and rec["flops_per_s"] > 0  # CPU: FLOPs counted, no peak
        per_step, spread = rec["per_step"], rec["samples_per_s_per_rank"]
        assert 0 < spread["min"] <= spread["median"] <= spread["max"]
        for name in ("step_s", "data_wait_s", "forward_backward_s", "optimizer_s"):
            assert 0 < per_step[name]["min"] <= per_step[name]["median"] <= per_step[name]["max"], name
        assert per_step["grad_comm_exposed_s"]["min"] >= 0 and per_step["checkpoint_s"]["max"] == 0
        # the parts of a rank's step never exceed it: the sum of the parts' minima is at most the fastest step,
        # and no part's maximum exceeds the slowest step
        assert sum(per_step[p]["min"] for p in PARTS) <= per_step["step_s"]["min"]
        assert all(per_step[p]["max"] <= per_step["step_s"]["max"] for p in PARTS)
        assert 0 <= rec["data_wait_frac"] < 1 and rec["slowest_rank"] in range(world)
    if world == 2:  # the all-reduce is timed by the comm hook
        assert max(r["per_step"]["grad_comm_exposed_s"]["max"] for r in intervals) > 0
    ledger, problems = read_jsonl(RunDir(tmp_path).ledger)
    assert problems == [] and [r["event"] for r in ledger] == ["start", "startup", "end"]
    start, boot, end = ledger
    assert boot["startup"]["ranks"] == world and boot["startup"]["phases"]["first_step"] > 0
    assert start["resumed_from_step"] == 0 and start["world_size"] == world and start["total_steps"] == 40
    assert 0 < start["startup_s"] < 600 and start["lost_s"] is None and start["job_id"] == "t1"
    assert end["status"] == "completed" and end["step"] == 40


def test_a_stop_request_on_one_rank_stops_every_rank_at_the_same_interval(tmp_path):
    results = run_world(_fit, 2, str(tmp_path), {"steps": 40, "log_every": 5}, 12, 1).results
    assert [r["step"] for r in results] == [15, 15] and all(r["stopped"] for r in results)
    ledger, _ = read_jsonl(RunDir(tmp_path).ledger)
    assert ledger[-1]["event"] == "end" and ledger[-1]["status"] == "stopped" and ledger[-1]["step"] == 15


def test_epochs_with_accumulation_and_evaluation_on_hdf5(tmp_path):
    from hpctrain.data import make_dataset

    h5 = make_dataset(tmp_path / "d.h5", 200, shape=(3, 4, 4), chunk_samples=16, compression="gzip")
    run = tmp_path / "run"
    cfg = {"epochs": 2, "grad_accum": 2, "log_every": 2, "eval_every": 2, "eval_batches": 2, "grad_clip": 1.0}
    results = run_world(_fit, 2, str(run), cfg, None, None, h5).results
    per_epoch = 200 // BATCH  # tail="drop"
    assert [r["total"] for r in results] == [2 * per_epoch // 2] * 2 and results[0]["step"] == per_epoch
    intervals, evals = _intervals(run)
    assert all(r["samples"] == r["steps"] * 2 * BATCH for r in intervals)  # two micro-batches a step
    assert [e["step"] for e in evals] == [2, 4, per_epoch] and all(e["batches"] == 2 for e in evals)
    assert not any(e["interrupted"] for e in evals)  # only a stop during an evaluation marks it
    assert results[0]["eval_loss"] == pytest.approx(evals[-1]["loss"]) and math.isfinite(evals[-1]["loss"])
    assert intervals[-1]["epoch"] == 1
    # rank 0's loader over each interval (what the capacity planner predicts data wait from)
    assert all(r["input"]["samples"] * 2 == r["samples"] and r["input"]["readers"] >= 1 for r in intervals)
    assert sum(r["input"]["bytes_read"] for r in intervals) > 0 and all(r["input"]["read_s"] >= 0 for r in intervals)


def test_metrics_off_keeps_loss_and_throughput_only(tmp_path):
    run_world(_fit, 1, str(tmp_path), {"steps": 6, "log_every": 3, "metrics": {"enabled": False}})
    intervals, _ = _intervals(tmp_path)
    assert [r["step"] for r in intervals] == [3, 6] and all(r["samples_per_s"] > 0 for r in intervals)
    assert not any(r["measured"] or "per_step" in r or r["flops_per_s"] for r in intervals)


def test_step_timer_charges_the_time_after_the_last_bucket_launch_to_exposed_communication():
    from hpctrain.train.metrics import StepTimer

    # each phase is bounded by clock reads around the calls that open and close it, not by a fixed slack: a loaded
    # machine stretches the sleeps and the gaps between calls, never shrinks them
    timer = StepTimer("cpu")
    t0 = time.perf_counter()
    timer.start()
    time.sleep(0.01)
    timer.mark("data_wait")
    t1 = time.perf_counter()
    time.sleep(0.02)
    t2 = time.perf_counter()
    timer.comm_launched()  # DDP launched the last bucket: compute is done, what follows is waiting
    t2_after = time.perf_counter()
    time.sleep(0.03)
    t3 = time.perf_counter()
    timer.mark("forward_backward")
    timer.mark("optimizer")
    t4 = time.perf_counter()
    timer.end()
    steps, step_s, sums = timer.take()
    wait, fb, comm, opt, ckpt = sums
    assert steps == 1 and ckpt == 0
    assert 0.01 <= wait <= t1 - t0 and 0.02 <= fb <= t2_after - t0 - wait and 0.03 <= comm <= t4 - t2, sums
    assert opt <= t4 - t3 and sum(sums) <= step_s and step_s >= 0.06
    assert timer.take() == (0, 0.0, [0.0] * 5)  # taken: reset


def _ddp_hook_probe(rank, world):
    import torch

    from hpctrain.train.metrics import MetricsRecorder

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    rec = MetricsRecorder(rank=rank, world_size=world, device="cpu", run_dir=None, total_steps=3)
    launches = []
    rec.timer.comm_launched = lambda: launches.append(1)  # count the stamps of each backward
    rec.attach_ddp(ddp)
    hooked = []
    for _ in range(3):
        launches.clear()
        rec.timer.start()
        ddp(torch.randn(5, 4)).sum().backward()
        rec.timer.mark("forward_backward")
        rec.step_done(torch.tensor(1.0), samples=5)
        hooked.append(len(launches))
    first_weight = next(net.parameters())
    rec.close()
    return hooked, len(rec._hooks), bool(first_weight._post_accumulate_grad_hooks)


def test_exposed_communication_costs_one_gradient_hook_per_backward_after_the_first():
    # The first backward hooks every parameter to learn which gradient is ready last (the first layer's
    # weight or bias: backward runs in reverse); from then on one hook, on it, stamps each backward.
    hooked, left, still_hooked = run_world(_ddp_hook_probe, 1).results[0]
    assert hooked == [4, 1, 1] and left == 0 and not still_hooked  # close() removed it


def test_what_the_trainer_cannot_do_is_one_clear_error(tmp_path):
    import torch

    from hpctrain.train import TrainConfig, Trainer

    ctx = _ctx(0, 1, tmp_path)
    common = dict(model=lambda: torch.nn.Linear(2, 2), optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss_fn=None)
    with pytest.raises(UsageError, match=r"TrainConfig.amp='bf16' needs a CUDA device"):
        Trainer(ctx, config=TrainConfig(steps=1, amp="bf16"), data=lambda s: iter(()), **common)
    with pytest.raises(UsageError, match="TrainConfig.epochs needs HDF5 data"):
        Trainer(ctx, config=TrainConfig(epochs=1), data=lambda s: iter(()), **common)
    with pytest.raises(UsageError, match="must be an H5DataConfig or a factory"):
        Trainer(ctx, config=TrainConfig(steps=1), data=[1, 2], **common)
    with pytest.raises(UsageError, match="must be a TrainConfig"):
        Trainer(ctx, config={"steps": 1}, data=lambda s: iter(()), **common)
    assert json.dumps(TrainConfig(steps=3).to_dict())  # the ledger stores it


def _late_rank_alternates(rank, world):
    import time

    import torch

    from hpctrain.train.metrics import MetricsRecorder

    rec = MetricsRecorder(rank=rank, world_size=world, device="cpu", run_dir=None, total_steps=4, log_every=4)
    rec.start_interval(0)
    waited = []  # per step: (the sleep alone, from before start() to after the mark): the wait lies between
    for step in range(1, 5):
        t0 = time.perf_counter()
        rec.timer.start()
        t1 = time.perf_counter()
        time.sleep(0.06 if step % 2 == rank else 0.0)  # rank 1 waits for its batch on odd steps, rank 0 on even
        t2 = time.perf_counter()
        rec.timer.mark("data_wait")
        waited.append((t2 - t1, time.perf_counter() - t0))
        rec.timer.mark("forward_backward")
        rec.step_done(torch.tensor(1.0), samples=1)
    record = rec.flush(4).record
    rec.close()
    return record["data_wait_step_max_s"], record["per_step"]["data_wait_s"]["max"], waited


def test_the_steps_data_wait_is_the_late_ranks_in_each_step():
    # every step waited >= 60 ms for one rank's batch, a different rank each step: the step's wait is the late rank's
    # (per step the maximum over ranks, then the mean over steps), and the slowest rank's own mean is about half of
    # it. Both are checked against the waits each rank measured around its calls: a loaded machine stretches them.
    results = run_world(_late_rank_alternates, 2).results
    waited = [r[2] for r in results]
    lo = sum(max(w[k][0] for w in waited) for k in range(4)) / 4
    hi = sum(max(w[k][1] for w in waited) for k in range(4)) / 4
    slow_lo = max(sum(s for s, _ in w) / 4 for w in waited)
    slow_hi = max(sum(t for _, t in w) / 4 for w in waited)
    for step_max, slowest_mean, _ in results:
        assert lo <= step_max <= hi and step_max >= 0.06, (step_max, lo, hi)
        assert slow_lo <= slowest_mean <= slow_hi and slowest_mean < step_max, (slowest_mean, slow_lo, slow_hi)
