"""An entry for tests/cluster/test_logs_cancel.py: every rank joins one all-reduce, then rank 1 raises (the others
then fail in the next all-reduce, as peers of a failed rank do)."""

from __future__ import annotations

import typing as tp


def main(ctx: tp.Any) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"raise_entry: rank {ctx.rank} of {ctx.world_size} on {ctx.hostname} after the first all-reduce", flush=True)
    if ctx.rank == 1:
        raise ValueError("raise_entry: rank 1 fails on purpose")
    dist.all_reduce(t)
