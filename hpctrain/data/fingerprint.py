"""Fingerprints of input files in two tiers, and the full content hash (numpy + h5py only, no torch).

- **Cheap tier** (:func:`cheap_fingerprint`, every start): path, size, mtime, inode, and for HDF5 the
  structure read from metadata only: every dataset's shape, dtype, chunking, filters, fill value and
  attributes, every group's attributes, soft/external links and their targets, virtual datasets' sources,
  and the size and mtime of every other file the data is read from (:func:`hpctrain.data._resolve.dataset_files`).
- **Content tier** (:func:`content_fingerprint`): a sha256 over a **deterministic sample**, labelled
  ``"kind": "sample"`` with its parameters: for each chunked dataset the first, the last and ``k`` evenly
  spaced chunks of its chunk grid, read raw with ``read_direct_chunk`` (the stored bytes, no filter pipeline),
  plus a hash of the chunk index (every chunk's position, stored size and filter mask: a change to any
  compressed chunk changes its size in practice); for contiguous data ``k + 2`` blocks of ``block_bytes``
  read with ``pread`` at the dataset's offset; otherwise (compact, virtual, external storage) the same number
  of row slices through h5py. A file that is not HDF5 is sampled as bytes the same way. **A sample is not
  the file**: a change outside the sampled chunks of uncompressed data goes unseen. :func:`full_hash` reads
  everything (``python -m hpctrain data hash FILE...``).
- :func:`fingerprint_files` caches the content tier in a JSON file keyed by the cheap tier (device, inode,
  size, mtime, path and structure, as DVC keys its state on inode/mtime/size), so a restart reads nothing
  but metadata. A file rewritten in place with its size and mtime restored is not seen by the cache.
- :func:`compare` says what changed between two fingerprints of a file, in words.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
import typing as tp

import numpy as np

from hpctrain._files import NotReadable, read_bounded, sha256_fd
from hpctrain.errors import HpctrainError, UsageError

__all__ = [
    "SAMPLE_K",
    "BLOCK_BYTES",
    "FINGERPRINT_SCHEMA",
    "cheap_fingerprint",
    "content_fingerprint",
    "fingerprint_files",
    "full_hash",
    "compare",
    "essentials",
    "cache_key",
]

FINGERPRINT_SCHEMA = "hpctrain.data.fingerprint/1"
CACHE_SCHEMA = "hpctrain.data.fingerprint-cache/1"
SAMPLE_K = 8
"""Evenly spaced chunks (or blocks) sampled per dataset besides the first and the last."""
BLOCK_BYTES = 1 << 20
"""Bytes per sampled block of contiguous data or of a non-HDF5 file."""
MAX_INDEXED_CHUNKS = 4_000_000
"""Datasets with more allocated chunks than this skip the chunk-index hash (its cost grows with the count)."""
CACHE_ENTRIES = 4096
_ATTR_INLINE = 64  # attribute arrays with more elements are recorded as dtype, shape and sha256
_READ = 8 << 20

# what h5py raises on damaged metadata (as in hpctrain.data._h5)
_DAMAGE = (OSError, RuntimeError, KeyError, ValueError, TypeError, SystemError, IndexError, OverflowError)


def _canonical(obj: tp.Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _sha(obj: tp.Any) -> str:
    return hashlib.sha256(_canonical(obj)).hexdigest()


# ---------------------------------------------------------------------------------------------- cheap tier
def _stat(path: str) -> tp.Dict[str, tp.Any]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot stat it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: not a regular file; input data must be files")
    return {
        "path": os.path.abspath(path),
        "name": os.path.basename(path),
        "size": int(st.st_size),
        "mtime_ns": int(st.st_mtime_ns),
        "inode": int(st.st_ino),
        "device": int(st.st_dev),
    }


def _jsonable(value: tp.Any) -> tp.Any:
    """An attribute (or fill) value as canonical JSON: small arrays as lists, large ones by their hash."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else repr(f)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufcSUO" and value.size <= _ATTR_INLINE and value.dtype.kind != "c":
            return [_jsonable(v) for v in value.reshape(-1).tolist()] if value.ndim else _jsonable(value.item())
        raw = value.tobytes() if value.dtype.kind != "O" else repr(value.tolist()).encode()
        return {"dtype": value.dtype.str, "shape": list(value.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)[:200]


def _attrs(obj: tp.Any) -> tp.Dict[str, tp.Any]:
    out: tp.Dict[str, tp.Any] = {}
    try:
        names = list(obj.attrs.keys())
    except _DAMAGE as exc:
        return {"<error>": _why(exc)}
    for name in sorted(names):
        try:
            out[name] = _jsonable(obj.attrs[name])
        except _DAMAGE as exc:  # an attribute of a type h5py cannot read
            out[name] = {"unreadable": _why(exc)}
    return out


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


def _layout(ds: tp.Any) -> str:
    import h5py

    try:
        kind = ds.id.get_create_plist().get_layout()
    except _DAMAGE:
        return "unknown"
    return {
        h5py.h5d.CONTIGUOUS: "contiguous",
        h5py.h5d.CHUNKED: "chunked",
        h5py.h5d.COMPACT: "compact",
        getattr(h5py.h5d, "VIRTUAL", -1): "virtual",
    }.get(kind, str(kind))


def _dataset(path: str, ds: tp.Any) -> tp.Dict[str, tp.Any]:
    from hpctrain.data._resolve import dataset_files

    plist = ds.id.get_create_plist()
    filters = []
    for i in range(plist.get_nfilters()):
        code, flags, values, name = plist.get_filter(i)
        filters.append([int(code), int(flags), [int(v) for v in values], name.decode("ascii", "replace")])
    desc: tp.Dict[str, tp.Any] = {
        "type": "dataset",
        "shape": None if ds.shape is None else [int(n) for n in ds.shape],
        "maxshape": None if ds.maxshape is None else [None if n is None else int(n) for n in ds.maxshape],
        "dtype": ds.dtype.str if ds.dtype.fields is None else str(ds.dtype.descr),
        "layout": _layout(ds),
        "chunks": [int(c) for c in ds.chunks] if ds.chunks else None,
        "filters": filters,
        "attrs": _attrs(ds),
    }
    try:
        desc["fillvalue"] = _jsonable(ds.fillvalue)
    except _DAMAGE:
        desc["fillvalue"] = None
    if ds.is_virtual:
        desc["virtual_sources"] = sorted([s.file_name, s.dset_name] for s in ds.virtual_sources())
    if ds.external:
        desc["external_storage"] = [[str(e[0]), int(e[1]), int(e[2])] for e in ds.external]
    try:
        deps = dataset_files(path, ds)
        desc["reads_files"] = {f: {"size": i[2], "mtime_ns": i[3]} for f, i in sorted(deps.items())}
    except UsageError as exc:
        desc["reads_files_error"] = str(exc).split(": ", 1)[-1]
    return desc


def _structure(path: str, f: tp.Any) -> tp.Dict[str, tp.Any]:
    import h5py

    objects: tp.Dict[str, tp.Any] = {"/": {"type": "group", "attrs": _attrs(f)}}

    def visit(name: str, link: tp.Any) -> None:
        try:  # never raise inside libhdf5's iteration: it comes back as a SystemError
            entry: tp.Dict[str, tp.Any]
            if isinstance(link, h5py.HardLink):
                obj = f.get(name)
                if isinstance(obj, h5py.Dataset):
                    entry = _dataset(path, obj)
                elif isinstance(obj, h5py.Group):
                    entry = {"type": "group", "attrs": _attrs(obj)}
                else:
                    entry = {"type": type(obj).__name__}
            elif isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                if isinstance(link, h5py.SoftLink):
                    entry = {"type": "soft link", "target": str(link.path)}
                else:
                    entry = {"type": "external link", "file": str(link.filename), "target": str(link.path)}
                try:
                    obj = f[name]
                except _DAMAGE:
                    entry["dangling"] = True
                    obj = None
                if isinstance(obj, h5py.Dataset):
                    entry["dataset"] = _dataset(path, obj)
            else:
                entry = {"type": "link of an unknown kind"}
        except _DAMAGE as exc:
            entry = {"error": _why(exc)}
        objects["/" + name] = entry

    try:
        f.visititems_links(visit)
    except _DAMAGE as exc:
        objects["<error>"] = _why(exc)
    return objects


def cheap_fingerprint(path: str) -> tp.Dict[str, tp.Any]:
    """The cheap tier of ``path``: stat, and the HDF5 structure read from metadata only (no data read)."""
    import h5py

    started = time.perf_counter()
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file; check the path")
    out = _stat(path)
    structure: tp.Any = None
    fmt = "raw"
    if out["size"] > 0 and h5py.is_hdf5(path):
        fmt = "hdf5"
        try:
            with h5py.File(path, "r", locking=False) as f:
                structure = _structure(path, f)
        except _DAMAGE as exc:
            structure = {"<error>": f"cannot be opened: {_why(exc)}"}
    out.update(
        format=fmt,
        structure=structure,
        structure_sha256=_sha(structure),
        seconds=round(time.perf_counter() - started, 4),
    )
    return out


def cache_key(cheap: tp.Mapping[str, tp.Any], k: int = SAMPLE_K, block_bytes: int = BLOCK_BYTES) -> str:
    """What the content tier is cached against: the file's identity on disk and its structure."""
    keys = ("path", "size", "mtime_ns", "inode", "device", "structure_sha256")
    return _sha({**{n: cheap.get(n) for n in keys}, "k": k, "block_bytes": block_bytes, "schema": CACHE_SCHEMA})


# ---------------------------------------------------------------------------------------------- content tier
def sample_indices(n: int, k: int = SAMPLE_K) -> tp.List[int]:
    """First, last, and ``k`` evenly spaced indices of ``range(n)`` (sorted, distinct)."""
    if n <= 0:
        return []
    picks = {0, n - 1} | {round(i * (n - 1) / (k + 1)) for i in range(1, k + 1)}
    return sorted(picks)


class _Reads:
    """Counts what the content tier reads (the benchmark reports it; tests check the cache avoided it)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.chunks = 0


def _chunk_index_hash(ds: tp.Any) -> tp.Optional[str]:
    """sha256 of (logical offset, stored size, filter mask) of every allocated chunk, in index order."""
    dsid = ds.id
    if not hasattr(dsid, "chunk_iter"):
        return None
    try:
        if dsid.get_num_chunks() > MAX_INDEXED_CHUNKS:
            return None
        h = hashlib.sha256()
        dsid.chunk_iter(lambda info: h.update(f"{info.chunk_offset}:{info.size}:{info.filter_mask};".encode()))
    except _DAMAGE:
        return None
    return h.hexdigest()


def _sample_chunked(ds: tp.Any, k: int, h: tp.Any, reads: _Reads) -> tp.Dict[str, tp.Any]:
    shape, chunks = ds.shape, ds.chunks
    grid = [max(1, math.ceil(s / c)) for s, c in zip(shape, chunks)]
    total = int(np.prod(grid, dtype=np.int64))
    picked = sample_indices(total, k)
    unallocated = 0
    for idx in picked:
        coord = tuple(int(c) * int(chunk) for c, chunk in zip(np.unravel_index(idx, grid), chunks))
        info = ds.id.get_chunk_info_by_coord(coord)
        h.update(f"chunk {idx} {coord}:".encode())
        if info.byte_offset is None:
            unallocated += 1
            h.update(b"unallocated;")
            continue
        mask, raw = ds.id.read_direct_chunk(coord)
        h.update(f"{mask}:{len(raw)}:".encode())
        h.update(raw)
        reads.bytes += len(raw)
        reads.chunks += 1
    out = {"method": "raw chunks", "sampled": len(picked), "of": total, "unallocated_sampled": unallocated}
    index = _chunk_index_hash(ds)
    if index is not None:
        h.update(index.encode())
        out["chunk_index_sha256"] = index
    return out


def _sample_contiguous(
    ds: tp.Any, offset: int, k: int, block_bytes: int, h: tp.Any, reads: _Reads
) -> tp.Dict[str, tp.Any]:
    size = int(ds.id.get_storage_size())
    blocks = max(1, math.ceil(size / block_bytes))
    picked = sample_indices(blocks, k) if size else []
    fd = os.open(ds.file.filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        for b in picked:
            start = b * block_bytes
            raw = os.pread(fd, min(block_bytes, size - start), offset + start)
            h.update(f"block {b}:{len(raw)}:".encode())
            h.update(raw)
            reads.bytes += len(raw)
    finally:
        os.close(fd)
    return {"method": "raw blocks", "block_bytes": block_bytes, "sampled": len(picked), "of": blocks}


def _sample_slices(ds: tp.Any, k: int, block_bytes: int, h: tp.Any, reads: _Reads) -> tp.Dict[str, tp.Any]:
    if ds.shape is None or ds.size == 0:
        h.update(b"empty;")
        return {"method": "empty", "sampled": 0, "of": 0}
    if ds.ndim == 0:
        raw = np.asarray(ds[()]).tobytes()
        h.update(raw)
        reads.bytes += len(raw)
        return {"method": "scalar", "sampled": 1, "of": 1}
    row_bytes = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize)
    rows = max(1, block_bytes // row_bytes)
    blocks = math.ceil(ds.shape[0] / rows)
    picked = sample_indices(blocks, k)
    for b in picked:
        data = np.ascontiguousarray(ds[b * rows : min(ds.shape[0], (b + 1) * rows)])
        raw = data.tobytes() if data.dtype.kind != "O" else repr(data.tolist()).encode()
        h.update(f"rows {b * rows}:{len(raw)}:".encode())
        h.update(raw)
        reads.bytes += len(raw)
    return {"method": "row slices", "rows_per_block": rows, "sampled": len(picked), "of": blocks}


def _sample_dataset(ds: tp.Any, k: int, block_bytes: int, reads: _Reads) -> tp.Dict[str, tp.Any]:
    """sha256 of one dataset's sample and how it was taken."""
    h = hashlib.sha256()
    layout = _layout(ds)
    if layout == "chunked" and ds.chunks and ds.shape and ds.size:
        info = _sample_chunked(ds, k, h, reads)
    else:
        offset = ds.id.get_offset() if layout == "contiguous" and not ds.external else None
        if offset is not None:
            info = _sample_contiguous(ds, int(offset), k, block_bytes, h, reads)
        else:
            info = _sample_slices(ds, k, block_bytes, h, reads)
    return {"sha256": h.hexdigest(), **info}


def _sample_bytes(path: str, k: int, block_bytes: int, reads: _Reads) -> tp.Dict[str, tp.Any]:
    h = hashlib.sha256()
    size = os.path.getsize(path)
    blocks = max(1, math.ceil(size / block_bytes)) if size else 0
    picked = sample_indices(blocks, k)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        for b in picked:
            raw = os.pread(fd, block_bytes, b * block_bytes)
            h.update(f"block {b}:{len(raw)}:".encode())
            h.update(raw)
            reads.bytes += len(raw)
    finally:
        os.close(fd)
    return {
        "sha256": h.hexdigest(),
        "method": "raw blocks",
        "block_bytes": block_bytes,
        "sampled": len(picked),
        "of": blocks,
    }


def content_fingerprint(
    path: str, cheap: tp.Optional[tp.Mapping[str, tp.Any]] = None, *, k: int = SAMPLE_K, block_bytes: int = BLOCK_BYTES
) -> tp.Dict[str, tp.Any]:
    """The content tier of ``path``: ``{"kind": "sample", "sha256", "params", "datasets", "bytes_read", ...}``.

    ``sha256`` covers every dataset's sample hash (HDF5) or the sampled blocks (other files). Reads about
    ``(k + 2) × chunk size`` per dataset, plus the chunk index of chunked ones."""
    import h5py

    started = time.perf_counter()
    path = os.fspath(path)
    cheap = cheap or cheap_fingerprint(path)
    reads = _Reads()
    datasets: tp.Dict[str, tp.Any] = {}
    if cheap.get("format") == "hdf5":
        names = []
        for name, entry in (cheap.get("structure") or {}).items():
            if isinstance(entry, dict) and (entry.get("type") == "dataset" or "dataset" in entry):
                names.append(name)
        try:
            with h5py.File(path, "r", locking=False) as f:
                for name in sorted(names):
                    try:
                        datasets[name] = _sample_dataset(f[name], k, block_bytes, reads)
                    except _DAMAGE as exc:
                        datasets[name] = {"error": _why(exc)}
        except _DAMAGE as exc:
            datasets["<file>"] = {"error": f"cannot be opened: {_why(exc)}"}
        digest = _sha({n: d.get("sha256") or d.get("error") for n, d in datasets.items()})
        method = (
            "per dataset: first, last and k evenly spaced chunks read raw (read_direct_chunk) + the chunk index; "
            "contiguous data: k + 2 blocks read with pread; other layouts: k + 2 row slices"
        )
    else:
        sampled = _sample_bytes(path, k, block_bytes, reads)
        digest = sampled.pop("sha256")
        datasets["<bytes>"] = sampled
        method = "first, last and k evenly spaced blocks of the file's bytes"
    return {
        "kind": "sample",
        "sha256": digest,
        "params": {"k": k, "block_bytes": block_bytes, "method": method},
        "datasets": datasets,
        "bytes_read": reads.bytes,
        "chunks_read": reads.chunks,
        "seconds": round(time.perf_counter() - started, 4),
    }


# ---------------------------------------------------------------------------------------------- both, cached
def _load_cache(cache_path: tp.Optional[str]) -> tp.Dict[str, tp.Any]:
    if cache_path is None:
        return {}
    try:
        raw, _ = read_bounded(cache_path, limit=64 << 20)
        data = json.loads(raw)
    except (FileNotFoundError, NotReadable, ValueError, UnicodeDecodeError, RecursionError):
        return {}  # a missing or damaged cache is rebuilt; it only saves reads
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA or not isinstance(data.get("entries"), dict):
        return {}
    return dict(data["entries"])


def _save_cache(cache_path: str, entries: tp.Dict[str, tp.Any]) -> None:
    from hpctrain._atomic import atomic_write_json

    if len(entries) > CACHE_ENTRIES:  # oldest first out
        ordered = sorted(entries.items(), key=lambda kv: kv[1].get("cached_at", 0))
        entries = dict(ordered[-CACHE_ENTRIES:])
    os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
    atomic_write_json(cache_path, {"schema": CACHE_SCHEMA, "entries": entries})


def fingerprint_files(
    paths: tp.Sequence[str],
    *,
    cache_path: tp.Optional[str] = None,
    content: bool = True,
    k: int = SAMPLE_K,
    block_bytes: int = BLOCK_BYTES,
) -> tp.List[tp.Dict[str, tp.Any]]:
    """Both tiers of every file, in order: ``[{"schema", "cheap", "content", "cached"}]``. The content tier
    comes from ``cache_path`` when the cheap tier matches a cached entry (``"cached": True``), else it is
    computed and the cache rewritten (atomically)."""
    entries = _load_cache(cache_path)
    dirty = False
    out: tp.List[tp.Dict[str, tp.Any]] = []
    for path in paths:
        cheap = cheap_fingerprint(os.fspath(path))
        record: tp.Dict[str, tp.Any] = {"schema": FINGERPRINT_SCHEMA, "cheap": cheap, "content": None, "cached": False}
        if content:
            key = cache_key(cheap, k, block_bytes)
            hit = entries.get(key)
            if isinstance(hit, dict) and isinstance(hit.get("content"), dict):
                record.update(content=hit["content"], cached=True)
            else:
                record["content"] = content_fingerprint(cheap["path"], cheap, k=k, block_bytes=block_bytes)
                entries[key] = {"content": record["content"], "cached_at": time.time(), "path": cheap["path"]}
                dirty = True
        out.append(record)
    if dirty and cache_path is not None:
        _save_cache(cache_path, entries)
    return out


def full_hash(path: str) -> tp.Dict[str, tp.Any]:
    """sha256 of every byte of ``path`` (what ``sha256sum`` prints): ``{"kind": "full", ...}``."""
    started = time.perf_counter()
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; check the path") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(
                f"{path}: {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a regular file'}; give files"
            )
        digest, size = sha256_fd(fd, block=_READ)
    except OSError as exc:
        raise HpctrainError(f"{path}: read failed ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return {
        "path": os.path.abspath(path),
        "kind": "full",
        "size": size,
        "sha256": digest,
        "seconds": round(time.perf_counter() - started, 4),
    }


# ---------------------------------------------------------------------------------------------- compare
def essentials(record: tp.Mapping[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    """What of one file's fingerprint makes a run's identity: its name (not its directory: a copy staged to
    node-local storage is the same data), size, structure and sampled content. Not mtime, inode or path."""
    cheap = record.get("cheap") or {}
    content = record.get("content") or {}
    return {
        "name": cheap.get("name"),
        "size": cheap.get("size"),
        "format": cheap.get("format"),
        "structure_sha256": cheap.get("structure_sha256"),
        "content": {"kind": content.get("kind"), "sha256": content.get("sha256"), "params": content.get("params")}
        if content
        else None,
    }


def _flatten(value: tp.Any, prefix: str, out: tp.Dict[str, tp.Any]) -> None:
    if isinstance(value, dict) and value:
        for k in value:
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def _structure_changes(old: tp.Any, new: tp.Any) -> tp.List[str]:
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    changes: tp.List[str] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            changes.append(f"{name!r} removed")
        elif name not in old:
            changes.append(f"{name!r} added")
        elif old[name] != new[name]:
            a: tp.Dict[str, tp.Any] = {}
            b: tp.Dict[str, tp.Any] = {}
            _flatten(old[name], "", a)
            _flatten(new[name], "", b)
            for field in sorted(set(a) | set(b), key=_field_order):
                if a.get(field) != b.get(field):
                    label = field.replace("dataset.", "")
                    changes.append(f"{name!r} {label} {_short(a.get(field))} -> {_short(b.get(field))}")
    return changes


_FIRST = ("type", "shape", "dtype", "layout", "chunks", "filters")


def _field_order(name: str) -> tp.Tuple[int, str]:
    """Structure differences in the order that says most first: shape, dtype, layout ... attributes last."""
    leaf = name.replace("dataset.", "").split(".")[0]
    return (_FIRST.index(leaf) if leaf in _FIRST else len(_FIRST) + int(leaf == "attrs"), name)


def _short(value: tp.Any) -> str:
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def compare(old: tp.Mapping[str, tp.Any], new: tp.Mapping[str, tp.Any]) -> tp.Tuple[tp.List[str], tp.List[str]]:
    """``(changes, notes)`` between two fingerprints of one file: the cheap tier first (size, format,
    structure), then the sampled content. ``notes`` are differences that are not a change of the data: a new
    path, mtime or inode with the same size, structure and sampled content (a copy, a touch)."""
    oc, nc = old.get("cheap") or {}, new.get("cheap") or {}
    changes: tp.List[str] = []
    notes: tp.List[str] = []
    if oc.get("format") != nc.get("format"):
        changes.append(f"format {oc.get('format')} -> {nc.get('format')}")
    elif oc.get("structure_sha256") != nc.get("structure_sha256"):
        found = _structure_changes(oc.get("structure"), nc.get("structure"))
        changes.extend(found or ["HDF5 structure changed"])
    if oc.get("size") != nc.get("size"):
        changes.append(f"size {oc.get('size')} -> {nc.get('size')} bytes")
    ok, nk = old.get("content") or {}, new.get("content") or {}
    if ok and nk and ok.get("params") == nk.get("params") and ok.get("sha256") != nk.get("sha256"):
        differing = sorted(
            n
            for n in set(ok.get("datasets", {})) | set(nk.get("datasets", {}))
            if (ok.get("datasets", {}).get(n) or {}).get("sha256")
            != (nk.get("datasets", {}).get(n) or {}).get("sha256")
        )
        what = ", ".join(repr(n) for n in differing[:3]) + (f" (+{len(differing) - 3})" if len(differing) > 3 else "")
        if not changes or differing:
            changes.append(f"sampled content of {what or 'the file'} differs")
    for field in ("path", "mtime_ns", "inode"):
        if oc.get(field) != nc.get(field):
            notes.append(f"{field} {oc.get(field)} -> {nc.get(field)}")
    return changes, notes
