"""How an attempt ends (hpctrain.launch.ending) with a fake Slurm: classification, requeue decision, records,
which rank decides.

The real signals, requeues and restarts are tested on the dev cluster (tests/cluster/test_preemption.py).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from hpctrain.launch.ending import finish_attempt, requeue_job_id
from hpctrain.launch.records import rank_end_path
from hpctrain.ledger import Ledger
from hpctrain.testing import FakeSlurm


def _run(tmp_path: Path, *, resumed: int, committed: int | None, restart: int = 0) -> None:
    """A ledger start record of attempt ``restart`` and a committed checkpoint ``committed``."""
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    if committed is not None:  # a real commit: the launcher asks hpctrain.ckpt.latest_committed
        import torch

        from hpctrain.ckpt import CheckpointConfig, Checkpointer

        saver = Checkpointer(CheckpointConfig(dir=ckpt))
        saver.save(committed, model=torch.nn.Linear(1, 1))
        saver.close()
    Ledger(tmp_path).append({"event": "start", "job_id": "7", "restart_count": restart, "resumed_from_step": resumed,
         "checkpoint_dir": str(ckpt), "time": time.time()},
    )  # fmt: skip


def _end(tmp_path: Path, slurm: FakeSlurm, **kw):
    args = dict(
        run_dir=tmp_path, rank=0, world_size=1, job_id="7", restart_count=0, launcher="slurm", stop=None,
        agreed_step=None, error=None, started=time.time() - 100, time_limit_s=3600.0, lead_s=120.0,
        max_requeues=3, slurm=slurm, peer_wait_s=0.2,
    )  # fmt: skip
    args.update(kw)
    return finish_attempt(**args)


def test_preemption_with_progress_requeues_once_by_rank_0_and_records_why(tmp_path, capsys):
    _run(tmp_path, resumed=0, committed=40)
    slurm = FakeSlurm()
    slurm.queue["7"] = ["RUNNING"]
    end = _end(tmp_path, slurm, stop=(signal.SIGUSR2, time.time()), agreed_step=40)
    assert (end.cause, end.requeued) == ("preemption", True) and slurm.requeued == ["7"]
    assert "requeued after preemption (1 of 3)" in capsys.readouterr().err
    (record,) = [json.loads(x) for x in (tmp_path / "train" / "ledger.jsonl").read_text().splitlines()][1:]
    assert record["event"] == "exit" and record["committed_step"] == 40 and record["agreed_step"] == 40
    assert json.loads(rank_end_path(tmp_path, "7", 0, 0).read_text())["cause"] == "stopped"


def test_other_ranks_only_record_their_end(tmp_path):
    slurm = FakeSlurm()
    assert _end(tmp_path, slurm, rank=2, world_size=3, error=ValueError("bad batch")) is None
    assert slurm.calls == [] and not (tmp_path / "train").exists()
    assert json.loads(rank_end_path(tmp_path, "7", 0, 2).read_text())["cause"] == "user_error"


@pytest.mark.parametrize(
    "limit, elapsed, state, signum, cause",
    [
        ("1:00", 40, "RUNNING", signal.SIGUSR2, "time_limit"),  # USR2 within the lead of the limit
        ("1:00:00", 100, "RUNNING", signal.SIGUSR2, "preemption"),  # USR2 long before it
        ("1:00:00", 100, "RUNNING", signal.SIGTERM, "preemption"),  # GraceTime preemption without user signal
        ("1:00:00", 100, "COMPLETING", signal.SIGTERM, "cancelled"),  # scancel: the job is already completing
        ("1:00:00", 3590, "TIMEOUT", signal.SIGTERM, "time_limit"),  # the limit's final notice
    ],
)
def test_stops_are_classified_from_the_signal_the_clock_and_slurm(tmp_path, limit, elapsed, state, signum, cause):
    _run(tmp_path, resumed=0, committed=10)
    slurm = FakeSlurm()
    slurm.queue["7"], slurm.limits["7"] = [state], limit
    now = time.time()
    end = _end(tmp_path, slurm, time_limit_s=None, lead_s=15, started=now - elapsed, stop=(signum, now))
    assert end.cause == cause
    assert end.requeued == (cause != "cancelled") and slurm.requeued == ([] if cause == "cancelled" else ["7"])


def test_failures_need_new_progress_preemptions_do_not(tmp_path):
    _run(tmp_path, resumed=20, committed=20, restart=1)
    slurm = FakeSlurm()
    slurm.queue["7"] = ["RUNNING"] * 2
    peer = RuntimeError("[gloo] Connection closed by peer [10.77.0.12]:5000")
    end = _end(tmp_path, slurm, restart_count=1, error=peer)
    assert end.cause == "node_failure" and not end.requeued and "committed no new checkpoint step" in end.reason
    end = _end(tmp_path, slurm, restart_count=1, stop=(signal.SIGUSR2, time.time()), agreed_step=20)
    assert end.cause == "preemption" and end.requeued  # the cluster's doing: requeued without a new step
    assert slurm.requeued == ["7"]


def test_a_peer_error_caused_by_another_ranks_user_error_is_a_user_error(tmp_path):
    _run(tmp_path, resumed=0, committed=30)
    rank_end_path(tmp_path, "7", 0, 1).parent.mkdir(parents=True, exist_ok=True)
    rank_end_path(tmp_path, "7", 0, 1).write_text(json.dumps({"cause": "user_error"}))
    slurm = FakeSlurm()
    slurm.queue["7"] = ["RUNNING"]
    end = _end(tmp_path, slurm, world_size=3, error=RuntimeError("Connection reset by peer"))
    assert end.cause == "user_error" and not end.requeued and slurm.requeued == []


def test_bound_counted_from_the_restart_count_and_a_failed_requeue_is_reported(tmp_path):
    _run(tmp_path, resumed=0, committed=50, restart=3)
    slurm = FakeSlurm()
    slurm.queue["7"] = ["RUNNING"] * 2
    end = _end(tmp_path, slurm, restart_count=3, stop=(signal.SIGUSR2, time.time()), agreed_step=50)
    assert not end.requeued and end.reason == "not requeued: 3 requeues used of --max-requeues 3"
    slurm.requeue_error = "Requested operation is presently disabled"
    end = _end(tmp_path, slurm, restart_count=3, max_requeues=5, stop=(signal.SIGUSR2, time.time()), agreed_step=50)
    assert not end.requeued and "presently disabled" in end.reason


def test_finished_and_local_runs_never_requeue(tmp_path):
    _run(tmp_path, resumed=0, committed=100)
    slurm = FakeSlurm()
    assert _end(tmp_path, slurm).cause == "finished" and slurm.calls == []
    end = _end(tmp_path, slurm, launcher="torchrun", job_id="", stop=(signal.SIGTERM, time.time()), agreed_step=9)
    assert not end.requeued and "not a Slurm job" in end.reason and slurm.calls == []


def test_array_tasks_requeue_only_themselves():
    assert requeue_job_id("105", {"SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "5"}) == "100_5"
    assert requeue_job_id("105", {}) == "105"


def _peer_error() -> RuntimeError:
    return RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")


def test_the_lowest_survivor_decides_when_rank_0_left_no_end_record(tmp_path, capsys):
    _run(tmp_path, resumed=0, committed=None)
    slurm = FakeSlurm()
    slurm.queue["7"] = ["RUNNING"]
    end = _end(tmp_path, slurm, rank=1, world_size=3, error=_peer_error(), takeover_wait_s=0.3)
    assert end is not None and end.cause == "node_failure" and end.record["decided_by_rank"] == 1
    assert [r["event"] for r in Ledger(tmp_path).records()] == ["start", "exit"]
    assert "rank 0 left no end record; rank 1 decided" in capsys.readouterr().err
    # rank 2 finds rank 1's end record: it does not decide again
    assert _end(tmp_path, slurm, rank=2, world_size=3, error=_peer_error(), takeover_wait_s=0.3) is None
    assert len(Ledger(tmp_path).records("exit")) == 1


def test_a_survivor_leaves_the_decision_to_a_rank_0_that_wrote_its_end(tmp_path):
    _run(tmp_path, resumed=0, committed=None)
    slurm = FakeSlurm()
    rank0_end = rank_end_path(tmp_path, "7", 0, 0)
    rank0_end.parent.mkdir(parents=True)
    rank0_end.write_text(json.dumps({"rank": 0, "cause": "node_failure"}))
    assert _end(tmp_path, slurm, rank=1, world_size=2, error=_peer_error(), takeover_wait_s=0.3) is None
    assert Ledger(tmp_path).records("exit") == []


def test_one_decision_per_attempt_even_when_rank_0_comes_late(tmp_path):
    _run(tmp_path, resumed=0, committed=None)
    slurm = FakeSlurm()
    first = _end(tmp_path, slurm, rank=1, world_size=2, error=_peer_error(), takeover_wait_s=0.1)
    late = _end(tmp_path, slurm, rank=0, world_size=2, error=_peer_error())
    assert first is not None and late is None and len(Ledger(tmp_path).records("exit")) == 1


def test_a_rank_that_is_not_a_failure_survivor_never_decides(tmp_path):
    _run(tmp_path, resumed=0, committed=None)
    assert _end(tmp_path, FakeSlurm(), rank=1, world_size=2, error=ValueError("user bug"), takeover_wait_s=0.1) is None
    assert _end(tmp_path, FakeSlurm(), rank=1, world_size=2, takeover_wait_s=0.1) is None
    assert Ledger(tmp_path).records("exit") == []
