"""``python -m hpctrain status``: live, finished, Slurm and damaged run directories; no torch on the login node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from hpctrain.status.cli import collect
from hpctrain.testing import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]


def _interval(step, total=100, loss=1.0, world=2):
    spread = lambda v: {"min": v, "median": v, "max": 1.5 * v, "max_rank": world - 1}
    return {
        "schema": "hpctrain.train.metrics/1",
        "kind": "interval",
        "time": time.time(),
        "step": step,
        "steps": 10,
        "total_steps": total,
        "world_size": world,
        "loss": loss,
        "samples": 1280,
        "interval_s": 1.0,
        "samples_per_s": 1280.0,
        "samples_per_s_per_rank": spread(640.0),
        "eta_s": (total - step) * 0.1,
        "flops_per_s": 1e9,
        "mfu": None,
        "measured": True,
        "per_step": {
            k: spread(v)
            for k, v in (
                ("step_s", 0.1),
                ("data_wait_s", 0.01),
                ("forward_backward_s", 0.05),
                ("grad_comm_exposed_s", 0.02),
                ("optimizer_s", 0.01),
                ("checkpoint_s", 0.0),
            )
        },
        "slowest_rank": world - 1,
        "data_wait_frac": 0.1,
        "last_checkpoint_step": None,
    }


def manifest(step, *, world=2, saved=None):
    """A committed checkpoint's MANIFEST.json as the checkpoint package validates it (docs/checkpoint.md);
    status asks hpctrain.ckpt.latest_committed, which reads nothing else of the step."""
    shards = [{"file": f"rank-{r:05d}-of-{world:05d}.shard", "bytes": 0, "crc32": 0} for r in range(world)]
    m = {"format": "hpctrain-ckpt", "format_version": 1, "step": step, "world_size": world, "shards": shards}
    return {**m, "time": time.time() if saved is None else saved}


def _run_dir(tmp_path, *, steps=(10, 20), end=None, pid=None, submission=None, ckpt_steps=(10,)):
    run = tmp_path / "run"
    run.mkdir()
    ck = run / "checkpoints"
    for s in ckpt_steps:
        d = ck / f"step-{s:09d}"
        d.mkdir(parents=True)
        (d / "MANIFEST.json").write_text(json.dumps(manifest(s, world=2, saved=time.time() - 5)))
    (ck / "step-000000099.tmp-j1-r0-abc-3").mkdir(parents=True)  # in progress: not committed
    if submission is not None:
        (run / "submission.json").write_text(json.dumps(submission))
    Ledger(run).append(
        {
            "event": "start",
            "time": time.time() - 60,
            "job_id": "77",
            "restart_count": 0,
            "hosts": ["node1", "node2"],
            "world_size": 2,
            "pid": pid if pid is not None else 999_999_999,
            "hostname": socket.gethostname(),
            "resumed_from_step": 0,
            "total_steps": 100,
            "checkpoint_dir": str(ck),
            "startup_s": 3.2,
            "lost_s": None,
            "down_s": None,
        },
    )
    path = RunDir(run).metrics
    path.write_text("".join(json.dumps(_interval(s)) + "\n" for s in steps))
    if end is not None:
        Ledger(run).append({"event": "end", "time": time.time(), "step": steps[-1], "status": end})
    return run


def test_live_local_run_is_running_with_progress_breakdown_and_checkpoint(tmp_path):
    run = _run_dir(tmp_path, pid=os.getpid())
    r = collect(run)
    assert r["job"]["state"] == "RUNNING" and r["job"]["source"] == "run dir"
    assert r["progress"]["step"] == 20 and r["progress"]["total_steps"] == 100
    assert r["progress"]["eta_s"] == pytest.approx(8.0) and r["progress"]["fraction"] == pytest.approx(0.2)
    assert r["checkpoint"]["step"] == 10 and r["checkpoint"]["world_size"] == 2  # the .tmp dir does not count
    assert r["last_interval"]["slowest_rank"] == 1 and r["restarts"] == 0 and r["problems"] == []


def test_finished_run_reports_its_end_and_no_eta(tmp_path):
    run = _run_dir(tmp_path, steps=(90, 100), end="completed")
    r = collect(run)
    assert r["job"]["state"] == "COMPLETED" and r["progress"]["ended"] == "completed"
    assert r["progress"]["step"] == 100 and r["progress"]["eta_s"] is None


def test_a_local_run_whose_process_died_without_an_end_record_says_so(tmp_path):
    r = collect(_run_dir(tmp_path))  # pid 999999999 does not exist
    assert r["job"]["state"].startswith("DIED")


def test_slurm_job_state_comes_from_squeue_then_sacct(tmp_path):
    run = _run_dir(tmp_path, submission={"job_id": "77", "cluster": "slurm", "state": "submitted"})
    slurm = FakeSlurm()
    slurm.queue["77"] = ["RUNNING"]
    r = collect(run, slurm=slurm)
    assert r["job"]["state"] == "RUNNING" and r["job"]["source"] == "squeue" and r["job"]["nodes"] == "node[1-2]"
    slurm.final["77"] = "TIMEOUT"
    assert collect(run, slurm=slurm)["job"] == {
        "id": "77",
        "cluster": "slurm",
        "state": "TIMEOUT",
        "source": "sacct",
        "nodes": "node[1-2]",
        "elapsed": "00:00:09",
        "reason": "",
    }


def test_slurm_unreachable_falls_back_to_the_run_records_with_a_warning(tmp_path):
    run = _run_dir(tmp_path, end="stopped", submission={"job_id": "77", "cluster": "slurm"})
    slurm = FakeSlurm()
    slurm.accounting = False  # squeue empty, sacct fails
    r = collect(run, slurm=slurm)
    assert r["job"]["state"] == "STOPPED" and r["job"]["source"] == "run dir"
    assert any("Slurm does not know job 77" in p for p in r["problems"])


def _status(*args):
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpctrain", "status", *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_corrupt_jsonl_line_is_named_and_the_rest_is_still_shown_without_importing_torch(tmp_path):
    run = _run_dir(tmp_path, steps=(10, 20, 30), pid=os.getpid())
    path = RunDir(run).metrics
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"kind": "interval", "step": 2\x00garbage\n' + "".join(lines[1:]) + '{"kind": "inter')
    proc = _status(run)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "metrics.jsonl line 2: not JSON" in out and "metrics.jsonl line 5: unfinished last line" in out
    assert "step 30/100" in out and "RUNNING" in out and "exposed comm" in out and "step 10 committed" in out
    imported = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported and not [line for line in imported if line.split("|")[-1].strip().split(".")[0] == "torch"]

    proc = _status(run, "--json")
    report = json.loads(proc.stdout)
    assert report["progress"]["step"] == 30 and len(report["problems"]) == 2


def test_bad_run_dir_is_one_line_and_exit_2(tmp_path):
    proc = _status(tmp_path / "nope")
    assert proc.returncode == 2 and proc.stderr.strip().endswith("no such directory")
    assert "hpctrain status: error: RUN_DIR" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = _status(tmp_path / "empty")
    assert proc.returncode == 2 and "is it a run directory?" in proc.stderr


# ------------------------------------------------------------------------------------------- 80 columns
def _render_80(run):
    from rich.console import Console

    from hpctrain.status.view import render
    from tests.status.rundirs import fake_slurm

    console = Console(width=80, record=True, color_system=None, highlight=False, emoji=False)
    render(collect(run, slurm=fake_slurm()), console)
    return console.export_text()


def _ledger_lines(text):
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("ledger"))
    header, rule = lines[head + 1], lines[head + 2]
    assert set(rule.strip()) == {"─"}, rule
    rows = []
    for line in lines[head + 3 :]:
        if not line.split() or line.split()[0] not in ("start", "end", "exit"):
            break
        rows.append(line)
    return header, rows


def test_the_ledger_of_a_requeued_run_reads_in_80_columns(tmp_path):
    """Every header whole, every record on one line, times compact, no line wider than the terminal."""
    from tests.status.rundirs import N_RECORDS, build

    text = _render_80(build(tmp_path / "run"))
    header, rows = _ledger_lines(text)
    assert "…" not in header and header.split() == [
        "event", "when", "attempt", "hosts", "from", "step", "lost", "down", "startup", "status"
    ]  # fmt: skip
    assert len(rows) == N_RECORDS and not [r for r in rows if "…" in r]
    assert rows[0].split()[2] == "77-r0" and "time_limit" in rows[1] and "completed" in rows[3]
    assert "1.5 s" in rows[2] and "40.0 s" in rows[2] and "3.2 s" in rows[2]  # the house's duration format
    table = text.splitlines()[text.splitlines().index(header) - 1 :]
    assert max(len(line.rstrip()) for line in table[: N_RECORDS + 3]) <= 80
    for line in text.splitlines():  # the step-time table too: whole headers, one line a part
        if line.startswith(("┃", "│")):
            assert "…" not in line and len(line) <= 80


def test_a_ledger_column_with_no_value_is_left_out(tmp_path):
    from tests.status.rundirs import LEDGER, build

    run = build(tmp_path / "run")
    records = [json.loads(line) for line in (run / LEDGER).read_text().splitlines()]
    for r in records:
        r.pop("lost_s", None), r.pop("down_s", None)
    (run / LEDGER).write_text("".join(json.dumps(r) + "\n" for r in records))
    header, rows = _ledger_lines(_render_80(run))
    assert "lost" not in header.split() and "down" not in header.split() and "startup" in header.split()
    assert len(rows) == 5
