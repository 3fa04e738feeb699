"""HDF5 access: opening without file locking, validation with one-line errors, the block table, and the
chunk-aware reader used inside each worker. numpy + h5py only (the login-node CLI imports this).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import typing as tp
from dataclasses import dataclass, field

import numpy as np

from hpctrain.data._resolve import Identity, check_identity, dataset_files, identity, open_dataset, open_identity
from hpctrain.errors import UsageError

_DIRECT_MIN_BYTES = 256  # smaller samples (labels) are cheaper through one staging read + gather
_GAP_BYTES = 64 << 10  # a staging pread also reads a gap this small between two needed blocks (see Reader.read)
# The direct path skips a run of rows of a block that the task does not need (one more ``preadv``) when it is at
# least _SKIP_BYTES and 1/_SKIP_SHARE of the block long, and reads it into a scratch row when shorter. A block whose
# rows the task needs only in part, as at a task's ends (a shuffle window that two tasks share), is then read only in
# part, in at most ~9 reads (each skip is an eighth of the block: a parallel filesystem sees few small reads, not one
# per row); a block needed whole or nearly so is one read. Read amplification in the benchmark 1.068 -> 1.022.
_SKIP_BYTES = 24 << 10
_SKIP_SHARE = 8
# numpy dtypes torch.from_numpy accepts (torch 2.x): anything else fails at the first batch, so refuse it early
TORCH_DTYPES = frozenset(
    np.dtype(t).str for t in ("f8", "f4", "f2", "c8", "c16", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "b1")
)

try:  # ISA-L's inflate is 2-3x zlib's on one core; optional (pip install 'hpctrain[fast]')
    from isal.isal_zlib import decompress as _inflate
    from isal.isal_zlib import error as _InflateError

    INFLATER = "isal"
except ImportError:  # pragma: no cover - depends on the environment
    from zlib import decompress as _inflate  # type: ignore[assignment]
    from zlib import error as _InflateError  # type: ignore[assignment]

    INFLATER = "zlib"

# what h5py raises on damaged metadata (byte flips, truncation): turned into one UsageError naming the file
DAMAGE_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, SystemError, IndexError, OverflowError)


def damaged(path: str, exc: BaseException) -> UsageError:
    why = " ".join(str(exc).split())[:200] or type(exc).__name__
    return UsageError(f"{path}: HDF5 metadata cannot be read (damaged file?): {why}; regenerate or re-copy the file")


__all__ = ["open_h5", "KeyInfo", "FileInfo", "Layout", "scan", "Reader"]


def open_h5(path: str, rdcc_nbytes: tp.Optional[int] = None) -> tp.Any:
    """Open read-only with HDF5 file locking off (flock fails on some Lustre/DVS mounts and costs MDS ops).

    Raises a one-line :class:`UsageError` naming the file for a missing, non-HDF5 or truncated file.
    """
    import h5py

    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file; check the path")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory, not an HDF5 file")
    if os.path.getsize(path) == 0 or not h5py.is_hdf5(path):
        raise UsageError(f"{path}: not an HDF5 file (empty, truncated, or another format); regenerate or fix the path")
    kwargs: tp.Dict[str, tp.Any] = {"locking": False}
    if rdcc_nbytes is not None:
        kwargs.update(rdcc_nbytes=rdcc_nbytes, rdcc_nslots=10007, rdcc_w0=1.0)
    try:
        return h5py.File(path, "r", **kwargs)
    except OSError as exc:
        why = " ".join(str(exc).split())
        hint = "truncated (an interrupted copy?)" if "truncated" in why or "eof" in why.lower() else "unreadable"
        raise UsageError(f"{path}: HDF5 file is {hint}: {why[:200]}") from None


@dataclass
class KeyInfo:
    """One dataset of one file."""

    dtype: str
    sample_shape: tp.Tuple[int, ...]
    length: int
    chunk_rows: tp.Optional[int]
    """Samples per HDF5 chunk along axis 0; None for contiguous storage."""
    compression: tp.Optional[str]
    offset: tp.Optional[int]
    """Byte offset of a contiguous, unfiltered dataset (read with pread, bypassing libhdf5)."""
    chunk_bytes: tp.Optional[int] = None
    inflate: bool = False
    """Whole-sample chunks whose only filter is deflate: read raw with ``read_direct_chunk`` and inflated
    here (ISA-L when installed) instead of through libhdf5's filter pipeline."""

    @property
    def sample_bytes(self) -> int:  # on the read path for every block: plain ints, no numpy reduction
        return np.dtype(self.dtype).itemsize * math.prod(int(d) for d in self.sample_shape)


@dataclass
class FileInfo:
    path: str
    size: int
    keys: tp.Dict[str, KeyInfo]
    identity: tp.Optional[Identity] = None
    """(device, inode, size, mtime_ns) at the scan; readers refuse a file that no longer matches."""
    linked: tp.Dict[str, Identity] = field(default_factory=dict)
    """Other files the keys read from (external-link targets, virtual-dataset sources) and their identities."""

    @property
    def length(self) -> int:
        return next(iter(self.keys.values())).length


@dataclass
class Layout:
    """Everything the order and the readers need, picklable and small (O(files + blocks))."""

    files: tp.List[FileInfo]
    keys: tp.Tuple[str, ...]
    file_starts: np.ndarray
    block_starts: np.ndarray
    fingerprint: str = field(default="")

    @property
    def num_samples(self) -> int:
        return int(self.file_starts[-1])

    def sample_bytes(self) -> int:
        return sum(self.files[0].keys[k].sample_bytes for k in self.keys)


def key_info(path: str, f: tp.Any, key: str, linked: tp.Optional[tp.Dict[str, Identity]] = None) -> KeyInfo:
    """Validate one key of an open file and describe how to read it. Files other than ``path`` that the key
    reads from (external links, virtual sources) are added to ``linked`` with their identities."""
    ds = open_dataset(path, f, key)
    if ds.ndim == 0:
        raise UsageError(f"{path}: {key!r} is a scalar; datasets must be indexed by sample along axis 0")
    if ds.dtype.hasobject or ds.dtype.kind in "OVSUM" or ds.dtype.fields is not None:
        raise UsageError(
            f"{path}: {key!r} has dtype {ds.dtype} (variable-length, string, compound or opaque), which "
            f"torch tensors cannot hold; store numeric datasets (one per field)"
        )
    if ds.dtype.newbyteorder("=").str not in TORCH_DTYPES:
        raise UsageError(
            f"{path}: {key!r} has dtype {ds.dtype} ({ds.dtype.itemsize} bytes), which torch tensors cannot hold; "
            f"store it as float64/float32/float16, complex64/128, (u)int8-64 or bool"
        )
    deps = dataset_files(path, ds)
    if linked is not None:
        linked.update(deps)
    elsewhere = os.path.realpath(ds.file.filename) != os.path.realpath(path)  # through an external link
    chunk_rows = ds.chunks[0] if ds.chunks else None
    offset = None
    # the preadv path reads the configured file at this offset: only for data stored in that very file
    if ds.chunks is None and not ds.compression and ds.dtype.isnative and not ds.is_virtual and not elsewhere:
        off = ds.id.get_offset()
        offset = None if off is None else int(off)  # None: never written (all fill value)
    chunk_bytes = int(np.prod(ds.chunks, dtype=np.int64)) * ds.dtype.itemsize if ds.chunks else None
    inflate = bool(
        ds.chunks
        and tuple(ds.chunks[1:]) == tuple(ds.shape[1:])
        and ds.compression == "gzip"
        and ds.dtype.isnative
        and ds.id.get_create_plist().get_nfilters() == 1
    )
    native = ds.dtype.newbyteorder("=")  # big-endian files are converted by libhdf5 on read
    return KeyInfo(
        native.str,
        tuple(int(s) for s in ds.shape[1:]),
        int(ds.shape[0]),
        chunk_rows,
        ds.compression,
        offset,
        chunk_bytes,
        inflate,
    )


def scan(files: tp.Sequence[str], keys: tp.Sequence[str], block_bytes: int = 4 << 20) -> Layout:
    """Open every file once, validate it, and build the block table. Errors name the file and the key."""
    infos: tp.List[FileInfo] = []
    for path in files:
        linked: tp.Dict[str, Identity] = {}
        with open_h5(path) as f:
            try:
                kinfo = {k: key_info(path, f, k, linked) for k in keys}
            except UsageError:
                raise
            except DAMAGE_ERRORS as exc:
                raise damaged(path, exc) from None
            ident = open_identity(f)
        lengths = {k: ki.length for k, ki in kinfo.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
            raise UsageError(
                f"{path}: datasets have different lengths along axis 0 ({detail}); "
                f"every key must hold one entry per sample"
            )
        if infos:
            for k in keys:
                a, b = infos[0].keys[k], kinfo[k]
                if (a.dtype, a.sample_shape) != (b.dtype, b.sample_shape):
                    raise UsageError(
                        f"{path}: key {k!r} is {np.dtype(b.dtype).name}{list(b.sample_shape)} but "
                        f"{infos[0].path} has {np.dtype(a.dtype).name}{list(a.sample_shape)}; "
                        f"files must agree"
                    )
        infos.append(FileInfo(path, ident[2], kinfo, ident, linked))
    counts = np.array([fi.length for fi in infos], dtype=np.int64)
    if counts.sum() == 0:
        raise UsageError(
            f"{files[0]}{' ...' if len(files) > 1 else ''}: zero samples in key {keys[0]!r}; nothing to train on"
        )
    file_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    blocks = []
    for fi, start in zip(infos, file_starts[:-1]):
        ref = fi.keys[keys[0]]
        rows = ref.chunk_rows or max(1, block_bytes // max(1, sum(fi.keys[k].sample_bytes for k in keys)))
        blocks.append(start + np.arange(0, fi.length, rows, dtype=np.int64))
    block_starts = np.concatenate(blocks + [file_starts[-1:]]).astype(np.int64)
    layout = Layout(infos, tuple(keys), file_starts, block_starts)
    layout.fingerprint = fingerprint(layout)
    return layout


def fingerprint(layout: Layout) -> str:
    """Identity of the data as the order sees it: file names (not directories, so staging copies match),
    sizes, per-key dtype/shape/length, and the block table."""
    desc = [
        [
            os.path.basename(fi.path),
            fi.size,
            {k: [ki.dtype, list(ki.sample_shape), ki.length] for k, ki in sorted(fi.keys.items())},
        ]
        for fi in layout.files
    ]
    h = hashlib.sha256(json.dumps(desc, sort_keys=True).encode())
    h.update(layout.block_starts.tobytes())
    return h.hexdigest()[:16]


def _merge_runs(
    flat: np.ndarray, starts: np.ndarray, stops: np.ndarray, fstart: np.ndarray, gap: int
) -> tp.Tuple[np.ndarray, ...]:
    """The reads that cover blocks ``[starts, stops)`` (sorted, of files ``fstart``): neighbours of one file
    at most ``gap`` samples apart merge into one read (0: only adjacent ones). Returns the runs' first and
    end samples, files and first rows in the concatenated runs (+ the total), and each id of ``flat``'s row."""
    brk = np.ones(len(starts), dtype=bool)
    brk[1:] = (starts[1:] - stops[:-1] > gap) | (fstart[1:] != fstart[:-1])
    idx = np.flatnonzero(brk)
    run_a, run_f = starts[idx], fstart[idx]
    run_b = np.append(stops[idx[1:] - 1], stops[-1]) if len(idx) else idx
    run_dest = np.concatenate([[0], np.cumsum(run_b - run_a)]).astype(np.int64)
    r = np.searchsorted(run_a, flat, side="right") - 1
    return run_a, run_b, run_f, run_dest, run_dest[r] + (flat - run_a[r])


def _spans(needed: np.ndarray, skip: int) -> tp.List[tp.Tuple[int, int]]:
    """The row ranges ``[lo, hi)`` of a block to read: from each needed row to the next needed one, cut wherever
    ``skip`` or more unneeded rows lie between them (those are not read); rows before the first needed one and
    after the last one are not read."""
    idx = np.flatnonzero(needed)
    if not len(idx):
        return []
    cut = np.flatnonzero(np.diff(idx) > skip)
    return list(zip(idx[np.r_[0, cut + 1]].tolist(), (idx[np.r_[cut, len(idx) - 1]] + 1).tolist()))


class Reader:
    """Reads arbitrary sample ids by reading whole blocks (chunks / large ranges), once each, then gathering.

    Opened lazily in the process that uses it; holds no handle when pickled.
    """

    def __init__(self, layout: Layout, rdcc_nbytes: int = 16 << 20) -> None:
        self.layout, self.rdcc_nbytes = layout, rdcc_nbytes
        self._h5: tp.Dict[int, tp.Any] = {}
        self._fds: tp.Dict[int, int] = {}
        self._staging: tp.Dict[str, np.ndarray] = {}
        self._datasets: tp.Dict[tp.Tuple[int, str], tp.Any] = {}
        self._row_cache: tp.Dict[int, tp.List[memoryview]] = {}
        self._scratch: tp.Optional[memoryview] = None
        self.bytes_read = 0

    def __getstate__(self) -> tp.Dict[str, tp.Any]:
        return {"layout": self.layout, "rdcc_nbytes": self.rdcc_nbytes}

    def __setstate__(self, state: tp.Dict[str, tp.Any]) -> None:
        self.__init__(state["layout"], state["rdcc_nbytes"])  # type: ignore[misc]

    def close(self) -> None:
        for f in self._h5.values():
            f.close()
        for fd in self._fds.values():
            os.close(fd)
        self._datasets.clear()
        self._h5.clear()
        self._fds.clear()

    def _file(self, i: int) -> tp.Any:
        f = self._h5.get(i)
        if f is None:
            fi = self.layout.files[i]
            f = open_h5(fi.path, self.rdcc_nbytes)
            try:
                if fi.identity is not None:
                    check_identity(fi.path, fi.identity, open_identity(f))
                for name, ident in fi.linked.items():
                    try:
                        now = identity(os.stat(name))
                    except OSError:
                        now = (0, 0, 0, 0)
                    check_identity(name, ident, now)
            except BaseException:
                f.close()
                raise
            self._h5[i] = f
        return f

    def _fd(self, i: int) -> int:
        fd = self._fds.get(i)
        if fd is None:
            fi = self.layout.files[i]
            try:
                fd = os.open(fi.path, os.O_RDONLY)
            except OSError as exc:
                raise UsageError(f"{fi.path}: cannot open: {exc.strerror}; was it removed while the job ran?") from None
            try:
                if fi.identity is not None:
                    check_identity(fi.path, fi.identity, identity(os.fstat(fd)))
            except BaseException:
                os.close(fd)
                raise
            self._fds[i] = fd
        return fd

    def _buffer(self, key: str, rows: int) -> np.ndarray:
        ki = self.layout.files[0].keys[key]
        buf = self._staging.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = self._staging[key] = np.empty((max(rows, 1),) + ki.sample_shape, dtype=ki.dtype)
        return buf

    def _read_run(self, key: str, fidx: int, a: int, b: int, dest: np.ndarray) -> None:
        """Rows [a, b) of file fidx into dest (C-contiguous, b - a rows)."""
        fi = self.layout.files[fidx]
        ki = fi.keys[key]
        if ki.offset is not None:
            view = memoryview(dest.reshape(-1).view(np.uint8))
            pos, off = 0, ki.offset + a * ki.sample_bytes
            while pos < len(view):
                n = os.preadv(self._fd(fidx), [view[pos:]], off + pos)
                if n <= 0:
                    raise UsageError(f"{fi.path}: key {key!r}: file ends before the data does (truncated?)")
                pos += n
        elif b > a:
            try:
                self._file(fidx)[key].read_direct(dest, np.s_[a:b], np.s_[0 : b - a])
            except DAMAGE_ERRORS as exc:
                why = " ".join(str(exc).split())[:200]
                raise UsageError(
                    f"{fi.path}: key {key!r}: read of samples {a}..{b} failed (corrupt or truncated file?): {why}"
                ) from None
        self.bytes_read += (b - a) * ki.sample_bytes

    def _chunk(self, fidx: int, key: str, ki: KeyInfo, cs: int) -> np.ndarray:
        """Samples [cs, cs + chunk_rows) of a deflate-only dataset: one raw chunk read, inflated here.
        A chunk that was never written (its samples are the fill value) goes through libhdf5."""
        c, fi = int(ki.chunk_rows or 1), self.layout.files[fidx]
        rows = min(c, ki.length - cs)
        shape = (rows,) + ki.sample_shape
        ds = self._datasets.get((fidx, key))
        if ds is None:
            ds = self._datasets[(fidx, key)] = self._file(fidx)[key]
        try:
            mask, raw = ds.id.read_direct_chunk((cs,) + (0,) * len(ki.sample_shape))
        except (OSError, KeyError, ValueError, RuntimeError):  # "chunk storage is not allocated"
            out = np.empty(shape, dtype=ki.dtype)
            try:
                ds.read_direct(out, np.s_[cs : cs + rows], np.s_[0:rows])
            except DAMAGE_ERRORS as exc:
                why = " ".join(str(exc).split())[:200]
                raise UsageError(
                    f"{fi.path}: key {key!r}: the chunk at sample {cs} cannot be read (corrupt file?): {why}"
                ) from None
            self.bytes_read += rows * ki.sample_bytes
            return out
        try:
            data = raw if mask & 1 else _inflate(raw, bufsize=c * ki.sample_bytes)  # bit 0: deflate skipped
        except _InflateError as exc:
            raise UsageError(
                f"{fi.path}: key {key!r}: the chunk at sample {cs} does not inflate (corrupt file?): {exc}"
            ) from None
        if len(data) < rows * ki.sample_bytes:
            raise UsageError(
                f"{fi.path}: key {key!r}: the chunk at sample {cs} holds {len(data)} bytes, "
                f"fewer than its {rows} samples (corrupt file?)"
            )
        self.bytes_read += rows * ki.sample_bytes
        return np.frombuffer(data, dtype=ki.dtype, count=rows * int(np.prod(ki.sample_shape, dtype=np.int64))).reshape(
            shape
        )

    def _read_inflate(
        self, key: str, flat: np.ndarray, sizes: tp.Sequence[int], outs: tp.Sequence[tp.Dict[str, np.ndarray]]
    ) -> None:
        """Deflate-only chunks: each needed chunk is read raw and inflated once, and its samples go
        straight from the inflated buffer into the batch rows (no staging copy, no libhdf5 filter)."""
        lay = self.layout
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        batch_of = np.repeat(np.arange(len(sizes)), sizes)
        row_of = np.arange(len(flat), dtype=np.int64) - bounds[batch_of]
        fidx = np.searchsorted(lay.file_starts, flat, side="right") - 1
        base = lay.file_starts[fidx]
        c = np.array([fi.keys[key].chunk_rows or 1 for fi in lay.files], dtype=np.int64)[fidx]
        chunk_start = base + ((flat - base) // c) * c  # global id of each sample's chunk's first sample
        order = np.argsort(chunk_start, kind="stable")
        cut = np.flatnonzero(np.diff(chunk_start[order])) + 1
        for grp in np.split(order, cut):
            f = int(fidx[grp[0]])
            cs_global = int(chunk_start[grp[0]])
            chunk = self._chunk(f, key, lay.files[f].keys[key], cs_global - int(lay.file_starts[f]))
            local, bi, ri = flat[grp] - cs_global, batch_of[grp], row_of[grp]
            if len(sizes) == 1 or (bi == bi[0]).all():
                outs[int(bi[0])][key][ri] = chunk[local]
                continue
            for i in np.unique(bi):
                sel = bi == i
                outs[int(i)][key][ri[sel]] = chunk[local[sel]]

    def read(self, ids: tp.Sequence[np.ndarray], outs: tp.Sequence[tp.Dict[str, np.ndarray]]) -> None:
        """For each batch i: ``outs[i][key][j] = sample ids[i][j]``. Each needed block (a whole chunk or a
        large contiguous range) is read once, merged with its neighbours, then samples are gathered."""
        lay = self.layout
        sizes = [int(np.size(a)) for a in ids]
        flat = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in ids])
        blk = np.unique(np.searchsorted(lay.block_starts, flat, side="right") - 1)
        starts, stops = lay.block_starts[blk], lay.block_starts[blk + 1]
        fstart = np.searchsorted(lay.file_starts, starts, side="right") - 1
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        runs: tp.Dict[int, tp.Tuple[np.ndarray, ...]] = {}  # by the gap merged over (samples)
        for key in lay.keys:
            pread = all(fi.keys[key].offset is not None for fi in lay.files)
            sample_bytes = lay.files[0].keys[key].sample_bytes
            if pread and sample_bytes >= _DIRECT_MIN_BYTES:
                self._read_direct(key, flat, sizes, outs)
                continue
            if all(fi.keys[key].inflate for fi in lay.files):
                self._read_inflate(key, flat, sizes, outs)
                continue
            # a pread key (labels) also reads the gaps between its blocks when they are small: a preadv and
            # its bookkeeping cost about as much as copying _GAP_BYTES (a task needs about half of the
            # blocks, so without this its labels are ~65 reads of ~700 bytes); libhdf5 keys read no gaps
            gap = _GAP_BYTES // max(1, sample_bytes) if pread else 0
            if gap not in runs:
                runs[gap] = _merge_runs(flat, starts, stops, fstart, gap)
            run_a, run_b, run_f, run_dest, rows = runs[gap]
            buf = self._buffer(key, int(run_dest[-1]))
            for a, b, f, d in zip(run_a, run_b, run_f, run_dest[:-1]):
                base = lay.file_starts[f]
                self._read_run(key, int(f), int(a - base), int(b - base), buf[d : d + (b - a)])
            for i, out in enumerate(outs):
                dest = out[key].reshape((sizes[i],) + buf.shape[1:])
                np.take(buf, rows[bounds[i] : bounds[i + 1]], axis=0, out=dest)

    def _rows(self, arr: np.ndarray) -> tp.List[memoryview]:
        """Byte views of each row of a (persistent) output array, cached."""
        views = self._row_cache.get(id(arr))
        if views is None or len(views) != len(arr):
            flat = memoryview(arr.reshape(len(arr), -1).view(np.uint8)).cast("B")
            step = arr[0].nbytes if len(arr) else 0
            views = self._row_cache[id(arr)] = [flat[i * step : (i + 1) * step] for i in range(len(arr))]
        return views

    def _read_direct(
        self, key: str, flat: np.ndarray, sizes: tp.Sequence[int], outs: tp.Sequence[tp.Dict[str, np.ndarray]]
    ) -> None:
        """Contiguous, unfiltered data: one ``preadv`` per block straight into the output rows (one copy,
        no staging, no libhdf5 lock); rows of the block that no batch needs land in a scratch row.

        Blocks go in the order the task first needs them, not in file order: ``flat`` is in stream order, so
        consecutive blocks then belong to one shuffle window and scatter into the same few batches, which
        keeps the copy's destination pages in the TLB and cache (file order jumps across every batch of the
        task: ~10 % more worker CPU per sample, issue 34's profile). Every block's iovecs come from one
        numpy scatter and one list, not a few numpy calls per block."""
        lay = self.layout
        if not len(flat):
            return
        dest: tp.List[memoryview] = []
        for i, out in enumerate(outs):
            dest.extend(self._rows(out[key])[: sizes[i]])
        sb = lay.files[0].keys[key].sample_bytes
        if self._scratch is None or len(self._scratch) < sb:
            self._scratch = memoryview(bytearray(sb))
        order = np.argsort(flat, kind="stable")
        sids = flat[order]
        first = np.ones(len(sids), dtype=bool)
        first[1:] = sids[1:] != sids[:-1]
        u_ids, u_pos = sids[first], order[first]  # distinct ids, sorted; where each first occurs in flat
        u_blk = np.searchsorted(lay.block_starts, u_ids, side="right") - 1
        g_start = np.flatnonzero(np.r_[True, u_blk[1:] != u_blk[:-1]])  # one group of u_ids per block
        a0s = lay.block_starts[u_blk[g_start]]
        lens = lay.block_starts[u_blk[g_start] + 1] - a0s
        go = np.argsort(np.minimum.reduceat(u_pos, g_start), kind="stable")  # blocks in first-needed order
        at = np.empty(len(go), dtype=np.int64)  # each block's first iovec, blocks laid out in that order
        at[go] = np.cumsum(lens[go]) - lens[go]
        gid = np.repeat(np.arange(len(g_start)), np.diff(np.r_[g_start, len(u_ids)]))
        need = np.full(int(lens.sum()), len(dest), dtype=np.int64)  # len(dest): the scratch row, added next
        need[at[gid] + (u_ids - a0s[gid])] = u_pos
        dest.append(self._scratch[:sb])
        iov = list(map(dest.__getitem__, need.tolist()))
        dest.pop()
        fidxs = np.searchsorted(lay.file_starts, a0s, side="right") - 1
        offsets = [lay.files[f].keys[key].offset for f in range(len(lay.files))]
        file_starts = lay.file_starts.tolist()
        step = max(1, min(1024, (64 << 20) // sb))  # IOV_MAX
        needed = need != len(dest)
        have = np.empty(len(at), dtype=np.int64)  # needed rows per block (reduceat wants the layout's order)
        have[go] = np.add.reduceat(needed, at[go], dtype=np.int64)
        sparse = (have < lens).tolist()
        skip = max(1, _SKIP_BYTES // sb)
        a0l, lenl, fidxl, atl = a0s.tolist(), lens.tolist(), fidxs.tolist(), at.tolist()
        for g in go.tolist():  # plain ints: this loop is Python
            a0, n, fidx, s = a0l[g], lenl[g], fidxl[g], atl[g]
            off = offsets[fidx] + (a0 - file_starts[fidx]) * sb  # type: ignore[operator]
            fd = self._fd(fidx)
            spans = _spans(needed[s : s + n], max(skip, n // _SKIP_SHARE)) if sparse[g] else ((0, n),)
            for lo, hi in spans:  # a block whose rows the task all needs: one span, the whole block
                for j in range(lo, hi, step):
                    part = iov[s + j : s + min(hi, j + step)]
                    if os.preadv(fd, part, off + j * sb) != len(part) * sb:
                        raise UsageError(
                            f"{lay.files[fidx].path}: key {key!r}: file ends before the data does (truncated?)"
                        )
                self.bytes_read += (hi - lo) * sb
        dups = np.flatnonzero(~first)
        if len(dups):  # padding repeats a sample: copy from its first occurrence
            src = np.flatnonzero(first)[np.searchsorted(np.flatnonzero(first), dups, side="right") - 1]
            for d, s_ in zip(order[dups].tolist(), order[src].tolist()):
                dest[d][:] = dest[s_]
