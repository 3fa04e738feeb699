"""Node failures on the dev cluster, for any cluster test: ``with failed_node("node2"): ...``.

``tests/cluster/devcluster fail-node`` sets the node DOWN (Slurm ends or shrinks the jobs on it) and keeps it
drained (the dev cluster's ReturnToService=2 would bring it back within 0.2 s, a real failed node stays out);
leaving the block, or an exception in it, resumes the node. The block may end early (as soon as the test has
seen what it needs) so that the node is back in service before the next attempt is scheduled.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import typing as tp
from pathlib import Path

from hpctrain.rundir import RunDir

__all__ = ["failed_node", "rank_host", "DEVCLUSTER"]

DEVCLUSTER = Path(__file__).with_name("devcluster")


@contextlib.contextmanager
def failed_node(node: str) -> tp.Iterator[float]:
    """Fail ``node`` now; yields the time it failed (``time.time()``); resumes it on exit."""
    failed_at = time.time()
    subprocess.run([str(DEVCLUSTER), "fail-node", node], check=True, capture_output=True, text=True, timeout=30)
    try:
        yield failed_at
    finally:
        subprocess.run([str(DEVCLUSTER), "resume-node", node], check=True, capture_output=True, text=True, timeout=30)


def rank_host(run_dir: Path, job_id: str, attempt: int, rank: int, timeout: float = 120) -> str:
    """The host rank ``rank`` of one attempt joined from (its join record), waiting for the record."""
    path = RunDir(run_dir).rank_record(job_id, attempt, rank)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no join record {path} after {timeout}s")
        time.sleep(0.3)
    return str(json.loads(path.read_text())["hostname"])
