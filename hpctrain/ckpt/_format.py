"""The on-disk format: names, shard files, the commit manifest. Pure stdlib (no torch, no pickle).

A committed checkpoint is one directory per step::

    DIR/step-000001200/              committed (renamed here only after every rank succeeded)
        MANIFEST.json                written last by rank 0: step, world size, shards with size + crc32, ...
        rank-00000-of-00004.shard    one file per rank: a JSON header + raw tensor bytes
        ...
    DIR/step-000001300.tmp-j123-r0-9f2c...   a save in progress or abandoned (never loaded)
    DIR/step-000001100.quarantined-20261130T120000   failed verification on restore (kept for forensics)
    DIR/step-000001200.replaced-1a2b3c4d     a re-save's previous copy, until the new step-N is committed
    DIR/LATEST                       "step-000001200\\n", replaced atomically (a hint only: restore scans)

A shard file is ``MAGIC (8 bytes) | header length (8 bytes, little endian) | header JSON | padding |
data``. Every data entry starts on a 64-byte boundary relative to the data start, which is itself
aligned to 64 bytes. The header holds:

* ``entries``: ``[{"key", "dtype", "shape", "start", "stop", "offset", "nbytes"}]``: this rank's
  piece of the flattened tensor ``key`` (elements ``start:stop``), stored at ``offset``. Or, for a
  sharded tensor (a DTensor's local chunk; format version 2), ``{"key", "dtype", "shape", "box",
  "offset", "nbytes"}``: ``shape`` is the global shape, ``box`` is ``[offsets, lengths]`` per dimension
  of the chunk, whose elements are stored row-major. The pieces of one tensor are all ranges or all boxes.
* ``trees`` (rank 0 only): the replicated state as JSON, tensors replaced by ``{"__tensor__": key}``.
* ``local``: this rank's rank-local state tree (RNG states), tensors keyed ``local/...``.

Loading never executes anything: JSON is parsed, bytes are reinterpreted with a whitelisted dtype.
"""

from __future__ import annotations

import json
import json.encoder
import re
import struct
import typing as tp
import zlib

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
    "HEADER_PREFIX",
    "MANIFEST",
    "LATEST",
    "DTYPE_SIZES",
    "NUMPY_DTYPES",
    "ALIGN",
    "ShardHeader",
    "CheckpointFormatError",
    "align",
    "shard_name",
    "step_name",
    "encode_header",
    "header_json",
    "entries_json",
    "RANGE_FIELDS",
    "tmp_name",
    "replaced_name",
    "quarantine_name",
    "parse_name",
    "crc32",
    "CRC32_IMPL",
]

FORMAT_VERSION = 2
"""Written as 2 when a checkpoint holds sharded (box) entries, else as 1; both are read."""
MAGIC = b"HPCKSHD1"
MANIFEST = "MANIFEST.json"
LATEST = "LATEST"
ALIGN = 64
"""Every tensor piece starts on a multiple of this many bytes from the data start (itself aligned)."""
HEADER_PREFIX = struct.Struct("<8sQ")
"""Magic and header length at the start of every shard."""
_escape = json.encoder.encode_basestring_ascii
"""JSON's own string escaper (C), as :func:`header_json` (``ensure_ascii``) writes every string."""
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

# dtypes a ``{"__tensor__": key, "as": "numpy"}`` reference may name (numpy has no bfloat16/float8)
NUMPY_DTYPES = frozenset(DTYPE_SIZES) - {"bfloat16", "float8_e4m3fn", "float8_e5m2"}

_NAME = re.compile(r"^step-(\d{9,})(?:\.(tmp|quarantined|deleting|replaced)-([A-Za-z0-9_.-]+))?$")


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def tmp_name(step: int, tag: str) -> str:
    return f"{step_name(step)}.tmp-{tag}"


def replaced_name(step: int, token: str) -> str:
    """Where a re-save moves the previous copy of ``step`` until the new one is durable."""
    return f"{step_name(step)}.replaced-{token}"


def quarantine_name(step: int, stamp: str) -> str:
    return f"{step_name(step)}.quarantined-{stamp}"


def shard_name(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}.shard"


def parse_name(name: str) -> tp.Optional[tp.Tuple[int, str]]:
    """``(step, kind)`` with kind in committed/tmp/quarantined/deleting/replaced, or None for foreign names."""
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group(1)), (m.group(2) or "committed")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class ShardHeader(tp.NamedTuple):
    header: tp.Dict[str, tp.Any]
    data_start: int


def header_json(value: tp.Any) -> str:
    """``value`` as the header's JSON text (compact; the encoding every header field is written with)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


RANGE_FIELDS = ("key", "dtype", "shape", "start", "stop", "offset", "nbytes")
"""A range entry's fields, in the order a save writes them."""


def entries_json(entries: tp.Sequence[tp.Dict[str, tp.Any]]) -> str:
    """:func:`header_json` of a list of header entries, the same text, at ~2.5x its speed for range entries (a
    first save's rank with 3000 small tensors: 1.6 ms instead of 3.9): each written from a template, its key
    escaped by json's own C escaper, its shape's text reused across entries of that shape. Any other entry (a
    box, a field in another order, a non-int number) is encoded by :func:`header_json` itself."""
    escape, shapes = _escape, {}
    out = []
    for e in entries:
        if tuple(e) != RANGE_FIELDS or type(e["key"]) is not str or type(e["dtype"]) is not str:
            out.append(header_json(e))
            continue
        shape, start, stop, offset, nbytes = e["shape"], e["start"], e["stop"], e["offset"], e["nbytes"]
        if not (type(start) is int and type(stop) is int and type(offset) is int and type(nbytes) is int):
            out.append(header_json(e))
            continue
        at = tuple(shape)
        text = shapes.get(at)
        if text is None:
            text = shapes[at] = header_json(shape)
        out.append(
            f'{{"key":{escape(e["key"])},"dtype":{escape(e["dtype"])},"shape":{text},"start":{start},'
            f'"stop":{stop},"offset":{offset},"nbytes":{nbytes}}}'
        )
    return "[" + ",".join(out) + "]"


def encode_header(header: tp.Dict[str, tp.Any], encoded: tp.Optional[tp.Mapping[str, str]] = None) -> bytes:
    """Prefix + JSON header + padding, so that data starts at an aligned offset.

    ``encoded``: fields whose :func:`header_json` text the caller already has (a save reuses its entries' text
    while the layout repeats); the bytes are exactly those of encoding ``header`` whole."""
    if encoded:
        text = ",".join(f"{header_json(k)}:{encoded[k] if k in encoded else header_json(v)}" for k, v in header.items())
        body = ("{" + text + "}").encode("utf-8")
    else:
        body = header_json(header).encode("utf-8")
    raw = HEADER_PREFIX.pack(MAGIC, len(body)) + body
    return raw + b"\0" * (align(len(raw)) - len(raw))
