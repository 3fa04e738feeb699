"""Who am I in the job? Ranks, node, rendezvous address and port, derived from the launcher's environment.

Pure functions of an environment mapping (no torch import), so the logic is unit-tested without a
cluster and the login node can use it too. Launchers understood, in this order:

- **Slurm** (``srun`` directly, or submitit's Slurm executor which runs under ``srun``):
  ``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NODEID`` and the *step's* task and node counts;
  the rendezvous host is the first host of the step's node list.
- **submitit's local executor** (``SUBMITIT_EXECUTOR=local``): ``SUBMITIT_LOCAL_*``, one node.
- **torchrun** / anything exporting ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
- nothing: a single process (rank 0 of 1).

``HPCTRAIN_MASTER_ADDR`` / ``HPCTRAIN_MASTER_PORT`` override the derived rendezvous. Plain
``MASTER_ADDR``/``MASTER_PORT`` are *not* trusted under Slurm: sbatch exports the submitting shell's
environment, and a stale ``MASTER_ADDR=localhost`` from a login shell would split the job.
"""

from __future__ import annotations

import os
import re
import typing as tp
from dataclasses import dataclass

from hpctrain.errors import HpctrainError
from hpctrain.runtime.ports import derive_port

__all__ = [
    "DistEnv",
    "DistEnvError",
    "from_environ",
    "expand_hostlist",
    "expand_tasks_per_node",
    "slurm_job_id",
    "NODE_INDEX_ENV",
    "TRAINING_NODES_ENV",
    "node_step_environ",
    "node_ranks",
]


class DistEnvError(HpctrainError):
    """The launcher's environment is missing or contradicts itself; starting would hang or mis-rank."""


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    """Global rank, 0 .. world_size-1."""
    local_rank: int
    """Rank among the tasks on this node (selects the GPU)."""
    world_size: int
    """Number of processes in the job step."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node in the step's node list."""
    num_nodes: int
    """Number of nodes in the step."""
    master_addr: str
    """Host that serves the rendezvous store (global rank 0's node)."""
    master_port: int
    """Rendezvous port, derived from the job id so that jobs sharing a node do not collide."""
    job_id: str
    """Scheduler job id ('' when there is none)."""
    restart_count: int
    """How many times Slurm requeued this job (0 on the first run)."""
    hostnames: tp.Tuple[str, ...]
    """All hosts of the step, node_rank order."""
    launcher: str
    """'slurm', 'submitit-local', 'torchrun' or 'single'."""
    cpus_per_task: tp.Optional[int] = None
    """CPUs Slurm gave each task (``SLURM_CPUS_PER_TASK``, i.e. ``--cpus-per-task``); None when not set."""


ATTEMPT_ENV = "HPCTRAIN_ATTEMPT"
"""Set by :mod:`hpctrain.launch.spares` on every step it starts: that step's attempt number (restart count)."""

NODE_INDEX_ENV = "HPCTRAIN_NODE_INDEX"
"""Set by :mod:`hpctrain.launch.spares` on a training step that runs on one node only (with in-job recovery the
training is one ``srun`` step per node, so that a failed node takes only its own step's tasks): that node's index
among the training nodes. Read only by :func:`node_step_environ`."""

TRAINING_NODES_ENV = "HPCTRAIN_TRAINING_NODES"
"""With :data:`NODE_INDEX_ENV`: every training node, comma-separated, in rank order (the first is the rendezvous)."""

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> tp.List[str]:
    """Expand a Slurm host list: ``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``.

    Zero padding is kept (``[08-10]`` -> 08, 09, 10). Multiple bracket groups (``rack[1-2]-n[1-2]``)
    expand as a cross product, as ``scontrol show hostnames`` does.
    """
    hosts: tp.List[str] = []
    for item in _split_top_level(hostlist.strip()):
        if item:
            hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> tp.List[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise DistEnvError(f"unbalanced brackets in Slurm host list {text!r}")
    parts.append("".join(current))
    return parts


def _expand_one(item: str) -> tp.List[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    values: tp.List[str] = []
    for rng in body.split(","):
        m = _RANGE.match(rng.strip())
        if not m:
            raise DistEnvError(f"cannot parse range {rng!r} in Slurm host list {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        values.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return [prefix + v + tail for v in values for tail in _expand_one(rest)]


def expand_tasks_per_node(spec: str) -> tp.List[int]:
    """``SLURM_TASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE``: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: tp.List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise DistEnvError(f"cannot parse Slurm tasks-per-node {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _int(environ: tp.Mapping[str, str], name: str) -> int:
    value = environ.get(name)
    if value is None or value == "":
        raise DistEnvError(f"{name} is not set: start the job with srun (or hpctrain.submit), not python directly")
    try:
        return int(value)
    except ValueError:
        raise DistEnvError(f"{name}={value!r} is not an integer") from None


def _override(environ: tp.Mapping[str, str], addr: str, port: int) -> tp.Tuple[str, int]:
    addr = environ.get("HPCTRAIN_MASTER_ADDR") or addr
    port_text = environ.get("HPCTRAIN_MASTER_PORT")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise DistEnvError(f"HPCTRAIN_MASTER_PORT={port_text!r} is not a TCP port (1-65535)")
        port = int(port_text)
    return addr, port


def slurm_job_id(environ: tp.Mapping[str, str] = os.environ) -> str:
    """The id that names this Slurm job to every Slurm command: ``ARRAYJOB_TASK`` for a task of a job array
    (``SLURM_JOB_ID`` is then the task's own record, and the array's id alone names every task: ``scontrol
    requeue`` of it requeued another running task), else ``SLURM_JOB_ID``."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else environ.get("SLURM_JOB_ID", "")


def node_ranks(index: int, per_node: int) -> tp.List[int]:
    """The global ranks of the tasks of training node ``index`` when each node runs its own step of ``per_node``
    tasks: the offset rule, ``index x per_node + SLURM_PROCID``."""
    return [index * per_node + local for local in range(per_node)]


def node_step_environ(environ: tp.Mapping[str, str]) -> tp.Dict[str, str]:
    """The environment of a task of one node's step, as a task of one step over every training node would see it.

    The one owner of the offset rule: global rank = node index x the step's tasks + ``SLURM_PROCID``, world = the
    training nodes x the step's tasks, the node list, node id and task counts those of the whole training, so
    that this module, submitit's JobEnvironment (its result file and log line) and every ``SLURM_*`` reader see
    the same ranks as under one step. :data:`NODE_INDEX_ENV` and :data:`TRAINING_NODES_ENV` are removed (applied
    once). ``environ`` unchanged when they are not set."""
    out = dict(environ)
    index_text = out.pop(NODE_INDEX_ENV, None)
    nodes_text = out.pop(TRAINING_NODES_ENV, None)
    if index_text is None and nodes_text is None:
        return out
    if not (index_text or "").isdigit() or not nodes_text:
        raise DistEnvError(f"{NODE_INDEX_ENV}={index_text!r} needs a node index and {TRAINING_NODES_ENV} the nodes")
    index, hosts = int(index_text or 0), expand_hostlist(nodes_text)
    per_node = _int(environ, "SLURM_STEP_NUM_TASKS")
    local = _int(environ, "SLURM_PROCID")
    if index >= len(hosts) or environ.get("SLURM_STEP_NUM_NODES", "1") != "1" or not 0 <= local < per_node:
        raise DistEnvError(
            f"{NODE_INDEX_ENV}={index} of {len(hosts)} training node(s) is set on a step of "
            f"{environ.get('SLURM_STEP_NUM_NODES')} node(s) and {per_node} task(s): it is for one node's step"
        )
    world = len(hosts) * per_node
    ranks = node_ranks(index, per_node)
    tasks = f"{per_node}(x{len(hosts)})" if len(hosts) > 1 else str(per_node)
    out.update(
        SLURM_PROCID=str(ranks[local]),
        SLURM_NODEID=str(index),
        SLURM_GTIDS=",".join(map(str, ranks)),
        SLURM_STEP_NODELIST=",".join(hosts),
        SLURM_STEP_NUM_NODES=str(len(hosts)),
        SLURM_STEP_NUM_TASKS=str(world),
        SLURM_STEP_TASKS_PER_NODE=tasks,
        SLURM_TASKS_PER_NODE=tasks,
        SLURM_NNODES=str(len(hosts)),
        SLURM_NTASKS=str(world),
        SLURM_NPROCS=str(world),
    )
    return out


def _from_slurm(environ: tp.Mapping[str, str]) -> DistEnv:
    environ = node_step_environ(environ)  # a task of one node's step not started through the wrapper: the same view
    job_id = slurm_job_id(environ)
    if "SLURM_STEP_ID" not in environ and "SLURM_STEPID" not in environ:
        ntasks = environ.get("SLURM_NTASKS", "1")
        if ntasks != "1":
            raise DistEnvError(
                f"running in the batch shell of job {job_id}, not in a job step: the {ntasks} tasks would wait "
                "for each other forever; launch the training command with srun"
            )
    rank = _int(environ, "SLURM_PROCID")
    world = (
        _int(environ, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in environ else _int(environ, "SLURM_NTASKS")
    )
    local_rank = _int(environ, "SLURM_LOCALID")
    node_rank = _int(environ, "SLURM_NODEID")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise DistEnvError("SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is not set: cannot find the rendezvous host")
    hosts = tuple(expand_hostlist(nodelist))
    num_nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or len(hosts))
    if num_nodes != len(hosts):
        raise DistEnvError(f"Slurm says {num_nodes} nodes but its node list {nodelist!r} has {len(hosts)}")
    tpn_spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    per_node = expand_tasks_per_node(tpn_spec) if tpn_spec else [world // max(num_nodes, 1)] * num_nodes
    if len(per_node) != num_nodes or sum(per_node) != world:
        raise DistEnvError(f"Slurm's tasks per node {tpn_spec!r} do not add up to {world} tasks on {num_nodes} nodes")
    # A torchrun-style value that disagrees with Slurm (often exported from the login shell, since
    # sbatch passes the environment on) would mis-rank the job or hang its rendezvous.
    for name, actual in (("WORLD_SIZE", world), ("RANK", rank)):
        for var in (name, f"HPCTRAIN_{name}"):
            if environ.get(var) not in (None, "", str(actual)):
                raise DistEnvError(
                    f"{var}={environ[var]} is set but Slurm started this task with {name}={actual}: "
                    f"unset {var} or request matching --nodes/--tasks-per-node"
                )
    if not 0 <= rank < world:
        raise DistEnvError(f"SLURM_PROCID={rank} is outside the step's {world} tasks")
    if not 0 <= node_rank < num_nodes:
        raise DistEnvError(f"SLURM_NODEID={node_rank} is outside the step's {num_nodes} nodes")
    if not 0 <= local_rank < per_node[node_rank]:
        raise DistEnvError(f"SLURM_LOCALID={local_rank} but node {node_rank} runs {per_node[node_rank]} tasks")
    # The attempt number: Slurm's requeue count, unless the spare-node loop (hpctrain.launch.spares) restarted
    # the step inside the allocation; it then numbers every step it starts (ATTEMPT_ENV), one owner for both.
    restart = int(environ.get(ATTEMPT_ENV) or environ.get("SLURM_RESTART_COUNT") or 0)
    # the port from the numeric id of this job record (an array task's own), distinct for neighbours on a node
    addr, port = _override(environ, hosts[0], derive_port(environ.get("SLURM_JOB_ID") or job_id, restart))
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=per_node[node_rank],
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=addr,
        master_port=port,
        job_id=job_id,
        restart_count=restart,
        hostnames=hosts,
        launcher="slurm",
        cpus_per_task=_positive_or_none(environ.get("SLURM_CPUS_PER_TASK")),
    )


def _from_submitit_local(environ: tp.Mapping[str, str]) -> DistEnv:
    rank = _int(environ, "SUBMITIT_LOCAL_GLOBALID")
    world = _int(environ, "SUBMITIT_LOCAL_NTASKS")
    local_rank = _int(environ, "SUBMITIT_LOCAL_LOCALID")
    job_id = environ.get("SUBMITIT_LOCAL_JOB_ID", "")
    if not 0 <= rank < world:
        raise DistEnvError(f"SUBMITIT_LOCAL_GLOBALID={rank} is outside the job's {world} tasks")
    addr, port = _override(environ, "127.0.0.1", derive_port(job_id))
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=world,
        node_rank=0,
        num_nodes=1,
        master_addr=addr,
        master_port=port,
        job_id=job_id,
        restart_count=0,
        hostnames=("localhost",),
        launcher="submitit-local",
    )


def _from_torchrun(environ: tp.Mapping[str, str]) -> DistEnv:
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    local_rank = int(environ.get("LOCAL_RANK", rank))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
    if not 0 <= rank < world:
        raise DistEnvError(f"RANK={rank} is outside WORLD_SIZE={world}")
    if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
        raise DistEnvError("RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not: set both or use srun")
    addr, port = _override(environ, environ["MASTER_ADDR"], _int(environ, "MASTER_PORT"))
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=int(environ.get("GROUP_RANK", 0)),
        num_nodes=max(1, world // max(local_world, 1)),
        master_addr=addr,
        master_port=port,
        job_id=environ.get("TORCHELASTIC_RUN_ID", ""),
        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        hostnames=(addr,),
        launcher="torchrun",
    )


def _positive_or_none(value: tp.Optional[str]) -> tp.Optional[int]:
    return int(value) if value is not None and value.strip().isdigit() and int(value) > 0 else None


def from_environ(environ: tp.Optional[tp.Mapping[str, str]] = None) -> DistEnv:
    """Derive this process's :class:`DistEnv` from ``environ`` (default ``os.environ``); see the module doc."""
    env = os.environ if environ is None else environ
    if env.get("SUBMITIT_EXECUTOR") == "local":
        return _from_submitit_local(env)
    if "SLURM_PROCID" in env and "SLURM_JOB_ID" in env:
        return _from_slurm(env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torchrun(env)
    addr, port = _override(env, "127.0.0.1", derive_port(str(os.getpid())))
    return DistEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=addr,
        master_port=port,
        job_id="",
        restart_count=0,
        hostnames=("localhost",),
        launcher="single",
    )
