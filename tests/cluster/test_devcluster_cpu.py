"""``tests/cluster/devcluster cpu CORES`` gives every Slurm task started afterwards CORES cores of its own.

The cap is applied by the cluster's TaskProlog (``$BASE/etc/task_prolog``, written by ``cpu`` and ``up``), which
slurmstepd runs in each task's process just before the task execs: it moves its parent into a cgroup of its own.
These tests run that very script the way slurmstepd does (a child of the task-to-be, with the task's Slurm
environment) under a random ``DEVCLUSTER_PREFIX`` and ``DEVCLUSTER_DIR``, so the shared dev cluster is never
capped and the cgroups are the prefix's own (``hpctrain-devcluster-PREFIX``). Real CFS bandwidth control: the task
forks two busy children after the prolog ran (as a rank forks loader workers) and their CPU time over a fixed wall
time comes from the kernel (``wait4``'s rusage). Needs root and a cgroup cpu controller; skips otherwise. The
benchmark that relies on it (benchmarks/capacity_validation.py) runs it through real Slurm jobs.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "devcluster"

# A task: runs the prolog as its child (PROLOG, with the environment given), waits for a line on stdin, forks two
# children that spin for WALL seconds, prints their CPU seconds and its own cgroup line; then exits.
TASK = r"""
import json, os, subprocess, sys, time
prolog, wall = sys.argv[1], float(sys.argv[2])
subprocess.run([prolog], check=True)
sys.stdin.readline()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        t = time.monotonic()
        while time.monotonic() - t < wall:
            pass
        os._exit(0)
    kids.append(pid)
cpu = 0.0
for pid in kids:
    _, status, usage = os.wait4(pid, 0)
    cpu += usage.ru_utime + usage.ru_stime
cg = [l for l in open("/proc/self/cgroup").read().splitlines() if ":cpu" in l or l.startswith("0::")]
print(json.dumps({"cpu_s": cpu, "cgroup": cg}), flush=True)
"""


def _cgroup_root() -> tp.Optional[Path]:
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_period_us").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    try:
        if "cpu" in (v2 / "cgroup.controllers").read_text().split():
            return v2
    except OSError:
        pass
    return None


def _reason() -> str:
    if os.geteuid() != 0:
        return "needs root (cgroups)"
    if _cgroup_root() is None:
        return "no cgroup cpu controller"
    return ""


class Cluster:
    """The script's commands under a prefix of this test's own, and tasks started as slurmstepd starts them."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = "hc" + secrets.token_hex(3)
        self.base = tmp_path / "dc"
        self.env = dict(os.environ, DEVCLUSTER_PREFIX=self.prefix, DEVCLUSTER_DIR=str(self.base))
        self.task_py = tmp_path / "task.py"
        self.task_py.write_text(TASK)
        self.procs: tp.List[subprocess.Popen] = []
        root = _cgroup_root()
        assert root is not None
        self.cgroup = root / f"hpctrain-devcluster-{self.prefix}"

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=60)

    def slurm_env(self, job: int, step: str, local_id: int) -> tp.Dict[str, str]:
        return dict(os.environ, SLURM_JOB_ID=str(job), SLURM_STEP_ID=step, SLURM_LOCALID=str(local_id),
                    SLURMD_NODENAME="node1")  # fmt: skip

    def task(self, job: int, step: str, local_id: int, wall_s: float) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, str(self.task_py), str(self.base / "etc" / "task_prolog"), str(wall_s)],
            env=self.slurm_env(job, step, local_id),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    @staticmethod
    def result(p: subprocess.Popen) -> tp.Dict[str, tp.Any]:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        out = json.loads(p.stdout.readline())
        assert p.wait(timeout=30) == 0
        return out

    def epilog(self, job: int, step: str, local_id: int) -> None:
        subprocess.run([str(self.base / "etc" / "task_epilog")], env=self.slurm_env(job, step, local_id), check=True)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self.run("down")


@pytest.fixture
def cluster(tmp_path: Path) -> tp.Iterator[Cluster]:
    reason = _reason()
    if reason:
        pytest.skip(reason)
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.cleanup()


def test_each_task_and_its_children_get_the_cores_then_off_lifts_it_and_the_epilog_removes_the_group(
    cluster: Cluster,
) -> None:
    r = cluster.run("cpu", "0.1")
    assert r.returncode == 0, r.stderr
    assert "cpu: 0.1 cores per task" in r.stderr
    assert cluster.run("cpu").stdout.strip() == "cpu: 0.1 cores per task (CFS bandwidth control)"
    wall = 2.0
    capped = cluster.task(7, "0", 1, wall)
    got = cluster.result(capped)
    group = cluster.cgroup / "node1" / "7.0.1"
    assert any(line.endswith(f"/hpctrain-devcluster-{cluster.prefix}/node1/7.0.1") for line in got["cgroup"]), got
    # two spinning children share the task's 0.1 cores for 2 s: 0.2 CPU seconds (a 10 ms period of slack each way)
    assert 0.12 < got["cpu_s"] < 0.3, got
    assert group.is_dir()
    cluster.epilog(7, "0", 1)
    assert not group.exists()

    r = cluster.run("cpu", "off")
    assert r.returncode == 0 and "cpu: uncapped" in r.stderr, r.stderr
    assert cluster.run("cpu").stdout.strip() == "cpu: uncapped"
    free = cluster.result(cluster.task(8, "0", 0, wall))
    assert not any(cluster.prefix in line for line in free["cgroup"]), free
    assert free["cpu_s"] > 2.5 * got["cpu_s"], (free, got)  # uncapped: up to 4 CPU seconds on two cores


def test_the_batch_step_is_not_capped_and_down_removes_the_groups(cluster: Cluster) -> None:
    assert cluster.run("cpu", "0.5").returncode == 0
    batch = cluster.result(cluster.task(9, "", 0, 0.1))  # the batch script: SLURM_STEP_ID is not set
    assert not any(cluster.prefix in line for line in batch["cgroup"]), batch
    left = cluster.task(9, "0", 0, 0.1)
    cluster.result(left)  # a task whose group its epilog never removed (the node was lost, say)
    assert (cluster.cgroup / "node1" / "9.0.0").is_dir()
    r = cluster.run("down")
    assert r.returncode == 0, r.stderr
    assert not cluster.cgroup.exists()
    assert not (cluster.base / "cpu").exists()


@pytest.mark.parametrize(
    "spec, names",
    [("abc", "is not a number"), ("-1", "is negative"), ("0", "above 0"), ("999", "at most"), ("", "no cores")],
)
def test_bad_input_exits_2_with_one_line_and_changes_nothing(cluster: Cluster, spec: str, names: str) -> None:
    assert cluster.run("cpu", "0.5").returncode == 0
    r = cluster.run("cpu", spec)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("devcluster: error: ") and names in lines[0], r.stderr
    assert cluster.run("cpu").stdout.strip().startswith("cpu: 0.5 cores per task")
    assert (cluster.base / "cpu.quota").read_text().strip() == "5000"  # 0.5 of the 10 ms period
