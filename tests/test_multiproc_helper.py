import pytest

from tests.multiproc import run_world


def _allreduce(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return (dist.get_rank(), dist.get_world_size(), t.item())


def _fail_on_rank1(rank, world_size):
    if rank == 1:
        raise ValueError("boom")
    return rank


def test_run_world_reduces_across_real_processes():
    res = run_world(_allreduce, 2)
    assert res.results == [(0, 2, 3.0), (1, 2, 3.0)]


def test_run_world_surfaces_rank_errors():
    with pytest.raises(RuntimeError, match="rank 1: ValueError: boom"):
        run_world(_fail_on_rank1, 2, init_pg=False)
