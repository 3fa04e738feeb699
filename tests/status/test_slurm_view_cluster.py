"""On the dev cluster: sacct's record of a job that a node failure requeued, read by ``status`` (issue 28, group 10).

The issue's case: a node set DOWN under a running job comes back into service at once (the dev cluster's
``ReturnToService=2``); Slurm requeues the job with NODE_FAIL and the next run lands on the same node. The job is
a plain batch script (no torch: ~20 s); the run directory gets the ledger hpctrain wrote in that case (rank 0
called it a preemption, requeued by Slurm itself), with the times the job itself logged. ``status`` must read
sacct's real rows, match them to the attempts and name the disagreement.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain._slurm import SlurmCommands
from hpctrain.ledger import Ledger
from hpctrain.status.report import collect
from tests.cluster.nodes import DEVCLUSTER
from tests.cluster.test_slurm_ddp import wait_final

pytestmark = [pytest.mark.slurm]

SCRIPT = """#!/bin/bash
echo "$(date +%s.%N) ${{SLURM_RESTART_COUNT:-0}} $(hostname)" >> {times}
if [ "${{SLURM_RESTART_COUNT:-0}}" -lt 1 ]; then sleep 120; fi
"""


def _idle_node() -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-t", "idle", "-o", "%N"], capture_output=True, text=True)
    nodes = sorted(set(out.stdout.split()))
    if not nodes:
        pytest.skip("no idle node to fail (the dev cluster is busy)")
    return nodes[-1]


def _lines(path: Path, n: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
        if len(lines) >= n:
            return [line.split() for line in lines]
        time.sleep(0.3)
    raise TimeoutError(f"{path}: fewer than {n} lines after {timeout}s")


def test_status_reads_sacct_for_a_job_requeued_after_a_node_failure_and_names_the_disagreement(tmp_path):
    node = _idle_node()
    times = tmp_path / "times.txt"
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.format(times=times))
    job = subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", "-N1", "-w", node, "--exclusive", "--requeue", "--job-name",
         "g10-sacct", "-o", str(tmp_path / "out.%j"), str(script)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        (first,) = _lines(times, 1, timeout=60)
        # --exclusive: only this job is on the node. DOWN without the drain of `devcluster fail-node`: the node is
        # back in service at once, as in the issue
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=status sacct test"], check=True)
        failed_at = time.time()
        assert wait_final(job, timeout=150) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        subprocess.run([str(DEVCLUSTER), "resume-node", node], capture_output=True, timeout=30)
    first, second = _lines(times, 2, timeout=5)
    assert [first[1], second[1]] == ["0", "1"] and first[2] == second[2] == node
    t0, t1 = float(first[0]), float(second[0])

    runs = SlurmCommands().job_runs([job])
    assert [(r.job_id, r.state, r.nodes) for r in runs] == [(job, "NODE_FAIL", node), (job, "COMPLETED", node)]
    # sacct's times are whole seconds (cut, not rounded): a time logged in a run lies within 1 s of its Start..End
    assert runs[0].start - 1 <= t0 <= runs[0].end + 1 and runs[0].end <= failed_at + 2
    assert runs[1].start - 1 <= t1 <= runs[1].end + 1 and runs[1].start >= runs[0].end

    run = tmp_path / "run"
    run.mkdir()
    (run / "submission.json").write_text(json.dumps({"job_id": job, "cluster": "slurm", "state": "submitted"}))
    common = {"job_id": job, "launcher": "slurm", "hosts": [node], "world_size": 1}
    for rec in (
        {"event": "start", "time": t0 + 0.2, "restart_count": 0, **common},
        {"event": "exit", "time": failed_at, "job_id": job, "restart_count": 0, "cause": "preemption",
         "requeued": True, "reason": "preemption, requeued by Slurm itself", "decided_by_rank": 0},
        {"event": "start", "time": t1 + 0.2, "restart_count": 1, **common},
        {"event": "end", "time": t1 + 0.4, "step": 10, "status": "completed"},
        {"event": "exit", "time": t1 + 0.5, "job_id": job, "restart_count": 1, "cause": "finished",
         "requeued": False, "reason": "finished", "decided_by_rank": 0},
    ):  # fmt: skip
        Ledger(run).append(rec)
    report = collect(run, slurm=SlurmCommands())
    view = report["slurm_view"]
    assert view["available"], view
    assert [(a["attempt"], a["slurm_state"], a["matched_by"]) for a in view["attempts"]] == [
        (f"{job}-r0", "NODE_FAIL", "time"),
        (f"{job}-r1", "COMPLETED", "time"),
    ]
    assert view["disagreements"] == [f"attempt {job}-r0: hpctrain says preemption, Slurm says NODE_FAIL"]
    assert (report["job"]["state"], report["job"]["source"], report["job"]["nodes"]) == ("COMPLETED", "sacct", node)
