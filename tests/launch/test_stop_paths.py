"""The stop path's loose ends, with real processes: a SIGKILLed rank 0, Ctrl-C on a local run, and
continuing a local run that was not requeued by following the message it printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, read_jsonl
from tests.multiproc import run_world

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR", COLUMNS="200")


def _runner(rank, world_size, run_dir, entry):
    from hpctrain.launch import Runner, RunnerSettings

    return Runner(entry=entry, run_dir=run_dir, settings=RunnerSettings(dist_timeout=60))()


def test_sigkill_of_rank_0_ends_the_survivors_with_one_line_and_the_lowest_records_the_exit(tmp_path, capfd):
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    res = run_world(
        _runner, 3, str(run_dir), "tests.entries:rank0_killed_after_a_collective", init_pg=False, allow_failures=True
    )
    took = time.monotonic() - t0
    assert res.exitcodes[0] == -signal.SIGKILL and res.exitcodes[1:] == [1, 1], res.exitcodes
    assert took < 60, f"the survivors took {took:.0f}s to end"
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    for rank in (1, 2):
        assert len(re.findall(rf"hpctrain: rank {rank}: a peer rank failed", err)) == 1, err[-3000:]
    (exit_record,) = Ledger(run_dir).records("exit")
    assert exit_record["cause"] == "node_failure" and exit_record["decided_by_rank"] == 1, exit_record
    assert "rank 0 left no end record; rank 1 decided" in err


def _submit(args, run_dir, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the test's Ctrl-C reaches the job, not pytest
        **kw,
    )


def _wait_for_steps(run_dir: Path, proc: subprocess.Popen, at_least: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        steps = [r.get("step", 0) for r in read_jsonl(RunDir(run_dir).metrics)[0] if r.get("kind") == "interval"]
        if steps and max(steps) >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"no interval record of step {at_least} within {timeout_s}s")


DEMO = ["--nodes", "2", "--entry", "hpctrain.examples.demo:main", "--follow"]
DEMO_ARGS = ["--", "--steps", "100000", "--log-every", "5", "--quiet", "--hidden", "16"]


def test_ctrl_c_on_a_local_follow_run_stops_cleanly_and_the_printed_command_resumes_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = _submit([*DEMO, "--run-dir", str(run_dir), *DEMO_ARGS, "--ckpt-every", "1000"], run_dir)
    _wait_for_steps(run_dir, proc, 10)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to its foreground group on Ctrl-C
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in RunDir(run_dir).logs.glob("*_log.*"))
    assert "Traceback" not in logs and "KeyboardInterrupt" not in logs, logs[-3000:]
    (exit_record,) = Ledger(run_dir).records("exit")
    assert exit_record["cause"] == "interrupted" and not exit_record["requeued"], exit_record
    agreed = exit_record["agreed_step"]
    assert agreed >= 10 and exit_record["committed_step"] == agreed, exit_record  # saved at the agreed step: 0 lost
    (end,) = Ledger(run_dir).records("end")
    assert end["status"] == "stopped" and end["step"] == agreed
    # the message names the command that continues the run; following it resumes from the agreed step
    command = re.search(r"resume with: (.+)$", exit_record["reason"]).group(1)
    assert command in out
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "hpctrain.submit"]
    again = ["--steps", str(agreed + 10), "--log-every", "5", "--quiet", "--hidden", "16", "--ckpt-every", "1000"]
    resumed = _submit([*argv[3:], "--follow", "--", *again], run_dir)
    out2, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out2[-3000:]
    starts = Ledger(run_dir).records("start")
    assert [s["resumed_from_step"] for s in starts] == [0, agreed], starts
    assert Ledger(run_dir).records("end")[-1]["status"] == "completed"
    # the first submission is kept beside the new one, never overwritten
    first = json.loads(RunDir(run_dir).previous_submission(0).read_text())
    assert first["job_id"] != json.loads(RunDir(run_dir).submission.read_text())["job_id"]


def test_a_second_ctrl_c_ends_the_process_at_once_with_one_line():
    # A process with the Runner's handlers: the first SIGINT is recorded (a clean stop follows), the second
    # exits with the shell's code for SIGINT. Signals are not queued, so the presses are apart, as a hand's are.
    child = (
        "import os, signal, sys, time\n"
        "from hpctrain.runtime.preemption import StopSignals\n"
        "s = StopSignals().install()\n"
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)\n"
        "print('recorded', [sig for sig, _ in s.received], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "print('still running')\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout.splitlines() == [f"recorded [{int(signal.SIGINT)}]"], proc.stdout
    assert proc.stderr.strip() == "hpctrain: second Ctrl-C: exiting now without saving"


def test_resume_refuses_a_directory_without_a_submission(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--resume", str(tmp_path), "--cluster", "local"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--resume" in proc.stderr and "submission.json" in proc.stderr
