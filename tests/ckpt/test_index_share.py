"""The shared index of a restore: each rank parses and checks only its share of a checkpoint's shard headers
(``build_index(share=...)``) and the ranks exchange what they found.

Every rank must end with the same index as one process that reads every header, and damage that one process
finds must be found by some rank (the restore then agrees on it and quarantines the step). The ranks are
threads here, so that every world size and every crafted header runs in a few milliseconds; the real
multi-process path (pickled parts over gloo) is covered by every multi-rank restore test."""

from __future__ import annotations

import shutil
import threading
import typing as tp
from pathlib import Path

import pytest

from hpctrain.ckpt._index import Index, build_index
from hpctrain.errors import CheckpointFormatError
from tests.ckpt import damage
from tests.ckpt import workers as w
from tests.ckpt.test_hostile import CRAFTED
from tests.multiproc import run_world

STEP = "step-000000002"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("three")
    run_world(w.save_steps, 3, str(d), [1, 2])
    return d / STEP


def shared_index(step_dir: Path, world: int) -> tp.List[tp.Union[Index, CheckpointFormatError]]:
    """``build_index`` as ``world`` ranks call it in a restore: one thread per rank, the exchange an all-gather
    between the threads."""
    barrier = threading.Barrier(world, timeout=30)
    slots: tp.List[tp.Any] = [None] * world
    out: tp.List[tp.Any] = [None] * world

    def rank(r: int) -> None:
        def exchange(obj: tp.Any) -> tp.List[tp.Any]:
            slots[r] = obj
            barrier.wait()
            got = list(slots)
            barrier.wait()
            return got

        try:
            out[r] = build_index(step_dir, share=(r, world, exchange))
        except CheckpointFormatError as exc:
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summary(index: Index) -> tp.Any:
    tensors = {k: (t.dtype, t.shape, sorted(t.pieces)) for k, t in index.tensors.items()}
    return tensors, index.data_starts, index.header_crcs, index.local, index.trees, index.local_trees


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_rank_gets_the_index_one_process_builds(saved, world):
    want = summary(build_index(saved))
    got = shared_index(saved, world)
    assert all(isinstance(i, Index) for i in got), got
    assert all(summary(i) == want for i in got)
    assert len(want[0]) > 10 and any(len(p) > 1 for _, _, p in want[0].values())  # some tensor spans shards


def test_entries_taken_as_columns_give_the_index_entries_taken_one_by_one_give(saved, monkeypatch):
    """The index takes a shard's checked range entries as columns (``_add_columns``) and the rest entry by entry:
    the index must be the one the entry-by-entry path alone builds, for one rank indexing every shard (a tensor
    split over shards: the later shard's entries go entry by entry) and for each shard alone."""
    from hpctrain.ckpt import _index

    took: tp.List[int] = []
    real = _index._add_columns
    monkeypatch.setattr(_index, "_add_columns", lambda *a: took.append(real(*a)) or took[-1])
    fast = [summary(build_index(saved))] + [summary(i) for i in shared_index(saved, 3)]
    assert sum(took) > 0 and 0 in took  # columns took entries; a shard's split tensor made one go one by one
    monkeypatch.setattr(_index, "_add_columns", lambda *a: 0)
    slow = [summary(build_index(saved))] + [summary(i) for i in shared_index(saved, 3)]
    assert fast == slow


@pytest.mark.parametrize("order", ["reversed", "local first", "local in the middle"])
def test_the_index_does_not_depend_on_the_order_of_a_headers_entries(saved, tmp_path, order):
    """Entries in any order (rank-local ones first, in the middle: not where a save writes them) give the same
    tensors and pieces: the columns take what they can, the entries after them go one by one."""

    def reorder(h: tp.Dict[str, tp.Any]) -> None:
        es = h["entries"]
        local = [e for e in es if e["key"].startswith("local/")]
        rest = [e for e in es if not e["key"].startswith("local/")]
        if order == "reversed":
            es.reverse()
        elif order == "local first":
            es[:] = local + rest
        else:
            es[:] = rest[: len(rest) // 2] + local + rest[len(rest) // 2 :]

    step = tmp_path / STEP
    shutil.copytree(saved, step)
    for shard in range(3):
        damage.rewrite_shard(step, shard, reorder)
    want = summary(build_index(saved))
    for got in [build_index(step)] + shared_index(step, 2):
        assert isinstance(got, Index), got
        s = summary(got)
        assert (s[0], s[1], s[3], s[4]) == (want[0], want[1], want[3], want[4]), order  # header crcs differ


# the crafted headers that change the state trees, which only shard 0 holds
TREE_KINDS = {"missing tensor", "trees not a dict", "no trees", "deep tree", "dict pair not a pair"}
TREE_KINDS |= {"unhashable key", "tuple not a list", "bf16 as numpy"}
CASES = [(k, 0) for k in sorted(CRAFTED)] + [(k, 2) for k in sorted(CRAFTED) if k not in TREE_KINDS]


@pytest.mark.parametrize("kind,shard", CASES)
def test_damage_one_process_finds_is_found_by_some_rank(saved, tmp_path, kind, shard):
    step = tmp_path / STEP
    shutil.copytree(saved, step)
    damage.rewrite_shard(step, shard, CRAFTED[kind])
    with pytest.raises(CheckpointFormatError):
        build_index(step)
    for world in (2, 3, 4):
        got = shared_index(step, world)
        errors = [str(i) for i in got if isinstance(i, CheckpointFormatError)]
        assert errors, (kind, shard, world)
        assert all("\n" not in e for e in errors)


def test_a_restores_index_exchange_of_thousands_of_tensors_fits_one_collective_only_compressed(tmp_path):
    """The restore exchanges every rank's share of the index in one collective of ``SHARE_INLINE``-byte rows,
    compressed (``Comm.all_gather_with(compress=True)``). For 4000 small tensors (1000 parameters and their Adam
    state) saved by 4 ranks every share's compressed pickle fits the row; the largest share uncompressed (shard 0's,
    which carries the state trees too: ~260 KB) would not, and would take a second collective."""
    from hpctrain.ckpt._commit import wire_bytes
    from hpctrain.ckpt._index import SHARE_INLINE, index_share

    run_world(w.save_many_small, 4, str(tmp_path), 1000)
    step_dir = tmp_path / "step-000000001"
    sent = []
    for r in range(4):
        message, manifest = index_share(step_dir, r, 4)
        assert message[0] == "" and manifest is not None, message[0]
        sent.append((len(wire_bytes((1, message))), len(wire_bytes((1, message), compress=True))))  # as restore sends
    assert max(c for _, c in sent) <= SHARE_INLINE, sent
    assert max(b for b, _ in sent) > SHARE_INLINE, sent
