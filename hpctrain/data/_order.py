"""The epoch order, rank sharding, tail policy and the resume arithmetic. Pure numpy, no I/O, no torch.

Vocabulary (see ``docs/data.md``):

* *block*: the read unit, a run of consecutive samples of one file (an HDF5 chunk along axis 0, or
  ``block_bytes`` of a contiguous dataset). ``block_starts[i]`` is the global id of block i's first sample.
* *stream* ``S``: the epoch's global order. Blocks are permuted (seeded by ``(seed, epoch)``), cut into
  windows of ``window`` consecutive permuted blocks, and samples are permuted inside each window.
* *partitions*: ``S`` is cut into ``P`` contiguous, near-equal pieces. Global batch ``b`` takes
  ``B/P`` consecutive samples from each partition, so a rank that owns whole partitions reads only the
  blocks of those partitions.
* *slot* ``(b, j)``: position j of global batch b; rank r of R owns slots ``j ∈ [r·B/R, (r+1)·B/R)``.

Nothing here depends on the world size or the worker count except the slot → rank split, so a
position "global batch b of epoch e" means the same samples on any topology: that is the resume.
"""

from __future__ import annotations

import typing as tp

import numpy as np

from hpctrain.errors import UsageError

__all__ = ["EpochOrder", "EpochPlan", "batches_per_epoch"]


class EpochOrder:
    """The stream ``S`` of one epoch, evaluated lazily: memory is O(blocks + window), not O(samples)."""

    def __init__(self, block_starts: np.ndarray, seed: int, epoch: int, window: int, shuffle: bool) -> None:
        self.block_starts = np.asarray(block_starts, dtype=np.int64)
        self.num_samples = int(self.block_starts[-1])
        self.seed, self.epoch, self.window, self.shuffle = int(seed), int(epoch), int(window), bool(shuffle)
        nblocks = len(self.block_starts) - 1
        sizes = np.diff(self.block_starts)
        if shuffle:
            self.perm = np.random.default_rng([self.seed, self.epoch, 0]).permutation(nblocks)
        else:
            self.perm = np.arange(nblocks)
        # seq_starts[k]: stream position of the k-th permuted block's first sample
        self.seq_starts = np.concatenate([[0], np.cumsum(sizes[self.perm])]).astype(np.int64)
        self.win_starts = self.seq_starts[np.arange(0, nblocks + self.window, self.window).clip(max=nblocks)]
        self.win_starts = np.unique(self.win_starts)
        self._cache: tp.Dict[int, np.ndarray] = {}

    def _window_perm(self, w: int) -> np.ndarray:
        perm = self._cache.get(w)
        if perm is None:
            size = int(self.win_starts[w + 1] - self.win_starts[w])
            perm = np.random.default_rng([self.seed, self.epoch, 1, w]).permutation(size)
            if len(self._cache) >= 8:
                self._cache.pop(next(iter(self._cache)))
            self._cache[w] = perm
        return perm

    def ids(self, pos: np.ndarray) -> np.ndarray:
        """Global sample ids at stream positions ``pos`` (any shape, values in [0, num_samples))."""
        pos = np.asarray(pos, dtype=np.int64)
        flat = pos.reshape(-1)
        if self.shuffle and len(flat):
            w = np.searchsorted(self.win_starts, flat, side="right") - 1
            lo, hi = int(w.min()), int(w.max())
            base = int(self.win_starts[lo])
            if int(self.win_starts[hi + 1]) - base <= 2 * len(flat):
                # the positions fill the windows they touch (a loader task, one partition): one lookup table
                # over those windows and one gather, not a mask per window (the consumer's CPU per task)
                lut = np.concatenate([self.win_starts[v] + self._window_perm(v) for v in range(lo, hi + 1)])
                flat = lut[flat - base]
            else:  # sparse (many partitions, a few positions): only the windows that hold one
                mixed = np.empty_like(flat)
                for win in np.unique(w):
                    sel = w == win
                    start = self.win_starts[win]
                    mixed[sel] = start + self._window_perm(int(win))[flat[sel] - start]
                flat = mixed
        k = np.searchsorted(self.seq_starts, flat, side="right") - 1
        out = self.block_starts[self.perm[k]] + (flat - self.seq_starts[k])
        return out.reshape(pos.shape)


def batches_per_epoch(num_samples: int, global_batch: int, partitions: int, tail: str) -> int:
    """Global batches in one epoch (the same on every rank)."""
    per = global_batch // partitions
    if tail == "drop":
        return (num_samples // partitions) // per
    per_partition = -(-num_samples // partitions)  # ceil(N/P)
    return -(-per_partition // per)


class EpochPlan:
    """Which samples each rank reads for each global batch of one epoch."""

    def __init__(self, order: EpochOrder, global_batch: int, partitions: int, tail: str) -> None:
        n, self.order = order.num_samples, order
        self.global_batch, self.partitions, self.tail = global_batch, partitions, tail
        if n < partitions:
            raise UsageError(f"the dataset has {n} samples, fewer than partitions={partitions}; lower partitions")
        self.per_part = global_batch // partitions
        self.part_starts = (np.arange(partitions + 1, dtype=np.int64) * n) // partitions
        self.part_len = np.diff(self.part_starts)
        self.num_batches = batches_per_epoch(n, global_batch, partitions, tail)

    def task_end(self, first: int, most: int, rank: int, world_size: int) -> int:
        """Where a read task of at most ``most`` batches from batch ``first`` should end (exclusive): at the batch
        nearest the last shuffle-window boundary of this rank's part of the stream that lies in the task's second
        half, else after ``most`` batches (or at the epoch's end, when that comes first).

        A window whose samples two tasks share is read by both: each needs some of its rows, scattered over all of
        its blocks. Ending tasks where windows end leaves them at most half a batch of rows to share, which the
        reader skips around (``_h5._spans``) instead of reading whole blocks twice. Which samples each batch holds
        does not change: only how batches are grouped into tasks."""
        last = first + most
        if last >= self.num_batches or most < 2:  # the epoch's end is a window's end too
            return min(last, self.num_batches)
        j0 = rank * (self.global_batch // world_size)
        p = min(j0 // self.per_part, self.partitions - 1)  # the rank's (first) partition
        base = int(self.part_starts[p]) + j0 % self.per_part
        lo = base + (first + (most + 1) // 2) * self.per_part  # stream positions of the second half (> 0)
        hi = base + last * self.per_part
        ws = self.order.win_starts  # ws[0] == 0 < lo
        w = int(ws[np.searchsorted(ws, hi, side="right") - 1])  # the last boundary at or before the task's end
        if w < lo:
            return last
        end = int(round((w - base) / self.per_part))  # the batch edge nearest the boundary
        return max(first + 1, min(last, end))

    def slots(self, batches: np.ndarray, rank: int, world_size: int) -> tp.Tuple[np.ndarray, np.ndarray]:
        """(ids, valid) of shape (len(batches), B/R) for this rank; invalid slots repeat a real sample."""
        if self.global_batch % world_size:
            raise UsageError(
                f"global_batch_size {self.global_batch} is not divisible by the world size "
                f"{world_size}; pick a global batch that every world size you use divides"
            )
        local = self.global_batch // world_size
        j = np.arange(rank * local, (rank + 1) * local, dtype=np.int64)
        p = j // self.per_part
        off = np.asarray(batches, dtype=np.int64)[:, None] * self.per_part + (j % self.per_part)[None, :]
        plen = self.part_len[p][None, :]
        valid = off < plen
        pos = self.part_starts[p][None, :] + np.where(valid, off, off % plen)
        return self.order.ids(pos), valid
