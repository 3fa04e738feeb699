"""The restore's joint verification (``_fetch._verify``): when the ranks together read every byte of every shard,
each rank decides every shard's verdict from the read reports alone (no collective: the same reports give the
same verdicts everywhere); when some bytes were read by nobody, the shard's owner reads them and the ranks agree.

The reports are built here as ranks would send them (crc32 of the byte ranges each read), from a real 3-rank
checkpoint's files; a Comm stand-in counts the collectives."""

from __future__ import annotations

import typing as tp
import zlib
from pathlib import Path

import pytest

from hpctrain.ckpt._fetch import _verify
from hpctrain.ckpt._index import build_index
from tests.ckpt import workers as w
from tests.multiproc import run_world


class CountingComm:
    """The two collectives ``_verify`` may use, for one rank whose peers agree with it."""

    def __init__(self) -> None:
        self.calls = 0

    def all_gather_ints(self, values: tp.Sequence[int]) -> tp.List[tp.List[int]]:
        self.calls += 1
        return [list(values)]

    def all_gather(self, obj: tp.Any) -> tp.List[tp.Any]:
        self.calls += 1
        return [obj]


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("verify")
    run_world(w.save_steps, 3, str(d), [1])
    return d / "step-000000001"


def reports(step_dir: Path, cut: float = 1.0) -> tp.List[tp.Tuple[str, tp.Dict[int, tp.List[tp.Tuple[int, int, int]]]]]:
    """One report per shard as its rank sends it after reading the data part of every shard: (start, end, crc32)
    of what it read; ``cut`` < 1: the last part of each shard's data read by nobody."""
    index = build_index(step_dir)
    out = []
    for i, s in enumerate(index.shards):
        raw = (step_dir / s["file"]).read_bytes()
        start = index.data_starts[i]
        end = start + int((s["bytes"] - start) * cut)
        out.append(("", {i: [(start, end, zlib.crc32(raw[start:end]))]}))
    return out


def test_every_byte_read_decides_without_a_collective(step_dir: Path) -> None:
    index, comm = build_index(step_dir), CountingComm()
    assert _verify(index, reports(step_dir), 0, 3, comm) == []
    assert comm.calls == 0


def test_a_damaged_byte_fails_on_every_rank_without_a_collective(step_dir: Path) -> None:
    index = build_index(step_dir)
    got = reports(step_dir)
    _, segs = got[1]
    (a, b, crc) = segs[1][0]
    got[1] = ("", {1: [(a, b, crc ^ 1)]})  # what rank 1 read was not what was written
    for rank in range(3):  # every rank reaches the same verdict from the same reports
        comm = CountingComm()
        errors = _verify(index, got, rank, 3, comm)
        assert len(errors) == 1 and "rank-00001" in errors[0] and "checksum mismatch" in errors[0]
        assert comm.calls == 0


def test_bytes_nobody_read_are_read_by_the_owner_and_agreed(step_dir: Path) -> None:
    index, comm = build_index(step_dir), CountingComm()
    assert _verify(index, reports(step_dir, cut=0.5), 0, 3, comm) == []
    assert comm.calls == 1  # the verdicts' agreement (its second collective only on failure)


def test_a_full_restore_reads_every_byte_and_verifies_without_a_collective_of_its_own(step_dir: Path) -> None:
    """A real 3-rank restore of every state, RNG included: the ranks' reads cover every byte of every shard (the
    alignment padding after each file region as well, before the rank-local RNG state that starts at the next
    64-byte boundary), so no owner reads what nobody read: three collectives in all (the index exchange, the
    plan's agreement, the read reports), not a fourth for the verdicts."""
    got = run_world(w.restore_collectives, 3, str(step_dir.parent)).results
    assert all(g["step"] == 1 for g in got)
    assert len({g["hash"] for g in got}) == 1 and got[0]["hash"] == w.expected_hash(1)
    for g in got:
        assert g["calls"] == ["all_gather_with", "all_gather_ints", "all_gather_with"], g["calls"]
