"""``--tensorboard`` on the real dev cluster: the demo preempted twice by a real ``high`` job (requeued, resumed
from the stop's commit), then cancelled, is one TensorBoard run with each step once, read back with
TensorBoard's own reader (the UI's ``plugin_event_multiplexer``), and it equals ``export-tensorboard``'s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.test_preemption import _exits, _restarts, _starts, _wait
from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final

pytestmark = [pytest.mark.slurm]

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import plugin_event_multiplexer as pem  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

LOG = 10


def _intervals(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    path = run_dir / "train" / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if rec.get("kind") == "interval":
            out.append(rec)
    return out


def _logged(run_dir: Path, restart: int) -> int:
    """Interval records attempt ``restart`` wrote."""
    return sum(1 for r in _intervals(run_dir) if r.get("restart_count") == restart)


def _preempt(run_dir: Path, job: str, restart: int) -> str:
    """A real preemption: a ``high`` job that needs the whole node of the attempt's rank 0."""
    node = json.loads((run_dir / "ranks" / f"{job}-r{restart}" / "rank-0.json").read_text())["hostname"]
    return subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def _read_ui(logdir: Path) -> tp.Dict[str, tp.List[tp.Tuple[int, float, float]]]:
    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    assert list(mux.Runs()) == ["."]  # one TensorBoard run
    return {
        tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in mux.Tensors(".", tag)]
        for tag in mux.Runs()["."]["tensors"]
    }


def _start_steps(event_file: Path) -> tp.List[int]:
    return [
        e.step
        for e in EventFileLoader(str(event_file)).Load()
        if e.HasField("session_log") and e.session_log.status == e.session_log.START
    ]


def test_the_demo_preempted_twice_is_one_tensorboard_run_each_step_once_equal_to_the_export(tmp_path):
    t0 = time.monotonic()
    run = tmp_path / "tb"
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", "1", "--time", "10",
         "--partition", "low", "--constraint", "preemptible", "--max-requeues", "3", "--job-name", "tb-live",
         "--entry", "hpctrain.examples.demo:main", "--run-dir", str(run), "--",
         "--steps", "1000000", "--log-every", str(LOG), "--ckpt-every", "200", "--quiet", "--tensorboard"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = str(json.loads((run / "submission.json").read_text())["job_id"])
    figures: tp.Dict[str, tp.Any] = {}
    highs = []
    try:
        for restart in (0, 1):
            _wait(f"attempt {restart}: 5 intervals", lambda r=restart: _logged(run, r) >= 5, timeout=120)
            if restart == 0:
                figures["submit_to_5_intervals_s"] = round(time.monotonic() - t0, 1)
            t_pre = time.monotonic()
            highs.append(_preempt(run, job, restart))
            _wait(f"attempt {restart + 1} logging", lambda r=restart: _logged(run, r + 1) >= 1, timeout=150)
            figures.setdefault("preempt_to_next_interval_s", []).append(round(time.monotonic() - t_pre, 1))
        _wait("attempt 2: 5 intervals", lambda: _logged(run, 2) >= 5, timeout=120)
        subprocess.run(["scancel", job], check=True)
        assert wait_final(job, timeout=120) == "CANCELLED"
        for high in highs:
            assert wait_final(high, timeout=60) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job, *highs], capture_output=True)
    _wait("the last exit record", lambda: len(_exits(run)) >= 3, timeout=30)
    exits, starts = _exits(run), _starts(run)
    assert [e["cause"] for e in exits] == ["preemption", "preemption", "cancelled"], exits
    assert all(e["agreed_step"] == e["committed_step"] for e in exits)  # each stop saved its step
    resumed = [s["resumed_from_step"] for s in starts]
    assert resumed[1:] == [e["committed_step"] for e in exits[:2]] and _restarts(job) == 2

    logdir = run / "tensorboard"
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert [_start_steps(f) for f in files] == [[1], [resumed[1] + 1], [resumed[2] + 1]]  # purge_step per attempt
    live = _read_ui(logdir)
    steps = [s for s, _, _ in live["train/loss"]]
    assert steps == sorted(set(steps)), "a step shows twice or out of order"
    assert steps == sorted({r["step"] for r in _intervals(run)})  # every logged interval, once
    assert {"train/lr", "throughput/samples_per_s", "step_time_ms/step"} <= set(live)

    out = tmp_path / "exported"
    export = subprocess.run(
        [sys.executable, "-m", "hpctrain", "export-tensorboard", str(run), "-o", str(out), "--json"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert export.returncode == 0, export.stdout + export.stderr
    assert _read_ui(out) == live  # same tags, steps, values and wall times
    figures.update(
        attempts=len(files),
        intervals=len(steps),
        resumed_from=resumed[1:],
        test_s=round(time.monotonic() - t0, 1),
    )
    print(f"figures tensorboard-cluster: {json.dumps(figures)}")
