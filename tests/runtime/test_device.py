"""Device choice from what a task sees, and the distinct-GPU check, on CPU with a fake CUDA runtime."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hpctrain.runtime.env import DistEnv, DistEnvError
from hpctrain.runtime.process_group import check_distinct_gpus, rank_and_world, select_device
from hpctrain.testing import FakeCuda
from tests.multiproc import run_world


def env(local_rank: int, local_world: int, rank: int = 0, world: int = 0) -> DistEnv:
    return DistEnv(
        rank=rank or local_rank,
        local_rank=local_rank,
        world_size=world or local_world,
        local_world_size=local_world,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
        job_id="1",
        restart_count=0,
        hostnames=("n1",),
        launcher="slurm",
    )


def test_cpu_job_never_touches_cuda():
    cuda = FakeCuda(0, available=False)
    assert select_device(env(0, 2), 0, cuda=cuda) == torch.device("cpu")
    assert cuda.current is None


def test_one_visible_gpu_per_task_is_cuda0_whatever_the_local_rank():
    cuda = FakeCuda(1)  # Slurm bound one GPU to this task (--gpus-per-task 1): it is cuda:0 here
    assert select_device(env(3, 4), 4, cuda=cuda) == torch.device("cuda", 0)
    assert cuda.current == 0


def test_node_bound_gpus_are_chosen_by_local_rank():
    cuda = FakeCuda(4)
    assert select_device(env(2, 4), 4, cuda=cuda) == torch.device("cuda", 2)
    assert cuda.current == 2
    assert select_device(env(1, 2), 2, cuda=FakeCuda(8)) == torch.device("cuda", 1)


def test_fewer_visible_gpus_than_tasks_is_a_clear_error():
    with pytest.raises(DistEnvError, match="runs 4 tasks but this task sees 2 GPUs.*would share a GPU"):
        select_device(env(3, 4), 2, cuda=FakeCuda(2))


def test_gpu_job_without_cuda_names_the_flag():
    with pytest.raises(DistEnvError, match="CUDA is not available.*--gpus-per-node 0"):
        select_device(env(0, 1), 1, cuda=FakeCuda(0, available=False))


def _check(rank, world, uuids):
    e = dataclasses.replace(env(rank, world, rank=rank, world=world))
    try:
        check_distinct_gpus(e, torch.device("cuda", 0), cuda=FakeCuda(1, uuids=[uuids[rank]]))
    except DistEnvError as exc:
        return str(exc)
    return "ok"


def test_ranks_on_the_same_gpu_are_caught_after_init_on_every_rank():
    same = run_world(_check, 3, ["GPU-a", "GPU-a", "GPU-b"]).results
    assert all("ranks [0, 1]" in r and "GPU-a" in r for r in same), same
    distinct = run_world(_check, 3, ["GPU-a", "GPU-b", "GPU-c"]).results
    assert distinct == ["ok", "ok", "ok"]


def _who(rank, world):
    return rank_and_world()


def test_rank_and_world_come_from_the_group_or_the_environment(monkeypatch):
    assert run_world(_who, 2).results == [(0, 2), (1, 2)]
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    assert rank_and_world() == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert rank_and_world() == (3, 4)
