"""The Runner on real processes: rendezvous from the environment, gloo group, entry(ctx), clean exit."""

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.multiproc import free_port, run_world

ROOT = Path(__file__).resolve().parents[2]


def _run_probe(rank, world_size, run_dir, port):
    os.environ.update(HPCTRAIN_MASTER_PORT=str(port))
    from hpctrain.launch import Runner, RunnerSettings

    settings = RunnerSettings(dist_timeout=60)
    return Runner(entry="tests.entries:allreduce_probe", run_dir=run_dir, entry_args=["--x", "1"], settings=settings)()


def test_runner_allreduce_and_ddp_step_on_real_processes(tmp_path):
    res = run_world(_run_probe, 3, str(tmp_path), free_port(), init_pg=False)
    records = res.results
    assert [r["rank"] for r in records] == [0, 1, 2]
    assert all(r["reduced"] == 6.0 and r["dist_world"] == 3 and r["backend"] == "gloo" for r in records)
    assert records[0]["weights"] == records[1]["weights"] == records[2]["weights"]  # DDP averaged the grads
    assert all(r["args"] == ["--x", "1"] for r in records)
    # 3 ranks on this node share its CPUs instead of each starting one thread per core
    if not os.environ.get("OMP_NUM_THREADS"):
        expected = max(1, len(os.sched_getaffinity(0)) // 3)
        assert all(r["cpu_threads"] == expected for r in records)
    # Every task left a record for the login-node tools.
    ranks = sorted(p.name for p in (tmp_path / "ranks").glob("*/rank-*.json"))
    assert ranks == ["rank-0.json", "rank-1.json", "rank-2.json"]


def test_missing_rank_fails_with_clear_error_instead_of_hanging(tmp_path):
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONPATH=str(ROOT),
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.launch",
            "--entry",
            "tests.entries:allreduce_probe",
            "--run-dir",
            str(tmp_path),
            "--dist-timeout",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctrain launch: error: rank 0/2 could not join the process group at 127.0.0.1:")
    assert time.monotonic() - t0 < 60


def test_inconsistent_environment_exits_before_rendezvous(tmp_path):
    env = dict(
        os.environ,
        SLURM_JOB_ID="9",
        SLURM_PROCID="0",
        SLURM_NTASKS="2",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURM_JOB_NODELIST="n1",
        PYTHONPATH=str(ROOT),
    )
    env.pop("SLURM_STEP_ID", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.launch",
            "--entry",
            "tests.entries:allreduce_probe",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "batch shell of job 9" in proc.stderr and "srun" in proc.stderr


def _run_failing(rank, world_size, run_dir, port):
    os.environ.update(HPCTRAIN_MASTER_PORT=str(port))
    from hpctrain.launch import Runner, RunnerSettings

    return Runner(entry="tests.entries:fail_on_rank_1", run_dir=run_dir, settings=RunnerSettings(dist_timeout=30))()


def test_entry_error_on_one_rank_ends_every_rank_without_waiting_for_the_timeout(tmp_path):
    t0 = time.monotonic()
    res = run_world(_run_failing, 2, str(tmp_path), free_port(), init_pg=False, allow_failures=True, timeout=60)
    assert res.results[1] is None and res.exitcodes[1] == 1  # the entry's error fails its task
    # Rank 0 finished its entry; its closing barrier sees the peer gone and ends (success or error),
    # well before the 30 s rendezvous timeout.
    assert res.exitcodes[0] in (0, 1)
    assert time.monotonic() - t0 < 25
