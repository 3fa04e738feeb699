"""A restore's reads, exchange and joint verification (step 2 and 3 of :mod:`hpctrain.ckpt._restore`).

Whole tensors (replicated state, and sharded chunks wanted whole by a plain target) are read by **file
region**, not by tensor: their stored pieces, sorted by (shard, position), are merged into regions wherever
they lie closer than ``_GAP`` bytes in a file (the alignment padding between them, and any small unwanted
piece, comes along), and the regions are packed one after another into one host buffer. A shard written by
the fully parallel save is then one region. With ``read_once`` each rank reads 1/world of that buffer (when
the world size did not change, about the bytes it wrote) with a few large ``preadv`` calls and one
``all_gather`` of the raw bytes hands every rank the rest (on the checkpointer's gloo group in host memory, or
on the training group through device buffers: :func:`route`); ``read_all``: every rank reads all of it. A
tensor held in one piece becomes a view of the buffer (no copy; :meth:`_Views.views`); one split over shards
(at most world - 1 of them) is assembled with one copy per piece. DTensor targets read only the byte runs
that overlap their new chunk; a chunk its replicas share (HSDP) is read once among them in ``read_once`` mode
(:func:`_share_chunks`).

Verification: each rank computes the crc32 of what it read, run by run as it reads (one value per run; a
run is a region's part, so a few per rank); the rank that owns shard ``i`` (``i % world``) combines the runs
every rank read of it with its header's crc into the crc32 of the whole file, reading only what nobody read
(state not restored, other ranks' RNG), and compares it with the manifest: a flipped or torn byte anywhere
in the file fails the step. One all-gather of the verdicts: every rank accepts or rejects the step together.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import os
import typing as tp
from itertools import chain

import torch

from hpctrain.ckpt import _nodebuf
from hpctrain.ckpt._boxes import crc32_combine
from hpctrain.ckpt._clock import PhaseClock
from hpctrain.ckpt._commit import Comm, fault
from hpctrain.ckpt._dtensor import Replicas, from_local, replicas
from hpctrain.ckpt._format import ALIGN, DTYPE_SIZES, CheckpointFormatError, align, crc32
from hpctrain.ckpt._index import Index, StoredTensor
from hpctrain.ckpt._nodebuf import NO_NODE_MEMORY, NodeBuffer
from hpctrain.ckpt._reader import count_read
from hpctrain.ckpt._state import DTYPES
from hpctrain.ckpt.config import RESTORE_EXCHANGES

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.ckpt._restore import Plan

__all__ = ["read", "shards_read", "pack", "Region"]

log = logging.getLogger("hpctrain.ckpt")

_GAP = 4096
"""Stored pieces closer than this in one file are read as one run, the bytes between them included."""
_RUN_TRIES = 4
"""How many of the next tensors of a shape :meth:`_Views._strided` tries as the second of an evenly spaced run."""
_CRC_CHUNK = 4 << 20
"""Large runs are read and checksummed this much at a time (the crc runs on bytes still in cache). Not the save's
256 KiB: on tmpfs that restored 1.2-1.5 % faster (paired rounds, 4 ranks), but not from a cold disk (1.005 and 0.960
in two paired runs), and a parallel filesystem serves a read best in requests of at least its RPC size (1-4 MiB on
Lustre)."""

Run = tp.Tuple[int, int, int, int]
"""(shard, file position, destination address, nbytes)."""


class _Segments:
    """Per shard: the crc32 of the byte ranges this rank read, ranges that touch combined into one."""

    def __init__(self) -> None:
        self.out: tp.Dict[int, tp.List[tp.Tuple[int, int, int]]] = {}

    def add(self, shard: int, pos: int, n: int, crc: int) -> None:
        segs = self.out.setdefault(shard, [])
        if segs and segs[-1][1] == pos:
            a, _, c = segs[-1]
            segs[-1] = (a, pos + n, crc32_combine(c, crc, n))
        else:
            segs.append((pos, pos + n, crc))


def _mem(addr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def _read_runs(index: Index, runs: tp.List[Run], segs: tp.Optional[_Segments]) -> None:
    """Execute the runs shard by shard in file order; runs contiguous in the file and in memory become one."""
    by_shard: tp.Dict[int, tp.List[tp.Tuple[int, int, int]]] = {}
    for shard, pos, addr, n in runs:
        if n:
            by_shard.setdefault(shard, []).append((pos, addr, n))
    for shard, rs in by_shard.items():
        rs.sort()
        merged: tp.List[tp.List[int]] = []
        for pos, addr, n in rs:
            if merged and merged[-1][0] + merged[-1][2] == pos and merged[-1][1] + merged[-1][2] == addr:
                merged[-1][2] += n
            else:
                merged.append([pos, addr, n])
        name = f"{index.path.name}/{index.shards[shard]['file']}"
        with index.open_shard(shard) as f:
            fd = f.fileno()
            for pos, addr, n in merged:
                view, got, crc = _mem(addr, n), 0, 0
                while got < n:
                    part = view[got : got + _CRC_CHUNK]
                    k = os.preadv(fd, [part], pos + got)
                    if k <= 0:
                        raise CheckpointFormatError(f"{name}: truncated while reading")
                    if segs is not None:
                        crc = crc32(part[:k], crc)
                    got += k
                count_read(n)
                if segs is not None:
                    segs.add(shard, pos, n, crc)


def _verify_shard(
    index: Index, i: int, segs: tp.Iterable[tp.Tuple[int, int, int]], may_read: bool = True
) -> tp.Optional[str]:
    """crc32 of shard ``i`` from the ranges every rank read, reading what nobody read (padding between them
    included: every byte of the file is covered, so a flipped byte anywhere fails it). ``may_read=False``: None
    when some byte was read by nobody (the shard's owner must read it), instead of reading it."""
    s = index.shards[i]
    size = s["bytes"]
    parts = sorted(set(segs) | {(0, index.data_starts[i], index.header_crcs[i])}, key=lambda x: (x[0], -x[1]))
    cursor = crc = j = 0
    f = None
    try:
        while cursor < size:
            while j < len(parts) and parts[j][0] < cursor:
                j += 1  # starts inside what is already covered: not usable
            if j < len(parts) and parts[j][0] == cursor:
                a, b, c = parts[j]
                crc, cursor, j = crc32_combine(crc, c, b - a), b, j + 1
                continue
            nxt = min(parts[j][0], size) if j < len(parts) else size
            if not may_read:
                return None
            f = f or index.open_shard(i)
            f.seek(cursor)
            left = nxt - cursor
            while left:
                chunk = f.read(min(left, 16 << 20))
                if not chunk:
                    return f"{index.path.name}/{s['file']}: truncated while reading"
                crc = crc32(chunk, crc)
                left -= len(chunk)
            count_read(nxt - cursor)
            cursor = nxt
    finally:
        if f is not None:
            f.close()
    if crc != s["crc32"]:
        return f"{index.path.name}/{s['file']}: checksum mismatch (corrupted shard)"
    return ""


def _verify(index: Index, reports: tp.List[tp.Any], rank: int, world: int, comm: Comm) -> tp.List[str]:
    """Every shard's verdict from every rank's report of what it read, the same list on every rank.

    When the ranks together read every byte of every shard (a full restore: each byte is someone's), every rank
    combines every shard's crc32 from the reports alone: the same reports give the same verdicts everywhere, so
    no collective is needed. Otherwise the owner of shard ``i`` (``i % world``) reads what nobody read, and one
    agreement (a second collective when some shard failed) gives every rank the verdicts."""

    def segments(i: int) -> tp.Iterator[tp.Tuple[int, int, int]]:
        return chain.from_iterable(r[1].get(i, ()) for r in reports)

    verdicts = [_verify_shard(index, i, segments(i), may_read=False) for i in range(len(index.shards))]
    if all(v is not None for v in verdicts):
        return [v for v in verdicts if v]
    mine = ""
    for i in range(rank, len(index.shards), world):
        try:
            v = verdicts[i]
            mine = mine or (v if v is not None else _verify_shard(index, i, segments(i))) or ""
        except CheckpointFormatError as exc:
            mine = str(exc)
    ok = comm.all_gather_ints([0 if mine else 1])
    return [] if all(o[0] for o in ok) else [e for e in comm.all_gather(mine) if e]


class Region(tp.NamedTuple):
    shard: int
    start: int
    """Byte position in the shard file."""
    end: int
    at: int
    """Byte offset in the packed buffer (64-byte aligned, as ``start`` is in the file)."""


def pack(
    stored: tp.Mapping[str, StoredTensor], keys: tp.Iterable[str], sizes: tp.Optional[tp.Sequence[int]] = None
) -> tp.Tuple[tp.List[Region], tp.Dict, int]:
    """The file regions holding the pieces of tensors ``keys``, packed in (shard, position) order: the regions,
    each piece's buffer offset by ``(shard, pos)``, and the packed size.

    ``sizes`` (each shard file's size): a region ends at the next 64-byte boundary after its last piece (at most
    the file's end), where the next piece of the file starts (the rank-local state, written last, or the next
    region), so the alignment padding is read and checksummed with it. A full restore then reads every byte of
    every shard, and each rank decides every verdict from the read reports alone: without that, the owner of a
    shard reads the few padding bytes nobody read and the ranks agree in a collective of its own (~3 ms with 4
    ranks on 2 cores). The padding fits: each region starts 64-byte aligned in the buffer."""
    spans = sorted((p.shard, p.pos, p.nbytes) for k in keys for p in stored[k].pieces if p.nbytes)
    regions: tp.List[Region] = []
    at: tp.Dict[tp.Tuple[int, int], int] = {}
    shard = start = end = base = -1

    def region() -> Region:
        return Region(shard, start, min(align(end), sizes[shard]) if sizes is not None else end, base)

    for sh, pos, n in spans:
        if sh != shard or pos - end > _GAP:
            if shard >= 0:
                regions.append(region())
                base = align(base + end - start)
            else:
                base = 0
            shard, start, end = sh, pos, pos + n
        else:
            end = max(end, pos + n)
        at[(sh, pos)] = base + pos - start
    if shard >= 0:
        regions.append(region())
    return regions, at, align(regions[-1].at + regions[-1].end - regions[-1].start) if regions else 0


def _packed(index: Index, p: "Plan") -> tp.Tuple[tp.List[Region], tp.Dict, int]:
    """:func:`pack` of the plan's whole tensors, computed once per plan (:func:`shards_read` and :func:`read`)."""
    got = p.memo.get("pack")
    if got is None:
        got = p.memo["pack"] = pack(p.stored, p.whole, [s["bytes"] for s in index.shards])
    return tp.cast(tp.Tuple[tp.List[Region], tp.Dict, int], got)


class _Views:
    """Tensors of the packed buffer: typed views of it (one per dtype) and cached contiguous strides."""

    def __init__(self, buf: torch.Tensor, at: tp.Dict[tp.Tuple[int, int], int]) -> None:
        self.buf, self.at = buf, at
        self._typed: tp.Dict[str, torch.Tensor] = {}
        self._strides: tp.Dict[tp.Tuple[int, ...], tp.Tuple[int, ...]] = {}

    def typed(self, dtype: str) -> torch.Tensor:
        tv = self._typed.get(dtype)
        if tv is None:  # every piece is 64-byte aligned in the buffer: a multiple of any element size
            es = DTYPE_SIZES[dtype]
            tv = self._typed[dtype] = self.buf[: self.buf.numel() // es * es].view(DTYPES[dtype])
        return tv

    def strides(self, shape: tp.Tuple[int, ...]) -> tp.Tuple[int, ...]:
        s = self._strides.get(shape)
        if s is None:
            out, acc = [], 1
            for d in reversed(shape):
                out.append(acc)
                acc *= max(d, 1)
            s = self._strides[shape] = tuple(out[::-1])
        return s

    def views(self, stored: tp.Mapping[str, StoredTensor], keys: tp.List[str]) -> tp.Tuple[tp.Dict, tp.List[str]]:
        """The tensors of ``keys`` stored in one piece, or in element ranges that lie end to end in the buffer (a
        tensor the save split over shards at an aligned cut: ``_state.split_replicated``), as views (metadata
        only: the bytes need not be there yet), and the keys of the others (split at an unaligned cut by an
        older save, or sharded chunks): :meth:`assemble` them."""
        rest: tp.List[str] = []
        at = self.at
        groups: tp.Dict[tp.Tuple[str, tp.Tuple[int, ...]], tp.Tuple[tp.List[str], tp.List[int]]] = {}
        for key in keys:  # tuple unpacking, not named fields: this loop runs for every tensor on every rank
            dtype, shape, pieces = stored[key]
            _, _, shard, pos, nbytes, box = pieces[0]
            if box is not None or not nbytes or (len(pieces) > 1 and not self._end_to_end(pieces)):
                rest.append(key)
                continue
            g = groups.get((dtype, shape))
            if g is None:
                g = groups[(dtype, shape)] = ([], [])
            g[0].append(key)
            g[1].append(at[shard, pos])
        out: tp.Dict[str, torch.Tensor] = {}
        for (dtype, shape), (names, offsets) in groups.items():
            out.update(zip(names, self._strided(dtype, shape, offsets)))
        return out, rest

    def _strided(self, dtype: str, shape: tp.Tuple[int, ...], offsets: tp.List[int]) -> tp.List[torch.Tensor]:
        """Tensors of one dtype and shape at byte ``offsets`` of the buffer, in that order.

        Tensors evenly spaced in the buffer become one strided view unbound into its rows: one call for the run
        (0.8 us a tensor here) instead of an ``as_strided`` each (1.8 us; 4000 tensors: most of a restore's
        per-tensor time on every rank). Runs are found by offset, not by neighbours in ``offsets``: a save lays
        out the same layer's tensors of a model, and each optimizer state of same-shaped parameters, with the same
        padding, but interleaved (``exp_avg`` of parameter i, its ``exp_avg_sq``, ``exp_avg`` of i + 1, ...)."""
        tv = self.typed(dtype)
        es = DTYPE_SIZES[dtype]
        s = self.strides(shape)
        n = len(offsets)
        out: tp.List[tp.Any] = [None] * n
        at = {o: k for k, o in enumerate(offsets)}
        for i in range(n):
            if out[i] is not None:
                continue
            chain: tp.List[int] = []
            step, tried, j = 0, 0, i + 1
            while j < n and tried < _RUN_TRIES:  # a run starting here: stepping to one of the next few
                if out[j] is None:
                    tried += 1
                    step = offsets[j] - offsets[i]
                    if step > 0 and step % es == 0:
                        chain = [i, j]
                        k = at.get(offsets[j] + step)
                        while k is not None and out[k] is None:  # offsets rise along a run: no repeat
                            chain.append(k)
                            k = at.get(offsets[k] + step)
                        if len(chain) > 2:
                            break
                    chain = []
                j += 1
            if not chain:
                out[i] = tv.as_strided(shape, s, offsets[i] // es)
                continue
            rows = tv.as_strided((len(chain), *shape), (step // es, *s), offsets[i] // es).unbind(0)
            for k, row in zip(chain, rows):
                out[k] = row
        return out

    def _end_to_end(self, pieces: tp.Sequence[tp.Any]) -> bool:
        """Whether range pieces (sorted by ``start``: the index's tiling check sorts them) follow each other in
        the buffer with no byte between them."""
        at = self.at
        end = at[(pieces[0].shard, pieces[0].pos)] + pieces[0].nbytes
        for q in pieces[1:]:
            if q.box is not None or not q.nbytes or at[(q.shard, q.pos)] != end:
                return False
            end += q.nbytes
        return True

    def assemble(self, st: StoredTensor) -> torch.Tensor:
        """A tensor from its pieces in the buffer: one copy per piece (into its element range or its box)."""
        tv = self.typed(st.dtype)
        es = tv.element_size()
        t = torch.empty(st.shape, dtype=tv.dtype)
        for p in st.pieces:
            if not p.nbytes:
                continue
            src = tv.as_strided((p.nbytes // es,), (1,), self.at[(p.shard, p.pos)] // es)
            if p.box is None:
                t.view(-1)[p.start : p.stop].copy_(src)
            else:
                t[tuple(slice(o, o + k) for o, k in zip(*p.box))].copy_(src.view(p.box[1]))
        return t


class Route(tp.NamedTuple):
    """Where ``read_once`` exchanges the bytes."""

    group: tp.Any
    """The process group (None: the default, training group)."""
    device: tp.Optional[torch.device]
    """None: in place in host memory; else through buffers on this device (NCCL moves only device memory)."""
    node: bool = False
    """Through a shared-memory buffer of the node (every rank on one host): :class:`NodeBuffer`."""


EXCHANGES = RESTORE_EXCHANGES  # the values CheckpointConfig.restore_exchange takes (ckpt/config.py)


def route(setting: str, comm: Comm) -> Route:
    """``node``: every rank on one host: through a shared-memory buffer of the node (each rank reads its part
    into it, then copies the whole of it); ranks on several hosts take ``host``'s route. ``host``: the
    checkpointer's gloo group, in host memory. ``device``: the training (default) group through buffers on its
    device (the current CUDA device under NCCL, the CPU under gloo). ``auto``: ``node`` when every rank runs on
    one host; across hosts ``device`` when the default group is NCCL (NVLink and InfiniBand instead of TCP),
    else ``host``."""
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "gloo"
    if setting in ("node", "auto") and comm.hosts == 1:
        return Route(comm.group, None, node=True)
    if setting in ("host", "node") or (setting == "auto" and "nccl" not in backend):
        return Route(comm.group, None)
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    return Route(None, device)


_DEVICE_ROUND = 1 << 30
"""The device path gathers at most this many bytes (all ranks' parts together) a round: bounded device memory."""


def _gather() -> tp.Callable[..., tp.Any]:
    from hpctrain.runtime.process_group import all_gather_into_tensor

    return all_gather_into_tensor()


def _gather_through_device(
    buf: torch.Tensor, chunk: int, rank: int, world: int, route: Route, round_bytes: int = _DEVICE_ROUND
) -> None:
    """Every rank's ``chunk`` bytes of ``buf`` (rank r's at ``r * chunk``) to every rank, through a device buffer
    in rounds: each round copies this rank's next piece to the device, all-gathers the pieces on the route's
    group, and copies all of them back into their places in ``buf`` with one strided copy (this rank's own
    piece comes back unchanged). The copies into pageable host memory are synchronous: ``buf`` holds every
    byte when this returns."""
    piece = align(max(1, min(chunk, round_bytes // world)))
    dev = torch.empty(piece * world, dtype=torch.uint8, device=route.device)
    rows = buf[: chunk * world].view(world, chunk)
    gather = _gather()
    for off in range(0, chunk, piece):
        n = min(piece, chunk - off)
        out = dev[: n * world]
        mine = out[rank * n : (rank + 1) * n]
        mine.copy_(rows[rank, off : off + n])
        gather(out, mine, group=route.group)
        rows[:, off : off + n].copy_(out.view(world, n))
    del dev


def _share_chunks(
    rep: Replicas,
    wants: tp.List[tp.Any],
    stored: tp.Mapping[str, StoredTensor],
    own: tp.Dict[str, torch.Tensor],
    runs: tp.List[Run],
) -> tp.Tuple[Replicas, torch.Tensor, int]:
    """DTensor chunks that the ranks of ``rep`` all need, read once among them: the chunks packed one after
    another into one buffer, this rank's 1/size of it added to ``runs``, each chunk a view of the buffer in
    ``own``. Return what the exchange needs: the group, the buffer, the part each rank reads."""
    offsets, total = [], 0
    for w in wants:
        offsets.append(total)
        total = align(total + math.prod(w.box[1]) * DTYPE_SIZES[stored[w.key].dtype])
    part = align(-(-total // rep.size))
    buf = torch.empty(part * rep.size, dtype=torch.uint8)
    lo, hi, base = rep.index * part, min((rep.index + 1) * part, total), buf.data_ptr()
    for w, off in zip(wants, offsets):
        st = stored[w.key]
        es = DTYPE_SIZES[st.dtype]
        for sh, pos, d, n in st.runs(w.box, es):
            a, b = max(off + d, lo), min(off + d + n, hi)
            if a < b:
                runs.append((sh, pos + a - off - d, base + a, b - a))
        own[w.key] = buf[off : off + math.prod(w.box[1]) * es].view(DTYPES[st.dtype])
    return rep, buf, part


def _share(total: int, rank: int, world: int, once: bool) -> tp.Tuple[int, int, int]:
    """(chunk, lo, hi): this rank's byte range of the packed buffer of whole tensors (all of it unless once)."""
    chunk = align(-(-total // world)) if once else total
    return (chunk, rank * chunk, min((rank + 1) * chunk, total)) if once else (chunk, 0, total)


def shards_read(index: Index, p: "Plan", rank: int, world: int, *, mode: str) -> tp.Set[int]:
    """The shard files :func:`read` opens on ``rank`` (metadata only; a superset for chunks that replicas share),
    and the ones it verifies: what a node must hold before a restore reads (the local checkpoint tier)."""
    regions, _, total = _packed(index, p)
    _, lo, hi = _share(total, rank, world, mode == "read_once" and world > 1)
    out = {r.shard for r in regions if max(r.at, lo) < min(r.at + r.end - r.start, hi)}
    for w in p.chunks.values():
        st = p.stored[w.key]
        out.update(sh for sh, _, _, _ in st.runs(w.box, DTYPE_SIZES[st.dtype]))
    return out | set(range(rank, len(index.shards), world))


def read(
    index: Index,
    p: "Plan",
    comm: Comm,
    *,
    mode: str,
    verify: bool,
    route: tp.Optional[Route] = None,
    clock: tp.Optional[PhaseClock] = None,
) -> tp.Tuple[tp.Dict[str, torch.Tensor], tp.List[str]]:
    """Read what this rank needs (collective: every rank calls it for the same step). Return the tensors
    (plain tensors whole, DTensor chunks as local tensors) and the errors of every rank ([] = verified).
    ``route``: where ``read_once`` exchanges the bytes (default: host memory on the checkpointer's group).
    ``clock``: where the exchange, the views and the verification are timed (the caller's phase takes the rest)."""
    route = route or Route(comm.group, None)
    clock = clock or PhaseClock()
    rank, world = comm.rank, comm.world
    packed = _packed(index, p)
    once = mode == "read_once" and world > 1
    chunk = _share(packed[2], rank, world, once)[0]
    node = None
    via_node = bool(once and packed[2] and route.node)
    if via_node:
        with clock("exchange"):
            node = NodeBuffer.open(comm, chunk * world, rank, chunk)
    try:
        tensors, errors = _read(index, p, comm, mode, verify, route, packed, node, via_node, clock)
    finally:
        if node is not None:
            with clock("exchange"):
                node.close()
    if via_node and any(e.startswith(NO_NODE_MEMORY) for e in errors):  # the same verdict on every rank
        log.warning("hpctrain.ckpt: %s: the restore reads again and exchanges over gloo", errors[0])
        return _read(index, p, comm, mode, verify, route._replace(node=False), packed, None, False, clock)
    return tensors, errors


def _read(
    index: Index,
    p: "Plan",
    comm: Comm,
    mode: str,
    verify: bool,
    route: Route,
    packed: tp.Tuple[tp.List[Region], tp.Dict, int],
    node: tp.Optional[NodeBuffer],
    via_node: bool,
    clock: PhaseClock,
) -> tp.Tuple[tp.Dict[str, torch.Tensor], tp.List[str]]:
    rank, world = comm.rank, comm.world
    stored, shared = p.stored, p.whole
    segs = _Segments() if verify else None
    regions, at, total = packed
    once = mode == "read_once" and world > 1
    chunk, lo, hi = _share(total, rank, world, once)
    if via_node and node is None:  # no buffer here: nothing to read into; the reports make every rank read again
        buf, lo, hi = torch.empty(ALIGN, dtype=torch.uint8), 0, 0
    elif node is None:
        buf = torch.empty(max(chunk * world if once else total, ALIGN), dtype=torch.uint8)
    else:  # this rank reads its share into the node's buffer; ``buf`` is its private mapping (below)
        assert node.shared is not None
        buf = node.shared
    base = buf.data_ptr()
    runs: tp.List[Run] = []
    for r in regions:  # this rank's share of the packed buffer
        a, b = max(r.at, lo), min(r.at + r.end - r.start, hi)
        if a < b:
            runs.append((r.shard, r.start + a - r.at, base + a, b - a))
    own: tp.Dict[str, torch.Tensor] = {}  # DTensor chunks and this rank's RNG: the overlapping runs only
    groups: tp.Dict[int, tp.Tuple[Replicas, tp.List[tp.Any]]] = {}
    for w in p.chunks.values():
        st = stored[w.key]
        es = DTYPE_SIZES[st.dtype]
        rep = replicas(w.like) if w.like is not None and math.prod(w.box[1]) else None
        if rep is not None and mode == "read_once":  # a chunk its replicas share: read once among them
            groups.setdefault(id(rep.group), (rep, []))[1].append(w)
            continue
        mem = own[w.key] = torch.empty(math.prod(w.box[1]), dtype=DTYPES[st.dtype])
        runs += [(sh, pos, mem.data_ptr() + d, n) for sh, pos, d, n in st.runs(w.box, es)]
    shared_chunks = [_share_chunks(rep, ws, stored, own, runs) for rep, ws in groups.values()]  # plan order
    err = f"{NO_NODE_MEMORY} on rank {rank} (it could not open or map it)" if via_node and node is None else ""
    try:
        fault("restore_read", rank)
        if node is not None:
            fault("node_memory", rank)  # test seam: node_memory:R:efault, a read into a full tmpfs
        if not err:
            _read_runs(index, runs, segs)
    except CheckpointFormatError as exc:
        err = f"rank {rank}: {exc}"
    except OSError as exc:
        if node is not None and exc.errno == errno.EFAULT:  # the node's tmpfs is full: not damage, no quarantine
            err = f"{NO_NODE_MEMORY} on rank {rank} ({_nodebuf.NODE_DIR} ran out of memory while it read its part)"
        else:
            err = f"rank {rank}: {index.path.name}: {type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure to read: the step is rejected on every rank
        err = f"rank {rank}: {index.path.name}: {type(exc).__name__}: {exc}"
    work = None
    try:
        with clock("exchange"):
            if via_node:  # the node's buffer: mapped privately once every rank has read its part (below)
                pass
            elif once and total and route.device is None:  # host memory on the checkpointer's gloo group, in place
                work = _gather()(buf, buf[rank * chunk : (rank + 1) * chunk], group=comm.group, async_op=True)
            elif once and total:
                _gather_through_device(buf, chunk, rank, world, route)
            for rep, gbuf, part in shared_chunks:  # the same groups in the same order on every rank
                if rep.device is None:
                    _gather()(gbuf, gbuf[rep.index * part : (rep.index + 1) * part], group=rep.group)
                else:
                    _gather_through_device(gbuf, part, rep.index, rep.size, Route(rep.group, rep.device))
    except Exception as exc:  # noqa: BLE001 - a peer died: the restore fails on every rank
        raise comm._fail(exc) from exc
    with clock("views"):
        views = _Views(buf, at)
        tensors, rest = views.views(stored, shared) if not via_node else ({}, [])  # while a gather runs: metadata
    if work is not None:
        try:
            with clock("exchange"):
                work.wait()
        except Exception as exc:  # noqa: BLE001
            raise comm._fail(exc) from exc
    with clock("verify"):
        report = (err, segs.out if segs is not None else {}, node.token if node is not None else b"")
        reports = comm.all_gather(report)
        errors = [e for e, _, _ in reports if e]
        if via_node and not any(e.startswith(NO_NODE_MEMORY) for e in errors):
            if node is None or not node.shared_by([t for _, _, t in reports]):  # every rank finds the same (above)
                errors = [
                    f"{NO_NODE_MEMORY}: the ranks do not share one {_nodebuf.NODE_DIR} (each made its own buffer file)"
                ]
        if not errors and segs is not None:
            errors = _verify(index, reports, rank, world, comm)
    if errors:
        return {}, errors
    if node is not None:  # every rank has read its part (the verdicts' gather above was the barrier)
        with clock("exchange"):
            mapped = node.private()
        with clock("views"):
            views = _Views(mapped, at)
            tensors, rest = views.views(stored, shared)
    with clock("views"):
        for key in rest:
            tensors[key] = views.assemble(stored[key])
        for key, mem in own.items():
            w = p.chunks[key]
            local = mem.view(w.box[1])
            tensors[key] = from_local(local, w.like) if w.like is not None else local
    return tensors, []
