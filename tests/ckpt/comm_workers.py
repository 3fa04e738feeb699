"""Rank bodies for tests/ckpt/test_comm.py (importable by spawned processes)."""

from __future__ import annotations

import typing as tp


def message(rank: int, size: int, noise: bool) -> tp.Dict[str, tp.Any]:
    """Rank ``rank``'s object of the gather: ``size`` bytes of one repeated byte, or of noise (which no compression
    shrinks), the same on every rank that builds it."""
    import random

    blob = random.Random(rank).randbytes(size) if noise else bytes([rank + 1]) * size
    return {"rank": rank, "blob": blob, "text": "é" * rank}


def gather_objects(rank: int, world: int, cases: tp.List[tp.Tuple[int, tp.List[int], bool, bool]]) -> tp.List[tp.Any]:
    """For each case ``(inline, sizes, compress, noise)``: every rank gathers ints and an object of ``sizes[rank]``
    bytes (:func:`message`) through ``Comm.all_gather_with``; returns what it got, how many collectives each gather
    took and whether its own entry is the object it passed (not an unpickled copy)."""
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
    for inline, sizes, compress, noise in cases:
        calls[0] = 0
        obj = message(rank, sizes[rank], noise)
        ints, objs = comm.all_gather_with([rank, -(2**62) + rank, 7], obj, inline=inline, compress=compress)
        out.append((ints, objs, calls[0], objs[rank] is obj))
    calls[0] = 0
    out.append((comm.all_gather(("err", rank)), calls[0]))
    return out
