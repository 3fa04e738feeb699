"""A failed node recovered inside the job on the dev cluster: the training runs as one srun step per node
(hpctrain.launch.node_step), so ``devcluster fail-node`` ends only the failed node's step; the ranks on the other
node keep their processes and recover in the job (docs/preemption.md, "A failed node").

2 nodes x 2 tasks, tests/cluster/preempt_entry.py with ``TrainConfig.recovery`` on, 0.1 s a step, a checkpoint
every 20 steps; the failed node is the host of ranks 2 and 3 (never the batch host, the allocation's first node:
losing it is the queue path's case). Each test compares the final checkpoint with an uninterrupted run of the same
world size. Figures (failure -> the first new step, from the ``in_job_recovery`` record and from the moment
``fail-node`` ran; the machine's 1-minute load then) are printed and appended to $HPCTRAIN_FIGURES when set;
docs/preemption.md quotes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as tp

import pytest

from tests.cluster.figures import recovery_figure
from tests.cluster.nodes import failed_node, rank_host
from tests.cluster.preempt_entry import write_data
from tests.cluster.test_node_failure import _figure as _restart_figure
from tests.cluster.test_node_failure import _submit
from tests.cluster.test_preemption import STEPS, _calls, _exits, _ledger, _restarts, _starts, _wait
from tests.cluster.test_slurm_ddp import ENV, ROOT, model_digest, wait_final

pytestmark = [pytest.mark.slurm]

FAIL_AFTER = 25  # calls of rank 0 before the node fails: past the commit at step 20


def _records(run_dir: tp.Any, event: str) -> tp.List[tp.Dict[str, tp.Any]]:
    return [r for r in _ledger(run_dir) if r["event"] == event]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("injobnode")
    write_data(root / "data.h5", 256)
    common = ["--data", str(root / "data.h5"), "--batch", "16", "--steps", str(STEPS), "--ckpt-every", "20"]
    ref = root / "ref"
    job = _submit(ref, args=common)  # the uninterrupted run of the same world size, recovery off
    yield root, common, (job, ref)
    subprocess.run(["scancel", job], capture_output=True)


def _reference(data: tp.Any) -> tp.Dict[str, str]:
    job, ref = data[2]
    assert wait_final(job, timeout=180) == "COMPLETED"
    return model_digest(ref, STEPS)


def _fail_second_node(run_dir: tp.Any, job: str, until: tp.Callable[[], tp.Any]) -> tp.Tuple[str, float, tp.Any, float]:
    """Fail the host of rank 3 once rank 0 has run FAIL_AFTER calls; ``(host, failed_at, until's result, load)``.
    The node is resumed when ``until`` holds (or on an error): a real failed node stays out, and the job's
    allocation has lost it already."""
    _wait(f"{FAIL_AFTER} steps", lambda: len(_calls(run_dir, 0)) >= FAIL_AFTER, timeout=150)
    host = rank_host(run_dir, job, 0, 3)
    assert host != rank_host(run_dir, job, 0, 0)  # never the batch host (rank 0's node, the allocation's first)
    with failed_node(host) as failed_at:
        got = _wait("the recovery", until, timeout=90)
        load = os.getloadavg()[0]  # the machine's load at the recovery (2 shared cores: the figure depends on it)
    return host, failed_at, got, load


def _figure(name: str, record: tp.Mapping[str, tp.Any], failed_at: float, load: float, **extra: tp.Any) -> None:
    recovery_figure(
        name, record, load, fail_node_to_first_step_s=round(record["first_step_at"] - failed_at, 2), **extra
    )


def _complete(record: tp.Mapping[str, tp.Any]) -> bool:
    return record.get("first_step_at") is not None or record.get("fallback") is not None


def test_a_failed_node_is_replaced_by_two_warm_spares_inside_the_job(data):
    root, common, _ = data
    run_dir = root / "warm"
    job = _submit(run_dir, "--spare-nodes", "1", "--warm-spares", args=[*common, "--sleep", "0.1", "--recovery"])
    try:
        host, failed_at, _, load = _fail_second_node(
            run_dir, job, lambda: [r for r in _records(run_dir, "in_job_recovery") if _complete(r)]
        )
        assert wait_final(job, timeout=150) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    (record,) = _records(run_dir, "in_job_recovery")
    assert sorted(record["failed_ranks"]) == [2, 3] and record["fallback"] is None, record
    assert sorted(r["rank"] for r in record["replaced"]) == [2, 3]
    assert sorted(r["by"] for r in record["replaced"]) == ["s0", "s1"]
    assert record["steps_redone"] <= 1  # at most the step the failure interrupted
    # the same job and attempt: no requeue, no restarted step, no restart from the last commit
    assert _restarts(job) == 0 and _records(run_dir, "in_job_restart") == []
    assert [s["restart_count"] for s in _starts(run_dir)] == [0]
    assert [(e["restart_count"], e["cause"]) for e in _exits(run_dir)] == [(0, "finished")]
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert f"NodeList={host}" not in out  # Slurm dropped the failed node from the --no-kill allocation
    assert model_digest(run_dir, STEPS) == _reference(data)
    # every rank's log under its global rank's name (rank 2 and 3's: the processes the failed node took)
    logs = sorted(p.name for p in (run_dir / "logs").glob(f"{job}_*_log.out"))
    assert [f"{job}_{r}_log.out" for r in range(4)] == [n for n in logs if n.split("_")[1].isdigit()]
    (lost,) = _records(run_dir, "node_lost")  # the loop's record: the node, not only its ranks
    assert lost["node"] == host and lost["node_index"] == 1 and lost["restart_count"] == 0
    shown = subprocess.run(
        [sys.executable, "-m", "hpctrain", "status", str(run_dir)],
        cwd=ROOT, env={**ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"{host} failed, its step (rank(s) 2,3) ended" in shown.stdout, shown.stdout
    assert "rank 2 by spare" in shown.stdout and "rank 3 by spare" in shown.stdout, shown.stdout
    got = subprocess.run(
        [sys.executable, "-m", "hpctrain", "logs", "--all", "--json", str(run_dir)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    ranks = {r["rank"]: r for r in json.loads(got.stdout)["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[2]["host"] == ranks[3]["host"] == host, got.stdout[:2000]
    # submitit's view is the global one too (node_step_environ): its JobEnvironment line names the global rank
    text = (run_dir / "logs" / f"{job}_2_log.out").read_text()
    assert "global_rank=2(4)" in text and "node=1(" in text, text[:1000]
    _figure("node failure, warm spares", record, failed_at, load)


def test_without_a_spare_the_survivors_of_a_failed_node_go_on_at_a_smaller_world(data):
    root, common, _ = data
    run_dir = root / "shrink"
    args = [*common, "--sleep", "0.1", "--recovery", "--shrink"]
    job = _submit(run_dir, "--in-job-recovery", args=args)
    try:
        _, failed_at, _, load = _fail_second_node(
            run_dir, job, lambda: [r for r in _records(run_dir, "in_job_recovery") if _complete(r)]
        )
        assert wait_final(job, timeout=150) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    (record,) = _records(run_dir, "in_job_recovery")
    assert sorted(record["failed_ranks"]) == [2, 3] and record["fallback"] is None, record
    assert record["elastic"] and record["world_size"] == 2 and record["replaced"] == []
    assert record["steps_redone"] <= 1
    assert _restarts(job) == 0 and _records(run_dir, "in_job_restart") == []
    assert [(e["restart_count"], e["cause"]) for e in _exits(run_dir)] == [(0, "finished")]
    assert model_digest(run_dir, STEPS)  # the smaller world committed the last step (not bit-equal: the docs)
    _figure("node failure, smaller world", record, failed_at, load)


def test_a_second_failure_during_the_recovery_falls_back_to_a_restart_from_the_last_commit(data, capfd):
    """Both warm spares SIGKILL themselves as they take the failed node's ranks: the survivors fall back (one line
    naming why), and the spare-node loop restarts the training on the healthy nodes from the last commit."""
    root, common, _ = data
    run_dir = root / "second"
    # the dead spares are found when the new group's rendezvous times out: collective_timeout_s bounds it (60 s by
    # default; 10 s here keeps the test short)
    args = [*common, "--sleep", "0.1", "--recovery", "--spare-dies-taking", "--collective-timeout", "10"]
    job = _submit(run_dir, "--spare-nodes", "1", "--warm-spares", args=args)
    try:
        host, failed_at, _, _ = _fail_second_node(run_dir, job, lambda: _records(run_dir, "in_job_restart"))
        assert wait_final(job, timeout=150) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    (record,) = _records(run_dir, "in_job_recovery")
    assert record["fallback"] and "second failure" in record["fallback"], record
    (restart,) = _records(run_dir, "in_job_restart")
    assert host in restart["failed_nodes"] and restart["next_restart_count"] == 1
    assert _restarts(job) == 0  # restarted inside the allocation, never requeued
    second = [s for s in _starts(run_dir) if s["restart_count"] == 1][0]
    assert host not in second["hosts"] and second["resumed_from_step"] >= 20
    assert _exits(run_dir)[-1]["cause"] == "finished"
    lines = [ln for p in (run_dir / "logs").glob(f"{job}_*_log.err") for ln in p.read_text().splitlines()]
    assert any("in-job recovery" in ln and "second failure" in ln for ln in lines)
    assert model_digest(run_dir, STEPS) == _reference(data)  # bit-exact from the last commit: no committed step lost
    _restart_figure(run_dir, "second failure: restart from the last commit", failed_at, 1)
