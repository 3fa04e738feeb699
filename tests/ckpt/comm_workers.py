"""Rank bodies for tests/ckpt/test_comm.py (importable by spawned processes)."""

from __future__ import annotations

import typing as tp


def gather_objects(rank: int, world: int, cases: tp.List[tp.Tuple[int, tp.List[int]]]) -> tp.List[tp.Any]:
    """For each case ``(inline, sizes)``: every rank gathers ints and an object of ``sizes[rank]`` bytes through
    ``Comm.all_gather_with``; returns what it got, how many collectives each gather took and whether its own entry
    is the object it passed (not an unpickled copy)."""
    from hpctrain.ckpt._commit import Comm
    from hpctrain.runtime import process_group

    comm = Comm(60.0)
    real = process_group.all_gather_into_tensor
    calls = [0]

    def counting() -> tp.Callable[..., tp.Any]:
        gather = real()

        def count(*a: tp.Any, **k: tp.Any) -> tp.Any:
            calls[0] += 1
            return gather(*a, **k)

        return count

    process_group.all_gather_into_tensor = counting  # type: ignore[assignment]
    out = []
    for inline, sizes in cases:
        calls[0] = 0
        obj = {"rank": rank, "blob": bytes([rank + 1]) * sizes[rank], "text": "é" * rank}
        ints, objs = comm.all_gather_with([rank, -(2**62) + rank, 7], obj, inline=inline)
        out.append((ints, objs, calls[0], objs[rank] is obj))
    calls[0] = 0
    out.append((comm.all_gather(("err", rank)), calls[0]))
    return out
