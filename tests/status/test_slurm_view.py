"""``status`` beside Slurm's record (sacct) of each attempt; the short identity; the slowest rank's own slow phase.

Issue 28, groups 10-12. Slurm's behaviour itself (sacct 22.05's rows for a requeued job) is checked on the dev
cluster in tests/status/test_slurm_view_cluster.py; here FakeSlurm answers, for the matching logic.
"""

from __future__ import annotations

import json
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain.bundle.attempts import attempts_from_ledger, summary
from hpctrain.identity import SCHEMA
from hpctrain.ledger import Ledger
from hpctrain.runtime.stragglers import find_straggler
from hpctrain.status.report import collect
from hpctrain.testing import FakeSlurm
from tests.status.rundirs import status

JOB = "12"
DISAGREE = "attempt 12-r0: hpctrain says preemption, Slurm says NODE_FAIL"


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # whole lines, as on a terminal


def _start(restart: int, t: float, hosts: tp.Sequence[str] = ("node2",)) -> tp.Dict[str, tp.Any]:
    return {
        "event": "start",
        "time": t,
        "job_id": JOB,
        "restart_count": restart,
        "hosts": list(hosts),
        "launcher": "slurm",
        "world_size": 2,
        "resumed_from_step": 0,
        "total_steps": 100,
    }


def _exit(restart: int, t: float, cause: str, requeued: bool, reason: str = "") -> tp.Dict[str, tp.Any]:
    return {
        "event": "exit",
        "time": t,
        "job_id": JOB,
        "restart_count": restart,
        "cause": cause,
        "requeued": requeued,
        "reason": reason or cause,
        "decided_by_rank": 0,
    }


def _run(tmp_path: Path, records: tp.Sequence[tp.Dict[str, tp.Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "submission.json").write_text(json.dumps({"job_id": JOB, "cluster": "slurm", "state": "submitted"}))
    for r in records:
        Ledger(run).append(r)
    return run


def _node_fail_recovered_at_once(tmp_path: Path) -> tp.Tuple[Path, FakeSlurm]:
    """The issue's run: node2 went DOWN under attempt 0 and was back at once (ReturnToService=2); Slurm requeued the
    job with NODE_FAIL, rank 0 saw only a SIGTERM and a requeue it did not make, and called it a preemption; the
    next attempt ran on node2 again and finished."""
    t0 = time.time() - 600
    run = _run(
        tmp_path,
        [
            _start(0, t0 + 5),
            _exit(0, t0 + 60, "preemption", True, "preemption, requeued by Slurm itself"),
            _start(1, t0 + 120),
            {"event": "end", "time": t0 + 300, "step": 100, "status": "completed"},
            _exit(1, t0 + 301, "finished", False),
        ],
    )
    slurm = FakeSlurm()
    slurm.history[JOB] = [
        {"State": "NODE_FAIL", "Start": t0, "End": t0 + 61, "NodeList": "node2"},
        {"State": "COMPLETED", "Start": t0 + 110, "End": t0 + 303, "NodeList": "node2"},
    ]
    return run, slurm


def _sacct_calls(slurm: FakeSlurm) -> tp.List[tp.List[str]]:
    return [c for c in slurm.calls if c[0] == "sacct"]


def test_a_node_failure_slurm_recovered_at_once_shows_slurms_state_and_the_disagreement(tmp_path, capsys):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    view = collect(run, slurm=slurm)["slurm_view"]
    assert view["available"] and view["disagreements"] == [DISAGREE]
    rows = {r["attempt"]: r for r in view["attempts"]}
    assert (rows["12-r0"]["cause"], rows["12-r0"]["slurm_state"], rows["12-r0"]["slurm_nodes"]) == (
        "preemption",
        "NODE_FAIL",
        "node2",
    )
    assert (rows["12-r1"]["slurm_state"], rows["12-r1"]["disagrees"]) == ("COMPLETED", None)
    assert rows["12-r0"]["matched_by"] == rows["12-r1"]["matched_by"] == "time"

    slurm.calls.clear()
    out = status(capsys, run, slurm=slurm).out
    assert DISAGREE in out
    assert "attempt 12-r0: hpctrain preemption (requeued) · Slurm NODE_FAIL on node2" in out
    assert "job 12 (slurm): COMPLETED on node[1-2]" not in out and "COMPLETED on node2" in out
    assert len(_sacct_calls(slurm)) == 1  # one sacct call per status: Slurm's view and the job's final state


def test_causes_that_agree_with_slurm_give_no_disagreement(tmp_path):
    t0 = time.time() - 900
    run = _run(
        tmp_path,
        [
            _start(0, t0 + 5),
            _exit(0, t0 + 60, "node_failure", True),
            _start(1, t0 + 120),
            _exit(1, t0 + 200, "time_limit", True),  # hpctrain requeued it itself: REQUEUED says no cause
            _start(2, t0 + 260),
            _exit(2, t0 + 300, "preemption", True),
        ],
    )
    slurm = FakeSlurm()
    slurm.history[JOB] = [
        {"State": "NODE_FAIL", "Start": t0, "End": t0 + 61, "NodeList": "node2"},
        {"State": "REQUEUED", "Start": t0 + 110, "End": t0 + 201, "NodeList": "node3"},
        {"State": "PREEMPTED", "Start": t0 + 250, "End": t0 + 302, "NodeList": "node3"},
        {"State": "PENDING", "Start": "Unknown", "End": "Unknown", "NodeList": "None assigned"},
    ]
    r = collect(run, slurm=slurm)
    assert r["slurm_view"]["disagreements"] == []
    assert [a["slurm_state"] for a in r["slurm_view"]["attempts"]] == ["NODE_FAIL", "REQUEUED", "PREEMPTED"]
    assert r["job"]["state"] == "PENDING"  # the newest run (the fake's squeue knows nothing of the job)


def test_attempts_are_matched_by_time_not_by_restart_count(tmp_path):
    """An in-job restart (spare nodes) numbers a new attempt inside the same Slurm run: attempts 0 and 1 both ran
    in Slurm's run 0; attempt 2 ran in run 1. Matching the n-th run to restart count n would be wrong."""
    t0 = time.time() - 900
    run = _run(
        tmp_path,
        [
            _start(0, t0 + 5),
            _exit(0, t0 + 30, "node_failure", False),
            _start(1, t0 + 40, hosts=("node3",)),
            _exit(1, t0 + 60, "preemption", True),
            _start(2, t0 + 130),
            _exit(2, t0 + 200, "finished", False),
        ],
    )
    slurm = FakeSlurm()
    slurm.history[JOB] = [
        {"State": "CANCELLED by 0", "Start": t0, "End": t0 + 62, "NodeList": "node[2-3]"},
        {"State": "COMPLETED", "Start": t0 + 120, "End": t0 + 201, "NodeList": "node2"},
    ]
    rows = collect(run, slurm=slurm)["slurm_view"]["attempts"]
    assert [(r["slurm_run"], r["shared"]) for r in rows] == [(0, True), (0, False), (1, False)]
    # attempt 0's node failure is not compared with the state of a run that went on after it; attempt 1's is
    assert [r["disagrees"] for r in rows] == [
        None,
        "attempt 12-r1: hpctrain says preemption, Slurm says CANCELLED",
        None,
    ]


def test_without_usable_times_the_nth_run_is_restart_count_n():
    ledger = [_exit(0, 1.0, "preemption", True), _exit(1, 2.0, "finished", False)]
    for rec in ledger:
        rec["slurm_state"] = "RUNNING"  # what squeue said at the time: a Slurm attempt
        rec["decided_by_rank"] = None  # recorded later: not a time of the attempt
    slurm = FakeSlurm()
    slurm.history[JOB] = ["NODE_FAIL|node2", "COMPLETED|node2"]  # sacct's times Unknown
    got = [summary(a) for a in attempts_from_ledger(ledger, slurm=slurm)]
    assert [(a["slurm"]["state"], a["slurm"]["matched_by"]) for a in got] == [
        ("NODE_FAIL", "restart count"),
        ("COMPLETED", "restart count"),
    ]
    assert got[0]["slurm_disagrees"] == DISAGREE and got[1]["slurm_disagrees"] is None


@pytest.mark.parametrize(
    "why, breaks",
    [
        ("Slurm accounting storage is disabled", lambda s: setattr(s, "accounting", False)),
        ("sacct is not on PATH", lambda s: s.missing.add("sacct")),
    ],
)
def test_without_accounting_status_still_works_and_says_slurms_view_is_unavailable(tmp_path, capsys, why, breaks):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    breaks(slurm)
    res = status(capsys, run, slurm=slurm)
    assert "Slurm's view is unavailable" in res.out and why in res.out and DISAGREE not in res.out
    assert "last exit  attempt 1: finished" in res.out  # the rest of the report is there
    report = status(capsys, run, "--json", slurm=slurm).report
    assert report["slurm_view"]["available"] is False and why in report["slurm_view"]["unavailable"]
    assert report["job"]["state"] == "COMPLETED" and report["job"]["source"] == "run dir"
    assert len(_sacct_calls(slurm)) == 2  # one per status call, not a second try for the job state


def test_a_local_run_asks_sacct_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    Ledger(run).append({**_start(0, time.time()), "launcher": "torchrun", "job_id": "4242"})
    slurm = FakeSlurm()
    r = collect(run, slurm=slurm)
    assert r["slurm_view"] is None and _sacct_calls(slurm) == []


def test_the_bundles_attempts_record_slurms_state_when_asked(tmp_path):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    ledger = [json.loads(line) for line in (run / "train" / "ledger.jsonl").read_text().splitlines()]
    got = [summary(a) for a in attempts_from_ledger(ledger, slurm=slurm)]
    assert [a["slurm"]["state"] for a in got] == ["NODE_FAIL", "COMPLETED"]
    assert got[0]["slurm_disagrees"] == DISAGREE and got[0]["slurm_unavailable"] is None
    slurm.accounting = False
    got = [summary(a) for a in attempts_from_ledger(ledger, slurm=slurm)]
    assert got[0]["slurm"] is None and "accounting storage is disabled" in got[0]["slurm_unavailable"]
    assert summary(attempts_from_ledger(ledger)[0])["slurm"] is None  # not asked: no sacct call at all


# ------------------------------------------------------------------------------------------- identity (group 11)
def _identity_record(run: Path, identity: tp.Any) -> None:
    d = run / "identity"
    d.mkdir(exist_ok=True)
    rec = {
        "schema": SCHEMA,
        "kind": "attempt",
        "identity": identity,
        "attempt": {"job_id": JOB, "restart_count": 0},
        "captured_at": time.time(),
    }
    (d / f"{JOB}-r0.json").write_text(json.dumps(rec))


def test_a_healthy_identity_is_shown_short_as_everywhere_else(tmp_path, capsys):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    ident = "bef22291000c" + "0123456789abcdef" * 3 + "0123"
    assert len(ident) == 64
    _identity_record(run, ident)
    out = status(capsys, run, slurm=slurm).out
    assert "identity   bef22291000c (1 attempt(s) recorded)" in out and "characters)" not in out


def test_a_hostile_identity_still_gets_the_bound(tmp_path, capsys):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    _identity_record(run, "Z" * 5000)
    out = status(capsys, run, slurm=slurm).out
    line = next(x for x in out.splitlines() if x.startswith("identity"))
    assert "ZZZZZZZZZZZZ... (64 characters)" in line and "Z" * 13 not in line


# --------------------------------------------------------------------------------------- slowest rank (group 12)
def _slow_rank_interval(step: int) -> tp.Dict[str, tp.Any]:
    """As measured with rank 1 sleeping 20 ms in its loss: its fwd+bwd is 20 ms longer, rank 0 waits for it in
    the gradient all-reduce (21 ms exposed comm against rank 1's 0.8 ms), both steps take as long."""

    def spread(r0: float, r1: float) -> tp.Dict[str, tp.Any]:
        lo, hi = sorted((r0, r1))
        return {"min": lo, "median": (r0 + r1) / 2, "max": hi, "max_rank": 0 if r0 > r1 else 1}

    step_s = (0.0302, 0.0305)
    comm = (0.0210, 0.0008)
    parts = {
        "step_s": spread(*step_s),
        "data_wait_s": spread(0.0010, 0.0009),
        "forward_backward_s": spread(0.0060, 0.0262),
        "grad_comm_exposed_s": spread(*comm),
        "optimizer_s": spread(0.0020, 0.0021),
        "checkpoint_s": spread(0.0, 0.0),
        "busy_s": spread(step_s[0] - comm[0], step_s[1] - comm[1]),
    }
    return {
        "kind": "interval",
        "time": time.time(),
        "step": step,
        "steps": 10,
        "total_steps": 100,
        "world_size": 2,
        "job_id": JOB,
        "restart_count": 1,
        "per_step": parts,
        "slowest_rank": 1,
        "comm_measure": "ddp_last_bucket",
    }


def test_the_slowest_line_names_the_slow_ranks_own_slow_phase_as_the_straggler_rule_does(tmp_path, capsys):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    rec = _slow_rank_interval(20)
    (run / "train" / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    out = status(capsys, run, slurm=slurm).out
    (line,) = [x for x in out.splitlines() if x.startswith("slowest")]
    assert find_straggler(rec)["phase"] == "compute"  # the detector's own attribution of this interval
    assert "rank 1 · slow phase: compute" in line and "exposed comm" not in line, line
    assert "exposed comm: after DDP's last bucket" in out  # how the column was measured: with the table


def test_no_phase_is_named_when_no_rank_works_longer_than_the_others(tmp_path, capsys):
    run, slurm = _node_fail_recovered_at_once(tmp_path)
    rec = _slow_rank_interval(20)
    rec["per_step"]["busy_s"] = {"min": 0.0094, "median": 0.0095, "max": 0.0096, "max_rank": 0}
    (run / "train" / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    out = status(capsys, run, slurm=slurm).out
    (line,) = [x for x in out.splitlines() if x.startswith("slowest")]
    assert "rank 0 · no phase stands out" in line and "slow phase:" not in line, line
