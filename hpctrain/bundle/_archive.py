"""A bundle tar streamed once, never unpacked (:class:`Scan`), with its bounds (:data:`ARCHIVE_RATIO`,
:data:`KEEP_LIMIT`, ...), and :func:`extract_verified`, which unpacks a verified tar's members checking each
against the verified file list as it writes. What a member is refused for: ``hpctrain.bundle.verify``."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import typing as tp
import zlib
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.bundle._io import CHUNK, HashingReader, archive_compression
from hpctrain.bundle._listing import parse_listing, safe_rel
from hpctrain.bundle.layout import BundleLayout
from hpctrain.errors import HpctrainError
from hpctrain.identity.manifest import SNAPSHOT_DIGEST_LIMIT, SnapshotUnreadable, snapshot_digest
from hpctrain.rundir import JSONL_LIMIT

__all__ = [
    "ARCHIVE_RATIO",
    "ARCHIVE_FLOOR",
    "SNAPSHOT_RATIO",
    "KEEP_LIMIT",
    "Scan",
    "is_tar",
    "snapshot_limit",
    "extract_verified",
]

ARCHIVE_RATIO = 100
"""A compressed bundle tar may unpack to this many times its own size (shards of weights hardly compress; a
member that would take it past this is refused at its header, before a byte of it is read)."""
ARCHIVE_FLOOR = 256 << 20
"""...and at least to this many bytes (a small bundle of text compresses well)."""
SNAPSHOT_RATIO = 200
"""The code snapshot inside a bundle may unpack to this many times its size when its content is hashed."""
KEEP_LIMIT = 256 << 20
"""Bytes of a tar's records (everything but checkpoint shards and the code snapshot) held for the checks: the
only scratch verify writes, in a private temporary directory, removed before it returns."""


def is_tar(p: Path) -> bool:
    try:
        return tarfile.is_tarfile(p)
    except OSError:
        return False


def is_record(rel: str) -> bool:
    """Members the checks read (kept in memory, then in a small private scratch directory): everything but the
    checkpoint's shards and the code snapshot, which are hashed as they stream past and never written."""
    if rel == BundleLayout.CODE + "/snapshot.tar.gz":
        return False
    parts = rel.split("/")
    if parts[0] == BundleLayout.CHECKPOINT:
        return len(parts) == 3 and parts[2] == "MANIFEST.json"
    return True


def declared_sizes(raw: bytes) -> tp.Dict[str, int]:
    """``contentSize`` of every file the crate lists (the bundle records each file's size there)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    graph = doc.get("@graph") if isinstance(doc, dict) else None
    out: tp.Dict[str, int] = {}
    for e in graph if isinstance(graph, list) else []:
        if isinstance(e, dict) and isinstance(e.get("@id"), str) and isinstance(e.get("contentSize"), str):
            if e["contentSize"].isdigit() and len(e["contentSize"]) < 20:
                out[e["@id"]] = int(e["contentSize"])
    return out


class Scan:
    """One streaming pass over a bundle tar: every regular member hashed as it is read, nothing unpacked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.top: tp.Optional[str] = None
        self.found: tp.Dict[str, tp.Tuple[str, int]] = {}
        self.skipped: tp.Set[str] = set()
        """Members refused by name (not hashed): neither missing nor extra for the file check."""
        self.kept: tp.Dict[str, bytes] = {}
        self.crc: tp.Dict[str, int] = {}
        self.problems: tp.List[str] = []
        self.refused: tp.Optional[str] = None
        """Why the stream stopped early (a member it must not read); None when it read to the end."""
        self.listed: tp.Optional[tp.Dict[str, str]] = None
        self.declared: tp.Dict[str, int] = {}
        self.snapshot: tp.Optional[tp.Dict[str, tp.Any]] = None
        self.snapshot_error: tp.Optional[str] = None
        self.bytes_read = 0
        self.kept_bytes = 0
        self.members = 0
        self.bound = 0

    def stop(self, problem: str) -> bool:
        """The stream ends here (reading on would pass the bound): False, for the loop."""
        self.refused = problem
        self.problems.append(problem + "; the tar was not read further")
        return False

    def skip(self, m: tarfile.TarInfo, problem: str) -> bool:
        """Refuse one member (never read, never hashed) and go on past it while the bound allows."""
        self.problems.append(problem)
        size = m.size if m.isreg() else 0
        if self.bytes_read + size > self.bound:
            return self.stop(f"skipping it would take the tar past {self.bound} bytes unpacked")
        self.bytes_read += size
        return True

    def run(self) -> "Scan":
        with open(self.path, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            compressed = archive_compression(raw.read(6)) is not None
            raw.seek(0)
            # a plain tar cannot hold more than its own size; a compressed one is bounded by a ratio
            self.bound = max(ARCHIVE_FLOOR, size * ARCHIVE_RATIO) if compressed else size
            try:
                with tarfile.open(fileobj=raw, mode="r|*") as tf:
                    for m in tf:
                        self.members += 1
                        if not self._member(tf, m):
                            break
            except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
                if self.members == 0 and not self.found:
                    raise HpctrainError(f"BUNDLE {self.path}: a damaged tar ({shorten(exc, 160)})") from None
                self.problems.append(
                    f"{self.path.name}: a damaged tar ({shorten(exc, 160)}); members after the damage were not read"
                )
                self.refused = self.refused or "damaged"
        return self

    def _member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> bool:
        name = m.name.rstrip("/")
        rel = safe_rel(name) if name not in ("", ".") else "."
        if rel is None:
            return self.skip(m, f"tar member {shorten(m.name, 120)!r}: a path outside the bundle; not unpacked")
        if rel == ".":
            return True
        first, _, inner = rel.partition("/")
        self.top = self.top or first
        if first != self.top:
            return self.skip(m, f"tar member {shorten(m.name, 120)!r}: outside the top directory {self.top}/")
        shown = inner or rel
        if m.isdir():
            return True
        if not m.isreg() or m.issparse() or not inner:
            kind = "a link" if m.issym() or m.islnk() else "not a regular file"
            return self.skip(m, f"{shown}: {kind} in the tar; not unpacked")
        if inner in self.found or inner in self.skipped:
            return self.skip(m, f"{inner}: twice in the tar; the second is not read")
        if self.listed is not None and inner not in self.listed:
            self.skipped.add(inner)
            return self.skip(m, f"{inner}: not in {BundleLayout.FILE_LIST} (added after the bundle was written)")
        declared = self.declared.get(inner)
        if declared is not None and m.size > declared:
            self.skipped.add(inner)
            return self.skip(m, f"{inner}: {m.size} bytes in the tar, the bundle recorded {declared}; not read")
        if self.bytes_read + m.size > self.bound:
            return self.stop(
                f"{inner}: {m.size} bytes would take the tar past {self.bound} bytes unpacked "
                f"({ARCHIVE_RATIO}x its size); not read (unpack it with tar and verify the directory)"
            )
        self.bytes_read += m.size
        keep = is_record(inner) and m.size <= JSONL_LIMIT and self.kept_bytes + m.size <= KEEP_LIMIT
        src = tf.extractfile(m)
        assert src is not None
        reader = HashingReader(src, limit=m.size)
        if inner == BundleLayout.CODE + "/snapshot.tar.gz":
            try:  # its content hash (what the identity binds), from the same bytes
                self.snapshot = snapshot_digest(reader, limit=snapshot_limit(m.size))
            except SnapshotUnreadable as exc:
                self.snapshot_error = str(exc)
        chunks: tp.List[bytes] = []
        crc = 0
        while True:
            block = reader.read(CHUNK)
            if not block:
                break
            if keep:
                chunks.append(block)
            if inner.startswith(BundleLayout.CHECKPOINT + "/"):
                crc = zlib.crc32(block, crc)
        if reader.size != m.size:
            raise EOFError(f"{inner}: ends after {reader.size} of its {m.size} bytes")
        self.found[inner] = (reader.hexdigest(), reader.size)
        self.crc[inner] = crc
        if keep:
            data = b"".join(chunks)
            self.kept[inner] = data
            self.kept_bytes += len(data)
            if inner == BundleLayout.FILE_LIST:
                self.listed = parse_listing(data)[0]
            elif inner == BundleLayout.METADATA:
                self.declared = declared_sizes(data)
        return True


def snapshot_limit(size: int) -> int:
    return min(SNAPSHOT_DIGEST_LIMIT, max(ARCHIVE_FLOOR, size * SNAPSHOT_RATIO))


def extract_verified(
    path: tp.Union[str, "os.PathLike[str]"],
    dest: Path,
    report: tp.Mapping[str, tp.Any],
    *,
    include: tp.Callable[[str], bool] = lambda rel: True,
) -> Path:
    """Unpack the members of the bundle tar ``path`` that ``include`` names into ``dest`` (a new private
    directory), after :func:`verify_bundle` passed (``report``): every written file is hashed as it is written
    and checked against the file list verify checked, and nothing beyond the sizes verify read is written. The
    bundle's top directory under ``dest``; HpctrainError when the tar changed since it was verified (what was
    written is left for the caller's cleanup of ``dest``)."""
    p = Path(path)
    info = report.get("archive") if isinstance(report.get("archive"), dict) else None
    if not report.get("ok") or info is None:
        raise HpctrainError(f"BUNDLE {p}: not verified; nothing is unpacked")
    top, budget = str(info["top"]), int(info["bytes_read"])
    written: tp.Dict[str, str] = {}
    file_list = b""
    total = 0
    seen: tp.Set[str] = set()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

    def changed(why: str) -> HpctrainError:
        return HpctrainError(f"BUNDLE {p} changed since it was verified ({why}); verify it again")

    try:
        with tarfile.open(p, "r|*") as tf:
            for m in tf:
                rel = safe_rel(m.name.rstrip("/")) if m.name.rstrip("/") not in ("", ".") else "."
                if rel is None or (rel != "." and rel.split("/", 1)[0] != top):
                    raise changed(f"member {shorten(m.name, 80)!r}")
                inner = rel.partition("/")[2]
                if m.isdir() or rel == "." or not inner:
                    if not m.isdir() and rel != ".":
                        raise changed(f"{rel}: not a directory")
                    continue
                if not m.isreg() or m.issparse() or inner in seen:
                    raise changed(f"{inner}: not one regular file")
                seen.add(inner)
                if not (include(inner) or inner == BundleLayout.FILE_LIST):
                    continue
                total += m.size
                if total > budget:
                    raise changed(f"{inner}: more bytes than verify read")
                src = tf.extractfile(m)
                assert src is not None
                reader = HashingReader(src, limit=m.size)
                target = dest / top / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                chunks: tp.List[bytes] = []
                with os.fdopen(os.open(target, flags, 0o600), "wb") as out:
                    while True:
                        block = reader.read(CHUNK)
                        if not block:
                            break
                        out.write(block)
                        if inner == BundleLayout.FILE_LIST:
                            chunks.append(block)
                if reader.size != m.size:
                    raise changed(f"{inner}: truncated")
                written[inner] = reader.hexdigest()
                if inner == BundleLayout.FILE_LIST:
                    file_list = b"".join(chunks)
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        raise changed(shorten(exc, 120)) from None
    if hashlib.sha256(file_list).hexdigest() != info.get("file_list_sha256"):
        raise changed(f"{BundleLayout.FILE_LIST} differs")
    listed, _ = parse_listing(file_list)
    for rel, sha in written.items():
        if rel != BundleLayout.FILE_LIST and listed.get(rel) != sha:
            raise changed(f"{rel}: sha256 differs")
    gone = sorted(rel for rel in listed if include(rel) and rel not in written)
    if gone:
        raise changed(f"{gone[0]}: no longer in it")
    return dest / top
