"""A checkpoint's index, built once and checked: restore, ``ckpt verify``, ``ckpt digest`` and ``ckpt ls`` use it.

:func:`build_index` checks everything about a checkpoint that does not need its tensor bytes, once:
the manifest (types, sizes, names), each shard's size and header (both read by :mod:`hpctrain.ckpt._reader`), the
piece index (which elements of which tensor lie where in which shard, and that they tile each tensor exactly), and
the state trees (well formed for unflattening, every ``{"__tensor__": key}`` naming a stored tensor). Then

* ``verify`` = index + crc32 of every shard (:func:`verify_dir`);
* restore = index + reads (``Checkpointer.restore``; 1/world of the crc32s per rank);
* ``digest`` = index + a hash of the bytes in element order (:func:`digest_dir`).

So whatever restore rejects as damaged, ``verify`` reports as invalid: they share every check. In a restore the
ranks share the work (:func:`index_share`): each parses its share of the headers and they exchange what they
found, as columns (:func:`_columns`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import os
import stat
import typing as tp
from dataclasses import dataclass
from itertools import chain, islice, repeat
from pathlib import Path

from hpctrain.ckpt._boxes import Box, boxes_tile, flat_runs, runs, whole
from hpctrain.ckpt._entries import RangeColumns
from hpctrain.ckpt._format import DTYPE_SIZES, CheckpointFormatError, crc32
from hpctrain.ckpt._reader import (
    READ_CHUNK,
    PathLike,
    count_read,
    file_label,
    open_regular,
    read_header_crc,
    read_manifest,
)
from hpctrain.ckpt._trees import check_tree, tensor_keys

__all__ = [
    "SHARE_INLINE",
    "PieceRef",
    "StoredTensor",
    "Index",
    "build_index",
    "index_share",
    "verify_dir",
    "digest_dir",
]

SHARE_INLINE = 64 << 10
"""The bytes of a rank's :func:`index_share` message that its exchange carries in its first collective, compressed
(``Comm.all_gather_with(compress=True)``): a share of ~3000 tensors pickles to ~190 KB and compresses to ~30 KB
(the rank holding shard 0 sends the state trees too, as large), so a restore of such a state exchanges its index in
one collective; a larger share takes a second. Every rank sends a row this wide: the exchange moves world x this."""


class PieceRef(tp.NamedTuple):
    start: int
    """First element of the flattened tensor in this piece (0 for a box)."""
    stop: int
    shard: int
    """Index of the shard file holding it."""
    pos: int
    """Absolute byte position in that file."""
    nbytes: int
    box: tp.Optional[Box] = None
    """A sharded tensor's chunk (offsets, lengths), stored row-major; None for a flat element range."""


class StoredTensor(tp.NamedTuple):
    dtype: str
    shape: tp.Tuple[int, ...]
    pieces: tp.List[PieceRef]
    """Sorted by ``start``; they tile ``[0, numel)`` exactly."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def sharded(self) -> bool:
        return self.pieces[0].box is not None

    def runs(self, dst: Box, es: int) -> tp.List[tp.Tuple[int, int, int, int]]:
        """``(shard, file position, byte offset in dst, nbytes)`` runs that fill box ``dst`` (row-major)."""
        if not self.sharded and dst == whole(self.shape):  # the common case: a replicated tensor, whole
            return [(p.shard, p.pos, p.start * es, p.nbytes) for p in self.pieces]
        out = []
        if self.sharded:
            for p in self.pieces:
                assert p.box is not None
                out += [(p.shard, p.pos + s * es, d * es, n * es) for s, d, n in runs(p.box, dst)]
        else:
            flat = [(p.start, p.stop) for p in self.pieces]
            for i, s, d, n in flat_runs(flat, self.shape, dst):
                p = self.pieces[i]
                out.append((p.shard, p.pos + s * es, d * es, n * es))
        return out


@dataclass
class Index:
    """A checkpoint's structure, fully checked; the tensor bytes and crc32s are not read."""

    path: Path
    manifest: tp.Dict[str, tp.Any]
    data_starts: tp.List[int]
    tensors: tp.Dict[str, StoredTensor]
    """Replicated tensors (split over shards)."""
    local: tp.List[tp.Dict[str, StoredTensor]]
    """Per shard: that rank's rank-local tensors (``local/...``), stored whole in its own shard."""
    trees: tp.Dict[str, tp.Any]
    local_trees: tp.List[tp.Optional[tp.Dict[str, tp.Any]]]
    header_crcs: tp.List[int]
    """Per shard: crc32 of its bytes before the data start (header and zero padding), as read for the index."""

    @property
    def shards(self) -> tp.List[tp.Dict[str, tp.Any]]:
        return tp.cast(tp.List[tp.Dict[str, tp.Any]], self.manifest["shards"])

    def open_shard(self, i: int) -> tp.BinaryIO:
        return open_regular(self.path / self.shards[i]["file"])


class _Part(tp.NamedTuple):
    """What indexing some of a checkpoint's shards found: their pieces, headers' data starts and crcs, trees."""

    shards: tp.List[int]
    data_starts: tp.List[int]
    header_crcs: tp.List[int]
    tensors: tp.Dict[str, StoredTensor]
    """Replicated and sharded tensors, with the pieces these shards hold."""
    local: tp.List[tp.Dict[str, StoredTensor]]
    local_trees: tp.List[tp.Optional[tp.Dict[str, tp.Any]]]
    trees: tp.Optional[tp.Dict[str, tp.Any]]
    """Shard 0's state trees, when shard 0 is among these."""
    partial: tp.List[str]
    """Keys whose pieces here do not tile the tensor alone: the rest must come from other shards."""


Exchange = tp.Callable[[tp.Any], tp.List[tp.Any]]
"""An all-gather of one picklable object per rank (``Comm.all_gather``)."""


def index_share(
    ckpt_dir: PathLike, rank: int, world: int
) -> tp.Tuple[tp.Tuple[str, tp.Any], tp.Optional[tp.Dict[str, tp.Any]]]:
    """What rank ``rank`` of ``world`` indexes of a checkpoint for :func:`build_index`'s ``share``: the message to
    exchange, ``(error, part)`` (the part: shards ``rank``, ``rank + world``, ... as plain tuples), and the manifest
    this rank read for it (None when it could not: the error says why). Never raises (the other ranks wait in the
    exchange)."""
    ckpt_dir = Path(ckpt_dir)
    manifest = None
    try:
        manifest = read_manifest(ckpt_dir)
        return ("", _plain(_index_shards(ckpt_dir, manifest, range(rank, len(manifest["shards"]), world)))), manifest
    except CheckpointFormatError as exc:
        return (str(exc), None), manifest
    except Exception as exc:  # noqa: BLE001 - damage of any kind is a format error, the same on every rank
        return (f"{ckpt_dir.name}: {type(exc).__name__}: {exc}", None), manifest


def build_index(
    ckpt_dir: PathLike,
    *,
    share: tp.Optional[tp.Tuple[int, int, Exchange]] = None,
    gathered: tp.Optional[tp.Tuple[tp.List[tp.Tuple[str, tp.Any]], tp.Optional[tp.Dict[str, tp.Any]]]] = None,
) -> Index:
    """Check a checkpoint's manifest, shard sizes, headers, piece tiling and trees; raise
    :class:`CheckpointFormatError` naming the first problem.

    ``share=(rank, world, all_gather)`` (a restore; collective: every rank calls it for the same step): rank r
    opens, parses and checks only shards r, r + world, ... and the ranks exchange what they found, so that a
    restart of N ranks opens and parses each shard header once, not N times (N x N file opens on the shared
    filesystem's metadata server). Every shard is still checked by some rank, the trees are checked one per
    rank (name order, round robin from rank 1), and the pieces of tensors split over shards parsed by different
    ranks are checked for tiling by every rank; an error found on some ranks only is raised there (the caller
    agrees). ``gathered``: with ``share``, every rank's :func:`index_share` message already exchanged and this
    rank's manifest (the caller combined the exchange with another agreement: one collective fewer)."""
    ckpt_dir = Path(ckpt_dir)
    if share is None:
        manifest = read_manifest(ckpt_dir)
        parts = [_index_shards(ckpt_dir, manifest, range(len(manifest["shards"])))]
        rank, world = 0, 1
    else:
        rank, world, exchange = share
        if gathered is None:
            message, read = index_share(ckpt_dir, rank, world)
            gathered = exchange(message), read
        got, read = gathered
        errors = [e for e, _ in got if e]
        if errors:
            raise CheckpointFormatError(errors[0])
        if read is None:  # pragma: no cover - this rank's error is among the errors above
            raise CheckpointFormatError(f"{ckpt_dir.name}: no manifest read")
        manifest = read
        parts = [_typed(p) for _, p in got if p is not None]
    world_saved = len(manifest["shards"])
    data_starts, header_crcs = [0] * world_saved, [0] * world_saved
    local: tp.List[tp.Dict[str, StoredTensor]] = [{} for _ in range(world_saved)]
    local_trees: tp.List[tp.Optional[tp.Dict[str, tp.Any]]] = [None] * world_saved
    tensors: tp.Dict[str, StoredTensor] = {}
    check: tp.Set[str] = set()
    trees: tp.Any = None
    for part in parts:
        for j, i in enumerate(part.shards):
            data_starts[i], header_crcs[i] = part.data_starts[j], part.header_crcs[j]
            local[i], local_trees[i] = part.local[j], part.local_trees[j]
        if part.trees is not None:
            trees = part.trees
        check.update(part.partial)
        if not tensors:
            tensors = dict(part.tensors)
            continue
        for key, st in part.tensors.items():
            have = tensors.get(key)
            if have is None:
                tensors[key] = st
            elif have.dtype != st.dtype or have.shape != st.shape:
                raise CheckpointFormatError(f"{ckpt_dir.name}: the stored pieces of tensor {key!r} disagree")
            else:  # split over shards that different ranks indexed: the pieces of both, tiling checked below
                tensors[key] = StoredTensor(have.dtype, have.shape, have.pieces + st.pieces)
                check.add(key)
    for key in sorted(check):
        _check_tiling(ckpt_dir.name, key, tensors[key])
    if not isinstance(trees, dict):
        raise CheckpointFormatError(f"{ckpt_dir.name}: shard 0 holds no state tree")
    for k, (name, tree) in enumerate(sorted(trees.items())):
        if (k + 1) % world == rank:  # from rank 1: rank 0 parsed shard 0's header, the one holding the trees
            check_tree(f"{ckpt_dir.name}: state tree {name!r}", tree, tensors)
    return Index(ckpt_dir, manifest, data_starts, tensors, local, trees, local_trees, header_crcs)


_Columns = tp.Tuple[tp.List[str], tp.List[str], tp.List[tp.Any], tp.Optional[tp.List[int]], tp.Tuple[tp.Any, ...]]
_DTYPE_OF, _SHAPE_OF, _PIECES_OF = (operator.itemgetter(i) for i in range(3))


def _columns(table: tp.Dict[str, StoredTensor]) -> _Columns:
    """A table of stored tensors as columns for the exchange: keys, dtypes, shapes, the pieces per tensor (None
    when every tensor has one) and the pieces' fields, each a list or tuple built in C (``map``/``zip``).

    Every rank unpickles every rank's part of the index: as columns that is a few lists of numbers and strings,
    not a tuple and a list per tensor and a tuple per piece (4000 tensors: 0.7 ms to unpickle and 1.3 ms to
    type on each rank, against 1.6 and 1.9 ms)."""
    stored = list(table.values())
    pieces = list(map(_PIECES_OF, stored))
    counts = list(map(len, pieces))
    fields = tuple(zip(*chain.from_iterable(pieces))) or ((),) * len(PieceRef._fields)
    one = max(counts, default=1) == 1
    return list(table), list(map(_DTYPE_OF, stored)), list(map(_SHAPE_OF, stored)), None if one else counts, fields


def _table(cols: _Columns) -> tp.Dict[str, StoredTensor]:
    """The table :func:`_columns` made columns of (``tuple.__new__``: no Python frame per object)."""
    keys, dtypes, shapes, counts, fields = cols
    new = tuple.__new__
    refs = list(map(new, repeat(PieceRef), zip(*fields)))
    if counts is None:
        pieces = list(map(list, zip(refs)))  # one piece each: [ref]
    else:
        it = iter(refs)
        pieces = [list(islice(it, n)) for n in counts]
    return dict(zip(keys, map(new, repeat(StoredTensor), zip(dtypes, shapes, pieces))))


def _plain(part: _Part) -> tp.Tuple[tp.Any, ...]:
    """``part`` for the exchange: its tables of stored tensors as columns (:func:`_columns`); the rest as it is."""
    return tuple(part._replace(tensors=_columns(part.tensors), local=[_columns(m) for m in part.local]))


def _typed(plain: tp.Tuple[tp.Any, ...]) -> _Part:
    """The :class:`_Part` that :func:`_plain` flattened."""
    part = tuple.__new__(_Part, plain)
    return part._replace(tensors=_table(part.tensors), local=[_table(m) for m in part.local])


def _index_shards(ckpt_dir: Path, manifest: tp.Dict[str, tp.Any], which: tp.Iterable[int]) -> _Part:
    """Open, size-check, parse and check the headers of shards ``which``; their pieces, checked for tiling
    where these shards hold a whole tensor."""
    shards, world, step = manifest["shards"], manifest["world_size"], manifest["step"]
    which = list(which)
    for i in which:  # sizes first: cheap, catches truncation and missing files before any parse
        p = ckpt_dir / shards[i]["file"]
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise CheckpointFormatError(f"{file_label(p)}: missing shard") from None
        if stat.S_ISREG(st.st_mode) and st.st_size != shards[i]["bytes"]:
            raise CheckpointFormatError(
                f"{file_label(p)}: size {st.st_size} != {shards[i]['bytes']} in the manifest (truncated?)"
            )
    part = _Part(which, [], [], {}, [], [], None, [])
    tensors = part.tensors
    loose: tp.List[str] = []  # keys added (or added to) entry by entry: their tiling is decided at the end
    new = tuple.__new__  # PieceRef / StoredTensor without NamedTuple.__new__'s Python frame (4000+ of each)
    for i in which:
        p = ckpt_dir / shards[i]["file"]
        with open_regular(p) as f:
            size = os.fstat(f.fileno()).st_size
            if size != shards[i]["bytes"]:
                want = shards[i]["bytes"]
                raise CheckpointFormatError(f"{file_label(p)}: size {size} != {want} in the manifest (truncated?)")
            h, head_crc, cols = read_header_crc(f, size, file_label(p))
        hdr = h.header
        for field, want in (("rank", i), ("world_size", world), ("step", step)):
            if field in hdr and hdr[field] != want:
                raise CheckpointFormatError(
                    f"{file_label(p)}: header says {field} {str(hdr[field])[:20]}, expected {want}"
                )
        part.data_starts.append(h.data_start)
        part.header_crcs.append(head_crc)
        mine: tp.Dict[str, StoredTensor] = {}
        ds = h.data_start
        entries = hdr["entries"]
        done = _add_columns(cols, i, ds, tensors, part.partial) if cols is not None else 0
        for e in itertools.islice(entries, done, None):  # what the columns did not take: entry by entry
            key = e["key"]
            if "box" in e:
                box = (tuple(e["box"][0]), tuple(e["box"][1]))
                ref = PieceRef(0, math.prod(box[1]), i, ds + e["offset"], e["nbytes"], box)
            else:
                ref = new(PieceRef, (e["start"], e["stop"], i, ds + e["offset"], e["nbytes"], None))
            table = mine if key.startswith("local/") else tensors
            st_ = table.get(key)
            if st_ is None:
                table[key] = new(StoredTensor, (e["dtype"], tuple(e["shape"]), [ref]))
            elif st_.dtype != e["dtype"] or st_.shape != tuple(e["shape"]):
                raise CheckpointFormatError(f"{ckpt_dir.name}: the stored pieces of tensor {key!r} disagree")
            else:
                st_.pieces.append(ref)
            if table is tensors:
                loose.append(key)
        for key, t in mine.items():
            _check_tiling(ckpt_dir.name, key, t)
        lt = hdr.get("local")
        if lt is not None and not isinstance(lt, dict):
            raise CheckpointFormatError(f"{ckpt_dir.name}: rank {i}'s local state is not a JSON object")
        if lt is not None:
            check_tree(f"{ckpt_dir.name}: rank {i}'s local state", lt, mine)
        part.local.append(mine)
        part.local_trees.append(lt)
        if i == 0:
            part = part._replace(trees=hdr.get("trees"))
    for key in dict.fromkeys(loose):
        t = tensors[key]
        p0 = t.pieces[0]
        if len(t.pieces) == 1 and p0.box is None and p0.start == 0 and p0.stop == t.numel:
            continue  # most tensors: one range piece, the whole tensor
        if p0.box is not None or not _tiles(t):
            part.partial.append(key)  # chunks of a sharded tensor, or a range split over shards
    return part


def _add_columns(
    cols: RangeColumns, shard: int, data_start: int, tensors: tp.Dict[str, StoredTensor], partial: tp.List[str]
) -> int:
    """Add the replicated tensors of one shard's checked range entries to ``tensors`` from their columns, in C
    (``map``/``zip``: a shard with 3000 small tensors, 0.6 ms instead of 2.6 entry by entry), and the keys whose
    piece is not the whole tensor to ``partial``. Return how many entries that took: the leading ones, up to the
    rank-local ones (``local/...``, written last), or none when a key repeats or is already in ``tensors`` (then
    every entry goes entry by entry, which checks that its pieces agree)."""
    keys = cols.keys
    n = len(keys)
    while n and keys[n - 1].startswith("local/"):
        n -= 1
    head = keys[:n] if n < len(keys) else keys
    if any(k.startswith("local/") for k in head) or len(set(head)) != n or not tensors.keys().isdisjoint(head):
        return 0
    new = tuple.__new__  # no NamedTuple.__new__ frame per object
    shapes = list(map(tuple, itertools.islice(cols.shapes, n)))
    starts, stops = cols.starts[:n], cols.stops[:n]
    pos = map(data_start.__add__, cols.offsets[:n])
    refs = map(new, repeat(PieceRef), zip(starts, stops, repeat(shard), pos, cols.nbytes[:n], repeat(None)))
    tensors.update(zip(head, map(new, repeat(StoredTensor), zip(cols.dtypes[:n], shapes, map(list, zip(refs))))))
    whole = map(operator.eq, stops, map(math.prod, shapes))
    partial += [k for k, a, w in zip(head, starts, whole) if a or not w]
    return n


def _tiles(t: StoredTensor) -> bool:
    """Whether the range pieces of ``t`` tile it (sorted in place by start)."""
    t.pieces.sort(key=lambda p: p.start)
    pos = 0
    for p in t.pieces:
        if p.box is not None or p.start != pos:
            return False
        pos = p.stop
    return pos == t.numel


def _check_tiling(where: str, key: str, t: StoredTensor) -> None:
    """The pieces of one tensor must tile it exactly: no gap, no overlap, nothing missing."""
    if len(t.pieces) == 1 and t.pieces[0].box is None and t.pieces[0].start == 0 and t.pieces[0].stop == t.numel:
        return  # most tensors: one range piece, the whole tensor
    kinds = {p.box is None for p in t.pieces}
    if len(kinds) > 1:
        raise CheckpointFormatError(f"{where}: tensor {key!r} is stored both as ranges and as chunks")
    if t.pieces[0].box is not None:
        bad = boxes_tile(t.shape, [p.box for p in t.pieces if p.box is not None])
        if bad:
            raise CheckpointFormatError(f"{where}: tensor {key!r}: {bad}")
        return
    t.pieces.sort(key=lambda p: p.start)
    pos = 0
    for p in t.pieces:
        if p.start != pos:
            raise CheckpointFormatError(f"{where}: the stored pieces of tensor {key!r} do not fit together")
        pos = p.stop
    if pos != t.numel:
        raise CheckpointFormatError(f"{where}: tensor {key!r} is incomplete ({pos} of {t.numel} elements stored)")


# ---------------------------------------------------------------------------------------------- tools
def verify_dir(
    ckpt_dir: PathLike, *, checksums: bool = True, only: tp.Optional[tp.Sequence[int]] = None
) -> tp.Dict[str, tp.Any]:
    """Everything restore checks: the index (structure) and the crc32 of every shard (or of shards ``only``).

    Return the manifest or raise :class:`CheckpointFormatError` naming the first bad file."""
    index = build_index(ckpt_dir)
    if checksums:
        for i, s in enumerate(index.shards):
            if only is not None and i not in only:
                continue
            crc = 0
            with index.open_shard(i) as f:
                while True:
                    chunk = f.read(READ_CHUNK)
                    if not chunk:
                        break
                    crc = crc32(chunk, crc)
            if crc != s["crc32"]:
                raise CheckpointFormatError(f"{index.path.name}/{s['file']}: checksum mismatch (corrupted shard)")
    return index.manifest


def digest_dir(ckpt_dir: PathLike) -> tp.Dict[str, str]:
    """sha256 per top-level state entry, independent of the world size that wrote the checkpoint.

    Each digest covers the entry's JSON structure and, for every tensor it references (in order),
    dtype, shape and the element bytes in order, however they were split over shards. Rank-local
    state (RNG) is excluded; ``data_state`` is hashed from the manifest.
    """
    index = build_index(ckpt_dir)
    files: tp.Dict[int, tp.BinaryIO] = {}
    out: tp.Dict[str, str] = {}
    try:
        for name in sorted(index.trees):
            h = hashlib.sha256(json.dumps(index.trees[name], sort_keys=True).encode())
            for key in tensor_keys(index.trees[name]):
                t = index.tensors[key]
                h.update(json.dumps([t.dtype, list(t.shape)]).encode())
                # the global value in row-major order, however it was split (ranges) or sharded (chunks)
                for shard, pos, _, nbytes in sorted(t.runs(whole(t.shape), DTYPE_SIZES[t.dtype]), key=lambda r: r[2]):
                    f = files.get(shard) or files.setdefault(shard, index.open_shard(shard))
                    f.seek(pos)
                    remaining = nbytes
                    while remaining:
                        chunk = f.read(min(remaining, READ_CHUNK))
                        if not chunk:
                            raise CheckpointFormatError(f"{index.path.name}: shard {shard} truncated")
                        h.update(chunk)
                        remaining -= len(chunk)
                    count_read(nbytes)
            out[name] = h.hexdigest()
    finally:
        for f in files.values():
            f.close()
    out["data_state"] = hashlib.sha256(
        json.dumps(index.manifest.get("data_state"), sort_keys=True).encode()
    ).hexdigest()
    return out
