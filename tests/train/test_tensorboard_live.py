"""``TrainConfig.tensorboard``: the real Trainer (2 gloo ranks on CPU) writes TensorBoard events while training;
a run that crashes after its last commit, then resumes (redoing steps) and is stopped and resumed again, is one
TensorBoard run with each step once, read back with TensorBoard's own reader (the UI's), and its scalars equal
``export-tensorboard``'s of the same run directory."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.train import TrainConfig
from hpctrain.train.tensorboard import EVAL_TAGS, INTERVAL_TAGS, scalars
from tests.multiproc import run_world
from tests.train.test_trainer import BATCH, _ctx

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402
from tensorboard.backend.event_processing import plugin_event_multiplexer as pem  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

STEPS, LOG, CKPT, EVAL = 20, 2, 5, 4


def _fit(rank, world, run_dir, h5, crash_at=None, stop_at=None):
    """A small classifier on ``h5`` with eval; ``crash_at``: every rank raises at its first log-interval poll at
    or after that step (after the last commit: the next attempt redoes the steps); ``stop_at``: rank 0 asks to
    stop there (all stop together and save, as at a preemption)."""
    import torch

    from hpctrain.data import H5DataConfig
    from hpctrain.train import CheckpointPolicy, MetricsConfig, StopSignal, Trainer

    config = TrainConfig(
        steps=STEPS,
        log_every=LOG,
        eval_every=EVAL,
        eval_batches=2,
        checkpoint=CheckpointPolicy(every_steps=CKPT, async_save=False),
        metrics=MetricsConfig(display=False),
        tensorboard=True,
    )
    stop = StopSignal()

    def should_stop(step):
        if crash_at is not None and step >= crash_at:
            raise RuntimeError(f"injected crash at step {step}")
        if stop_at is not None and step >= stop_at and rank == 0:
            stop.request()
        return stop(step)

    data = H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0)
    eval_data = H5DataConfig(
        files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0, shuffle=False, tail="exact"
    )
    fit = Trainer(
        _ctx(rank, world, run_dir),
        config=config,
        model=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10)),
        optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b["x"].float()), b["y"].long()),
        data=data,
        eval_data=eval_data,
        should_stop=should_stop,
    ).fit()
    return {"step": fit.step, "stopped": fit.stopped, "start": fit.start_step}


def _fit_one(rank, world, run_dir, h5, tensorboard):
    """4 steps, fresh, with ``TrainConfig.tensorboard=tensorboard``."""
    import torch

    from hpctrain.data import H5DataConfig
    from hpctrain.train import MetricsConfig, Trainer

    Trainer(
        _ctx(rank, world, run_dir),
        config=TrainConfig(steps=4, log_every=2, metrics=MetricsConfig(display=False), tensorboard=tensorboard),
        model=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10)),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b["x"].float()), b["y"].long()),
        data=H5DataConfig(files=(h5,), keys=("x", "y"), global_batch_size=BATCH, num_workers=0),
    ).fit()


def _starts(event_file):
    """The steps of the ``SessionLog.START`` events of one event file."""
    return [
        e.step
        for e in EventFileLoader(str(event_file)).Load()
        if e.HasField("session_log") and e.session_log.status == e.session_log.START
    ]


def _read(logdir, **kw):
    """``{tag: [(step, value, wall_time), ...]}`` through the legacy ``EventAccumulator``: every event as written
    (it purges only legacy ``simple_value`` scalars, never the tensor-form scalars TensorBoard's writer writes)."""
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.TENSORS: 0, ea.SCALARS: 0}, **kw)
    acc.Reload()
    return {
        tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


def _read_ui(logdir):
    """The same through ``plugin_event_multiplexer``: the reader of the TensorBoard UI's Python loader, which
    honours ``SessionLog.START`` (``purge_step``)."""
    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    assert list(mux.Runs()) == ["."]  # one TensorBoard run, not one per attempt
    out = {}
    for tag in mux.Runs()["."]["tensors"]:
        out[tag] = [
            (e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in mux.Tensors(".", tag)
        ]
    return out


def test_a_bad_value_is_one_line_naming_the_option():
    for bad in (5, "", b"tb", 1.0):
        with pytest.raises(UsageError) as info:
            TrainConfig(steps=1, tensorboard=bad)
        text = str(info.value)
        assert text.startswith("TrainConfig.tensorboard ") and "\n" not in text, text
    assert TrainConfig(steps=1, tensorboard=True).tensorboard_dir("/r") == "/r/tensorboard"
    assert TrainConfig(steps=1, tensorboard="tb/x").tensorboard_dir("/r") == "/r/tb/x"
    assert TrainConfig(steps=1, tensorboard="/abs").tensorboard_dir("/r") == "/abs"
    assert TrainConfig(steps=1, tensorboard=False).tensorboard_dir("/r") is None
    assert TrainConfig(steps=1).to_dict()["tensorboard"] is None
    assert TrainConfig(steps=1, tensorboard=Path("tb")).to_dict()["tensorboard"] == "tb"


def test_one_mapping_of_a_record_to_scalars():
    rec = {
        "kind": "interval",
        "step": 7,
        "loss": 0.5,
        "lr": 0.01,
        "samples_per_s": 10,
        "mfu": None,
        "flops_per_s": math.nan,
        "per_step": {"step_s": {"median": 0.002}, "data_wait_s": {"median": None}},
    }
    got = {tag: (value, step) for tag, value, step in scalars(rec)}
    assert got == {
        "train/loss": (0.5, 7),
        "train/lr": (0.01, 7),
        "throughput/samples_per_s": (10.0, 7),
        "step_time_ms/step": (2.0, 7),
    }
    assert scalars({"kind": "eval", "step": 4, "loss": 1.25}) == [("eval/loss", 1.25, 4)]
    assert scalars({"kind": "other", "step": 4, "loss": 1.0}) == [] == scalars({"kind": "eval", "loss": 1.0})
    from hpctrain.report import tensorboard as export_side

    assert export_side.INTERVAL_TAGS is INTERVAL_TAGS and export_side.EVAL_TAGS is EVAL_TAGS  # one owner


def test_a_crash_a_stop_and_two_resumes_are_one_tensorboard_run_each_step_once_equal_to_the_export(tmp_path):
    from hpctrain.data import make_dataset
    from hpctrain.report.tensorboard import export

    h5 = str(make_dataset(tmp_path / "d.h5", 200, shape=(3, 4, 4), chunk_samples=16))
    run = tmp_path / "run"
    logdir = run / "tensorboard"
    # attempt 1: commits 5 and 10, logs up to 12 (eval at 4, 8, 12), then crashes: 11.. are redone
    with pytest.raises(Exception, match="injected crash"):
        run_world(_fit, 2, str(run), h5, 13)
    assert sorted(s for s, _, _ in _read(logdir)["train/loss"]) == [2, 4, 6, 8, 10, 12]
    # attempt 2: resumes from 10 (purge_step 11); asked to stop at 15, all ranks stop at the interval of 16 and
    # save it (a preemption's path)
    second = run_world(_fit, 2, str(run), h5, None, 15).results
    assert second[0] == {"step": 16, "stopped": True, "start": 10}
    # attempt 3: resumes from 16 (purge_step 17), runs to the end
    third = run_world(_fit, 2, str(run), h5).results
    assert third[0] == {"step": STEPS, "stopped": False, "start": 16}

    files = sorted(logdir.glob("events.out.tfevents.*"))  # one file per attempt, one directory, in attempt order
    assert [_starts(f) for f in files] == [[1], [11], [17]]  # purge_step = the resumed step + 1, fresh: 1
    live = _read_ui(logdir)
    steps = {tag: [s for s, _, _ in points] for tag, points in live.items()}
    assert steps["train/loss"] == list(range(LOG, STEPS + 1, LOG))  # each step once, in order
    assert steps["eval/loss"] == [4, 8, 12, 20]  # the stop at 16 came before its eval
    assert {"train/lr", "throughput/samples_per_s", "step_time_ms/step"} <= set(live)
    # the test can fail: without the purge the redone steps 12 (loss, eval) show twice
    unpurged = _read(logdir)
    assert [s for s, _, _ in unpurged["train/loss"]].count(12) == 2
    assert [s for s, _, _ in unpurged["eval/loss"]].count(12) == 2

    res = export(run, tmp_path / "exported")
    assert res.superseded > 0
    exported = _read_ui(tmp_path / "exported")
    assert exported == live  # same tags, steps, values (float32) and wall times


def test_off_by_default_and_a_directory_of_your_own(tmp_path):
    from hpctrain.data import make_dataset

    h5 = str(make_dataset(tmp_path / "d.h5", 64, shape=(3, 4, 4), chunk_samples=16))
    run = tmp_path / "run"

    run_world(_fit_one, 1, str(run), h5, None, init_pg=False)
    assert not (run / "tensorboard").exists()
    run_world(_fit_one, 1, str(run), h5, "tb/mine", init_pg=False)
    assert [s for s, _, _ in _read_ui(run / "tb" / "mine")["train/loss"]] == [2, 4]
