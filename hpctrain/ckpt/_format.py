"""The on-disk format: names, shard files, the commit manifest. Pure stdlib (no torch, no pickle).

A committed checkpoint is one directory per step::

    DIR/step-000001200/              committed (renamed here only after every rank succeeded)
        MANIFEST.json                written last by rank 0: step, world size, shards with size + crc32, ...
        rank-00000-of-00004.shard    one file per rank: a JSON header + raw tensor bytes
        ...
    DIR/step-000001300.tmp-j123-r0-9f2c...   a save in progress or abandoned (never loaded)
    DIR/step-000001100.quarantined-20261130T120000   failed verification on restore (kept for forensics)
    DIR/LATEST                       "step-000001200\\n", replaced atomically (a hint only: restore scans)

A shard file is ``MAGIC (8 bytes) | header length (8 bytes, little endian) | header JSON | padding |
data``. Every data entry starts on a 64-byte boundary relative to the data start, which is itself
aligned to 64 bytes. The header holds:

* ``entries``: ``[{"key", "dtype", "shape", "start", "stop", "offset", "nbytes"}]``: this rank's
  piece of the flattened tensor ``key`` (elements ``start:stop``), stored at ``offset``.
* ``trees`` (rank 0 only): the replicated state as JSON, tensors replaced by ``{"__tensor__": key}``.
* ``local``: this rank's rank-local state tree (RNG states), tensors keyed ``local/...``.

Loading never executes anything: JSON is parsed, bytes are reinterpreted with a whitelisted dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import typing as tp
import zlib
from pathlib import Path

from hpctrain.errors import CheckpointFormatError

try:  # ISA-L's crc32 is the same CRC (gzip polynomial) at ~4-5x zlib's speed; checksums stay compatible
    from isal.isal_zlib import crc32

    CRC32_IMPL = "isal"
except ImportError:  # pragma: no cover - the [fast] extra is optional
    crc32 = zlib.crc32
    CRC32_IMPL = "zlib"

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MANIFEST",
    "LATEST",
    "DTYPE_SIZES",
    "ShardHeader",
    "CheckpointFormatError",
    "shard_name",
    "step_name",
    "parse_header_bytes",
    "encode_header",
    "tmp_name",
    "quarantine_name",
    "parse_name",
    "read_header",
    "read_manifest",
    "crc32",
    "CRC32_IMPL",
    "crc32_file",
    "verify_dir",
    "digest_dir",
    "ALIGN",
]

FORMAT_VERSION = 1
MAGIC = b"HPCKSHD1"
MANIFEST = "MANIFEST.json"
LATEST = "LATEST"
ALIGN = 64
_PREFIX = struct.Struct("<8sQ")
_MAX_HEADER = 1 << 30

# torch dtype name -> element size; the only dtypes a shard may name (anything else is rejected).
DTYPE_SIZES: tp.Dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

_NAME = re.compile(r"^step-(\d{9,})(?:\.(tmp|quarantined|deleting)-([A-Za-z0-9_.-]+))?$")


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def tmp_name(step: int, tag: str) -> str:
    return f"{step_name(step)}.tmp-{tag}"


def quarantine_name(step: int, stamp: str) -> str:
    return f"{step_name(step)}.quarantined-{stamp}"


def shard_name(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}.shard"


def parse_name(name: str) -> tp.Optional[tp.Tuple[int, str]]:
    """``(step, kind)`` with kind in committed/tmp/quarantined/deleting, or None for foreign names."""
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group(1)), (m.group(2) or "committed")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class ShardHeader(tp.NamedTuple):
    header: tp.Dict[str, tp.Any]
    data_start: int


def encode_header(header: tp.Dict[str, tp.Any]) -> bytes:
    """Prefix + JSON header + padding, so that data starts at an aligned offset."""
    body = json.dumps(header, separators=(",", ":"), allow_nan=True).encode("utf-8")
    raw = _PREFIX.pack(MAGIC, len(body)) + body
    return raw + b"\0" * (align(len(raw)) - len(raw))


def read_header(path: tp.Union[str, os.PathLike]) -> ShardHeader:
    """Parse and bounds-check a shard header; raise :class:`CheckpointFormatError` naming the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size:
                raise CheckpointFormatError(f"{path.name}: truncated ({size} bytes, no header)")
            magic, hlen = _PREFIX.unpack(prefix)
            if magic != MAGIC:
                raise CheckpointFormatError(f"{path.name}: not an hpctrain shard (bad magic {magic[:8]!r})")
            if hlen > min(_MAX_HEADER, size):
                raise CheckpointFormatError(f"{path.name}: header length {hlen} exceeds file size {size}")
            body = f.read(hlen)
    except OSError as exc:
        raise CheckpointFormatError(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    return _parse_body(path.name, body, hlen, size)


def parse_header_bytes(name: str, data: tp.Union[bytes, memoryview]) -> ShardHeader:
    """Like :func:`read_header` for a shard already read into memory."""
    size = len(data)
    if size < _PREFIX.size:
        raise CheckpointFormatError(f"{name}: truncated ({size} bytes, no header)")
    magic, hlen = _PREFIX.unpack(bytes(data[: _PREFIX.size]))
    if magic != MAGIC:
        raise CheckpointFormatError(f"{name}: not an hpctrain shard (bad magic {magic[:8]!r})")
    if hlen > min(_MAX_HEADER, size - _PREFIX.size):
        raise CheckpointFormatError(f"{name}: header length {hlen} exceeds file size {size}")
    return _parse_body(name, bytes(data[_PREFIX.size : _PREFIX.size + hlen]), hlen, size)


def _parse_body(name: str, body: bytes, hlen: int, size: int) -> ShardHeader:
    if len(body) != hlen:
        raise CheckpointFormatError(f"{name}: truncated header")
    try:
        header = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(f"{name}: corrupt header ({exc})") from None
    data_start = align(_PREFIX.size + hlen)
    _check_entries(name, header, data_start, size)
    return ShardHeader(header, data_start)


def _check_entries(name: str, header: tp.Any, data_start: int, size: int) -> None:
    if not isinstance(header, dict) or not isinstance(header.get("entries"), list):
        raise CheckpointFormatError(f"{name}: header has no entry list")
    for e in header["entries"]:
        try:
            dtype, shape, start, stop = e["dtype"], e["shape"], int(e["start"]), int(e["stop"])
            offset, nbytes = int(e["offset"]), int(e["nbytes"])
            if dtype not in DTYPE_SIZES:
                raise CheckpointFormatError(f"{name}: entry {e['key']!r} has unsupported dtype {dtype!r}")
            numel = 1
            for d in shape:
                if int(d) < 0:
                    raise ValueError
                numel *= int(d)
            if not (0 <= start <= stop <= numel) or nbytes != (stop - start) * DTYPE_SIZES[dtype]:
                raise ValueError
            if offset < 0 or offset % ALIGN or data_start + offset + nbytes > size:
                raise CheckpointFormatError(f"{name}: entry {e['key']!r} lies past the end of the file (truncated?)")
        except (KeyError, TypeError, ValueError):
            raise CheckpointFormatError(f"{name}: malformed entry {str(e)[:80]}") from None


def read_manifest(ckpt_dir: tp.Union[str, os.PathLike]) -> tp.Dict[str, tp.Any]:
    """Load and validate ``MANIFEST.json``; raise :class:`CheckpointFormatError` when it is missing or malformed."""
    path = Path(ckpt_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise CheckpointFormatError(f"{Path(ckpt_dir).name}: no {MANIFEST} (never committed)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(f"{Path(ckpt_dir).name}/{MANIFEST}: unreadable ({exc})") from None
    ok = (
        isinstance(manifest, dict)
        and manifest.get("format") == "hpctrain-ckpt"
        and isinstance(manifest.get("step"), int)
        and isinstance(manifest.get("world_size"), int)
        and isinstance(manifest.get("shards"), list)
        and len(manifest["shards"]) == manifest["world_size"]
    )
    if not ok:
        raise CheckpointFormatError(f"{Path(ckpt_dir).name}/{MANIFEST}: malformed manifest")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{Path(ckpt_dir).name}: format version {manifest['format_version']} is newer than this hpctrain "
            f"({FORMAT_VERSION}); upgrade hpctrain"
        )
    for s in manifest["shards"]:
        if not (
            isinstance(s, dict)
            and isinstance(s.get("file"), str)
            and "/" not in s["file"]
            and isinstance(s.get("bytes"), int)
            and isinstance(s.get("crc32"), int)
        ):
            raise CheckpointFormatError(f"{Path(ckpt_dir).name}/{MANIFEST}: malformed shard record {str(s)[:80]}")
    return manifest


def crc32_file(path: tp.Union[str, os.PathLike], chunk: int = 16 << 20) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                return crc
            crc = crc32(view[:n], crc)


def verify_dir(
    ckpt_dir: tp.Union[str, os.PathLike], *, checksums: bool = True, only: tp.Optional[tp.Sequence[int]] = None
) -> tp.Dict[str, tp.Any]:
    """Check a checkpoint against its manifest; return the manifest or raise :class:`CheckpointFormatError`.

    Sizes and headers are always checked; crc32 of every shard (or of shards ``only``) when ``checksums``.
    The error names the first bad file.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    for i, s in enumerate(manifest["shards"]):
        path = ckpt_dir / s["file"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointFormatError(f"{ckpt_dir.name}/{s['file']}: missing shard") from None
        if size != s["bytes"]:
            raise CheckpointFormatError(
                f"{ckpt_dir.name}/{s['file']}: size {size} != {s['bytes']} in the manifest (truncated?)"
            )
        if checksums and (only is None or i in only):
            if crc32_file(path) != s["crc32"]:
                raise CheckpointFormatError(f"{ckpt_dir.name}/{s['file']}: checksum mismatch (corrupted shard)")
        read_header(path)
    return manifest


def _tensor_keys(tree: tp.Any, out: tp.List[str]) -> None:
    if isinstance(tree, dict):
        if "__tensor__" in tree and len(tree) == 1:
            out.append(tree["__tensor__"])
            return
        for v in tree.values():
            _tensor_keys(v, out)
    elif isinstance(tree, list):
        for v in tree:
            _tensor_keys(v, out)


def digest_dir(ckpt_dir: tp.Union[str, os.PathLike]) -> tp.Dict[str, str]:
    """sha256 per top-level state entry, independent of the world size that wrote the checkpoint.

    Each digest covers the entry's JSON structure and, for every tensor it references (in order),
    dtype, shape and the element bytes in order, however they were split over shards. Rank-local
    state (RNG) is excluded; ``data_state`` is hashed from the manifest.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest = verify_dir(ckpt_dir, checksums=False)
    headers = [read_header(ckpt_dir / s["file"]) for s in manifest["shards"]]
    pieces: tp.Dict[str, tp.List[tp.Tuple[int, int, int, tp.Dict[str, tp.Any]]]] = {}
    for i, h in enumerate(headers):
        for e in h.header["entries"]:
            pieces.setdefault(e["key"], []).append((e["start"], i, h.data_start + e["offset"], e))
    trees = headers[0].header.get("trees", {})
    out: tp.Dict[str, str] = {}
    files = [open(ckpt_dir / s["file"], "rb") for s in manifest["shards"]]
    try:
        for name in sorted(trees):
            h = hashlib.sha256(json.dumps(trees[name], sort_keys=True).encode())
            keys: tp.List[str] = []
            _tensor_keys(trees[name], keys)
            for key in keys:
                ps = sorted(pieces.get(key, []), key=lambda p: p[0])
                if not ps:
                    raise CheckpointFormatError(f"{ckpt_dir.name}: tensor {key!r} has no stored piece")
                e0 = ps[0][3]
                h.update(json.dumps([e0["dtype"], e0["shape"]]).encode())
                for _, i, off, e in ps:
                    files[i].seek(off)
                    remaining = e["nbytes"]
                    while remaining:
                        chunk = files[i].read(min(remaining, 16 << 20))
                        if not chunk:
                            raise CheckpointFormatError(f"{ckpt_dir.name}: shard {i} truncated")
                        h.update(chunk)
                        remaining -= len(chunk)
            out[name] = h.hexdigest()
    finally:
        for f in files:
            f.close()
    out["data_state"] = hashlib.sha256(json.dumps(manifest.get("data_state"), sort_keys=True).encode()).hexdigest()
    return out
