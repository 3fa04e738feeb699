"""The Trainer at its edges (issue 17 §3 and §4): a tensor learning rate, the slips that must be one line
naming the option rather than a traceback, and a stop that lands during an evaluation."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir, read_jsonl
from tests.multiproc import run_world
from tests.train.test_trainer import _ctx

DIM, BATCH = 8, 16


def _data(batches=None):
    """A regression factory: ``batches`` batches in all (None: forever)."""
    import torch

    def data(start):
        gen = torch.Generator().manual_seed(start)
        n = 0
        while batches is None or n < batches:
            n += 1
            x = torch.randn(BATCH, DIM, generator=gen)
            yield x, x.flip(1)

    return data


def _common():
    import torch

    return dict(
        model=lambda: torch.nn.Linear(DIM, DIM),
        optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
    )


def _records(run_dir):
    metrics, problems = read_jsonl(RunDir(run_dir).metrics)
    ledger, ledger_problems = read_jsonl(RunDir(run_dir).ledger)
    assert problems == [] and ledger_problems == []
    return metrics, ledger


def test_a_tensor_learning_rate_trains_checkpoints_resumes_and_records_a_float(tmp_path):
    # issue 17 §3: Adam(p, lr=torch.tensor(0.01)) killed fit() at the first log interval (a tensor in the record)
    import torch

    from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig, Trainer

    def fit(steps):
        config = TrainConfig(
            steps=steps,
            log_every=2,
            checkpoint=CheckpointPolicy(every_steps=2),
            metrics=MetricsConfig(display=False),
        )
        return Trainer(
            _ctx(0, 1, tmp_path),
            config=config,
            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
            data=_data(),
            **{**_common(), "optimizer": lambda p: torch.optim.Adam(p, lr=torch.tensor(0.01))},
        ).fit()

    first = fit(4)
    second = fit(6)  # restores the optimizer and scheduler state saved with a tensor lr
    assert first.step == 4 and second.start_step == 4 and second.step == 6 and not second.stopped
    metrics, ledger = _records(tmp_path)
    lrs = [r["lr"] for r in metrics if r["kind"] == "interval"]
    assert [type(v) for v in lrs] == [float] * 3
    assert lrs == pytest.approx([0.005, 0.0025, 0.00125])  # halved every 2 steps, across the resume
    assert [(r["event"], r.get("status")) for r in ledger] == [
        ("start", None),
        ("startup", None),
        ("end", "completed"),
        ("start", None),
        ("startup", None),
        ("end", "completed"),
    ]


def test_a_data_factory_that_runs_out_is_one_line_naming_the_option(tmp_path):
    from hpctrain.train import MetricsConfig, TrainConfig, Trainer

    config = TrainConfig(steps=5, grad_accum=1, metrics=MetricsConfig(display=False))
    trainer = Trainer(_ctx(0, 1, tmp_path), config=config, data=_data(batches=3), **_common())
    with pytest.raises(UsageError, match=r"^Trainer\(data=...\): the data factory's iterator ended at step 4 of 5"):
        trainer.fit()  # was a bare StopIteration from inside the loop
    _, ledger = _records(tmp_path)
    assert ledger[-1]["status"] == "failed" and ledger[-1]["error"].startswith("UsageError: Trainer(data=...)")
    with pytest.raises(UsageError, match=r"the data factory returned a int, not an iterable of batches"):
        Trainer(_ctx(0, 1, tmp_path), config=config, data=lambda start: 3, **_common()).fit()


def test_objects_where_factories_belong_are_refused_at_construction(tmp_path):
    import torch

    from hpctrain.train import TrainConfig, Trainer

    ctx, config, common = _ctx(0, 1, tmp_path), TrainConfig(steps=1), _common()
    net = torch.nn.Linear(DIM, DIM)
    cases = [
        ({"model": net}, r"Trainer\(model=...\) got an nn.Module; pass a factory: model=lambda: "),
        ({"optimizer": torch.optim.SGD(net.parameters(), lr=0.1)}, r"Trainer\(optimizer=...\) got a SGD; pass a"),
        ({"scheduler": 5}, r"Trainer\(scheduler=...\) got a int; pass a factory"),
        ({"loss_fn": torch.nn.MSELoss()}, r"Trainer\(loss_fn=...\) must be a function \(model, batch\) -> loss"),
    ]
    for override, message in cases:
        with pytest.raises(UsageError, match=message):
            Trainer(ctx, config=config, data=_data(), **{**common, **override})
    with pytest.raises(UsageError, match=r"Trainer\(model=...\): the factory returned a NoneType, not an nn.Module"):
        Trainer(ctx, config=config, data=_data(), **{**common, "model": lambda: None}).fit()  # seen when called


def test_eval_every_without_eval_data_is_refused_at_construction(tmp_path):
    from hpctrain.train import TrainConfig, Trainer

    with pytest.raises(UsageError, match=r"TrainConfig.eval_every=5 needs eval data: give Trainer\(eval_data=...\)"):
        Trainer(_ctx(0, 1, tmp_path), config=TrainConfig(steps=10, eval_every=5), data=_data(), **_common())


def _eval_h5(tmp_path):
    from hpctrain.data import H5DataConfig, make_dataset

    h5 = make_dataset(tmp_path / "d.h5", 200, shape=(DIM,), chunk_samples=16)
    return H5DataConfig(files=(str(h5),), keys=("x", "y"), global_batch_size=32, num_workers=0, shuffle=False)


def _h5_common():
    import torch

    return dict(
        model=lambda: torch.nn.Linear(DIM, 10),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b["x"].float()), b["y"].long()),
    )


def test_a_stop_before_the_first_eval_batch_records_no_loss_not_zero(tmp_path):
    import torch

    from hpctrain.train import MetricsConfig, TrainConfig, Trainer

    def in_eval(step):  # a collective hook (one rank: trivially agreed) that asks to stop inside evaluation
        return not torch.is_grad_enabled()

    in_eval.collective = True
    data = _eval_h5(tmp_path)
    config = TrainConfig(steps=6, log_every=2, eval_every=2, metrics=MetricsConfig(display=False))
    run = tmp_path / "run"
    fit = Trainer(_ctx(0, 1, run), config=config, data=data, eval_data=data, should_stop=in_eval, **_h5_common()).fit()
    assert fit.stopped and fit.step == 2 and fit.eval_loss is None
    metrics, ledger = _records(run)
    evals = [r for r in metrics if r["kind"] == "eval"]
    assert evals == [{**evals[0], "step": 2, "loss": None, "batches": 0, "interrupted": True}]
    assert ledger[-1]["status"] == "stopped" and ledger[-1]["step"] == 2


def _stopped_in_eval(rank, world, run_dir, h5):
    import signal
    import time

    import torch

    from hpctrain.data import H5DataConfig
    from hpctrain.launch.context import RunContext
    from hpctrain.runtime.preemption import StopAgreement, StopSignals
    from hpctrain.train import CheckpointPolicy, MetricsConfig, TrainConfig, Trainer

    signals = StopSignals()  # not installed: the test records the "signal" itself, as the handler would
    ctx = RunContext(
        rank=rank,
        local_rank=rank,
        world_size=world,
        local_world_size=world,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=0,
        job_id="t1",
        restart_count=0,
        hostnames=("host",),
        launcher="single",
        run_dir=Path(run_dir),
        device=torch.device("cpu"),
        backend="gloo",
        hostname="host",
        stop=StopAgreement(signals),
    )
    agreed = (ctx.agree(rank, "max"), ctx.agree(rank, "min"))

    def loss_fn(model, batch):
        if rank == 1 and not torch.is_grad_enabled() and not signals.requested:  # rank 1's first eval batch
            signals.received.append((int(signal.SIGUSR2), time.time()))
        return torch.nn.functional.cross_entropy(model(batch["x"].float()), batch["y"].long())

    def cfg(**kw):
        return H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=32, **kw)

    config = TrainConfig(
        steps=8,
        log_every=2,
        eval_every=4,
        checkpoint=CheckpointPolicy(every_steps=4),  # async: in flight when the stop lands
        metrics=MetricsConfig(display=False),
    )
    fit = Trainer(
        ctx,
        config=config,
        model=lambda: torch.nn.Linear(DIM, 10),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss_fn=loss_fn,
        data=cfg(num_workers=1),
        eval_data=cfg(num_workers=0, shuffle=False, tail="exact"),
    ).fit()
    ctx.stop.settle()  # as the Runner does: no collective left pending when the process group goes
    return {"step": fit.step, "stopped": fit.stopped, "eval_loss": fit.eval_loss, "agreed": agreed}


def test_a_stop_during_evaluation_records_it_as_interrupted_and_saves_that_step(tmp_path):
    # issue 17 §4: the cut-short evaluation was written as a normal eval record
    from hpctrain.ckpt import latest_committed
    from hpctrain.data import make_dataset

    h5 = str(make_dataset(tmp_path / "d.h5", 200, shape=(DIM,), chunk_samples=16))
    run = tmp_path / "run"
    results = run_world(_stopped_in_eval, 2, str(run), h5).results
    assert all(r["agreed"] == (1, 0) for r in results)  # RunContext.agree: max and min over the ranks
    assert [(r["step"], r["stopped"]) for r in results] == [(4, True), (4, True)]
    metrics, ledger = _records(run)
    evals = [r for r in metrics if r["kind"] == "eval"]
    # rank 1 is signalled at its first eval batch; the pipelined agreement stops every rank two polls later
    assert [(e["step"], e["interrupted"], e["batches"]) for e in evals] == [(4, True, 2)]
    assert math.isfinite(evals[0]["loss"]) and results[0]["eval_loss"] == pytest.approx(evals[0]["loss"])
    assert ledger[-1]["status"] == "stopped" and ledger[-1]["step"] == 4 and ledger[-1]["committed_step"] == 4
    assert latest_committed(RunDir(run).checkpoints).step == 4


class _FakeCheckpointer:
    def __init__(self, every_steps=4):
        from hpctrain.ckpt.config import SaveCadence

        self.calls, self.cadence = [], SaveCadence(every_steps=every_steps)

    def should_save(self, step, *, requested=False):
        return self.cadence.tier(step, requested=requested)

    def save(self, step, *, blocking, tier="global", **state):
        self.calls.append(("save", step, blocking))

    def wait(self):
        self.calls.append(("wait",))

    def abandon(self):
        self.calls.append(("abandon",))
        return True  # the in-flight save was dropped uncommitted


def test_a_stop_short_of_time_that_drops_the_save_of_its_own_step_saves_that_step_again():
    # a periodic async save of step 4, then a stop at step 4's interval with too little time left: the
    # in-flight save is abandoned, so step 4 must be saved again (it used to be only waited for: nothing committed)
    from hpctrain.train import CheckpointPolicy
    from hpctrain.train.ledger_records import AttemptProgress
    from hpctrain.train.saving import Saver
    from hpctrain.train.stopping import Stopping

    ckpt, progress, notes = _FakeCheckpointer(), AttemptProgress(), []
    saver = Saver(ckpt, CheckpointPolicy(every_steps=4), state={}, loader=None, progress=progress)
    assert saver.periodic(4, total=10)
    stopping = Stopping(types.SimpleNamespace(stop_time_left=lambda: 0.0), None)
    saver.finish(4, start=0, stopped=True, stopping=stopping, note=notes.append)
    assert ckpt.calls == [("save", 4, False), ("abandon",), ("save", 4, True)]
    assert progress.committed_step == 4 and notes[0].startswith("hpctrain.train: abandoned the in-flight save")


def test_run_context_agree_is_local_without_a_stop_agreement_and_checks_its_op(tmp_path):
    from hpctrain.launch.context import RunContext

    ctx = RunContext(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=0,
        job_id="",
        restart_count=0,
        hostnames=("host",),
        launcher="local",
        run_dir=tmp_path,
        device="cpu",
        backend="gloo",
        hostname="host",
    )
    assert ctx.agree(7, "max") == 7 and ctx.agree(7, "min") == 7
    with pytest.raises(ValueError, match="must be 'max' or 'min'"):
        ctx.agree(1, "sum")
