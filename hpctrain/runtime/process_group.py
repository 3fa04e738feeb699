"""Start and stop torch.distributed for a :class:`~hpctrain.runtime.env.DistEnv`, and choose the device.

NCCL when the job has GPUs, gloo on CPU. The rendezvous is a TCP store on the master host with a
timeout, so a missing rank ends in an error that names the host and port instead of a silent hang.

The GPU of a task is chosen from what the task *sees* (Slurm may bind GPUs per task or per node), and
after the group is up every rank checks that no other rank on its node holds the same physical GPU
(by UUID): two ranks on one GPU would otherwise fail later inside NCCL with a misleading message.
"""

from __future__ import annotations

import datetime
import os
import socket
import typing as tp

import torch
import torch.distributed as dist

from hpctrain._cuda import CudaRuntime
from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S
from hpctrain.runtime import gloo_teardown
from hpctrain.runtime.env import DistEnv, DistEnvError

__all__ = [
    "init_process_group",
    "destroy_process_group",
    "wrap_ddp",
    "select_device",
    "check_distinct_gpus",
    "rank_and_world",
    "cpu_threads",
    "set_cpu_threads",
    "all_gather_into_tensor",
]


def all_gather_into_tensor() -> tp.Callable[..., tp.Any]:
    """torch's gather of equal-sized tensors into one: ``dist.all_gather_single`` where this torch has it (the
    newer name), else ``dist.all_gather_into_tensor`` (same signature and semantics). One shim for the
    checkpoint exchange and the metrics gather."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def select_device(env: DistEnv, gpus_per_node: int, *, cuda: tp.Optional[CudaRuntime] = None) -> torch.device:
    """The device of this task: CPU for a CPU job, else the GPU it sees as its own.

    - the task sees exactly one GPU (per-task binding, ``--gpus-per-task``/``CUDA_VISIBLE_DEVICES`` of one):
      ``cuda:0``, whatever its local rank;
    - it sees at least as many GPUs as its node runs tasks (per-node binding): ``cuda:<local_rank>``;
    - otherwise ranks would share GPUs: an error naming the counts (a CUDA-less GPU job too).
    Whether single-GPU tasks really hold distinct GPUs is checked after init (:func:`check_distinct_gpus`).
    """
    if gpus_per_node <= 0:
        return torch.device("cpu")
    cuda = cuda or CudaRuntime()
    host = socket.gethostname()
    if not cuda.is_available():
        raise DistEnvError(
            f"the job asked for {gpus_per_node} GPU(s) per node but CUDA is not available on {host}: check the "
            "partition/--gpus-per-node, or use --gpus-per-node 0 for a CPU job"
        )
    seen = cuda.count()
    if seen == 1:
        index = 0
    elif seen >= env.local_world_size:
        index = env.local_rank
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise DistEnvError(
            f"{host} runs {env.local_world_size} tasks but this task sees {seen} GPUs "
            f"(CUDA_VISIBLE_DEVICES={visible}): ranks would share a GPU; request --gpus-per-node >= "
            "--tasks-per-node (or fewer tasks per node)"
        )
    cuda.set_device(index)
    return torch.device("cuda", index)


def check_distinct_gpus(env: DistEnv, device: torch.device, *, cuda: tp.Optional[CudaRuntime] = None) -> None:
    """After init: every rank of a node must hold a different physical GPU (one all-gather of host + UUID)."""
    if device.type != "cuda" or env.world_size == 1:
        return
    cuda = cuda or CudaRuntime()
    mine = (socket.gethostname(), cuda.uuid(device.index or 0))
    everyone: tp.List[tp.Any] = [None] * env.world_size
    dist.all_gather_object(everyone, mine)
    owners: tp.Dict[tp.Tuple[str, str], tp.List[int]] = {}
    for rank, key in enumerate(everyone):
        owners.setdefault(tuple(key), []).append(rank)
    shared = {k: v for k, v in owners.items() if len(v) > 1}
    if shared:
        (host, uuid), ranks = next(iter(shared.items()))
        raise DistEnvError(
            f"ranks {ranks} on {host} all use GPU {uuid}: Slurm gave each task the same GPU; request one GPU per "
            "task (--gpus-per-node = --tasks-per-node) or fewer tasks per node"
        )


def cpu_threads(env: DistEnv, environ: tp.Mapping[str, str], usable_cpus: int) -> tp.Optional[int]:
    """Intra-op CPU threads for one rank, or None to leave torch's own choice.

    torch starts as many threads as the node has cores *in every process*: with 4 ranks on a node that is
    4x oversubscribed, and the spinning OpenMP threads slow every CPU op, the gloo collectives and the
    data path (measured on a 2-core VM, 2 ranks: the demo ran 3.4x faster with one thread per rank).
    So, like torchrun: ``OMP_NUM_THREADS`` if the user set it (torch reads it: None here), else Slurm's
    ``--cpus-per-task``, else the CPUs this process may use divided among the ranks of its node.
    """
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    if env.cpus_per_task:
        return env.cpus_per_task
    return max(1, usable_cpus // max(1, env.local_world_size))


def set_cpu_threads(env: DistEnv, environ: tp.Optional[tp.Mapping[str, str]] = None) -> int:
    """Apply :func:`cpu_threads` to this process; returns the intra-op thread count now in effect."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = cpu_threads(env, os.environ if environ is None else environ, usable)
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
    return torch.get_num_threads()


def rank_and_world(group: tp.Any = None) -> tp.Tuple[int, int]:
    """This process's rank and the world size: the initialised process group's (``group`` or the default), else
    what the launcher's environment says (:func:`hpctrain.runtime.env.from_environ`; rank 0 of 1 alone).

    The one place the torch-side layers (data, ckpt) ask who they are."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    from hpctrain.runtime.env import from_environ

    env = from_environ()
    return env.rank, env.world_size


def init_process_group(
    env: DistEnv, device: torch.device, *, timeout_s: float = DEFAULT_DIST_TIMEOUT_S, backend: tp.Optional[str] = None
) -> str:
    """Initialise the default process group for ``env``; returns the backend used ('nccl' or 'gloo').

    NCCL error handling is left at torch's default (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: abort the
    communicator and skip the clean-up that could block on a wedged GPU); set it yourself to change it.
    """
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kwargs: tp.Dict[str, tp.Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device  # eager NCCL init: a bad GPU/network fails here, not in step 1
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{_bracket(env.master_addr)}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    except (RuntimeError, ValueError) as exc:
        raise DistEnvError(
            f"rank {env.rank}/{env.world_size} could not join the process group at "
            f"{env.master_addr}:{env.master_port} ({backend}) within {timeout_s:.0f}s: {str(exc).splitlines()[0]}"
        ) from exc
    return backend


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def destroy_process_group(*, synchronize: bool = True) -> None:
    """Tear down the default group if one exists (idempotent).

    ``synchronize``: barrier first, so rank 0 (which hosts the rendezvous store) is the last to
    leave; a peer whose store vanishes under it can abort at exit ("terminate called without an
    active exception"). Pass False on an error path, where a barrier could wait for a dead rank.
    The groups are freed only once their gloo workers rest (:mod:`~hpctrain.runtime.gloo_teardown`: else a
    DDP wrapper freed later can hang the process).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if synchronize:
        dist.barrier()
    groups = gloo_teardown.hold_groups()
    dist.destroy_process_group()
    # after the barrier every work is done and a worker may only need the GIL; on an error path one may still
    # wait for a dead peer: held to the end of the process rather than waited for here
    gloo_teardown.release_when_idle(groups, 30.0 if synchronize else 1.0)


def wrap_ddp(model: torch.nn.Module, device: torch.device, **ddp_kwargs: tp.Any) -> torch.nn.Module:
    """Move ``model`` to ``device`` and wrap it in DistributedDataParallel (device_ids set on GPU)."""
    from torch.nn.parallel import DistributedDataParallel

    model = model.to(device)
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device.index])
        ddp_kwargs.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **ddp_kwargs)
