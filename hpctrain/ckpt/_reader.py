"""The one reader of checkpoint files. Pure stdlib: restore, ``ckpt verify``, ``ckpt digest`` and ``ckpt ls`` use it.

:func:`build_index` checks everything about a checkpoint that does not need its tensor bytes, once:
the manifest (types, sizes, names), each shard's size and header, the piece index (which elements of
which tensor lie where in which shard, and that they tile each tensor exactly), and the state trees
(well formed for unflattening, every ``{"__tensor__": key}`` naming a stored tensor). Then

* ``verify`` = index + crc32 of every shard (:func:`verify_dir`);
* restore = index + reads (``Checkpointer.restore``; 1/world of the crc32s per rank);
* ``digest`` = index + a hash of the bytes in element order (:func:`digest_dir`).

So whatever restore rejects as damaged, ``verify`` reports as invalid: they share every check.

Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be regular files (``fstat``): a FIFO or a
device in place of a shard or manifest is an error, not a hang, and a symbolic link is refused (a
checkpoint is a self-contained directory; nothing it names lies outside it). Sizes are bounded
before anything is read into memory, and JSON nesting is bounded before anything recurses over it.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import math
import os
import stat
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain.ckpt._boxes import Box, boxes_tile, flat_runs, runs, whole
from hpctrain.ckpt._entries import _entry_problem, _is_int, _ranges_ok
from hpctrain.ckpt._format import (
    DTYPE_SIZES,
    FORMAT_VERSION,
    HEADER_PREFIX,
    MAGIC,
    MANIFEST,
    CheckpointFormatError,
    ShardHeader,
    align,
    crc32,
    parse_name,
    shard_name,
)
from hpctrain.ckpt._trees import check_tree, tensor_keys

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_WORLD_SIZE",
    "MAX_JSON_DEPTH",
    "SHARE_INLINE",
    "PieceRef",
    "StoredTensor",
    "Index",
    "open_regular",
    "read_manifest",
    "read_header",
    "build_index",
    "index_share",
    "verify_dir",
    "digest_dir",
    "bytes_read",
]

MAX_MANIFEST_BYTES = 64 << 20
"""A manifest names one small record per rank (~100 bytes): 64 MiB is far beyond any real world size."""
MAX_HEADER_BYTES = 1 << 30
"""A shard header is JSON metadata; a length beyond this is damage, never a real header."""
MAX_WORLD_SIZE = 99_999
"""Shard file names carry five digits of rank and world size."""
MAX_JSON_DEPTH = 100
"""State dicts nest a handful of levels; deeper JSON is refused before anything recurses over it."""
SHARE_INLINE = 256 << 10
"""The bytes of a rank's :func:`index_share` message that its exchange carries in its first collective: a share
of ~4000 tensors pickles to ~200 KB (the rank holding shard 0 sends the state trees too), so a restore of such a
state exchanges its index in one collective; a larger share takes a second."""
_READ_CHUNK = 16 << 20
_BYTES_READ = [0]  # tensor bytes read from shard files by this process (restore, digest): the benchmark's meter


def bytes_read() -> int:
    """Tensor bytes this process has read from shard files so far (headers and manifests not counted)."""
    return _BYTES_READ[0]


PathLike = tp.Union[str, os.PathLike]


def _where(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def open_regular(path: PathLike) -> tp.BinaryIO:
    """Open a checkpoint file for reading: a regular file, not a symlink, never blocking on a FIFO or device."""
    path = Path(path)
    where = _where(path)
    try:
        st = os.lstat(path)  # refuse specials before opening them: opening a device can have side effects
    except FileNotFoundError:
        raise CheckpointFormatError(f"{where}: missing") from None
    except OSError as exc:
        raise CheckpointFormatError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointFormatError(
            f"{where}: is a symbolic link; a checkpoint's files must be regular files inside its directory"
        )
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointFormatError(f"{where}: not a regular file (a FIFO, device or directory); remove it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointFormatError(f"{where}: is a symbolic link") from None
        raise CheckpointFormatError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between lstat and open
        os.close(fd)
        raise CheckpointFormatError(f"{where}: not a regular file")
    return os.fdopen(fd, "rb", buffering=0)


def _read_exactly(f: tp.BinaryIO, n: int, where: str) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = f.read(min(n - got, _READ_CHUNK))
        if not chunk:
            raise CheckpointFormatError(f"{where}: truncated while reading")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _loads(raw: bytes, where: str, what: str) -> tp.Any:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointFormatError(f"{where}: corrupt {what} ({str(exc)[:100]})") from None
    except RecursionError:
        raise CheckpointFormatError(f"{where}: {what} nested too deeply") from None
    if not _shallow(raw):
        _check_depth(obj, where, what)
    return obj


_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_LEVEL = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _shallow(raw: bytes) -> bool:
    """True when the (successfully parsed) JSON text ``raw`` nests containers at most MAX_JSON_DEPTH deep, from
    its bytes at C speed: escaped backslashes and quotes removed (JSON escapes are 2 bytes, ``\\uXXXX`` has no
    backslash or quote after the first), every byte but brackets and quotes deleted, the strings (now
    between quote pairs) dropped, the running bracket level's maximum taken. False: :func:`_check_depth` decides."""
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    s = b"".join(s.split(b'"')[::2])
    return max(itertools.accumulate(map(_LEVEL.__getitem__, s)), default=0) <= MAX_JSON_DEPTH


def _check_depth(obj: tp.Any, where: str, what: str) -> None:
    """Iteratively: nothing recursive (unflatten, json.dumps) ever meets JSON deeper than MAX_JSON_DEPTH.

    Level by level over the containers only (a parsed header holds ~10 nodes per tensor: one list
    comprehension per container, not one stack push per node)."""
    level = [obj] if type(obj) is dict or type(obj) is list else []
    depth = 0
    while level:
        if depth >= MAX_JSON_DEPTH and any(level):  # a non-empty container here has children deeper than the bound
            raise CheckpointFormatError(f"{where}: {what} nested deeper than {MAX_JSON_DEPTH} levels")
        nxt: tp.List[tp.Any] = []
        for node in level:
            nxt += [v for v in (node.values() if type(node) is dict else node) if type(v) is dict or type(v) is list]
        level, depth = nxt, depth + 1


# ---------------------------------------------------------------------------------------------- manifest
def read_manifest(ckpt_dir: PathLike) -> tp.Dict[str, tp.Any]:
    """Load and validate ``MANIFEST.json``; raise :class:`CheckpointFormatError` naming what is wrong."""
    ckpt_dir = Path(ckpt_dir)
    where = f"{ckpt_dir.name}/{MANIFEST}"
    if not (ckpt_dir / MANIFEST).exists() and not (ckpt_dir / MANIFEST).is_symlink():
        raise CheckpointFormatError(f"{ckpt_dir.name}: no {MANIFEST} (never committed)")
    with open_regular(ckpt_dir / MANIFEST) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_MANIFEST_BYTES:
            raise CheckpointFormatError(f"{where}: {size} bytes, over the {MAX_MANIFEST_BYTES >> 20} MiB bound")
        m = _loads(_read_exactly(f, size, where), where, "manifest")
    bad = _manifest_problem(m, ckpt_dir.name)
    if bad:
        raise CheckpointFormatError(f"{where}: malformed manifest ({bad})")
    return m


def _manifest_problem(m: tp.Any, dir_name: str) -> str:
    if not isinstance(m, dict) or m.get("format") != "hpctrain-ckpt":
        return "not an hpctrain manifest"
    version = m.get("format_version", 0)
    if not _is_int(version):
        return "format_version is not a non-negative integer"
    if version > FORMAT_VERSION:
        return f"format version {version} is newer than this hpctrain ({FORMAT_VERSION}); upgrade hpctrain"
    if not _is_int(m.get("step")):
        return "step is not a non-negative integer"
    parsed = parse_name(dir_name)
    if parsed is not None and parsed[0] != m["step"]:
        return f"step {m['step']} does not match the directory name"
    world = m.get("world_size")
    if not _is_int(world, 1, MAX_WORLD_SIZE):
        return f"world_size is not an integer in 1..{MAX_WORLD_SIZE}"
    shards = m.get("shards")
    if not isinstance(shards, list) or len(shards) != world:
        return "shards is not a list of world_size records"
    for i, s in enumerate(shards):
        if not (
            isinstance(s, dict)
            and s.get("file") == shard_name(i, world)
            and _is_int(s.get("bytes"))
            and _is_int(s.get("crc32"), 0, 0xFFFFFFFF)
            and s.get("rank", i) == i
        ):
            return f"shard record {i} is not {{file: {shard_name(i, world)}, bytes, crc32}}: {str(s)[:80]}"
    t = m.get("time", 0.0)
    # an int of hundreds of digits overflows math.isfinite: bound ints by value instead
    if not (type(t) is float and math.isfinite(t)) and not (type(t) is int and abs(t) < 1 << 62):
        return "time is not a number"
    for key in ("run_id", "identity", "host", "slurm_job_id", "job_id", "torch"):
        if not isinstance(m.get(key, ""), str):
            return f"{key} is not a string"
    if not isinstance(m.get("entries", []), list):
        return "entries is not a list"
    return ""


# ---------------------------------------------------------------------------------------------- headers
def _read_header_from(f: tp.BinaryIO, size: int, where: str) -> ShardHeader:
    return _read_header_crc(f, size, where)[0]


def _read_header_crc(f: tp.BinaryIO, size: int, where: str) -> tp.Tuple[ShardHeader, int]:
    """The checked header, and the crc32 of the file's bytes before its data start (read once)."""
    prefix = f.read(HEADER_PREFIX.size)
    if len(prefix) < HEADER_PREFIX.size:
        raise CheckpointFormatError(f"{where}: truncated ({size} bytes, no header)")
    magic, hlen = HEADER_PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CheckpointFormatError(f"{where}: not an hpctrain shard (bad magic {magic[:8]!r})")
    if hlen > min(MAX_HEADER_BYTES, size - HEADER_PREFIX.size):
        raise CheckpointFormatError(f"{where}: header length {hlen} exceeds file size {size}")
    body = _read_exactly(f, hlen, where)
    header = _loads(body, where, "header")
    data_start = align(HEADER_PREFIX.size + hlen)
    if not isinstance(header, dict) or not isinstance(header.get("entries"), list):
        raise CheckpointFormatError(f"{where}: header has no entry list")
    entries = header["entries"]
    ranges = [e for e in entries if type(e) is not dict or "box" not in e]
    # range entries are checked a field at a time; entry by entry (naming the first bad one) when that fails
    slow = entries if not _ranges_ok(ranges, data_start, size) else [e for e in entries if "box" in e]
    for e in slow:
        bad = _entry_problem(e, data_start, size)
        if bad:
            raise CheckpointFormatError(f"{where}: {bad}")
    crc = crc32(_read_exactly(f, data_start - HEADER_PREFIX.size - hlen, where), crc32(body, crc32(prefix)))
    return ShardHeader(header, data_start), crc


def read_header(path: PathLike) -> ShardHeader:
    """Parse and bounds-check one shard's header (entries only; :func:`build_index` checks the rest)."""
    path = Path(path)
    with open_regular(path) as f:
        return _read_header_from(f, os.fstat(f.fileno()).st_size, _where(path))


# ---------------------------------------------------------------------------------------------- the index
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


_Plain = tp.Tuple[str, tp.Tuple[int, ...], tp.List[tp.Tuple[tp.Any, ...]]]


def _plain(part: _Part) -> tp.Tuple[tp.Any, ...]:
    """``part`` as plain tuples for the exchange: pickle writes a NamedTuple through a Python ``__getnewargs__`` per
    object (6 ms per 1000 tensors, on every rank of every restore), a tuple in C."""

    def flat(table: tp.Dict[str, StoredTensor]) -> tp.Dict[str, _Plain]:
        return {k: (t.dtype, t.shape, [tuple(q) for q in t.pieces]) for k, t in table.items()}

    return tuple(part._replace(tensors=flat(part.tensors), local=[flat(m) for m in part.local]))


def _typed(plain: tp.Tuple[tp.Any, ...]) -> _Part:
    """The :class:`_Part` that :func:`_plain` flattened (``tuple.__new__``: no Python frame per object)."""
    new = tuple.__new__

    def typed(table: tp.Dict[str, _Plain]) -> tp.Dict[str, StoredTensor]:
        return {k: new(StoredTensor, (d, s, [new(PieceRef, q) for q in ps])) for k, (d, s, ps) in table.items()}

    part = new(_Part, plain)
    return part._replace(tensors=typed(part.tensors), local=[typed(m) for m in part.local])


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
            raise CheckpointFormatError(f"{_where(p)}: missing shard") from None
        if stat.S_ISREG(st.st_mode) and st.st_size != shards[i]["bytes"]:
            raise CheckpointFormatError(
                f"{_where(p)}: size {st.st_size} != {shards[i]['bytes']} in the manifest (truncated?)"
            )
    part = _Part(which, [], [], {}, [], [], None, [])
    tensors = part.tensors
    new = tuple.__new__  # PieceRef / StoredTensor without NamedTuple.__new__'s Python frame (4000+ of each)
    for i in which:
        p = ckpt_dir / shards[i]["file"]
        with open_regular(p) as f:
            size = os.fstat(f.fileno()).st_size
            if size != shards[i]["bytes"]:
                want = shards[i]["bytes"]
                raise CheckpointFormatError(f"{_where(p)}: size {size} != {want} in the manifest (truncated?)")
            h, head_crc = _read_header_crc(f, size, _where(p))
        hdr = h.header
        for field, want in (("rank", i), ("world_size", world), ("step", step)):
            if field in hdr and hdr[field] != want:
                raise CheckpointFormatError(f"{_where(p)}: header says {field} {str(hdr[field])[:20]}, expected {want}")
        part.data_starts.append(h.data_start)
        part.header_crcs.append(head_crc)
        mine: tp.Dict[str, StoredTensor] = {}
        ds = h.data_start
        for e in hdr["entries"]:
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
    for key, t in tensors.items():
        p0 = t.pieces[0]
        if len(t.pieces) == 1 and p0.box is None and p0.start == 0 and p0.stop == t.numel:
            continue  # most tensors: one range piece, the whole tensor
        if p0.box is not None or not _tiles(t):
            part.partial.append(key)  # chunks of a sharded tensor, or a range split over shards
    return part


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
                    chunk = f.read(_READ_CHUNK)
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
                        chunk = f.read(min(remaining, _READ_CHUNK))
                        if not chunk:
                            raise CheckpointFormatError(f"{index.path.name}: shard {shard} truncated")
                        h.update(chunk)
                        remaining -= len(chunk)
                    _BYTES_READ[0] += nbytes
            out[name] = h.hexdigest()
    finally:
        for f in files.values():
            f.close()
    out["data_state"] = hashlib.sha256(
        json.dumps(index.manifest.get("data_state"), sort_keys=True).encode()
    ).hexdigest()
    return out
