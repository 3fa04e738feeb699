"""The contiguous (pread) read path: samples scattered straight into the batch rows, blocks in the order the
task needs them, small keys (labels) read with the small gaps between their blocks. Whatever the order of the
reads, every row must hold its sample, across files, block edges and repeats."""

from __future__ import annotations

import h5py
import numpy as np

from hpctrain.data._h5 import _GAP_BYTES, _SKIP_BYTES, _SKIP_SHARE, Reader, scan


def _write(path, start, n):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(start, start + n, dtype=np.float32)[:, None].repeat(80, 1))
        f.create_dataset("y", data=np.arange(start, start + n, dtype=np.int64))


def _batches(rng, n, sizes):
    return [rng.integers(0, n, size=s) for s in sizes]


def test_scattered_ids_over_two_files_land_in_their_rows(tmp_path):
    _write(tmp_path / "a.h5", 0, 700)
    _write(tmp_path / "b.h5", 700, 500)
    lay = scan([str(tmp_path / "a.h5"), str(tmp_path / "b.h5")], ["x", "y"], block_bytes=20 * 320)
    assert all(fi.keys["x"].offset is not None for fi in lay.files)  # the preadv path, not libhdf5
    rng = np.random.default_rng(3)
    reader = Reader(lay)
    for sizes in ([64, 64, 64], [1], [200, 7]):
        ids = _batches(rng, lay.num_samples, sizes)
        ids[0][-3:] = ids[0][0]  # a repeated sample (padding) in a batch and across batches
        ids[-1][0] = ids[0][0]
        outs = [{"x": np.full((s, 80), -1, np.float32), "y": np.full(s, -1, np.int64)} for s in sizes]
        reader.read(ids, outs)
        for i, out in zip(ids, outs):
            np.testing.assert_array_equal(out["y"], i)
            np.testing.assert_array_equal(out["x"], i[:, None].astype(np.float32).repeat(80, 1))
    reader.close()


def test_label_reads_take_small_gaps_only(tmp_path):
    _write(tmp_path / "a.h5", 0, 20000)
    lay = scan([str(tmp_path / "a.h5")], ["y"], block_bytes=8 * 100)  # 100 labels a block: 200 blocks
    reader = Reader(lay)
    ids = np.array([0, 19999, 150, 1000])  # blocks 0, 1, 10, 199: gaps of 0, 8, 188 blocks
    out = {"y": np.empty(4, np.int64)}
    reader.read([ids], [out])
    np.testing.assert_array_equal(out["y"], ids)
    # blocks 0-10 in one read (its 8-block gap is 6.4 kB); block 199 alone: 188 blocks apart is more than
    # _GAP_BYTES, so the gap is not read
    assert 188 * 800 > _GAP_BYTES
    assert reader.bytes_read == (11 + 1) * 100 * 8
    reader.close()


def test_rows_a_task_does_not_need_are_not_read_when_the_gap_is_long(tmp_path):
    # a task that needs a few rows of a block (a shuffle window two tasks share) reads those rows and the short
    # gaps between them, not the whole block: no read amplification at a task's ends
    _write(tmp_path / "a.h5", 0, 1000)
    lay = scan([str(tmp_path / "a.h5")], ["x"], block_bytes=500 * 320)  # 320-byte rows, 500 rows a block: 2 blocks
    skip = max(_SKIP_BYTES // 320, 500 // _SKIP_SHARE)
    reader = Reader(lay)
    ids = np.array([10, 11, 12 + skip - 1, 400, 700])  # rows 10..12+skip-1 one span (gap skip-1); 400; 700
    out = {"x": np.full((5, 80), -1, np.float32)}
    reader.read([ids], [out])
    np.testing.assert_array_equal(out["x"], ids[:, None].astype(np.float32).repeat(80, 1))
    assert reader.bytes_read == (skip + 2 + 1 + 1) * 320
    whole = [np.arange(500, 1000)]  # every row of block 1: the whole block, one span
    reader.bytes_read = 0
    out = {"x": np.full((500, 80), -1, np.float32)}
    reader.read(whole, [out])
    np.testing.assert_array_equal(out["x"][:, 0], np.arange(500, 1000, dtype=np.float32))
    assert reader.bytes_read == 500 * 320
    reader.close()


def test_short_gaps_in_a_block_are_read_through_so_a_block_takes_few_reads(tmp_path):
    # 8 kB rows, 64 rows a block: a gap of 5 unneeded rows (40 kB, over _SKIP_BYTES) is still read through, since
    # it is under an eighth of the block (8 rows): a block costs at most ~9 reads, never one per row
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(128, dtype=np.float32)[:, None].repeat(2048, 1))
    lay = scan([str(tmp_path / "a.h5")], ["x"], block_bytes=64 * 8192)
    assert 5 * 8192 >= _SKIP_BYTES and 5 < 64 // _SKIP_SHARE
    reader = Reader(lay)
    ids = np.array([0, 6, 12, 30])  # gaps of 5, 5 (read through) and 17 (skipped)
    out = {"x": np.full((4, 2048), -1, np.float32)}
    reader.read([ids], [out])
    np.testing.assert_array_equal(out["x"][:, 0], ids.astype(np.float32))
    assert reader.bytes_read == (13 + 1) * 8192
    reader.close()


def test_tasks_that_end_at_window_edges_read_each_window_about_once(tmp_path):
    """A shuffle window two read tasks share is read by both (each needs rows all over its blocks): tasks of a
    fixed size that does not match the windows read ~1.27x the data here, tasks cut by ``EpochPlan.task_end``
    (at most half a batch of a window left to share, which the reader skips around) ~1.003x. Every row still holds
    its sample."""
    from hpctrain.data._order import EpochOrder, EpochPlan

    n, width, batch = 1600, 3072, 16  # 12 KiB rows: a gap of a few rows is worth a read of its own (_SKIP_BYTES)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(n, dtype=np.float32)[:, None].repeat(width, 1))
        f.create_dataset("y", data=np.arange(n, dtype=np.int64))
    row = width * 4 + 8
    lay = scan([str(tmp_path / "a.h5")], ["x", "y"], block_bytes=40 * row)  # 40-sample blocks
    plan = EpochPlan(EpochOrder(lay.block_starts, 0, 0, 4, True), batch, 1, "drop")  # windows of 160 samples
    most = 17  # 272 samples: 1.7 windows
    read = {}
    for how in ("fixed", "aligned"):
        reader, first = Reader(lay), 0
        while first < plan.num_batches:
            end = plan.task_end(first, most, 0, 1) if how == "aligned" else min(plan.num_batches, first + most)
            ids, _ = plan.slots(np.arange(first, end), 0, 1)
            outs = [{"x": np.empty((batch, width), np.float32), "y": np.empty(batch, np.int64)} for _ in ids]
            reader.read(list(ids), outs)
            for i, out in zip(ids, outs):
                np.testing.assert_array_equal(out["y"], i)
                np.testing.assert_array_equal(out["x"][:, -1], i.astype(np.float32))
            first = end
        read[how] = reader.bytes_read / (plan.num_batches * batch * row)
        reader.close()
    assert read["fixed"] > 1.2
    assert read["aligned"] < 1.02
