"""One srun step per training node (in-job recovery): the step's argv, the wrapper that gives each task its global
rank (the SLURM_* variables of one step over every training node) and its global rank's log files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpctrain.launch.node_step import fill_pattern, node_step_argv, split_srun
from hpctrain.runtime.env import DistEnvError, from_environ, node_step_environ

SRUN = ["srun", "--kill-on-bad-exit=0", "--unbuffered", "--output", "/r/logs/%j_%t_log.out", "--error",
        "/r/logs/%j_%t_log.err", "--cpu-bind=none", "/py", "-u", "-m", "submitit.core._submit", "/r/logs"]  # fmt: skip

# what slurmstepd gives task 1 of the step of node2 (the second training node) of job 7
TASK = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_STEP_NODELIST": "node2", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node[1-3]",
        "HPCTRAIN_NODE_INDEX": "1", "HPCTRAIN_TRAINING_NODES": "node1,node2"}  # fmt: skip


def test_the_step_of_a_node_runs_the_wrapper_with_the_jobs_log_patterns_and_srun_gets_its_own():
    assert split_srun(SRUN[1:])[1][:1] == ["/py"]
    argv = node_step_argv(SRUN, python="/venv/py", index=1, host="node2", tasks_per_node=2)
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node2"]
    assert argv[argv.index("--output") + 1] == "/r/logs/%j_node1-%t_log.out"  # srun's own: never a rank's name
    i = argv.index("/venv/py")
    assert argv[i:] == ["/venv/py", "-m", "hpctrain.launch.node_step", "--output", "/r/logs/%j_%t_log.out",
                        "--error", "/r/logs/%j_%t_log.err", "--", *SRUN[8:]]  # fmt: skip
    assert "--cpu-bind=none" in argv[:i] and "--kill-on-bad-exit=0" in argv[:i]
    joined = node_step_argv(["srun", "--output=/l/%j_%t.out", "cmd"], python="p", index=0, host="n", tasks_per_node=1)
    assert joined[-7:] == ["p", "-m", "hpctrain.launch.node_step", "--output", "/l/%j_%t.out", "--", "cmd"]
    assert joined[joined.index("--output") + 1] == "/l/%j_node0-%t.out"


def test_the_offset_rule_gives_the_global_rank_and_the_whole_trainings_world():
    env = node_step_environ(TASK)
    assert "HPCTRAIN_NODE_INDEX" not in env and node_step_environ(env) == env  # applied once
    assert (env["SLURM_PROCID"], env["SLURM_NODEID"], env["SLURM_GTIDS"]) == ("3", "1", "2,3")
    dist = from_environ(TASK)  # env.py reads a task not started through the wrapper the same way
    assert (dist.rank, dist.world_size, dist.node_rank, dist.num_nodes, dist.local_rank) == (3, 4, 1, 2, 1)
    assert dist.master_addr == "node1" and dist.hostnames == ("node1", "node2")
    assert from_environ(env) == dist
    assert fill_pattern("/r/%j_%t_log.out", env) == "/r/7_3_log.out"
    with pytest.raises(DistEnvError, match="one node's step"):
        node_step_environ(dict(TASK, HPCTRAIN_NODE_INDEX="2"))
    with pytest.raises(ValueError, match="%Z"):
        fill_pattern("/r/%Z", env)


def test_the_wrapper_writes_the_global_ranks_log_and_execs_the_command_with_its_slurm_view(tmp_path):
    script = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k[:6] in ('SLURM_', 'HPCTRA')}))"
    )
    out = str(tmp_path / "logs" / "%j_%t_log.out")
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.launch.node_step", "--output", out, "--", sys.executable, "-c", script],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **TASK},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    seen = json.loads((tmp_path / "logs" / "7_3_log.out").read_text())
    assert seen["SLURM_PROCID"] == "3" and seen["SLURM_STEP_NUM_TASKS"] == "4" and "HPCTRAIN_NODE_INDEX" not in seen
    bad = subprocess.run([sys.executable, "-m", "hpctrain.launch.node_step", "--", "true"], capture_output=True,
                         text=True, env={**os.environ, **TASK, "HPCTRAIN_NODE_INDEX": "x"}, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "HPCTRAIN_NODE_INDEX" in bad.stderr
