"""The sbatch text: a golden file, and hostile names that must not inject shell (submitit's weird_tmp_path)."""

import difflib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import render_sbatch

GOLDEN = Path(__file__).with_name("sbatch_golden.txt")


def golden_config():
    return SubmitConfig(
        nodes=2,
        gpus_per_node=4,
        cpus_per_task=8,
        mem="64G",
        time="1-00:00:00",
        partition="gpu",
        account="proj",
        qos="normal",
        constraint="a100&ib",
        job_name="golden",
        entry="pkg.train:main",
    )


def test_sbatch_matches_golden_file():
    text = render_sbatch(golden_config(), folder="/scratch/runs/golden/logs", python="/opt/venv/bin/python")
    if not GOLDEN.exists():
        GOLDEN.write_text(text)
        pytest.fail(f"created {GOLDEN}; review it and commit it")
    expected = GOLDEN.read_text()
    diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "rendered", lineterm=""))
    assert text == expected, f"sbatch text changed (delete {GOLDEN.name} if this is intended):\n{diff}"


def test_gpu_job_requests_gpus_and_one_task_per_gpu():
    text = render_sbatch(golden_config(), folder="/f", python="py")
    assert "#SBATCH --gres=gpu:4" in text and "#SBATCH --ntasks-per-node=4" in text
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=USR2@120" in text and "#SBATCH --time=1440" in text


HOSTILE = [
    "a 0",
    'a"=0"',
    "a'; touch PWNED; echo '",
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "x\\y&&touch PWNED",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_do_not_inject_shell(tmp_path, name):
    run_dir = tmp_path / name
    folder = run_dir / "logs"
    cfg = SubmitConfig(job_name=name, run_dir=str(run_dir), entry="a:b")
    script = render_sbatch(cfg, folder=folder, python=str(tmp_path / "bin" / "python 3"))
    # Run the script with a fake srun that records the argv it was given.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "srun.argv"
    fake_srun = bindir / "srun"
    fake_srun.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}\n')
    fake_srun.chmod(fake_srun.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "job.sh").write_text(script)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env, check=True, timeout=30)
    assert not list(tmp_path.rglob("PWNED")), "the script executed a command hidden in a name"
    argv = record.read_text().split("\0")[:-1]
    # The interpreter (with a space in its path) and the folder arrive intact, each as one argument.
    assert argv[-5:] == [str(tmp_path / "bin" / "python 3"), "-u", "-m", "submitit.core._submit", str(folder)]
    assert argv[argv.index("--output") + 1] == f"{folder}/%j_%t_log.out"


GOLDEN_SPARES = Path(__file__).with_name("sbatch_golden_spares.txt")


def test_spare_nodes_sbatch_matches_golden_file():
    cfg = SubmitConfig(nodes=2, tasks_per_node=2, spare_nodes=1, job_name="golden", entry="pkg.train:main")
    text = render_sbatch(cfg, folder="/scratch/runs/golden/logs", python="/opt/venv/bin/python",
                         run_dir="/scratch/runs/golden")  # fmt: skip
    if not GOLDEN_SPARES.exists():
        GOLDEN_SPARES.write_text(text)
        pytest.fail(f"created {GOLDEN_SPARES}; review it and commit it")
    assert text == GOLDEN_SPARES.read_text(), f"sbatch text changed (delete {GOLDEN_SPARES.name} if intended)"
    assert "#SBATCH --nodes=3" in text and "#SBATCH --no-kill" in text
    assert "--no-kill" not in render_sbatch(golden_config(), folder="/f", python="py")


def test_spare_nodes_script_runs_the_training_srun_through_the_restart_loop(tmp_path):
    run_dir = tmp_path / "run dir; touch PWNED"
    cfg = SubmitConfig(nodes=2, tasks_per_node=2, spare_nodes=1, run_dir=str(run_dir), entry="a:b")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    python = bindir / "python 3"  # records what the loop is started with
    python.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {tmp_path / "loop.argv"}\n')
    python.chmod(0o755)
    (tmp_path / "job.sh").write_text(render_sbatch(cfg, folder=run_dir / "logs", python=str(python), run_dir=run_dir))
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, check=True, timeout=30)
    argv = (tmp_path / "loop.argv").read_text().split("\0")[:-1]
    assert not list(tmp_path.rglob("PWNED"))
    sep = argv.index("--")
    assert argv[:sep] == ["-m", "hpctrain.launch.spares", "--nodes", "2", "--tasks-per-node", "2", "--spares", "1",
                          "--run-dir", str(run_dir)]  # fmt: skip
    # after --: submitit's own srun line, unchanged
    assert argv[sep + 1 : sep + 3] == ["srun", "--unbuffered"] and argv[-3:] == ["-m", "submitit.core._submit",
                                                                                 str(run_dir / "logs")]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "mode", "no_kill"),
    [
        # no spare node: the smaller world, --no-kill all the same (a failed node must leave the others running)
        ({"in_job_recovery": True}, "--in-job-recovery", True),
        ({"spare_nodes": 1, "warm_spares": True}, "--warm-spares", True),
        ({"spare_nodes": 1, "warm_spares": True, "in_job_recovery": True}, "--warm-spares", True),
    ],
)
def test_in_job_recovery_runs_the_step_through_the_loop_with_or_without_spare_nodes(tmp_path, kwargs, mode, no_kill):
    run_dir = tmp_path / "run"
    cfg = SubmitConfig(nodes=2, tasks_per_node=2, run_dir=str(run_dir), entry="a:b", **kwargs)
    text = render_sbatch(cfg, folder=run_dir / "logs", python="py", run_dir=run_dir)
    (loop,) = [line for line in text.splitlines() if line.startswith("srun() {")]
    assert "-m hpctrain.launch.spares" in loop and loop.split(" -- ")[0].endswith(mode), loop
    assert ("#SBATCH --no-kill" in text) is no_kill
    assert f"#SBATCH --nodes={2 + cfg.spare_nodes}" in text
