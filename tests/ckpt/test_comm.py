"""The checkpointer's control-plane gather of objects (``Comm.all_gather_with``) on real gloo processes: one
collective when every rank's pickle fits the inline width, a second only when some rank's does not, and every
rank gets every rank's ints and object exactly, whatever mix of short and long messages the ranks send (its own
as the object it passed: nothing of its own is unpickled)."""

from __future__ import annotations

import pickle

from hpctrain.ckpt._commit import INLINE_BYTES, INLINE_TOTAL
from tests.ckpt import comm_workers
from tests.multiproc import run_world

WORLD = 3


def test_objects_are_gathered_exactly_in_one_collective_when_they_fit_and_two_when_any_does_not():
    cases = [
        (INLINE_BYTES, [10, 0, 100]),  # every pickle fits: one collective
        (4096, [10, 9000, 100]),  # one rank's does not: a second for its rest
        (4096, [5000, 9000, 20000]),  # none does
        (1, [0, 0, 0]),  # the narrowest row: everything in the second
        (1 << 20, [300_000, 0, 1]),  # a wide inline row (a restore's index exchange)
    ]
    results = run_world(comm_workers.gather_objects, WORLD, cases).results
    for rank, got in enumerate(results):
        for (inline, sizes), (ints, objs, collectives, own_as_passed) in zip(cases, got):
            assert ints == [[r, -(2**62) + r, 7] for r in range(WORLD)], (rank, inline)
            want = [{"rank": r, "blob": bytes([r + 1]) * sizes[r], "text": "é" * r} for r in range(WORLD)]
            assert objs == want, (rank, inline)
            assert own_as_passed, (rank, inline)
            width = min(inline, INLINE_TOTAL // WORLD)
            fits = max(len(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)) for o in want) <= width
            assert collectives == (1 if fits else 2), (rank, inline, sizes, collectives)
        plain, collectives = got[-1]
        assert plain == [("err", r) for r in range(WORLD)] and collectives == 1
