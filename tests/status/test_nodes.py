"""``status`` shows node failures, the hosts a job excludes and in-job restarts on spare nodes, from the ledger."""

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
