"""The epoch order, sharding, tail policy and resume arithmetic, without I/O (fast, exhaustive)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hpctrain.data._order import EpochOrder, EpochPlan
from hpctrain.errors import UsageError


def blocks(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


BLOCKS = blocks([64] * 30 + [17] + [50] * 11 + [3])  # three "files" with ragged last blocks: 2490 samples


def plan(seed=0, epoch=0, window=4, shuffle=True, batch=48, parts=4, tail="drop", bs=BLOCKS):
    return EpochPlan(EpochOrder(bs, seed, epoch, window, shuffle), batch, parts, tail)


def consumed(p, world, batches):
    """All (ids, valid) of the given global batches, gathered over every rank of ``world``."""
    ids, valid = [], []
    for r in range(world):
        i, v = p.slots(np.asarray(batches, dtype=np.int64), r, world)
        ids.append(i)
        valid.append(v)
    return np.concatenate(ids, axis=1), np.concatenate(valid, axis=1)


def test_stream_is_a_permutation_and_deterministic():
    a = EpochOrder(BLOCKS, 7, 3, 4, True).ids(np.arange(2490))
    b = EpochOrder(BLOCKS, 7, 3, 4, True).ids(np.arange(2490))
    assert sorted(a.tolist()) == list(range(2490))
    assert (a == b).all()
    assert not (a == EpochOrder(BLOCKS, 7, 4, 4, True).ids(np.arange(2490))).all()  # next epoch differs
    assert not (a == EpochOrder(BLOCKS, 8, 3, 4, True).ids(np.arange(2490))).all()  # other seed differs
    assert (EpochOrder(BLOCKS, 7, 3, 4, False).ids(np.arange(2490)) == np.arange(2490)).all()


def test_the_order_is_the_one_every_earlier_version_wrote():
    """A checkpoint's data position means the same samples in every version: the ids of whole epochs (one
    and several partitions, ranks, windows of 1 to all blocks, padding) hash to the value pinned here."""
    import hashlib

    h = hashlib.sha256()
    bs = blocks(np.random.default_rng(0).integers(1, 200, size=300))
    for seed, epoch, window, parts, world in [(0, 0, 16, 1, 1), (7, 3, 4, 8, 2), (1, 2, 1, 6, 3), (5, 1, 1000, 4, 1)]:
        p = EpochPlan(EpochOrder(bs, seed, epoch, window, True), 48, parts, "pad")
        for r in range(world):
            ids, valid = p.slots(np.arange(p.num_batches), r, world)
            h.update(ids.tobytes())
            h.update(valid.tobytes())
    assert h.hexdigest()[:16] == "0999b12a5a8e8396"


def test_dense_and_sparse_positions_give_the_same_ids():
    """A loader task asks for positions that fill their windows (one lookup table), a rank of many partitions
    for a few scattered ones (a mask per window): the same position is the same sample either way."""
    o = EpochOrder(BLOCKS, 3, 1, 4, True)
    every = o.ids(np.arange(2490))
    rng = np.random.default_rng(1)
    for _ in range(20):
        pos = np.sort(rng.choice(2490, size=rng.integers(1, 40), replace=False))
        assert (o.ids(pos) == every[pos]).all()
        a = int(rng.integers(0, 2400))
        assert (o.ids(np.arange(a, a + 90)[::-1]) == every[a : a + 90][::-1]).all()
    assert o.ids(np.zeros(0, dtype=np.int64)).shape == (0,)


def test_window_only_mixes_its_own_chunks():
    o = EpochOrder(BLOCKS, 1, 0, 4, True)
    ids = o.ids(np.arange(2490))
    blk = np.searchsorted(BLOCKS, ids, side="right") - 1
    for w in range(len(o.win_starts) - 1):
        a, b = o.win_starts[w], o.win_starts[w + 1]
        assert len(set(blk[a:b].tolist())) <= 4  # a window spans at most `window` chunks
        assert set(blk[a:b].tolist()) == set(o.perm[w * 4 : (w + 1) * 4].tolist())


@pytest.mark.parametrize("tail", ["drop", "pad", "exact"])
@pytest.mark.parametrize("parts,world", [(1, 1), (2, 2), (4, 4), (4, 2), (2, 4), (3, 1), (1, 3)])
def test_exact_coverage_and_equal_batches(tail, parts, world):
    batch = 48
    p = plan(parts=parts, batch=batch, tail=tail)
    ids, valid = consumed(p, world, range(p.num_batches))
    assert ids.shape == (p.num_batches, batch)
    for r in range(world):  # every rank: same number of batches, same batch size
        assert p.slots(np.arange(p.num_batches), r, world)[0].shape == (p.num_batches, batch // world)
    got = ids[valid]
    assert len(set(got.tolist())) == len(got)  # no sample twice among real slots
    if tail == "drop":
        assert valid.all()
        assert 2490 - len(got) < batch + parts  # only the tail is dropped
    else:
        assert sorted(got.tolist()) == list(range(2490))  # every sample exactly once
        assert (~valid).sum() == p.num_batches * batch - 2490


def test_order_does_not_depend_on_world_size():
    p = plan(parts=4)
    one, _ = consumed(p, 1, range(p.num_batches))
    for world in (2, 4, 8, 12, 16):
        many, _ = consumed(p, world, range(p.num_batches))
        assert (one == many).all()


@pytest.mark.parametrize("before,after", [(4, 2), (2, 4), (1, 3), (3, 1), (4, 16)])
def test_resume_on_another_world_size_consumes_each_sample_once(before, after):
    p = plan(parts=4, batch=48, tail="pad")
    rng = np.random.default_rng(before * 10 + after)
    stop = int(rng.integers(1, p.num_batches))
    ids1, v1 = consumed(p, before, range(stop))
    # resume: the state is only "samples_consumed = stop * B"; a fresh plan from (seed, epoch)
    p2 = plan(parts=4, batch=48, tail="pad")
    ids2, v2 = consumed(p2, after, range(stop, p2.num_batches))
    union = np.concatenate([ids1[v1], ids2[v2]])
    assert sorted(union.tolist()) == list(range(2490))


def test_partition_locality_a_rank_reads_only_its_chunks():
    """With partitions == world size, ranks touch (almost) disjoint chunk sets: no read amplification."""
    p = plan(parts=4, batch=48, window=2)
    per_rank = []
    for r in range(4):
        ids, _ = p.slots(np.arange(p.num_batches), r, 4)
        per_rank.append(set((np.searchsorted(BLOCKS, ids.ravel(), side="right") - 1).tolist()))
    for a, b in itertools.combinations(per_rank, 2):
        assert len(a & b) <= 2  # only the chunks straddling a partition boundary are shared


def test_mixing_is_chunk_plus_window():
    """Neighbours in the stream come from distinct chunks most of the time (document the figure)."""
    o = EpochOrder(blocks([64] * 200), 0, 0, 16, True)
    ids = o.ids(np.arange(12800))
    chunk = ids // 64
    same = np.mean(chunk[1:] == chunk[:-1])
    assert same < 2.0 / 16  # about 1/window for a 16-chunk window


def test_topology_errors_are_clear():
    p = plan(parts=4, batch=48)
    with pytest.raises(UsageError, match="not divisible by the world size 5"):
        p.slots(np.arange(2), 0, 5)
    with pytest.raises(UsageError, match="fewer than partitions"):
        EpochPlan(EpochOrder(blocks([3]), 0, 0, 4, True), 8, 4, "pad")


@pytest.mark.parametrize("parts,world", [(1, 1), (4, 4), (4, 2), (2, 4)])
def test_read_tasks_end_at_window_edges_and_tile_the_epoch(parts, world):
    """``task_end`` groups a rank's batches into read tasks of at most ``most`` batches that tile the epoch. A task
    that reaches the epoch's end ends there; any other ends, where a window boundary of the rank's partition lies in
    its second half, within half a batch of the last such boundary (the batch edge nearest it), else after ``most``
    batches."""
    p = plan(parts=parts, batch=48, window=3)
    per, ws = p.per_part, p.order.win_starts
    for rank in range(world):
        j0 = rank * (p.global_batch // world)
        base = int(p.part_starts[j0 // per]) + j0 % per
        for most in (1, 2, 5, 9):
            first, seen, aligned = 0, [], 0
            while first < p.num_batches:
                end = p.task_end(first, most, rank, world)
                reach = first + most
                if reach >= p.num_batches or most == 1:
                    assert end == min(reach, p.num_batches)
                else:
                    half = base + (first + (most + 1) // 2) * per
                    inside = ws[(ws >= half) & (ws <= base + reach * per)]
                    if len(inside):
                        assert abs(base + end * per - int(inside.max())) <= per // 2
                        assert first < end <= reach
                        aligned += 1
                    else:
                        assert end == reach  # no boundary in reach: a full task
                seen.extend(range(first, end))
                first = end
            assert seen == list(range(p.num_batches))
            if most == 9:
                assert aligned > 0  # windows of 3 blocks (at most 192 samples) end inside some 9-batch tasks
