"""``status`` shows node failures, the hosts a job excludes, in-job restarts on spare nodes and in-job recoveries
by warm spares, from the ledger."""

from __future__ import annotations

import json
import time

from hpctrain.ledger import Ledger
from hpctrain.status.report import collect
from hpctrain.status.view import render


def test_status_names_failed_and_excluded_hosts_and_the_spare_restart(tmp_path, capsys):
    now = time.time()
    ledger = Ledger(tmp_path)
    ledger.append({"event": "start", "time": now - 100, "job_id": "9", "restart_count": 0, "hosts": ["n1", "n2"]})
    ledger.append(
        {
            "event": "exit",
            "time": now - 90,
            "job_id": "9",
            "restart_count": 0,
            "cause": "node_failure",
            "requeued": False,
            "in_job_restart": True,
            "failed_nodes": ["n2"],
            "suspect_nodes": ["n2"],
        }
    )
    ledger.append(
        {
            "event": "in_job_restart",
            "time": now - 89,
            "job_id": "9",
            "restart_count": 0,
            "next_restart_count": 1,
            "failed_at": now - 90,
            "failed_nodes": ["n2"],
            "excluded_nodes": ["n2"],
            "spares_used": 1,
            "spares": 1,
        }
    )
    ledger.append({"event": "start", "time": now - 80, "job_id": "9", "restart_count": 1, "hosts": ["n1", "n3"]})
    ledger.append({"event": "exit", "time": now - 50, "job_id": "9", "restart_count": 1, "cause": "node_failure",
                   "requeued": True, "failed_nodes": ["n3"], "excluded_nodes": ["n3"], "newly_excluded": ["n3"],
                   "not_excluded": ["n1"]})  # fmt: skip
    report = collect(tmp_path)
    assert [f["failed_nodes"] for f in report["node_failures"]] == [["n2"], ["n3"]]
    assert report["excluded_nodes"] == ["n3"]
    (restart,) = report["in_job_restarts"]
    assert restart["next_restart_count"] == 1 and abs(restart["failure_to_start_s"] - 10) < 1e-6
    json.dumps(report)
    from rich.console import Console

    render(report, Console(width=200, highlight=False))
    out = capsys.readouterr().out
    assert "node_failure on n2 · restarted inside the allocation" in out
    assert "node_failure on n3 · requeued (kept n1: bound)" in out
    assert "attempt 0 -> 1 without n2 (spare 1 of 1) · next attempt started 10.0s after the failure" in out
    assert "excluded   n3" in out


def test_status_names_the_rank_a_warm_spare_replaced_in_the_job_and_a_fallback(tmp_path, capsys):
    now = time.time()
    ledger = Ledger(tmp_path)
    ledger.append({"event": "start", "time": now - 100, "job_id": "9", "restart_count": 0, "hosts": ["n1", "n2"]})
    ledger.append(
        {
            "event": "in_job_recovery",
            "time": now - 60,
            "job_id": "9",
            "restart_count": 0,
            "generation": 1,
            "failed_ranks": [3],
            "agreed_step": 29,
            "steps_redone": 1,
            "replaced": [{"rank": 3, "was": "r3", "by": "s0", "spare": 0}],
            "failure_to_first_step_s": 1.57,
            "fallback": None,
        }
    )
    ledger.append({"event": "in_job_recovery", "time": now - 30, "job_id": "9", "restart_count": 0, "generation": 2,
                   "failed_ranks": [1], "replaced": "garbage", "failure_to_first_step_s": "x",
                   "fallback": "no warm spare left for rank(s) [1] (1 configured, 1 used)"})  # fmt: skip
    report = collect(tmp_path)
    first, second = report["in_job_recoveries"]
    assert first["replaced"] == [{"rank": 3, "spare": 0}] and first["failure_to_first_step_s"] == 1.57
    assert second["replaced"] == [] and second["failure_to_first_step_s"] is None  # damage: unknown, not a crash
    assert any("failure_to_first_step_s" in p and "unknown" in p for p in report["problems"]), report["problems"]
    json.dumps(report)
    from rich.console import Console

    render(report, Console(width=220, highlight=False))
    out = capsys.readouterr().out
    assert "recovered  attempt 0, generation 1: rank 3 by spare 0 in the job · continued after step 29, 1 step" in out
    assert "first step 1.6s after the failure" in out
    assert "recovery   attempt 0: rank(s) 1 lost, in-job recovery fell back: no warm spare left for rank(s) [1]" in out


def test_status_names_the_smaller_world_a_run_went_on_at(tmp_path, capsys):
    now = time.time()
    ledger = Ledger(tmp_path)
    ledger.append({"event": "start", "time": now - 100, "job_id": "9", "restart_count": 0, "hosts": ["n1", "n2"]})
    elastic = {"world_size_was": 4, "world_size": 3, "dropped": [2], "ranks": {"0": 0, "1": 1, "3": 2}}
    ledger.append({"event": "in_job_recovery", "time": now - 60, "job_id": "9", "restart_count": 0, "generation": 1,
                   "failed_ranks": [2], "agreed_step": 29, "steps_redone": 1, "replaced": [], "elastic": elastic,
                   "failure_to_first_step_s": 1.31, "fallback": None})  # fmt: skip
    ledger.append({"event": "in_job_recovery", "time": now - 30, "job_id": "9", "restart_count": 0, "generation": 2,
                   "failed_ranks": [0], "replaced": [], "elastic": {"world_size": "3"}, "fallback": None})  # fmt: skip
    report = collect(tmp_path)
    first, second = report["in_job_recoveries"]
    assert first["elastic"] == {"world_size_was": 4, "world_size": 3, "dropped": [2]}
    assert second["elastic"] is None  # damaged: the line says no more than the failed ranks
    json.dumps(report)
    from rich.console import Console

    render(report, Console(width=260, highlight=False))
    out = capsys.readouterr().out
    assert (
        "recovered  attempt 0, generation 1: rank(s) 2 dropped (no spare left), the run went on at a smaller world "
        "of 3 (was 4; the next attempt is full size) in the job · continued after step 29, 1 step redone · first "
        "step 1.3s after the failure"
    ) in out
    assert "recovered  attempt 0, generation 2: 0 in the job" in out


def test_status_names_a_failed_node_whose_step_ended_while_the_others_recovered_in_the_job(tmp_path, capsys):
    """In-job recovery runs one step per node: the loop's ``node_lost`` record names the node, status its ranks."""
    now = time.time()
    ledger = Ledger(tmp_path)
    ledger.append({"event": "start", "time": now - 100, "job_id": "9", "restart_count": 0, "hosts": ["n1", "n2"]})
    ledger.append({"event": "node_lost", "time": now - 61, "job_id": "9", "restart_count": 0, "node": "n2",
                   "node_index": 1, "exit_code": 0, "tasks": 2, "ranks": [2, 3]})  # fmt: skip
    ledger.append({"event": "in_job_recovery", "time": now - 60, "job_id": "9", "restart_count": 0, "generation": 1,
                   "failed_ranks": [2, 3], "agreed_step": 24, "steps_redone": 1, "fallback": None,
                   "replaced": [{"rank": 2, "by": "s0", "spare": 0}, {"rank": 3, "by": "s1", "spare": 1}],
                   "failure_to_first_step_s": 2.29})  # fmt: skip
    report = collect(tmp_path)
    (lost,) = report["nodes_lost"]
    assert lost["node"] == "n2" and lost["ranks"] == [2, 3]
    from rich.console import Console

    render(report, Console(width=200, highlight=False))
    out = capsys.readouterr().out
    assert "node lost  attempt 0: n2 failed, its step (rank(s) 2,3) ended · the other nodes' ranks went on" in out
    assert "rank 2 by spare 0, rank 3 by spare 1 in the job" in out
