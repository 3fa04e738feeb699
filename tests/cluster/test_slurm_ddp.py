"""On the real dev cluster (tests/cluster/devcluster up): multi-node DDP through hpctrain.submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import render_sbatch

pytestmark = [pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR")


def submit(args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def model_digest(run_dir: Path, steps: int) -> dict:
    """``ckpt digest``'s model and optimizer digests of the run's newest commit, which must be at ``steps``:
    the one comparison of "finished bit-exactly like the uninterrupted run" every cluster test makes."""
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", "digest", str(run_dir / "checkpoints"), "--json"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    got = json.loads(out)
    assert got["step"] == steps, got
    return {k: v for k, v in got["digests"].items() if k in ("model", "optimizer")}


def sacct_state(job_id: str) -> str:
    lines = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
    ).stdout.split("\n")
    lines = [line for line in lines if line.strip()]
    return lines[-1].split()[0] if lines else ""  # "CANCELLED by 0" -> CANCELLED


def sacct_job_name(job_id: str, timeout: float = 30) -> str:
    """The job's name as accounting stores it.

    When slurmdbd gets a step record before the job's own record it files a placeholder job named
    "allocation" and fixes it when the job record arrives, so a name read right after the job ends can
    still be the placeholder: wait for the real one.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobName"], capture_output=True, text=True
        ).stdout.strip()
        if (got and got != "allocation") or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def wait_final(job_id: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip()
        if not queued:
            state = sacct_state(job_id)
            if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
                return state
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} still not finished after {timeout}s")


def test_two_nodes_two_tasks_allreduce_and_ddp_step(tmp_path):
    run_dir = tmp_path / "ddp"
    args = [
        "--nodes",
        "2",
        "--tasks-per-node",
        "2",
        "--gpus-per-node",
        "0",
        "--time",
        "5",
        "--job-name",
        "ddp-probe",
        "--entry",
        "tests.entries:allreduce_probe",
        "--run-dir",
        str(run_dir),
    ]
    proc = submit([*args, "--follow", "--", "--marker", "42"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((run_dir / "submission.json").read_text())
    job_id = record["job_id"]
    assert f"Submitted job {job_id}" in proc.stdout and "ended COMPLETED" in proc.stdout
    # sacct agrees (accounting is on in the dev cluster, as on a real one).
    assert wait_final(job_id) == "COMPLETED"

    probes = [json.loads(p.read_text()) for p in sorted((run_dir / "probe").glob("rank-*.json"))]
    assert sorted(p["rank"] for p in probes) == [0, 1, 2, 3]  # each rank exactly once
    assert all(p["world_size"] == 4 and p["dist_world"] == 4 and p["dist_rank"] == p["rank"] for p in probes)
    assert all(p["reduced"] == 1 + 2 + 3 + 4 for p in probes)
    assert len({json.dumps(p["weights"]) for p in probes}) == 1  # DDP averaged different batches identically
    assert all(p["args"] == ["--marker", "42"] and p["job_id"] == job_id for p in probes)
    hosts = {p["hostname"] for p in probes}
    addresses = {p["address"] for p in probes}
    assert len(hosts) == 2 and len(addresses) == 2, (hosts, addresses)  # two nodes, two network namespaces
    assert {p["master"].split(":")[0] for p in probes} == {sorted(hosts)[0]}
    for p in probes:  # local ranks 0,1 on each node, node rank matches the host
        assert p["local_rank"] == p["rank"] % 2 and p["node_rank"] == p["rank"] // 2

    logs = run_dir / "logs"
    for rank in range(4):
        out = (logs / f"{job_id}_{rank}_log.out").read_text()
        assert f"hpctrain: rank {rank}/4" in out
        assert (logs / f"{job_id}_{rank}_log.err").exists()
    # What was submitted is exactly what --dry-run prints for the same configuration.
    cfg = SubmitConfig(
        nodes=2,
        tasks_per_node=2,
        gpus_per_node=0,
        time="5",
        job_name="ddp-probe",
        entry="tests.entries:allreduce_probe",
    )
    assert (run_dir / "sbatch.sh").read_text() == render_sbatch(cfg, folder=logs, python=sys.executable)
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks" / f"{job_id}-r0").glob("rank-*.json")]
    print(
        f"\nsbatch -> all 4 ranks started: {max(r['started_at'] for r in ranks) - record['submitted_at']:.2f}s, "
        f"joined the group: {max(r['joined_at'] for r in ranks) - record['submitted_at']:.2f}s"
    )


def test_hostile_run_dir_and_job_name_run_without_injection(tmp_path):
    name = 'we\'ird "name"; $(touch PWNED) `touch PWNED`'
    run_dir = tmp_path / "a b'; $(touch PWNED)"
    proc = submit(
        [
            "--nodes",
            "1",
            "--time",
            "5",
            "--job-name",
            name,
            "--entry",
            "hpctrain.examples.demo:main",
            "--run-dir",
            str(run_dir),
            "--follow",
            "--",
            "--steps",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = json.loads((run_dir / "submission.json").read_text())["job_id"]
    assert json.loads((run_dir / "demo_result.json").read_text())["steps"] == 2
    assert not list(tmp_path.rglob("PWNED")) and not (ROOT / "PWNED").exists()
    assert sacct_job_name(job_id) == name.replace('"', "`")  # slurmdbd stores a double quote as a backtick


def test_demo_on_hdf5_data_checkpoints_on_2_nodes_and_resumes_on_1(tmp_path):
    """The pieces on the real cluster: HDF5 input, sharded checkpoints on the shared filesystem, and a
    second job (another node count) that resumes mid-epoch from the first job's checkpoint."""
    from hpctrain.data import make_dataset

    data = make_dataset(tmp_path / "train.h5", 400, shape=(3, 8, 8), chunk_samples=32, compression="gzip")
    ck = tmp_path / "ck"
    demo = ["--data", data, "--batch-size", "32", "--workers", "1", "--ckpt-every", "3", "--ckpt-dir", str(ck)]
    for nodes, steps, run in ((2, 7, "a"), (1, 10, "b")):
        proc = submit(
            [
                "--nodes",
                str(nodes),
                "--time",
                "5",
                "--entry",
                "hpctrain.examples.demo:main",
                "--run-dir",
                str(tmp_path / run),
                "--follow",
                "--",
                "--steps",
                str(steps),
                *demo,
            ]
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads((tmp_path / "a" / "demo_result.json").read_text())
    second = json.loads((tmp_path / "b" / "demo_result.json").read_text())
    assert first["world_size"] == 2 and first["steps"] == 7 and first["resumed"] is None
    assert second["world_size"] == 1 and second["resumed"]["step"] == 7 and second["resumed"]["saved_world_size"] == 2
    assert second["steps_run"] == 3 and second["weights_in_sync"]
    verify = subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", "verify", str(ck), "--json"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0 and [r["step"] for r in json.loads(verify.stdout)["checkpoints"]] == [9, 10]


def test_unknown_partition_names_the_real_ones(tmp_path):
    proc = submit(["--partition", "nosuch", "--entry", "hpctrain.examples.demo:main", "--run-dir", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert (
        "--partition 'nosuch' does not exist on this cluster; sinfo lists: debug, low, lownograce, high" in proc.stderr
    )
    assert not (tmp_path / "r").exists()


def test_plain_sbatch_template_runs_the_same_entry(tmp_path):
    run_dir = tmp_path / "plain"
    env = dict(
        ENV,
        HPCTRAIN_ENTRY="tests.entries:allreduce_probe",
        HPCTRAIN_RUN_DIR=str(run_dir),
        HPCTRAIN_PYTHON=sys.executable,
    )
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--time=5",
            f"--output={tmp_path}/batch-%j.out",
            str(ROOT / "sbatch_templates" / "ddp.sbatch"),
            "--from-template",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    job_id = out.split(";")[0]
    assert wait_final(job_id) == "COMPLETED", (tmp_path / f"batch-{job_id}.out").read_text()
    probes = [json.loads(p.read_text()) for p in sorted((run_dir / "probe").glob("rank-*.json"))]
    assert [p["rank"] for p in probes] == [0, 1] and all(p["reduced"] == 3.0 for p in probes)
    assert len({p["hostname"] for p in probes}) == 2 and all(p["args"] == ["--from-template"] for p in probes)


def test_launch_in_the_batch_shell_fails_fast_with_advice(tmp_path):
    cmd = f"{sys.executable} -m hpctrain.launch --entry tests.entries:allreduce_probe --run-dir {tmp_path}"
    job_id = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks=2",
            "--time=2",
            f"--output={tmp_path}/out-%j.txt",
            "--wrap",
            cmd,
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert wait_final(job_id) == "FAILED"
    text = (tmp_path / f"out-{job_id}.txt").read_text()
    assert "running in the batch shell of job" in text and "launch the training command with srun" in text


def test_second_up_is_a_noop():
    base = Path(os.environ.get("DEVCLUSTER_DIR", "/tmp/hpctrain-devcluster"))
    before = (base / "run" / "slurmctld.pid").read_text()
    proc = subprocess.run(
        [str(ROOT / "tests" / "cluster" / "devcluster"), "up"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "already up" in proc.stderr
    assert (base / "run" / "slurmctld.pid").read_text() == before
    status = subprocess.run(
        [str(ROOT / "tests" / "cluster" / "devcluster"), "status"], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0 and "accounting: sacct answers" in status.stdout
    assert (
        status.stdout.count("running (pid") >= 6
    )  # munge (unless pre-existing), mariadb, slurmdbd, slurmctld, 4 slurmd


def squeue_reason(job_id: str, timeout: float = 60) -> str:
    """squeue's reason for a pending job once the scheduler has given one ('None' until its first pass)."""
    deadline = time.monotonic() + timeout
    while True:
        reason = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%r"], capture_output=True, text=True
        ).stdout.strip()
        if (reason and reason != "None") or time.monotonic() > deadline:
            return reason
        time.sleep(0.5)


def test_request_larger_than_the_cluster_is_flagged(tmp_path):
    proc = submit(["--nodes", "8", "--entry", "hpctrain.examples.demo:main", "--run-dir", str(tmp_path / "r")])
    job_id = json.loads((tmp_path / "r" / "submission.json").read_text())["job_id"]
    try:
        assert proc.returncode == 0, proc.stderr
        # The CLI waits about 2 s for the scheduler's pass; on a cold or busy controller it may not come
        # in time, and the CLI must then say so rather than print a bare PENDING.
        # Slurm 22.05 gives an 8-node request on 4 nodes either reason, from one scheduler pass to another (a full
        # run here saw PartitionNodeLimit); the CLI treats both as "never starts".
        too_big = ("PartitionConfig", "PartitionNodeLimit")
        if "reason not yet assigned" in proc.stdout:
            assert "cannot start as requested" not in proc.stdout
        else:
            assert any(f"reason {r}" in proc.stdout for r in too_big) and "cannot start as requested" in proc.stdout
        assert squeue_reason(job_id) in too_big  # Slurm's own verdict, however long its pass takes
    finally:
        subprocess.run(["scancel", job_id], check=True)


SLEEPER = "import time\n\ndef main(ctx):\n    print('sleeping', flush=True)\n    time.sleep(600)\n"


def test_a_job_that_overruns_its_limit_is_not_requeued(tmp_path):
    """An entry that never polls ctx.should_stop: the Runner records the warning and every later signal
    (submitit's handlers are replaced, so rank 0 is not stopped and submitit does not requeue), the job
    runs into its limit and ends TIMEOUT, not requeued (docs/preemption.md)."""
    (tmp_path / "overrun.py").write_text(SLEEPER)
    env = dict(ENV, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    jobs = {}
    for tasks in (1, 2):  # submitted together: both wait out the same minute
        run_dir = tmp_path / f"t{tasks}"
        proc = subprocess.run(
            [sys.executable, "-m", "hpctrain.submit", "--nodes", "1", "--tasks-per-node", str(tasks), "--time", "1"]
            + ["--max-requeues", "3", "--entry", "overrun:main", "--run-dir", str(run_dir)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        jobs[tasks] = (json.loads((run_dir / "submission.json").read_text())["job_id"], run_dir)
    try:
        finals = {tasks: wait_final(job_id, timeout=240) for tasks, (job_id, _) in jobs.items()}
    finally:
        subprocess.run(["scancel", *(job_id for job_id, _ in jobs.values())])
    assert finals == {1: "TIMEOUT", 2: "TIMEOUT"}
    for job_id, run_dir in jobs.values():
        records = subprocess.run(
            ["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", "JobID"], capture_output=True, text=True
        ).stdout.split()
        assert records == [job_id]  # one record: never requeued
        err = (run_dir / "logs" / f"{job_id}_0_log.err").read_text()
        assert "checkpoint_and_try_requeue" not in err and "not checkpointable" not in err
