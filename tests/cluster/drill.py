"""A failure drill on the dev cluster, by hand: one run survives a hang and then a node failure.

    python -m tests.cluster.drill [RUN_ROOT]        (from the repository root; the dev cluster up)

2 nodes x 2 tasks, tests/cluster/preempt_entry.py, 120 steps, a checkpoint every 10, ``--hang-timeout 10``.
Attempt 0: rank 1 hangs at step 25 (the watchdog ends every rank; cause ``hang``; its host is excluded).
Attempt 1: once it has run 20 steps, the host of its rank 3 is set DOWN (cause ``node_failure``; excluded).
Attempt 2 runs on the two nodes left and completes. Prints ``python -m hpctrain status`` of the run: the
output docs/preemption.md shows. The cluster tests cover each failure alone (test_hang.py,
test_node_failure.py); this one shows them together, as a user meets them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import typing as tp
from pathlib import Path

from tests.cluster.nodes import failed_node, rank_host
from tests.cluster.preempt_entry import write_data
from tests.cluster.test_preemption import _calls, _exits, _wait
from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final


def main(argv: tp.Sequence[str]) -> int:
    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="hpctrain-drill-"))
    root.mkdir(parents=True, exist_ok=True)
    data, run_dir = root / "data.h5", root / "run"
    write_data(data, 256)
    subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", "2", "--time", "8",
         "--max-requeues", "3", "--hang-timeout", "10", "--job-name", "drill",
         "--entry", "tests.cluster.preempt_entry:main", "--run-dir", str(run_dir), "--",
         "--data", str(data), "--batch", "16", "--steps", "120", "--ckpt-every", "10", "--sleep", "0.1",
         "--workers", "0", "--hang-at", "25"],
        cwd=ROOT, env=ENV, check=True, timeout=120,
    )  # fmt: skip
    job = str(json.loads((run_dir / "submission.json").read_text())["job_id"])
    _wait("the hang's exit record", lambda: _exits(run_dir), timeout=400)
    _wait("20 steps of attempt 1", lambda: len(_calls(run_dir, 1)) >= 20, timeout=400)
    host = rank_host(run_dir, job, 1, 3)
    print(f"drill: setting {host} DOWN under attempt 1 of job {job}", flush=True)
    with failed_node(host):
        _wait("the node failure's exit record", lambda: len(_exits(run_dir)) >= 2, timeout=120)
    print(f"drill: job {job} ended {wait_final(job, timeout=600)}", flush=True)
    return subprocess.run([sys.executable, "-m", "hpctrain", "status", str(run_dir)], cwd=ROOT, env=ENV).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
