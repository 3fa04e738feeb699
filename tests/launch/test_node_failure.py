"""Node failures with a fake Slurm: classification from Slurm's view, the exclusion and its bound, the spare-node
loop's bookkeeping. The real thing (a node set DOWN under a running job) is tests/cluster/test_node_failure.py."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from hpctrain._atomic import atomic_write_json
from hpctrain.launch.ending import finish_attempt
from hpctrain.launch.exclusion import exclude_hosts, is_failed_state, plan_exclusion, record_unseen_end
from hpctrain.launch.spares import SpareLoop, next_attempt, step_argv
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from hpctrain.runtime.env import from_environ
from hpctrain.testing import FakeSlurm

NODES = ["node1", "node2", "node3", "node4"]


def _slurm(**job: str) -> FakeSlurm:
    slurm = FakeSlurm()
    slurm.node_state = {n: "idle" for n in NODES}
    slurm.jobs["7"] = {"JobState": "RUNNING", "Restarts": "0", "NodeList": "node[1-2]", "NumNodes": "2",
                       "Partition": "debug", "ExcNodeList": "(null)", **job}  # fmt: skip
    return slurm


def _ranks(run_dir: Path, hosts: list, *, ended: list, restart: int = 0) -> None:
    """Join records of one attempt (rank r on hosts[r]) and end records of the ranks in ``ended``."""
    paths = RunDir(run_dir)
    for rank, host in enumerate(hosts):
        path = paths.rank_record("7", restart, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"rank": rank, "hostname": host})
        if rank in ended:
            atomic_write_json(paths.rank_end("7", restart, rank), {"rank": rank, "cause": "stopped"})


def _end(run_dir: Path, slurm: FakeSlurm, monkeypatch, *, world: int = 4, **kw):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.delenv("HPCTRAIN_SPARES_LEFT", raising=False)
    args = dict(
        run_dir=run_dir, rank=0, world_size=world, job_id="7", restart_count=0, launcher="slurm",
        stop=(signal.SIGTERM, time.time()), agreed_step=38, error=None, started=time.time() - 100,
        time_limit_s=3600.0, lead_s=120.0, max_requeues=3, slurm=slurm, peer_wait_s=0.2,
    )  # fmt: skip
    args.update(kw)
    return finish_attempt(**args)


@pytest.mark.parametrize(
    "state, failed",
    [("down*", True), ("drained", True), ("draining", True), ("idle*", True), ("fail", True), ("mixed", False),
     ("idle", False), ("allocated", False), ("completing", False)],
)  # fmt: skip
def test_failed_node_states(state, failed):
    assert is_failed_state(state) is failed


def test_a_sigterm_with_a_drained_node_and_slurms_own_requeue_is_a_node_failure_excluded(tmp_path, monkeypatch):
    slurm = _slurm(JobState="COMPLETING", Restarts="1")
    slurm.queue["7"] = ["COMPLETING"]
    slurm.node_state["node2"] = "drained"
    _ranks(tmp_path, ["node1", "node1", "node2", "node2"], ended=[0, 1, 2, 3])
    end = _end(tmp_path, slurm, monkeypatch)
    assert end.cause == "node_failure" and end.requeued
    assert slurm.requeued == []  # Slurm requeued it already: no second requeue
    assert slurm.jobs["7"]["ExcNodeList"] == "node2"
    assert end.record["failed_nodes"] == ["node2"] and end.record["excluded_nodes"] == ["node2"]
    assert "requeued by Slurm itself" in end.reason and "excluded node2" in end.reason


def test_ranks_that_died_with_their_node_name_it_when_its_state_is_back(tmp_path, monkeypatch):
    # ReturnToService=2: the node answers again at once; its ranks never recorded an end
    slurm = _slurm(JobState="COMPLETING", Restarts="1")
    slurm.queue["7"] = ["COMPLETING"]
    _ranks(tmp_path, ["node1", "node1", "node2", "node2"], ended=[0, 1])
    end = _end(tmp_path, slurm, monkeypatch)
    assert end.cause == "node_failure" and end.record["failed_nodes"] == ["node2"]


def test_scancel_stays_cancelled_and_a_requeue_without_failed_node_is_a_preemption(tmp_path, monkeypatch):
    slurm = _slurm(JobState="COMPLETING", Restarts="0")
    slurm.queue["7"] = ["COMPLETING"]
    _ranks(tmp_path, ["node1", "node2"], ended=[0, 1])
    end = _end(tmp_path, slurm, monkeypatch, world=2)
    assert (end.cause, end.requeued, slurm.jobs["7"]["ExcNodeList"]) == ("cancelled", False, "(null)")
    other = tmp_path / "other"
    slurm = _slurm(JobState="COMPLETING", Restarts="1")  # preempted without GraceTime: Slurm requeues
    slurm.queue["7"] = ["COMPLETING"]
    _ranks(other, ["node1", "node2"], ended=[0, 1])
    end = _end(other, slurm, monkeypatch, world=2)
    assert (end.cause, end.requeued, end.record["failed_nodes"]) == ("preemption", True, [])
    assert slurm.requeued == [] and slurm.jobs["7"]["ExcNodeList"] == "(null)"


def test_a_hang_excludes_the_watchdogs_suspects_after_hpctrains_own_requeue(tmp_path, monkeypatch):
    import hpctrain.launch.exclusion as exclusion

    monkeypatch.setattr(exclusion, "suspects", lambda run_dir, job, restart, cause, failed: ["node2"])
    slurm = _slurm()
    slurm.queue["7"] = ["RUNNING"] * 2
    _ranks(tmp_path, ["node1", "node2"], ended=[0, 1])
    Ledger(tmp_path).append({"event": "start", "job_id": "7", "restart_count": 0, "resumed_from_step": 0})
    from hpctrain.runtime.preemption import StopCause

    monkeypatch.setattr("hpctrain.launch.ending.classify_end", lambda **kw: StopCause.HANG)
    end = _end(tmp_path, slurm, monkeypatch, world=2, stop=None, error=RuntimeError("hung"))
    # no new commit: the policy would not requeue, so nothing is excluded
    assert end.cause == "hang" and not end.requeued and slurm.jobs["7"]["ExcNodeList"] == "(null)"
    monkeypatch.setattr(exclusion, "suspects", lambda run_dir, job, restart, cause, failed: ["node2"])
    monkeypatch.setattr("hpctrain.launch.ending.committed_progress", lambda *a: (0, 40))
    (tmp_path / "ranks" / "7-r0" / "exit.json").unlink()
    end = _end(tmp_path, slurm, monkeypatch, world=2, stop=None, error=RuntimeError("hung"))
    assert end.requeued and slurm.requeued == ["7"] and slurm.jobs["7"]["ExcNodeList"] == "node2"


def test_the_bound_keeps_enough_nodes_of_the_partition():
    plan = plan_exclusion(suspects=["node2", "node3", "node9"], already=["node1"], partition_nodes=NODES,
                          nodes_needed=2)  # fmt: skip
    # node1 already out; node2 leaves node3+node4 = 2: allowed; node3 would leave 1 < 2; node9 is not in it
    assert plan.added == ["node2", "node9"] and plan.refused == ["node3"]
    assert plan.excluded_nodes == ["node1", "node2", "node9"] and "kept node3" in plan.note


def test_exclusions_accumulate_across_attempts_and_slurms_own_list(tmp_path):
    slurm = _slurm(JobState="PENDING", ExcNodeList="node4")  # the user's own --exclude
    slurm.members["debug"] = [*NODES, "node5"]
    Ledger(tmp_path).append({"event": "exit", "excluded_nodes": ["node1"]})  # an earlier attempt's
    got = exclude_hosts(slurm, tmp_path, "7", ["node2"])
    assert got.added == ["node2"] and slurm.jobs["7"]["ExcNodeList"] == "node4,node1,node2"
    # a fourth would leave 0 of the 2 nodes the job needs
    assert exclude_hosts(slurm, tmp_path, "7", ["node3"]).refused == ["node3"]


def test_an_exclusion_slurm_refuses_is_reported_not_raised(tmp_path):
    slurm = _slurm(JobState="RUNNING")
    got = exclude_hosts(slurm, tmp_path, "7", ["node2"])
    assert got.added == [] and got.refused == ["node2"] and "no longer pending" in got.note


def test_attempt_numbers_never_collide_across_in_job_restarts_and_requeues(tmp_path):
    env = {"SLURM_RESTART_COUNT": "0"}
    assert next_attempt(tmp_path, "7", env) == 0
    RunDir(tmp_path).attempt_dir("7", 0).mkdir(parents=True)
    RunDir(tmp_path).attempt_dir("7", 1).mkdir(parents=True)  # an in-job restart
    assert next_attempt(tmp_path, "7", {"SLURM_RESTART_COUNT": "1"}) == 2  # then Slurm's requeue
    assert next_attempt(tmp_path, "7", {"SLURM_RESTART_COUNT": "5"}) == 5
    assert next_attempt(tmp_path, "8", env) == 0


def test_the_step_sees_the_attempt_number_the_loop_gave_it():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "node[1,3]",
           "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_RESTART_COUNT": "1"}  # fmt: skip
    assert from_environ(env).restart_count == 1
    assert from_environ(dict(env, HPCTRAIN_ATTEMPT="3")).restart_count == 3


def test_step_argv_sizes_the_step_to_the_training_nodes():
    argv = step_argv(["srun", "--unbuffered", "python", "-m", "x"], nodes=2, tasks_per_node=2, hosts=["n1", "n3"])
    assert argv == ["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--nodelist=n1,n3", "--unbuffered",
                    "python", "-m", "x"]  # fmt: skip


def _loop(tmp_path: Path, slurm: FakeSlurm, results: list, spares: int = 1):
    steps = []

    def run_step(argv, env):
        steps.append((argv, env))
        rc, lose = results.pop(0)
        if lose:  # what Slurm does to a --no-kill job: the failed node leaves its allocation
            slurm.jobs["7"]["NodeList"] = ",".join(n for n in slurm.jobs["7"]["NodeList"].split(",") if n != lose)
        RunDir(tmp_path).attempt_dir("7", int(env["HPCTRAIN_ATTEMPT"])).mkdir(parents=True)
        return rc

    environ = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-3]"}
    loop = SpareLoop(run_dir=tmp_path, nodes=2, tasks_per_node=2, spares=spares, srun=["srun", "cmd"],
                     slurm=slurm, environ=environ, run_step=run_step, exit_wait_s=0.2)  # fmt: skip
    return loop, steps


def test_a_node_failure_restarts_the_step_on_the_spare_with_the_next_attempt_number(tmp_path):
    slurm = _slurm(NodeList="node1,node2,node3", NumNodes="3")
    loop, steps = _loop(tmp_path, slurm, [(137, "node2"), (0, None)])
    assert loop.run() == 0
    assert [a[4] for a, _ in steps] == ["--nodelist=node1,node2", "--nodelist=node1,node3"]
    assert [e["HPCTRAIN_ATTEMPT"] for _, e in steps] == ["0", "1"]
    assert [e["HPCTRAIN_SPARES_LEFT"] for _, e in steps] == ["1", "0"]
    (exit_,) = Ledger(tmp_path).records("exit")  # the ranks died with the step: the loop recorded the end
    assert exit_["cause"] == "node_failure" and exit_["failed_nodes"] == ["node2"] and exit_["in_job_restart"]
    (restart,) = Ledger(tmp_path).records("in_job_restart")
    assert restart["failed_nodes"] == ["node2"] and restart["next_restart_count"] == 1 and restart["spares_used"] == 1
    assert slurm.requeued == []


def test_other_failures_end_the_loop_and_a_failure_without_spares_goes_back_to_the_queue(tmp_path):
    slurm = _slurm(NodeList="node1,node2,node3", NumNodes="3")
    loop, steps = _loop(tmp_path, slurm, [(1, None)])
    assert loop.run() == 1 and len(steps) == 1 and Ledger(tmp_path).records("in_job_restart") == []
    other = tmp_path / "other"
    slurm = _slurm(NodeList="node1,node2", NumNodes="2")
    loop, steps = _loop(other, slurm, [(137, "node2")], spares=0)
    assert loop.run() == 137 and slurm.requeued == ["7"]
    (exit_,) = Ledger(other).records("exit")
    assert exit_["requeued"] and exit_["excluded_nodes"] == ["node2"] and slurm.jobs["7"]["ExcNodeList"] == "node2"


def test_a_hang_the_ranks_recorded_restarts_without_the_suspect_host(tmp_path):
    slurm = _slurm(NodeList="node1,node2,node3", NumNodes="3")

    loop, steps = _loop(tmp_path, slurm, [(1, None), (0, None)])
    Ledger(tmp_path).append({"event": "exit", "job_id": "7", "restart_count": 0, "cause": "hang", "requeued": False,
                             "in_job_restart": True, "suspect_nodes": ["node1"]})  # fmt: skip
    assert loop.run() == 0
    assert steps[1][0][4] == "--nodelist=node2,node3"
    assert json.loads(json.dumps(Ledger(tmp_path).records("in_job_restart")))[0]["failed_nodes"] == ["node1"]


def test_the_next_start_records_an_attempt_whose_ranks_all_died(tmp_path):
    slurm = _slurm(Restarts="1")
    slurm.history["7"] = ["NODE_FAIL|node[1-2]", "RUNNING|node[3-4]"]
    _ranks(tmp_path, ["node1", "node2"], ended=[])  # attempt 0: joined, never ended
    RunDir(tmp_path).attempt_dir("7", 1).mkdir(parents=True)
    got = record_unseen_end(tmp_path, "7", 1, 2, slurm=slurm)
    assert got["cause"] == "node_failure" and got["restart_count"] == 0 and got["slurm_state"] == "NODE_FAIL"
    assert [r["cause"] for r in Ledger(tmp_path).records("exit")] == ["node_failure"]
    assert record_unseen_end(tmp_path, "7", 1, 2, slurm=slurm) is None  # once
    # an attempt that did record its end is left alone
    other = tmp_path / "other"
    _ranks(other, ["node1", "node2"], ended=[0, 1])
    Ledger(other).append({"event": "exit", "job_id": "7", "restart_count": 0, "cause": "preemption"})
    assert record_unseen_end(other, "7", 1, 2, slurm=slurm) is None


def test_a_requeue_leaves_out_the_hosts_the_watchdog_blames(tmp_path, monkeypatch):
    import hpctrain.runtime.watchdog as watchdog

    blamed = [{"host": "node2", "reason": "straggler", "ranks": [1]}]
    monkeypatch.setattr(watchdog, "suspect_hosts", lambda run_dir, job, restart: blamed)
    slurm = _slurm()
    slurm.queue["7"], slurm.limits["7"] = ["RUNNING"] * 2, "1:00"
    _ranks(tmp_path, ["node1", "node2"], ended=[0, 1])
    monkeypatch.setattr("hpctrain.launch.ending.committed_progress", lambda *a: (0, 40))
    end = _end(tmp_path, slurm, monkeypatch, world=2, stop=(signal.SIGUSR2, time.time()), time_limit_s=None,
               lead_s=15, started=time.time() - 40)  # fmt: skip
    assert end.cause == "time_limit" and end.requeued and slurm.requeued == ["7"]
    assert end.record["suspect_nodes"] == ["node2"] and slurm.jobs["7"]["ExcNodeList"] == "node2"


def test_the_bound_counts_only_nodes_with_the_jobs_features_and_never_excludes_a_requested_node(tmp_path):
    slurm = _slurm(JobState="PENDING", Features="steady")
    slurm.features = {"node1": ["steady"], "node2": ["steady"], "node3": ["preemptible"], "node4": ["preemptible"]}
    got = exclude_hosts(slurm, tmp_path, "7", ["node2"])  # would leave 1 steady node of the 2 the job needs
    assert got.refused == ["node2"] and slurm.jobs["7"]["ExcNodeList"] == "(null)"
    slurm = _slurm(JobState="PENDING", ReqNodeList="node[1-2]")
    got = exclude_hosts(slurm, tmp_path, "7", ["node2"])
    assert got.refused == ["node2"] and slurm.jobs["7"]["ExcNodeList"] == "(null)"
    slurm = _slurm(JobState="PENDING", Features="steady|preemptible")  # not interpreted: all four count
    assert exclude_hosts(slurm, tmp_path, "7", ["node2"]).added == ["node2"]
