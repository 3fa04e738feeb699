"""A hung rank on the real dev cluster: the watchdog ends every rank, the end is classified ``hang`` with the
hung rank and its host named and its stacks written, the job is requeued (a step was committed) without that
host, resumes from the newest committed step and completes. Entry: tests/cluster/preempt_entry.py (``--hang-at``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.preempt_entry import write_data
from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final

pytestmark = [pytest.mark.slurm]

STEPS, BATCH, SAMPLES, HANG_TIMEOUT = 40, 16, 128, 10


def _ledger(run_dir: Path, event: str):
    path = run_dir / "train" / "ledger.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


def test_a_hung_rank_ends_the_attempt_as_a_hang_which_is_requeued_and_resumes(tmp_path):
    data = tmp_path / "data.h5"
    write_data(data, SAMPLES)
    run_dir = tmp_path / "hang"
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", "1", "--time", "5",
         "--max-requeues", "2", "--hang-timeout", str(HANG_TIMEOUT), "--job-name", "hang",
         "--entry", "tests.cluster.preempt_entry:main", "--run-dir", str(run_dir), "--",
         "--data", str(data), "--steps", str(STEPS), "--batch", str(BATCH), "--ckpt-every", "10",
         "--sleep", "0.05", "--workers", "0", "--hang-at", "25"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = str(json.loads((run_dir / "submission.json").read_text())["job_id"])
    assert wait_final(job, timeout=300) == "COMPLETED"

    first, last = _ledger(run_dir, "exit")
    assert first["cause"] == "hang" and first["requeued"], first
    assert first["committed_step"] == 20 and last["cause"] == "finished"
    hang = first["hang"]
    host1 = json.loads((run_dir / "ranks" / f"{job}-r0" / "rank-1.json").read_text())["hostname"]
    assert hang["attributed"] and hang["hung_ranks"] == [1] and hang["hosts"] == [host1], hang
    stacks = (run_dir / "ranks" / f"{job}-r0" / "stacks-rank-1.txt").read_text()
    assert "preempt_entry.py" in stacks and "loss_fn" in stacks, stacks[-2000:]
    starts = _ledger(run_dir, "start")
    assert [s["resumed_from_step"] for s in starts] == [0, 20]  # nothing lost beyond the last commit
    assert starts[1]["after"].startswith("hang")
    # the hung rank's host is a suspect (hpctrain.runtime.watchdog.suspect_hosts): the requeue left it out
    assert first["excluded_nodes"] == [host1] and host1 not in starts[1]["hosts"], (first, starts[1]["hosts"])

    # the figure for docs/preemption.md: from the hang to the last rank's exit (its heartbeat's last write)
    began = next(
        json.loads(line)["hang"]
        for line in (run_dir / "samples" / "r0-rank1.jsonl").read_text().splitlines()
        if '"hang"' in line
    )
    beats = [json.loads(p.read_text()) for p in (run_dir / "ranks" / f"{job}-r0").glob("heartbeat-rank-*.json")]
    assert len(beats) == 2 and all(b.get("hung") for b in beats), beats
    took = max(b.get("exited") or first["time"] for b in beats) - began
    print(f"figures hang: hang -> all ranks exited {took:.1f}s (--hang-timeout {HANG_TIMEOUT}); "
          f"steps lost beyond the last commit: {starts[1]['resumed_from_step'] - first['committed_step']}")  # fmt: skip
    assert took < HANG_TIMEOUT + 30, took
    if os.environ.get("HPCTRAIN_FIGURES"):
        with open(os.environ["HPCTRAIN_FIGURES"], "a") as f:
            f.write(json.dumps({"run": "hang", "hang_to_all_ended_s": took, "job": job, "time": time.time()}) + "\n")
