"""`python -m hpctrain.submit` as a researcher runs it: real subprocesses, exit codes, one-line errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.submit import cli
from hpctrain.testing import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]


def submit(args, cwd, *extra_python):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *extra_python, "-m", "hpctrain.submit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def imported_modules(proc):
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_help_and_dry_run_do_not_import_torch(tmp_path):
    for args in (["--help"], ["--nodes", "2", "--entry", "hpctrain.examples.demo:main", "--dry-run"]):
        proc = submit(args, tmp_path, "-X", "importtime")
        assert proc.returncode == 0, proc.stderr
        mods = imported_modules(proc)
        assert "hpctrain.submit.cli" in mods and "torch" not in mods and "numpy" not in mods


def test_dry_run_prints_script_and_creates_nothing(tmp_path):
    run_dir = tmp_path / "myrun"
    proc = submit(
        [
            "--nodes",
            "3",
            "--tasks-per-node",
            "2",
            "--entry",
            "hpctrain.examples.demo:main",
            "--run-dir",
            str(run_dir),
            "--dry-run",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=3\n" in proc.stdout and "#SBATCH --ntasks-per-node=2\n" in proc.stdout
    assert f"{run_dir}/logs/%j_%t_log.out" in proc.stdout
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_hpctrain_toml_in_cwd_names_the_entry(tmp_path):
    (tmp_path / "hpctrain.toml").write_text(
        '[job]\ntime = "00:20:00"\n[train]\nentry = "hpctrain.examples.demo:main"\n'
    )
    proc = submit(["--nodes", "8", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=8\n" in proc.stdout and "#SBATCH --time=20\n" in proc.stdout


@pytest.mark.parametrize(
    "args, toml, message",
    [
        (["--nodes", "0"], None, "--nodes 0 must be at least 1"),
        (["--time", "25:99"], None, "--time '25:99': seconds must be < 60"),
        (["--entry", "no_such_module_xyz:main"], "", "no module named 'no_such_module_xyz'"),
        (["--entry", "hpctrain.examples.demo:nope"], "", "defines no top-level 'nope'"),
        (["--entry", "not-an-entry"], "", "is not of the form"),
        (
            [],
            '[job]\nnodes = 2\ngpus = 4\n[train]\nentry = "hpctrain.examples.demo:main"\n',
            "unknown key(s) ['gpus'] in [job]",
        ),
        ([], "", "no training entry"),
        (["--job-name", "a\nb"], None, "--job-name"),
        (["--mem", "lots"], None, "--mem 'lots'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, toml, message):
    if toml is not None:
        (tmp_path / "hpctrain.toml").write_text(toml)
    default_entry = [] if toml is not None else ["--entry", "hpctrain.examples.demo:main"]
    proc = submit([*default_entry, *args, "--cluster", "local"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain submit: error: "), proc.stderr
    assert message in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == (["hpctrain.toml"] if toml is not None else [])


def test_entry_that_fails_to_import_is_caught_before_submission(tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_dependency_xyz\n\ndef main(ctx):\n    pass\n")
    proc = submit(["--entry", "broken:main", "--cluster", "local"], tmp_path)
    assert proc.returncode == 2
    assert "does not import: ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_unknown_partition_is_rejected_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = FakeSlurm(["debug*", "low"])
    with pytest.raises(UsageError, match="--partition 'gpu' does not exist on this cluster; sinfo lists: debug, low"):
        cli.main(["--entry", "hpctrain.examples.demo:main", "--cluster", "slurm", "--partition", "gpu"], slurm=fake)
    assert fake.calls == [["sinfo", "-h", "-o", "%P"]]
    assert list(tmp_path.iterdir()) == []


def test_existing_run_dir_is_never_overwritten(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "submission.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="already holds a submission"):
        cli.main(
            ["--entry", "hpctrain.examples.demo:main", "--cluster", "local", "--run-dir", str(run_dir)],
            slurm=FakeSlurm(),
        )
    assert (run_dir / "submission.json").read_text() == "{}"


def test_local_cluster_runs_the_demo_with_the_same_number_of_processes(tmp_path):
    proc = submit(
        [
            "--cluster",
            "local",
            "--nodes",
            "2",
            "--entry",
            "hpctrain.examples.demo:main",
            "--run-dir",
            str(tmp_path / "run"),
            "--",
            "--steps",
            "5",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended COMPLETED" in proc.stdout
    import json

    result = json.loads((tmp_path / "run" / "demo_result.json").read_text())
    assert result["world_size"] == 2 and result["weights_in_sync"] and result["steps"] == 5
    record = json.loads((tmp_path / "run" / "submission.json").read_text())
    assert record["cluster"] == "local" and record["state"] == "submitted" and record["config"]["nodes"] == 2


def test_report_prints_names_with_brackets_literally(tmp_path):
    from rich.console import Console

    from hpctrain.submit.backend import Submission
    from hpctrain.submit.config import SubmitConfig

    fake = FakeSlurm()
    fake.queue["12"] = ["PENDING"]
    cfg = SubmitConfig(job_name="exp[/]1 [bold]x", entry="a:b")
    run_dir = tmp_path / "run [red]dir"
    sub = Submission(job=None, job_id="12", run_dir=run_dir, cluster="slurm", submitted_at=0.0)
    console = Console(record=True, width=300)
    assert cli._report(cfg, sub, fake, follow_job=False, console=console) == 0
    out = console.export_text()
    assert "(exp[/]1 [bold]x)" in out and f"run dir : {run_dir}" in out and "reason Priority" in out
    assert f"tail -f '{run_dir}/logs/12_0_log.out'" in out


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self):
        return self.now


def test_wait_for_reason_polls_until_the_scheduler_assigns_one():
    fake, clock = FakeSlurm(), FakeClock()
    fake.queue["7"] = ["PENDING:None", "PENDING:None", "PENDING:PartitionConfig", "PENDING:PartitionConfig"]
    state = cli.wait_for_reason(fake, "7", timeout_s=2.0, poll_s=0.25, sleep=clock.sleep, clock=clock)
    assert (state.state, state.reason) == ("PENDING", "PartitionConfig")
    assert clock.sleeps == [0.25, 0.25] and len(fake.calls) == 3


def test_wait_for_reason_is_bounded_and_returns_at_once_when_there_is_nothing_to_wait_for():
    fake, clock = FakeSlurm(), FakeClock()
    fake.queue["7"] = ["PENDING:None"] * 100
    state = cli.wait_for_reason(fake, "7", timeout_s=2.0, poll_s=0.25, sleep=clock.sleep, clock=clock)
    assert state.reason == "" and clock.now == 2.0 and len(fake.calls) == 9  # first look + 8 polls, then give up
    for states in (["RUNNING"], ["PENDING"], []):  # running, a reason already, or gone from the queue
        fake, clock = FakeSlurm(), FakeClock()
        fake.queue["8"] = list(states)
        cli.wait_for_reason(fake, "8", sleep=clock.sleep, clock=clock)
        assert clock.sleeps == [] and len(fake.calls) == 1 + (not states)  # + sacct when squeue has no line
    fake, clock = FakeSlurm(), FakeClock()
    fake.queue["9"] = ["PENDING:None"] * 100
    cli.wait_for_reason(fake, "9", sleep=clock.sleep, clock=clock)  # the defaults: a gentle client
    assert len(fake.calls) <= 4 and min(clock.sleeps) >= 1.0


def report(fake, job_id="12"):
    from rich.console import Console

    from hpctrain.submit.backend import Submission
    from hpctrain.submit.config import SubmitConfig

    sub = Submission(job=None, job_id=job_id, run_dir=Path("/r"), cluster="slurm", submitted_at=0.0)
    console = Console(record=True, width=300)
    assert cli._report(SubmitConfig(entry="a:b"), sub, fake, follow_job=False, console=console) == 0
    return console.export_text()


def test_report_says_when_slurm_has_not_assigned_a_reason_and_warns_on_one_that_never_starts(monkeypatch):
    monkeypatch.setattr(cli.time, "sleep", lambda s: None)  # the real clock still bounds the wait
    fake = FakeSlurm()
    fake.queue["12"] = ["PENDING:None"] * 1000
    out = report(fake)
    assert "state   : PENDING (squeue, reason not yet assigned)" in out and "warning" not in out
    fake = FakeSlurm()
    fake.queue["12"] = ["PENDING:None", "PENDING:PartitionConfig"]
    out = report(fake)
    assert "reason PartitionConfig" in out and "cannot start as requested" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "0"],
        ["--nodes", "9" * 5000],
        ["--no-such-flag"],
        ["--config", "."],
        ["--entry", "hpctrain.examples.demo:main", "--nodes", "2", "--run-dir", "/tmp/x", "--dry-run"],
        ["--help"],
    ],
    ids=["bad-value", "huge-number", "unknown-flag", "config-is-dir", "dry-run", "help"],
)
def test_python_m_hpctrain_submit_and_python_m_hpctrain_dot_submit_behave_identically(tmp_path, args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.run(
            [sys.executable, "-m", *front, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        for front in (["hpctrain", "submit"], ["hpctrain.submit"])
    ]
    a, b = procs
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    if args != ["--help"] and "--dry-run" not in args:
        assert a.returncode == 2 and a.stderr.startswith("hpctrain submit: error: ") and a.stderr.count("\n") == 1
    else:
        assert a.returncode == 0 and a.stdout
    assert list(tmp_path.iterdir()) == []


def test_max_requeues_help_says_what_happens():
    # hpctrain requeues by itself (hpctrain.launch.ending); Runner must have no `checkpoint`, or submitit's
    # own requeue path would run too (double requeue, and every USR2 would burn submitit's timeout counter).
    from hpctrain.launch.runner import Runner

    assert not hasattr(Runner, "checkpoint")
    text = " ".join(cli.build_parser().format_help().split())
    assert "requeues after a time limit, preemption or rank/node failure (default 3)" in text
    assert "SLURM_RESTART_COUNT" in text and "committed no new checkpoint step" in text
    assert "No automatic requeue yet" not in text
