"""Start and stop torch.distributed for a :class:`~hpctrain.runtime.env.DistEnv`.

NCCL when the job has GPUs (the CUDA device is chosen from the local rank), gloo on CPU. The
rendezvous is a TCP store on the master host with a timeout, so a missing rank ends in an error
that names the host and port instead of a silent hang.
"""

from __future__ import annotations

import datetime
import os
import typing as tp

import torch
import torch.distributed as dist

from hpctrain.runtime.env import DistEnv, DistEnvError

__all__ = ["init_process_group", "destroy_process_group", "wrap_ddp", "select_device"]


def select_device(env: DistEnv, gpus_per_node: int) -> torch.device:
    """``cuda:<local_rank mod visible GPUs>`` for a GPU job, else CPU; a GPU job without CUDA is an error."""
    if gpus_per_node <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DistEnvError(
            f"the job asked for {gpus_per_node} GPU(s) per node but CUDA is not available on "
            f"{os.uname().nodename}: check the partition/--gpus-per-node, or use --gpus-per-node 0 for a CPU job"
        )
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_process_group(
    env: DistEnv, device: torch.device, *, timeout_s: float = 600.0, backend: tp.Optional[str] = None
) -> str:
    """Initialise the default process group for ``env``; returns the backend used ('nccl' or 'gloo')."""
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    # Errors on a NCCL communicator abort the process instead of hanging the other ranks forever.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # Reverse DNS of peers often fails on clusters (and in the dev cluster's namespaces): quiet c10d.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
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
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if synchronize:
        dist.barrier()
    dist.destroy_process_group()


def wrap_ddp(model: torch.nn.Module, device: torch.device, **ddp_kwargs: tp.Any) -> torch.nn.Module:
    """Move ``model`` to ``device`` and wrap it in DistributedDataParallel (device_ids set on GPU)."""
    from torch.nn.parallel import DistributedDataParallel

    model = model.to(device)
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device.index])
        ddp_kwargs.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **ddp_kwargs)
