"""``--warm-spares``: the spare-node loop serves in-job recovery's store, runs the warm spares beside the training
step, releases them after it, and takes a step whose replaced task died but whose run finished as a success."""

from __future__ import annotations

import sys
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain.launch.spares import SpareLoop, step_argv
from hpctrain.launch.warm_spares import WarmSpares
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from hpctrain.testing import FakeSlurm

ENV = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-3]"}


class _Spares:
    made: tp.List["_Spares"] = []

    def __init__(self, *, hosts, tasks_per_node, world_size):
        self.hosts, self.tasks_per_node, self.world_size, self.ended = hosts, tasks_per_node, world_size, False
        _Spares.made.append(self)

    def start(self, srun, env, argv_of):
        self.argv = argv_of(srun, nodes=len(self.hosts), tasks_per_node=self.tasks_per_node, hosts=self.hosts)
        return dict(env, HPCTRAIN_RECOVERY_STORE="node1:4242", HPCTRAIN_RECOVERY_SPARES="2")

    def end(self):
        self.ended = True


def _loop(
    run_dir: Path, rcs: tp.List[int], *, finished: bool, spares: int = 1, **mode: bool
) -> tp.Tuple[SpareLoop, tp.List[tp.Any]]:
    slurm = FakeSlurm()
    nodes = "node[1-3]" if spares else "node[1-2]"
    slurm.jobs["7"] = {"JobState": "RUNNING", "Restarts": "0", "NodeList": nodes, "NumNodes": str(2 + spares)}
    steps: tp.List[tp.Any] = []

    lock = threading.Lock()  # one step per node: the loop runs them side by side

    def run_step(argv, env):
        with lock:
            steps.append((argv, env))
            n = len(steps)
        if finished and n == 1:  # the deciding rank's record of a run that completed
            Ledger(run_dir).append({"event": "exit", "job_id": "7", "restart_count": 0, "cause": "finished"})
        return rcs[n - 1]

    loop = SpareLoop(run_dir=run_dir, nodes=2, tasks_per_node=2, spares=spares, srun=["srun", "cmd"], slurm=slurm,
                     environ=dict(ENV, SLURM_JOB_NODELIST=nodes), run_step=run_step, exit_wait_s=0.2,
                     make_spares=_Spares, **(mode or {"warm_spares": True}))  # fmt: skip
    return loop, steps


def _by_node(steps: tp.List[tp.Any]) -> tp.List[tp.Any]:
    return sorted(steps, key=lambda s: s[1]["HPCTRAIN_NODE_INDEX"])


def test_the_training_runs_as_one_step_per_node_kept_past_a_dead_task_and_a_finished_run_is_a_success(tmp_path):
    _Spares.made.clear()
    loop, steps = _loop(tmp_path, [0, 137], finished=True)
    assert loop.run() == 0  # rank 3's task was SIGKILLed (its srun exits 137) but the run finished in the job
    (a, env_a), (b, env_b) = _by_node(steps)
    # one step per training node (a failed node takes only its own), each told its index and the training nodes
    assert a[:6] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node1",
                     "--kill-on-bad-exit=0"]  # fmt: skip
    assert b[:5] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node2"]
    assert a[-5:] == [sys.executable, "-m", "hpctrain.launch.node_step", "--", "cmd"]
    assert (env_a["HPCTRAIN_NODE_INDEX"], env_b["HPCTRAIN_NODE_INDEX"]) == ("0", "1")
    assert env_a["HPCTRAIN_TRAINING_NODES"] == env_b["HPCTRAIN_TRAINING_NODES"] == "node1,node2"
    assert env_a["HPCTRAIN_RECOVERY_STORE"] == env_b["HPCTRAIN_RECOVERY_STORE"] == "node1:4242"
    (spares,) = _Spares.made
    assert spares.hosts == ["node3"] and spares.world_size == 4 and spares.ended
    assert spares.argv[:5] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node3"]


def test_in_job_recovery_without_spare_nodes_serves_the_store_and_keeps_the_step_past_a_dead_task(tmp_path):
    """``--in-job-recovery``: no spare node, no spare step; the survivors may go on at a smaller world."""
    _Spares.made.clear()
    loop, steps = _loop(tmp_path, [137, 0], finished=True, spares=0, in_job_recovery=True)
    assert loop.run() == 0
    for argv, env in _by_node(steps):
        assert argv[5] == "--kill-on-bad-exit=0" and env["HPCTRAIN_RECOVERY_STORE"] == "node1:4242"
    (spares,) = _Spares.made
    assert spares.hosts == [] and spares.world_size == 4 and spares.ended


def test_without_in_job_recovery_the_step_is_plain(tmp_path):
    _Spares.made.clear()
    loop, steps = _loop(tmp_path, [0], finished=False, spares=0, in_job_recovery=False)
    assert loop.run() == 0
    ((argv, env),) = steps
    assert "--kill-on-bad-exit=0" not in argv and "HPCTRAIN_RECOVERY_STORE" not in env and not _Spares.made


def test_a_store_without_spares_starts_no_spare_step(tmp_path, capfd):
    warm = WarmSpares(hosts=[], tasks_per_node=2, world_size=4)
    env = warm.start(["false-srun-never-run"], {}, step_argv)
    assert env["HPCTRAIN_RECOVERY_SPARES"] == "0" and env["HPCTRAIN_RECOVERY_STORE"].endswith(f":{warm.store.port}")
    assert warm.proc is None and warm.end() is None
    assert "no warm spares; recovery store" in capfd.readouterr().err


def test_a_failed_run_is_still_a_failure(tmp_path):
    loop, steps = _loop(tmp_path, [0, 1], finished=False)
    assert loop.run() == 1 and len(steps) == 2  # the loop waited for both nodes' steps


SPARE = """
import datetime, json, os, sys
import torch.distributed as dist
host, port = "127.0.0.1", os.environ["HPCTRAIN_RECOVERY_STORE"].rsplit(":", 1)[1]
store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=30))
key = "hpctrain/recovery/spare/0/assign"
store.wait([key])
print(os.environ["HPCTRAIN_RECOVERY_SPARE"], os.environ["HPCTRAIN_RECOVERY_WORLD"], sys.argv[1:],
      json.loads(store.get(key)), flush=True)
"""


def test_the_store_is_served_and_a_spare_standing_by_is_released_when_the_step_ends(tmp_path, capfd):
    script = tmp_path / "fake_srun.py"
    script.write_text(f"#!{sys.executable}\n{SPARE}")  # an "srun" that takes the step's options as arguments
    script.chmod(0o755)
    warm = WarmSpares(hosts=["node3"], tasks_per_node=1, world_size=4, wait_s=60)
    env = warm.start([str(script), "--output", "d/%j_%t_log.out"], {}, step_argv)
    assert env["HPCTRAIN_RECOVERY_SPARES"] == "1" and env["HPCTRAIN_RECOVERY_STORE"].endswith(f":{warm.store.port}")
    assert warm.end() == 0  # released: it read the finish key and exited
    out = capfd.readouterr().out
    assert out.startswith("task 4 ") and "'d/%j_spare%t_log.out'" in out and "{'finish': True}" in out, out


@pytest.mark.parametrize("took_rank_0", [False, True])
def test_the_runner_gives_a_warm_spare_a_context_without_a_group_and_no_result(tmp_path, took_rank_0):
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HPCTRAIN_RECOVERY_SPARE="task", SLURM_PROCID="1", HPCTRAIN_RECOVERY_WORLD="4",
               PYTHONPATH=str(root))  # fmt: skip
    for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.launch", "--entry", "tests.entries:spare_probe", "--run-dir", str(tmp_path),
         "--", *(["take-rank-0"] if took_rank_0 else [])],
        env=env, cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "spare.json").read_text()) == {
        "rank": -1,
        "world_size": 4,
        "group": False,
        "stop": True,
    }
    assert "hpctrain: warm spare 1 on " in proc.stdout and "for a world of 4" in proc.stdout
    assert not list(tmp_path.glob("ranks/*/rank-*.json"))  # no rank record of its own (its index is a rank's)
    exits = Ledger(tmp_path).records("exit")
    if took_rank_0:  # it trained as rank 0 to the end: it records the attempt's end, as rank 0 would
        assert [(e["cause"], e["decided_by_rank"]) for e in exits] == [("finished", 0)], exits
    else:
        assert exits == []


def _node_loop(tmp_path: Path, survivors_rc: int, finished: bool) -> tp.Tuple[SpareLoop, FakeSlurm, tp.List[tp.Any]]:
    """Attempt 0: node2 fails (Slurm drops it from the job's NodeList, its srun exits 0 at once, as measured);
    node1's step runs on and ends ``survivors_rc`` (``finished``: the deciding rank recorded the run finished)."""
    slurm = FakeSlurm()
    slurm.jobs["7"] = {"JobState": "RUNNING", "Restarts": "0", "NodeList": "node[1-3]", "NumNodes": "3"}
    steps: tp.List[tp.Any] = []
    lock = threading.Lock()

    def run_step(argv, env):
        with lock:
            steps.append((argv, env))
        RunDir(tmp_path).attempt_dir("7", int(env["HPCTRAIN_ATTEMPT"])).mkdir(parents=True, exist_ok=True)
        if env.get("HPCTRAIN_ATTEMPT") != "0":
            Ledger(tmp_path).append({"event": "exit", "job_id": "7", "restart_count": 1, "cause": "finished"})
            return 0
        if env["HPCTRAIN_NODE_INDEX"] == "1":
            slurm.jobs["7"]["NodeList"] = "node[1,3]"
            return 0
        deadline = time.monotonic() + 60  # the survivors recover in the job meanwhile: node1's step waits for it
        while not Ledger(tmp_path).records("node_lost") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r["node"] for r in Ledger(tmp_path).records("node_lost")] == ["node2"]  # before node1's ended
        if finished:
            Ledger(tmp_path).append({"event": "exit", "job_id": "7", "restart_count": 0, "cause": "finished"})
        return survivors_rc

    loop = SpareLoop(run_dir=tmp_path, nodes=2, tasks_per_node=2, spares=1, srun=["srun", "cmd"], slurm=slurm,
                     environ=dict(ENV), run_step=run_step, exit_wait_s=0.2, make_spares=_Spares,
                     warm_spares=True)  # fmt: skip
    return loop, slurm, steps


def test_a_failed_nodes_step_ending_early_leaves_the_other_nodes_step_running_to_the_end(tmp_path):
    _Spares.made.clear()
    loop, _, steps = _node_loop(tmp_path, 0, finished=True)
    assert loop.run() == 0 and len(steps) == 2  # one attempt: no restart while the in-job recovery succeeded
    (lost,) = Ledger(tmp_path).records("node_lost")
    assert (lost["node"], lost["node_index"], lost["restart_count"], lost["tasks"]) == ("node2", 1, 0, 2)
    assert lost["ranks"] == [2, 3]  # runtime.env.node_ranks: the offset rule's one owner
    assert Ledger(tmp_path).records("in_job_restart") == []


def test_when_the_in_job_recovery_falls_back_the_loop_restarts_without_the_failed_node(tmp_path):
    _Spares.made.clear()
    loop, _, steps = _node_loop(tmp_path, 1, finished=False)  # the survivors printed the fallback line, exited 1
    assert loop.run() == 0
    (restart,) = Ledger(tmp_path).records("in_job_restart")
    assert restart["failed_nodes"] == ["node2"] and restart["next_restart_count"] == 1
    again = sorted((a for a in steps if a[1]["HPCTRAIN_ATTEMPT"] == "1"), key=lambda s: s[1]["HPCTRAIN_NODE_INDEX"])
    # the warm spare node is a training node now; no spare node is left, so no spare step, the store only
    assert [a[0][4] for a in again] == ["--nodelist=node1", "--nodelist=node3"]
    assert again[0][1]["HPCTRAIN_TRAINING_NODES"] == "node1,node3" and _Spares.made[-1].hosts == []
