import socket

import pytest

from hpctrain.runtime.env import DistEnvError, expand_hostlist, expand_tasks_per_node, from_environ
from hpctrain.runtime.ports import derive_port, free_port


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[08-10,15],login1", ["gpu08", "gpu09", "gpu10", "gpu15", "login1"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[3],c", ["a", "b3", "c"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_expand_hostlist_rejects_garbage():
    with pytest.raises(DistEnvError, match="unbalanced"):
        expand_hostlist("node[1-2")
    with pytest.raises(DistEnvError, match="cannot parse range"):
        expand_hostlist("node[a-b]")


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(DistEnvError):
        expand_tasks_per_node("2(y3)")


def slurm_env(**over):
    env = {
        "SLURM_JOB_ID": "1234",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_ranks_and_rendezvous():
    e = from_environ(slurm_env())
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank, e.num_nodes) == (3, 1, 4, 2, 1, 2)
    assert e.master_addr == "gpu07" and e.hostnames == ("gpu07", "gpu08")
    assert e.master_port == derive_port("1234") and e.launcher == "slurm" and e.restart_count == 0


def test_slurm_ignores_inherited_master_addr_but_honours_hpctrain_override():
    e = from_environ(slurm_env(MASTER_ADDR="localhost", MASTER_PORT="1"))
    assert (e.master_addr, e.master_port) == ("gpu07", derive_port("1234"))
    e = from_environ(slurm_env(HPCTRAIN_MASTER_ADDR="10.0.0.5", HPCTRAIN_MASTER_PORT="29500"))
    assert (e.master_addr, e.master_port) == ("10.0.0.5", 29500)


def test_restart_count_changes_port():
    first = from_environ(slurm_env())
    again = from_environ(slurm_env(SLURM_RESTART_COUNT="1"))
    assert again.restart_count == 1 and again.master_port != first.master_port


def test_ports_distinct_for_consecutive_jobs_and_below_the_ephemeral_range():
    ports = {derive_port(str(j), r) for j in range(1000, 7000) for r in (0, 1)}
    # 6000 consecutive jobs, two ports each; none in Linux's default ephemeral range (32768-60999), where any
    # outgoing connection on the node may hold it when the master binds (CI: a local job's 36738, EADDRINUSE)
    assert len(ports) == 12000 and all(20000 <= p < 32768 for p in ports)
    assert len({derive_port(str(j)) for j in range(1000, 7001)}) == 6000  # the 6001st wraps


def test_free_port_is_bindable_and_apart_from_every_derived_port():
    derived = {derive_port(str(j), r) for j in range(6000) for r in (0, 1)}
    picks = {free_port() for _ in range(20)}
    assert all(10000 <= p < 20000 for p in picks) and not picks & derived
    with socket.socket() as s:
        s.bind(("127.0.0.1", picks.pop()))  # free a moment ago: only another free_port() caller could take it


@pytest.mark.parametrize(
    "over, message",
    [
        ({"SLURM_STEP_ID": None, "SLURM_NTASKS": "4"}, "batch shell"),
        ({"SLURM_PROCID": "x"}, "not an integer"),
        ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
        ({"SLURM_PROCID": "4"}, "outside the step's 4 tasks"),
        ({"WORLD_SIZE": "8"}, "WORLD_SIZE=8 is set but Slurm started this task with WORLD_SIZE=4"),
        ({"RANK": "0"}, "RANK=0 is set but Slurm started this task with RANK=3"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, "do not add up"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "node list"),
        ({"SLURM_LOCALID": "2"}, "node 1 runs 2 tasks"),
        ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None}, "NODELIST is not set"),
    ],
)
def test_inconsistent_slurm_environment_is_a_clear_error(over, message):
    with pytest.raises(DistEnvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_environ(slurm_env(**over))


def test_submitit_local_and_torchrun_and_single():
    e = from_environ(
        {
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_NTASKS": "3",
            "SUBMITIT_LOCAL_LOCALID": "1",
            "SUBMITIT_LOCAL_JOB_ID": "777",
        }
    )
    assert (e.rank, e.world_size, e.master_addr, e.master_port, e.launcher) == (
        1,
        3,
        "127.0.0.1",
        derive_port("777"),
        "submitit-local",
    )
    e = from_environ(
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "h",
            "MASTER_PORT": "29400",
        }
    )
    assert (e.rank, e.world_size, e.num_nodes, e.master_port, e.launcher) == (2, 4, 2, 29400, "torchrun")
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    e = from_environ({})
    assert (e.rank, e.world_size, e.launcher) == (0, 1, "single")


@pytest.mark.parametrize("value, expected", [("8", 8), ("0", None), ("", None), ("x", None), (None, None)])
def test_slurm_cpus_per_task(value, expected):
    assert from_environ(slurm_env(SLURM_CPUS_PER_TASK=value)).cpus_per_task == expected


def test_cpu_threads_divide_the_node_among_its_ranks_unless_told():
    from hpctrain.runtime.process_group import cpu_threads

    env = from_environ(slurm_env())  # 2 tasks on this node, no --cpus-per-task
    assert cpu_threads(env, {}, usable_cpus=16) == 8
    assert cpu_threads(env, {}, usable_cpus=1) == 1  # never 0
    with_cpt = from_environ(slurm_env(SLURM_CPUS_PER_TASK="6"))
    assert cpu_threads(with_cpt, {}, usable_cpus=16) == 6  # Slurm's --cpus-per-task wins over the division
    assert cpu_threads(with_cpt, {"OMP_NUM_THREADS": "3"}, usable_cpus=16) is None  # the user's setting stays
