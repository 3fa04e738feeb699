"""Checks of a shard header's entries (stdlib): entry by entry, naming the first bad one, and a field at a time
for range entries (one comprehension per field instead of one call per entry: the fast path of restore)."""

from __future__ import annotations

import math
import operator
import typing as tp

from hpctrain.ckpt._format import ALIGN, DTYPE_SIZES, RANGE_FIELDS

__all__ = ["MAX_DIMS", "RangeColumns", "_entry_problem", "_ranges_ok", "range_columns"]

MAX_DIMS = 64
_MAX_ELEMENTS = 1 << 62  # keeps shapes and strides inside int64 (torch's index type)


def _is_int(v: tp.Any, lo: int = 0, hi: tp.Optional[int] = None) -> bool:
    """A JSON integer in [lo, hi] (``True`` is not an int here)."""
    return type(v) is int and v >= lo and (hi is None or v <= hi)


def _entry_problem(e: tp.Any, data_start: int, size: int) -> str:
    if type(e) is not dict or type(e.get("key")) is not str:
        return f"malformed entry {_short(e)}"
    key, dtype, shape = e["key"], e.get("dtype"), e.get("shape")
    es = DTYPE_SIZES.get(dtype) if type(dtype) is str else None
    if es is None:
        return f"entry {key!r} has unsupported dtype {_short(dtype, 40)!r}"
    if type(shape) is not list or len(shape) > MAX_DIMS or not all([type(d) is int and d >= 0 for d in shape]):
        return f"entry {key!r} has a malformed shape {_short(shape)}"
    numel = math.prod(shape)
    if (numel if numel else math.prod([max(d, 1) for d in shape])) >= _MAX_ELEMENTS:
        return f"entry {key!r} has an absurd shape {_short(shape)}"
    offset, nbytes = e.get("offset"), e.get("nbytes")
    if "box" in e:  # a sharded tensor's chunk (format 2)
        box = e["box"]
        if not (
            isinstance(box, list)
            and len(box) == 2
            and all(isinstance(b, list) and len(b) == len(shape) and all(_is_int(x) for x in b) for b in box)
            and "start" not in e
            and _is_int(offset)
            and _is_int(nbytes)
        ):
            return f"entry {key!r} has a malformed chunk {_short(box)}"
        if any(o + n > d for o, n, d in zip(box[0], box[1], shape)):
            return f"entry {key!r}: chunk {box} lies outside the shape {shape}"
        start, stop = 0, math.prod(box[1])
    else:
        start, stop = e.get("start"), e.get("stop")
        if not (
            type(start) is int
            and type(stop) is int
            and type(offset) is int
            and type(nbytes) is int
            and min(start, stop, offset, nbytes) >= 0
        ):
            return f"malformed entry {_short(e)}"
    if not start <= stop <= numel or nbytes != (stop - start) * es:
        return f"entry {key!r} has inconsistent element range {start}:{stop} of {numel} / {nbytes} bytes"
    if offset % ALIGN or data_start + offset + nbytes > size:
        return f"entry {key!r} lies past the end of the file (truncated?)"
    return ""


class RangeColumns(tp.NamedTuple):
    """The fields of checked range entries, one list per field, in the entries' order."""

    keys: tp.List[str]
    dtypes: tp.List[str]
    shapes: tp.List[tp.List[int]]
    starts: tp.List[int]
    stops: tp.List[int]
    offsets: tp.List[int]
    nbytes: tp.List[int]


def _ranges_ok(entries: tp.List[tp.Any], data_start: int, size: int) -> bool:
    """Whether every one of ``entries`` passes :func:`_entry_problem` as a range entry (:func:`range_columns`)."""
    return range_columns(entries, data_start, size) is not None


def range_columns(entries: tp.List[tp.Any], data_start: int, size: int) -> tp.Optional[RangeColumns]:
    """The fields of ``entries`` when every one passes :func:`_entry_problem` as a range entry, checked a field
    at a time (one comprehension per field, not one call per entry); the index is built from these columns. None:
    some entry does not (or is not a range entry); the caller then checks entry by entry, which names the first
    bad one."""
    if not all([type(e) is dict for e in entries]):
        return None
    keys, dtypes, shapes, starts, stops, offsets, nbytes = ([e.get(f) for e in entries] for f in RANGE_FIELDS)
    try:
        if not (set(map(type, keys)) <= {str} and set(map(type, dtypes)) <= {str}):
            return None
        if not set(dtypes) <= DTYPE_SIZES.keys():
            return None
        if not set(map(type, shapes)) <= {list} or max(map(len, shapes), default=0) > MAX_DIMS:
            return None
        dims = [d for shape in shapes for d in shape]
        ints = starts + stops + offsets + nbytes
        if not (set(map(type, dims)) <= {int} and set(map(type, ints)) <= {int}):
            return None
        if min(dims, default=0) < 0 or min(ints, default=0) < 0:
            return None
        numels = list(map(math.prod, shapes))
        if max(numels, default=0) >= _MAX_ELEMENTS:
            return None
        if 0 in numels and any(math.prod([max(d, 1) for d in s]) >= _MAX_ELEMENTS for s in shapes):
            return None
        sizes = list(map(DTYPE_SIZES.__getitem__, dtypes))
        room = size - data_start
        ok = (
            all(map(operator.le, starts, stops))
            and all(map(operator.le, stops, numels))
            and not any([n != (b - a) * es for a, b, n, es in zip(starts, stops, nbytes, sizes)])
            and not any([o % ALIGN or o + n > room for o, n in zip(offsets, nbytes)])
        )
    except TypeError:  # an unhashable dtype and the like: the per-entry check says what
        return None
    return RangeColumns(keys, dtypes, shapes, starts, stops, offsets, nbytes) if ok else None


def _short(v: tp.Any, n: int = 80) -> str:
    """The start of ``str(v)`` for an error message (the JSON is depth-checked before: str cannot recurse far)."""
    return str(v)[:n]
