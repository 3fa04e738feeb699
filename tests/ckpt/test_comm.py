"""The checkpointer's control-plane gather of objects (``Comm.all_gather_with``) on real gloo processes: one
collective when every rank's pickle fits the inline width, a second only when some rank's does not, and every
rank gets every rank's ints and object exactly, whatever mix of short and long messages the ranks send (its own
as the object it passed: nothing of its own is unpickled). Compressed (a restore's index exchange), a message
takes one collective when its compressed pickle fits, and comes out exactly as it went in."""

from __future__ import annotations

from hpctrain.ckpt._commit import INLINE_BYTES, INLINE_TOTAL, wire_bytes
from tests.ckpt import comm_workers
from tests.multiproc import run_world

WORLD = 3


def test_objects_are_gathered_exactly_in_one_collective_when_they_fit_and_two_when_any_does_not():
    cases = [  # (inline, sizes, compress, noise), and the collectives it takes
        ((INLINE_BYTES, [10, 0, 100], False, False), 1),  # every pickle fits
        ((4096, [10, 9000, 100], False, False), 2),  # one rank's does not: a second for its rest
        ((4096, [5000, 9000, 20000], False, False), 2),  # none does
        ((1, [0, 0, 0], False, False), 2),  # the narrowest row: everything in the second
        ((1 << 20, [300_000, 0, 1], False, False), 1),  # a wide inline row
        ((4096, [10, 300_000, 100], True, False), 1),  # compressed, the long one fits
        ((4096, [10, 9000, 20000], True, True), 2),  # noise does not compress
        ((1, [0, 0, 0], True, False), 2),
        ((64 << 10, [50_000, 200, 40_000], True, True), 1),  # a restore's index exchange: 64 KiB rows
    ]
    results = run_world(comm_workers.gather_objects, WORLD, [c for c, _ in cases]).results
    for rank, got in enumerate(results):
        for ((inline, sizes, compress, noise), taken), (ints, objs, collectives, own_as_passed) in zip(cases, got):
            assert ints == [[r, -(2**62) + r, 7] for r in range(WORLD)], (rank, inline)
            want = [comm_workers.message(r, sizes[r], noise) for r in range(WORLD)]
            assert objs == want, (rank, inline, compress)
            assert own_as_passed, (rank, inline)
            width = min(inline, INLINE_TOTAL // WORLD)
            sent = max(len(wire_bytes(o, compress)) for o in want)
            assert collectives == taken == (1 if sent <= width else 2), (rank, inline, sizes, compress, collectives)
        plain, collectives = got[-1]
        assert plain == [("err", r) for r in range(WORLD)] and collectives == 1
