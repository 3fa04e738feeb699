"""The checkpointer's control-plane gather of objects (``Comm.all_gather_with``) on real gloo processes: one
collective when every rank's pickle fits the inline width, a second only when some rank's does not, and every
rank gets every rank's ints and object exactly, whatever mix of short and long messages the ranks send (its own
as the object it passed: nothing of its own is unpickled). Compressed (a restore's index exchange), a message
takes one collective when its compressed pickle fits, and comes out exactly as it went in."""

from __future__ import annotations

import pickle
import zlib

from hpctrain.ckpt._commit import INLINE_BYTES, INLINE_TOTAL
from tests.ckpt import comm_workers
from tests.multiproc import run_world

WORLD = 3


def test_objects_are_gathered_exactly_in_one_collective_when_they_fit_and_two_when_any_does_not():
    cases = [  # (inline, sizes, compress, noise)
        (INLINE_BYTES, [10, 0, 100], False, False),  # every pickle fits: one collective
        (4096, [10, 9000, 100], False, False),  # one rank's does not: a second for its rest
        (4096, [5000, 9000, 20000], False, False),  # none does
        (1, [0, 0, 0], False, False),  # the narrowest row: everything in the second
        (1 << 20, [300_000, 0, 1], False, False),  # a wide inline row
        (4096, [10, 300_000, 100], True, False),  # compressed, the long one fits: one collective
        (4096, [10, 9000, 20000], True, True),  # noise does not compress: a second
        (1, [0, 0, 0], True, False),
        (64 << 10, [50_000, 200, 70_000], True, True),  # a restore's index exchange: 64 KiB rows
    ]
    results = run_world(comm_workers.gather_objects, WORLD, cases).results
    for rank, got in enumerate(results):
        for (inline, sizes, compress, noise), (ints, objs, collectives, own_as_passed) in zip(cases, got):
            assert ints == [[r, -(2**62) + r, 7] for r in range(WORLD)], (rank, inline)
            want = [comm_workers.message(r, sizes[r], noise) for r in range(WORLD)]
            assert objs == want, (rank, inline, compress)
            assert own_as_passed, (rank, inline)
            width = min(inline, INLINE_TOTAL // WORLD)
            pickles = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in want]
            sent = [len(zlib.compress(b, 1)) if compress else len(b) for b in pickles]
            assert collectives == (1 if max(sent) <= width else 2), (rank, inline, sizes, compress, collectives)
        plain, collectives = got[-1]
        assert plain == [("err", r) for r in range(WORLD)] and collectives == 1
