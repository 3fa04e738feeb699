"""On the real dev cluster: the demo Trainer on 2 nodes trains, checkpoints and finishes; status shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR", COLUMNS="160")


def _hpctrain(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *map(str, args)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_on_2_nodes_trains_checkpoints_finishes_and_status_shows_it(tmp_path):
    run = tmp_path / "run"
    proc = _hpctrain(
        "submit", "--nodes", "2", "--time", "5", "--job-name", "train-status", "--entry",
        "hpctrain.examples.demo:main", "--run-dir", run, "--follow", "--",
        "--steps", "30", "--ckpt-every", "10", "--log-every", "5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = json.loads((run / "submission.json").read_text())["job_id"]
    assert "hpctrain.train: step 30/30" in proc.stdout  # rank 0's interval lines in the followed log

    report = json.loads(_hpctrain("status", run, "--json").stdout)
    assert report["job"]["id"] == job_id and report["job"]["cluster"] == "slurm"
    assert report["job"]["state"] in ("COMPLETED", "COMPLETING") and report["job"]["source"] in ("squeue", "sacct")
    assert report["progress"]["step"] == 30 and report["progress"]["ended"] == "completed"
    assert report["checkpoint"]["step"] == 30 and report["checkpoint"]["world_size"] == 2
    assert report["checkpoint"]["dir"] == str(run / "checkpoints")
    last = report["last_interval"]
    assert last["world_size"] == 2 and last["samples_per_s"] > 0 and last["slowest_rank"] in (0, 1)
    start = report["ledger"][0]
    assert start["job_id"] == job_id and len(set(start["hosts"])) == 2 and start["launcher"] == "slurm"

    view = _hpctrain("status", run)
    assert view.returncode == 0 and f"job {job_id} (slurm)" in view.stdout and "step 30/30" in view.stdout
    print("\n" + view.stdout)
