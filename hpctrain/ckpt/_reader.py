"""The one reader of checkpoint files: their opening, the manifest and the shard headers, checked. Pure stdlib.

:mod:`hpctrain.ckpt._index` builds the index of a checkpoint from what this reads (restore, ``ckpt verify``,
``ckpt digest`` and ``ckpt ls`` all go through it).

Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be regular files (``fstat``): a FIFO or a
device in place of a shard or manifest is an error, not a hang, and a symbolic link is refused (a
checkpoint is a self-contained directory; nothing it names lies outside it). Sizes are bounded
before anything is read into memory, and JSON nesting is bounded before anything recurses over it.
"""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import stat
import typing as tp
from pathlib import Path

from hpctrain.ckpt._entries import RangeColumns, _entry_problem, _is_int, range_columns
from hpctrain.ckpt._format import (
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

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_WORLD_SIZE",
    "MAX_JSON_DEPTH",
    "READ_CHUNK",
    "PathLike",
    "file_label",
    "open_regular",
    "read_exactly",
    "read_manifest",
    "read_header",
    "read_header_crc",
    "bytes_read",
    "count_read",
]

MAX_MANIFEST_BYTES = 64 << 20
"""A manifest names one small record per rank (~100 bytes): 64 MiB is far beyond any real world size."""
MAX_HEADER_BYTES = 1 << 30
"""A shard header is JSON metadata; a length beyond this is damage, never a real header."""
MAX_WORLD_SIZE = 99_999
"""Shard file names carry five digits of rank and world size."""
MAX_JSON_DEPTH = 100
"""State dicts nest a handful of levels; deeper JSON is refused before anything recurses over it."""
READ_CHUNK = 16 << 20
"""The largest single read of a checkpoint file."""
_BYTES_READ = [0]  # tensor bytes read from shard files by this process (restore, digest): the benchmark's meter


def bytes_read() -> int:
    """Tensor bytes this process has read from shard files so far (headers and manifests not counted)."""
    return _BYTES_READ[0]


def count_read(nbytes: int) -> None:
    """Add ``nbytes`` of tensor bytes read from shard files to :func:`bytes_read`."""
    _BYTES_READ[0] += nbytes


PathLike = tp.Union[str, os.PathLike]


def file_label(path: Path) -> str:
    """``step-N/file``: how errors name a checkpoint's file."""
    return f"{path.parent.name}/{path.name}"


def open_regular(path: PathLike) -> tp.BinaryIO:
    """Open a checkpoint file for reading: a regular file, not a symlink, never blocking on a FIFO or device."""
    path = Path(path)
    where = file_label(path)
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


def read_exactly(f: tp.BinaryIO, n: int, where: str) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = f.read(min(n - got, READ_CHUNK))
        if not chunk:
            raise CheckpointFormatError(f"{where}: truncated while reading")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _loads(raw: bytes, where: str, what: str) -> tp.Any:
    """The parsed JSON ``raw``, checked to nest at most MAX_JSON_DEPTH deep."""
    obj = _parse(raw, where, what)
    _check_nesting(raw, obj, where, what)
    return obj


def _check_nesting(raw: bytes, obj: tp.Any, where: str, what: str) -> None:
    """``obj`` (parsed from ``raw``) nests at most MAX_JSON_DEPTH deep: decided from the bytes when they say so
    (:func:`_shallow`), else by walking the tree."""
    if not _shallow(raw):
        _check_depth(obj, where, what)


def _parse(raw: bytes, where: str, what: str) -> tp.Any:
    """The parsed JSON ``raw``, its depth not checked yet (as deep as the parser went: the caller checks it before
    anything recursive meets it)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointFormatError(f"{where}: corrupt {what} ({str(exc)[:100]})") from None
    except RecursionError:
        raise CheckpointFormatError(f"{where}: {what} nested too deeply") from None


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
        m = _loads(read_exactly(f, size, where), where, "manifest")
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
    return read_header_crc(f, size, where)[0]


def read_header_crc(f: tp.BinaryIO, size: int, where: str) -> tp.Tuple[ShardHeader, int, tp.Optional[RangeColumns]]:
    """The checked header, the crc32 of the file's bytes before its data start (read once), and its entries'
    fields as columns when every entry is a range entry (checked a field at a time; None otherwise)."""
    prefix = f.read(HEADER_PREFIX.size)
    if len(prefix) < HEADER_PREFIX.size:
        raise CheckpointFormatError(f"{where}: truncated ({size} bytes, no header)")
    magic, hlen = HEADER_PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CheckpointFormatError(f"{where}: not an hpctrain shard (bad magic {magic[:8]!r})")
    if hlen > min(MAX_HEADER_BYTES, size - HEADER_PREFIX.size):
        raise CheckpointFormatError(f"{where}: header length {hlen} exceeds file size {size}")
    body = read_exactly(f, hlen, where)
    header = _parse(body, where, "header")
    data_start = align(HEADER_PREFIX.size + hlen)
    if not isinstance(header, dict) or not isinstance(header.get("entries"), list):
        _check_nesting(body, header, where, "header")  # a header too deep is reported as that, as any JSON is
        raise CheckpointFormatError(f"{where}: header has no entry list")
    entries = header["entries"]
    ranges = [e for e in entries if type(e) is not dict or "box" not in e]
    # range entries are checked a field at a time (nothing recursive: range_columns looks at each value's type
    # first); entry by entry (naming the first bad one) when that fails
    cols = range_columns(ranges, data_start, size)
    if cols is not None and len(ranges) == len(entries):
        # every entry is flat (strings, ints, a list of ints): only the rest of the header (the state trees, which
        # unflatten recurses over) can nest; checked as a tree, not the whole text as bytes (a shard of 3000 small
        # tensors: its header's 380 KB, 1.9 ms and ~1.5 MB of fresh memory in _shallow, on the rank every other
        # rank waits for in a restore's index exchange)
        _check_depth({k: v for k, v in header.items() if k != "entries"}, where, "header")
    else:
        _check_nesting(body, header, where, "header")
    slow = entries if cols is None else [e for e in entries if "box" in e]
    for e in slow:
        bad = _entry_problem(e, data_start, size)
        if bad:
            raise CheckpointFormatError(f"{where}: {bad}")
    crc = crc32(read_exactly(f, data_start - HEADER_PREFIX.size - hlen, where), crc32(body, crc32(prefix)))
    return ShardHeader(header, data_start), crc, cols if len(ranges) == len(entries) else None


def read_header(path: PathLike) -> ShardHeader:
    """Parse and bounds-check one shard's header (entries only; :func:`hpctrain.ckpt._index.build_index` checks
    the rest)."""
    path = Path(path)
    with open_regular(path) as f:
        return _read_header_from(f, os.fstat(f.fileno()).st_size, file_label(path))
