"""``python -m hpctrain export-tensorboard``: the event files read back with TensorBoard's own
EventAccumulator hold every scalar at its step, with its value and the record's wall time; a restart's redone
steps supersede the earlier ones; no torch on the way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from tests.report.synth import make_run

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "export-tensorboard", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _read(logdir):
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.TENSORS: 0, ea.SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in acc.Tensors(tag)]
    return out, acc


def _expected(records, tag_value):
    """(step, value, time) of the intervals the export keeps: attempt 1's up to step 80 (a restart redid 90
    and 100), all of attempt 2's; those with a time and a value for this tag."""
    kept = [r for r in records if isinstance(r.get("time"), float) and not (r["restart_count"] == 0 and r["step"] > 80)]
    return [(r["step"], tag_value(r), r["time"]) for r in kept if tag_value(r) is not None]


def test_round_trip_steps_values_and_wall_times(tmp_path):
    run = tmp_path / "run"
    exp = make_run(run)
    res = _cli(run)
    assert res.returncode == 0, res.stderr
    assert f"tensorboard {RunDir(run).tensorboard}:" in res.stdout
    assert "3 record(s) superseded by a restart" in res.stdout  # intervals 90 and 100, the eval at 100
    files = list(RunDir(run).tensorboard.iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")

    got, acc = _read(RunDir(run).tensorboard)
    intervals = exp["intervals"]
    checks = {
        "train/loss": lambda r: r["loss"],
        "train/lr": lambda r: r["lr"],
        "throughput/samples_per_s": lambda r: r["samples_per_s"],
        "throughput/mfu": lambda r: r["mfu"],
        "throughput/data_wait_frac": lambda r: r["data_wait_frac"],
        "step_time_ms/step": lambda r: 1e3 * r["per_step"]["step_s"]["median"],
        "step_time_ms/data_wait": lambda r: 1e3 * r["per_step"]["data_wait_s"]["median"],
        "step_time_ms/forward_backward": lambda r: 1e3 * r["per_step"]["forward_backward_s"]["median"],
        "step_time_ms/grad_comm_exposed": lambda r: 1e3 * r["per_step"]["grad_comm_exposed_s"]["median"],
        "step_time_ms/optimizer": lambda r: 1e3 * r["per_step"]["optimizer_s"]["median"],
        "step_time_ms/checkpoint": lambda r: 1e3 * r["per_step"]["checkpoint_s"]["median"],
    }
    for tag, value in checks.items():
        want = _expected(intervals, value)
        have = got[tag]
        assert [s for s, _, _ in have] == [s for s, _, _ in want], tag
        for (s, v, t), (_, wv, wt) in zip(have, want):
            assert v == pytest.approx(wv, rel=1e-6, abs=1e-9), (tag, s)  # float32 in the event
            assert t == wt, (tag, s)  # the record's time, to the bit (a double in the event)
    # the run's steps: attempt 1 up to its checkpoint's successors, then attempt 2 from 90 (redone) to 200
    assert [s for s, _, _ in got["throughput/samples_per_s"]] == list(range(10, 201, 10))
    # the NaN loss at step 50 (null) is no point; every other scalar of that interval is
    assert 50 not in [s for s, _, _ in got["train/loss"]] and 50 in [s for s, _, _ in got["throughput/mfu"]]
    # evaluations: step 50 (attempt 1) and 200 (attempt 2, interrupted); attempt 1's eval at 100 was redone past
    assert [(s, v) for s, v, _ in got["eval/loss"]] == [(50, pytest.approx(2.6)), (200, pytest.approx(1.3))]
    assert [t for _, _, t in got["eval/loss"]] == [e["time"] for e in exp["evals"] if e["step"] in (50, 200)]
    # TensorBoard shows them as scalars, each with its description
    meta = acc.SummaryMetadata("train/loss")
    assert meta.plugin_data.plugin_name == "scalars" and "mean training loss" in meta.summary_description
    assert "throughput/flops_per_s" in got and "step_time_ms/step" in got


def test_an_earlier_export_is_kept_unless_overwrite(tmp_path):
    run = tmp_path / "run"
    make_run(run)
    out = tmp_path / "tb"
    assert _cli(run, "-o", out).returncode == 0
    first = sorted(out.iterdir())
    res = _cli(run, "-o", out)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "pass --force" in res.stderr
    assert sorted(out.iterdir()) == first
    (out / "notes.txt").write_text("mine")
    res = _cli(run, "-o", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2 and "notes.txt" in names and first[0].name not in names  # a new file, the old one gone
    assert len([n for n in names if n.startswith("events.out.tfevents.")]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tb.tmp-")]  # no temporary left
    assert _read(out)[0]["train/loss"]


def test_no_metrics_or_not_a_run_dir_is_exit_2_and_no_torch(tmp_path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        res = _cli(path)
        assert res.returncode == 2 and res.stdout == "" and len(res.stderr.splitlines()) == 1, res
        assert res.stderr.startswith("hpctrain export-tensorboard: error: RUN_DIR ")
    run = tmp_path / "run"
    make_run(run)
    code = (
        "import sys; from hpctrain.__main__ import main; rc = main(['export-tensorboard', sys.argv[1]]); "
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)"
    )
    res = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.stdout.strip().splitlines()[-1] == "NO-TORCH 0", res.stderr
