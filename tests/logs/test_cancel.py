"""``python -m hpctrain cancel`` with a fake Slurm: the request and ledger record, the node side's decision that
never requeues a cancelled attempt, --save (signal, wait for the exit record, then scancel), a finished run.

The real job, signals and checkpoint are on the dev cluster (tests/cluster/test_logs_cancel.py).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

from hpctrain import cancel
from hpctrain.__main__ import main as hpctrain_main
from hpctrain.launch.ending import cancel_request, cancel_request_path, finish_attempt
from hpctrain.ledger import Ledger
from hpctrain.run import attempts
from hpctrain.testing import FakeSlurm

JOB = "21"


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "submission.json").write_text(json.dumps({"job_id": JOB, "cluster": "slurm", "world_size": 1}))
    return run


def _end(run: Path, slurm: FakeSlurm, signum: int):
    return finish_attempt(
        run_dir=run, rank=0, world_size=1, job_id=JOB, restart_count=0, launcher="slurm",
        stop=(signum, time.time()), agreed_step=5, error=None, started=time.time() - 100, time_limit_s=3600.0,
        lead_s=120.0, max_requeues=3, slurm=slurm, peer_wait_s=0.1,
    )  # fmt: skip


def test_plain_cancel_records_who_and_scancels(tmp_path):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.queue[JOB] = ["RUNNING"] * 3
    result = cancel.cancel_run(run, slurm=slurm)
    assert result["scancel"] and ["scancel", JOB] in slurm.calls and not slurm.signalled
    rec = Ledger(run).records("cancel")[-1]
    assert rec["job_id"] == JOB and rec["user"] and rec["host"] and rec["save"] is False
    assert cancel_request(run, JOB)["user"] == rec["user"]
    # the node side: scancel's SIGTERM while squeue says COMPLETING -> cancelled, never requeued, who is recorded
    slurm.queue[JOB] = ["COMPLETING"]
    end = _end(run, slurm, signal.SIGTERM)
    assert end.cause == "cancelled" and not end.requeued and not slurm.requeued
    assert end.record["cancelled_by"]["user"] == rec["user"] and "cancelled by " in end.reason
    last = attempts(Ledger(run).records())[-1]
    assert last.cause == "cancelled" and last.status == "stopped" and "cancelled by" in last.exit["reason"]


def test_a_usr2_that_looks_like_a_preemption_is_not_requeued_after_a_cancel_request(tmp_path):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.queue[JOB] = ["RUNNING"] * 5
    end = _end(run, slurm, signal.SIGUSR2)  # no request: a preemption, requeued
    assert end.cause == "preemption" and end.requeued
    run2 = _run(tmp_path / "b")
    cancel_request_path(run2).write_text(json.dumps({"job_id": JOB, "user": "alice", "host": "login1", "save": True}))
    end = _end(run2, slurm, signal.SIGUSR2)
    assert end.cause == "cancelled" and not end.requeued
    assert end.record["cancelled_by"]["user"] == "alice" and "--save" in end.reason
    run3 = _run(tmp_path / "c")  # a request for another job of the run (before a --resume) does not count
    cancel_request_path(run3).write_text(json.dumps({"job_id": "20", "user": "alice"}))
    assert _end(run3, slurm, signal.SIGUSR2).requeued


def test_save_signals_waits_for_the_exit_record_then_cancels(tmp_path):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.queue[JOB] = ["RUNNING"] * 1000

    def node_side():  # the job: sees USR2, saves step 7, rank 0 decides (reading the request)
        while not slurm.signalled:
            time.sleep(0.01)
        Ledger(run).append({"event": "exit", "job_id": JOB, "restart_count": 0, "cause": "cancelled",
                            "requeued": False, "agreed_step": 7, "committed_step": 7, "time": time.time()})  # fmt: skip

    thread = threading.Thread(target=node_side, daemon=True)
    thread.start()
    result = cancel.cancel_run(run, save=True, timeout_s=60, slurm=slurm, poll_s=0.01, log=lambda s: None)
    thread.join(10)
    assert slurm.signalled == [(JOB, "USR2")]
    assert result["exit"]["committed_step"] == 7 and result["scancel"]
    signalled = slurm.calls.index(["scancel", "--signal=USR2", JOB])
    assert slurm.calls.index(["scancel", JOB]) > signalled
    assert Ledger(run).records("cancel")[-1]["save"] is True


def test_save_of_a_pending_job_just_cancels(tmp_path):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.queue[JOB] = ["PENDING"] * 3
    result = cancel.cancel_run(run, save=True, slurm=slurm, log=lambda s: None)
    assert result["scancel"] and not slurm.signalled


def test_a_finished_run_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.final[JOB] = "COMPLETED"
    monkeypatch.setattr("hpctrain._slurm.SlurmCommands.run", lambda self, argv, timeout=30.0: slurm.run(argv))
    assert hpctrain_main(["cancel", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has already ended (COMPLETED)" in err
    assert not Ledger(run).records("cancel") and not cancel_request_path(run).exists()
    assert hpctrain_main(["cancel", str(tmp_path / "nope")]) == 2
    local = tmp_path / "local"
    local.mkdir()
    (local / "submission.json").write_text(json.dumps({"job_id": "99", "cluster": "local"}))
    assert hpctrain_main(["cancel", str(local)]) == 2


def test_cancel_json(tmp_path, capsys, monkeypatch):
    run = _run(tmp_path)
    slurm = FakeSlurm()
    slurm.queue[JOB] = ["RUNNING"] * 3
    monkeypatch.setattr("hpctrain._slurm.SlurmCommands.run", lambda self, argv, timeout=30.0: slurm.run(argv))
    assert hpctrain_main(["cancel", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "hpctrain.cancel/1" and doc["scancel"] is True and doc["job_id"] == JOB
