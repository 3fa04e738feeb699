"""``python -m hpctrain bundle verify BUNDLE``: is this bundle what was written, and does it hang together?

Checks, each reported on its own (one failing does not hide the others):

* **files**: every file against ``MANIFEST.sha256`` (its sha256), files missing from the bundle, files the
  list does not name, anything that is not a regular file (a symbolic link is never followed), and the
  list's own last line (the sha256 of the lines above it), so a flipped byte anywhere names its file;
* **checkpoint**: the checkpoint's own verify (structure and every shard's crc32, ``hpctrain.ckpt``), and
  its manifest's sha256 and step against what ``bundle.json`` recorded;
* **approvals**: the hash chain (:func:`hpctrain.approvals.verify_chain`), its count and head against
  ``bundle.json`` (a removed last entry shows here), and every approval of the bundled step against the
  bundled checkpoint's manifest sha256;
* **identity**: each manifest's ``identity`` recomputed from its parts with the one function that computed it
  at capture (:func:`hpctrain.identity.manifest.identity_hash`), the code snapshot's sha256 and (identity format
  2) its content hash recomputed from the bundled tarball and compared with every record's, the entry and
  arguments ``run/submission.json`` would resubmit against the records; a record of format 1 (from before the
  snapshot was bound) is a warning that says so, a format this hpctrain does not know a failure; the environment
  lock and data fingerprint against the manifest they came from; an identity that changed between attempts is
  shown (a warning: it is what happened);
* **crate**: ``ro-crate-metadata.json`` parses, its root lists every file, and it holds one CreateAction per
  recorded attempt (``roc-validator`` checks the rest: ``../shared/tools/rocrate-validate BUNDLE``).

Nothing in a bundle is executed or imported: JSON is parsed, the code snapshot is hashed, never unpacked.

A bundle **tar** (``.tar``, ``.tar.gz``, ...) is streamed once, never unpacked: every member hashed as it is
read; the records the checks parse (everything but the checkpoint's shards and the code snapshot, at most
:data:`KEEP_LIMIT` bytes) held and written to a private temporary directory for the checks; the shards' sizes
and crc32s checked from the stream. A member is refused at its header, and the tar not read further, when it is
a link, a device or any non-regular file, an absolute or ``..`` path, outside the top directory, a second
member of one name, not in ``MANIFEST.sha256`` (once that was read), larger than the size the crate records,
or would take the tar past :data:`ARCHIVE_RATIO` times its size unpacked. :func:`extract_verified` unpacks a
verified tar's members (what reproduce needs), checking each against the verified file list as it writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import typing as tp
import zlib
from pathlib import Path, PurePosixPath

from hpctrain._files import NotReadable, read_bounded, shorten
from hpctrain.approvals import checkpoint_identity, verify_chain
from hpctrain.bundle import _records as records
from hpctrain.bundle._io import CHUNK, HashingReader, archive_compression, hash_file, open_regular, regular_files
from hpctrain.bundle.build import SELF_LINE
from hpctrain.bundle.layout import ARCHIVE_SUFFIXES, BUNDLE_SCHEMA, BundleLayout
from hpctrain.errors import CheckpointFormatError, HpctrainError, UsageError
from hpctrain.identity.manifest import (
    SNAPSHOT_DIGEST_LIMIT,
    SnapshotUnreadable,
    identity_format,
    identity_hash,
    snapshot_digest,
)
from hpctrain.rundir import JSONL_LIMIT, RECORD_LIMIT, read_json

__all__ = ["verify_bundle", "extract_verified", "Check"]

_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")
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
Check = tp.Dict[str, tp.Any]


def _check(name: str) -> Check:
    return {"check": name, "ok": True, "detail": "", "problems": [], "warnings": []}


def _fail(c: Check, problem: str) -> None:
    c["ok"] = False
    c["problems"].append(problem)


def _safe_rel(rel: tp.Any) -> tp.Optional[str]:
    """A path inside the bundle, or None: relative, no ``..``, no empty or odd components."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("..", ".", "") for part in p.parts):
        return None
    return p.as_posix()


# ---------------------------------------------------------------------------------------------- entry point
def verify_bundle(path: tp.Union[str, "os.PathLike[str]"]) -> tp.Dict[str, tp.Any]:
    """The report: ``{"bundle", "format", "ok", "checks": [...], "record", "approvals", "attempts"}`` (a tar's
    also ``"archive"``: what the stream read and how much scratch the checks used).

    :class:`UsageError` when ``path`` is not a bundle (exit 2); a damaged bundle is a report with ``ok``
    False (exit 1), and a tar damaged before its first member one :class:`HpctrainError` (exit 1)."""
    p = Path(path)
    if not os.path.lexists(p):
        raise UsageError(f"BUNDLE {p} does not exist")
    if p.is_dir():
        return _verify_dir(p, p, "directory")
    if not p.is_file():
        raise UsageError(f"BUNDLE {p} is neither a directory nor a tar file")
    if not (p.name.endswith(ARCHIVE_SUFFIXES) or _is_tar(p)):
        raise UsageError(f"BUNDLE {p} is neither a bundle directory nor a tar of one")
    return _verify_archive(p)


def _is_tar(p: Path) -> bool:
    try:
        return tarfile.is_tarfile(p)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- a tar, streamed
def _is_record(rel: str) -> bool:
    """Members the checks read (kept in memory, then in a small private scratch directory): everything but the
    checkpoint's shards and the code snapshot, which are hashed as they stream past and never written."""
    if rel == BundleLayout.CODE + "/snapshot.tar.gz":
        return False
    parts = rel.split("/")
    if parts[0] == BundleLayout.CHECKPOINT:
        return len(parts) == 3 and parts[2] == "MANIFEST.json"
    return True


def _declared_sizes(raw: bytes) -> tp.Dict[str, int]:
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


class _Scan:
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

    def run(self) -> "_Scan":
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
        rel = _safe_rel(name) if name not in ("", ".") else "."
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
        keep = _is_record(inner) and m.size <= JSONL_LIMIT and self.kept_bytes + m.size <= KEEP_LIMIT
        src = tf.extractfile(m)
        assert src is not None
        reader = HashingReader(src, limit=m.size)
        if inner == BundleLayout.CODE + "/snapshot.tar.gz":
            try:  # its content hash (what the identity binds), from the same bytes
                self.snapshot = snapshot_digest(reader, limit=_snapshot_limit(m.size))
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
                self.listed = _listing(data)[0]
            elif inner == BundleLayout.METADATA:
                self.declared = _declared_sizes(data)
        return True


def _snapshot_limit(size: int) -> int:
    return min(SNAPSHOT_DIGEST_LIMIT, max(ARCHIVE_FLOOR, size * SNAPSHOT_RATIO))


def _verify_archive(p: Path) -> tp.Dict[str, tp.Any]:
    scan = _Scan(p).run()
    if scan.top is None:
        if scan.problems:
            raise HpctrainError(f"BUNDLE {p}: {scan.problems[0]}")
        raise UsageError(f"BUNDLE {p}: a tar without the one top directory a bundle tar holds")
    scratch = Path(tempfile.mkdtemp(prefix="hpctrain-verify-"))  # private (0700), small: the records only
    try:
        root = scratch / scan.top
        root.mkdir()
        for rel, data in scan.kept.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:
                out.write(data)
        source = _ArchiveSource(scan)
        report = _verify_dir(root, p, "tar", source=source)
        report["archive"] = {
            "top": scan.top,
            "members": scan.members,
            "bytes_read": scan.bytes_read,
            "bound": scan.bound,
            "scratch_bytes": scan.kept_bytes,
            "file_list_sha256": (scan.found.get(BundleLayout.FILE_LIST) or (None,))[0],
        }
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _ArchiveSource:
    """What the checks of a tar read that is not in its scratch copy: hashes, crc32s, the snapshot's digest."""

    def __init__(self, scan: _Scan) -> None:
        self.scan = scan


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
                rel = _safe_rel(m.name.rstrip("/")) if m.name.rstrip("/") not in ("", ".") else "."
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
    listed, _ = _listing(file_list)
    for rel, sha in written.items():
        if rel != BundleLayout.FILE_LIST and listed.get(rel) != sha:
            raise changed(f"{rel}: sha256 differs")
    gone = sorted(rel for rel in listed if include(rel) and rel not in written)
    if gone:
        raise changed(f"{gone[0]}: no longer in it")
    return dest / top


# ---------------------------------------------------------------------------------------------- the checks
def _verify_dir(root: Path, shown: Path, fmt: str, source: tp.Optional[_ArchiveSource] = None) -> tp.Dict[str, tp.Any]:
    lay = BundleLayout(root)
    if source is None and not os.path.lexists(lay.file_list) and not os.path.lexists(lay.record):
        raise UsageError(f"BUNDLE {shown}: no {lay.FILE_LIST} and no {lay.RECORD}: not an hpctrain bundle")
    if source is not None and not {lay.FILE_LIST, lay.RECORD} & set(source.scan.found):
        if source.scan.refused is None:
            raise UsageError(f"BUNDLE {shown}: no {lay.FILE_LIST} and no {lay.RECORD}: not an hpctrain bundle")
    files = _check_files(lay) if source is None else _check_archive_files(lay, source.scan)
    record_problems: tp.List[str] = []
    record = read_json(lay.record, record_problems)
    why = ""
    if record is None or record.get("schema") != BUNDLE_SCHEMA:
        why = record_problems[0] if record_problems else f"{lay.RECORD} missing or not a {BUNDLE_SCHEMA} record"
        record = None
    if source is not None and source.scan.refused is not None:
        record, why = None, "the tar was not read to its end (see files)"
    checks = [files]
    ck, approvals, identity, crate = (_check(n) for n in ("checkpoint", "approvals", "identity", "crate"))
    if record is None:
        for c in (ck, approvals, identity, crate):
            _fail(c, f"not checked: {why}")
        entries: tp.List[tp.Dict[str, tp.Any]] = []
    else:
        if source is None:
            _check_checkpoint(lay, record, ck)
            snapshot, snapshot_error = _snapshot_of(lay)
        else:
            _check_archive_checkpoint(lay, record, ck, source.scan)
            snapshot, snapshot_error = source.scan.snapshot, source.scan.snapshot_error
        entries = _check_approvals(lay, record, approvals)
        _check_identity(lay, record, identity, entries, snapshot, snapshot_error)
        _check_crate(lay, record, crate, files.get("listed", []))
    checks += [ck, approvals, identity, crate]
    files.pop("listed", None)
    return {
        "bundle": str(shown),
        "format": fmt,
        "ok": all(c["ok"] for c in checks),
        "checks": checks,
        "record": {
            k: (record or {}).get(k)
            for k in ("created_utc", "hpctrain_version", "source_run", "run_name", "run_identity", "checkpoint")
        },
        "approvals": [
            {k: e.get(k) for k in ("seq", "time", "decision", "by", "reason", "step", "entry_hash")} for e in entries
        ],
        "attempts": (record or {}).get("attempts") or [],
    }


def _listing(raw: bytes) -> tp.Tuple[tp.Dict[str, str], tp.List[str]]:
    """``({path: sha256}, problems)`` of ``MANIFEST.sha256``'s bytes, its last line (the sha256 of the lines
    above it) checked."""
    problems: tp.List[str] = []
    listed: tp.Dict[str, str] = {}
    if not raw:
        return listed, problems
    name = BundleLayout.FILE_LIST
    text = raw.decode("utf-8", errors="replace")
    body, _, last = text.rstrip("\n").rpartition("\n")
    body = body + "\n" if body else ""
    expected = hashlib.sha256(body.encode("utf-8", errors="replace")).hexdigest()
    if not last.startswith(SELF_LINE) or last[len(SELF_LINE) :].strip() != expected or "\ufffd" in text:
        problems.append(f"{name}: edited or damaged (its last line, the sha256 of the list, does not match)")
    for n, line in enumerate(body.splitlines(), start=1):
        m = _LINE.match(line)
        rel = _safe_rel(m.group(2)) if m else None
        if m is None or rel is None:
            problems.append(f"{name} line {n}: not '<sha256>  <path inside the bundle>' (damaged)")
            continue
        if rel in listed:
            problems.append(f"{name} line {n}: {rel} listed twice")
        listed[rel] = m.group(1)
    return listed, problems


def _compare_listing(
    c: Check,
    listed: tp.Dict[str, str],
    found: tp.Mapping[str, tp.Tuple[str, int]],
    present: tp.Set[str],
    unreadable: tp.Mapping[str, str],
    *,
    stopped: bool = False,
    refused: tp.AbstractSet[str] = frozenset(),
) -> None:
    nbytes = 0
    unread = 0
    for rel in sorted(listed):
        if rel in refused:  # named already, with why
            continue
        if rel in unreadable:
            _fail(c, f"{rel}: cannot read it ({unreadable[rel]})")
            continue
        if rel not in present:
            if stopped:  # the tar was refused before it reached this member: one line for all of them
                unread += 1
            else:
                _fail(c, f"{rel}: missing (listed in {BundleLayout.FILE_LIST})")
            continue
        sha, size = found[rel]
        nbytes += size
        if sha != listed[rel]:
            _fail(c, f"{rel}: sha256 mismatch (changed or damaged since the bundle was written)")
    if unread:
        _fail(c, f"{unread} listed file(s) not read: the tar was refused before them")
    for rel in sorted(present - set(listed)):
        _fail(c, f"{rel}: not in {BundleLayout.FILE_LIST} (added after the bundle was written)")
    good = len([r for r in listed if r in present])
    c["detail"] = f"{len(listed)} files listed, {good} present, {nbytes} bytes hashed"
    if c["ok"]:
        c["detail"] = f"{len(listed)} files, {nbytes} bytes: every sha256 matches, none missing or extra"
    c["listed"] = sorted(listed)


def _check_files(lay: BundleLayout) -> Check:
    c = _check("files")
    try:
        raw, _ = read_bounded(lay.file_list, limit=JSONL_LIMIT)
    except FileNotFoundError:
        _fail(c, f"{lay.FILE_LIST}: missing (the file list; nothing can be checked against it)")
        raw = b""
    except NotReadable as exc:
        _fail(c, f"{lay.FILE_LIST}: {exc}")
        raw = b""
    listed, problems = _listing(raw)
    for problem in problems:
        _fail(c, problem)
    try:
        on_disk, other = regular_files(lay.root)
    except OSError as exc:
        _fail(c, f"cannot list the bundle ({exc.filename}: {exc.strerror or exc})")
        on_disk, other = [], []
    for o in other:
        _fail(c, f"{lay.rel(o)}: a symbolic link or special file (a bundle holds regular files only; not followed)")
    present = {lay.rel(f) for f in on_disk} - {lay.FILE_LIST}
    found: tp.Dict[str, tp.Tuple[str, int]] = {}
    unreadable: tp.Dict[str, str] = {}
    for rel in sorted(present & set(listed)):
        try:
            found[rel] = hash_file(lay.root / rel)
        except (HpctrainError, OSError) as exc:
            unreadable[rel] = str(exc)
    _compare_listing(c, listed, found, present, unreadable)
    return c


def _check_archive_files(lay: BundleLayout, scan: _Scan) -> Check:
    c = _check("files")
    for problem in scan.problems:
        _fail(c, problem)
    raw = scan.kept.get(lay.FILE_LIST, b"")
    if lay.FILE_LIST not in scan.found:
        _fail(c, f"{lay.FILE_LIST}: missing (the file list; nothing can be checked against it)")
    elif lay.FILE_LIST not in scan.kept:
        _fail(c, f"{lay.FILE_LIST}: over the {JSONL_LIMIT}-byte bound")
    listed, problems = _listing(raw)
    for problem in problems:
        _fail(c, problem)
    present = set(scan.found) - {lay.FILE_LIST}
    _compare_listing(c, listed, scan.found, present, {}, stopped=scan.refused is not None, refused=scan.skipped)
    c["detail"] += f"; streamed from the tar ({scan.bytes_read} bytes), nothing unpacked"
    return c


def _snapshot_of(lay: BundleLayout) -> tp.Tuple[tp.Optional[tp.Dict[str, tp.Any]], tp.Optional[str]]:
    """The bundled code snapshot's digest (:func:`hpctrain.identity.manifest.snapshot_digest`), or why not."""
    if not os.path.lexists(lay.code_snapshot):
        return None, None
    try:
        fd = open_regular(lay.code_snapshot)
    except (HpctrainError, OSError) as exc:
        return None, str(exc)
    try:
        with os.fdopen(fd, "rb") as f:
            return snapshot_digest(f, limit=_snapshot_limit(os.fstat(f.fileno()).st_size)), None
    except (SnapshotUnreadable, OSError) as exc:
        return None, str(exc)


def _check_checkpoint(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check) -> None:
    from hpctrain.ckpt import verify as verify_checkpoint

    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    rel = _safe_rel(ck.get("dir"))
    c["detail"] = "does not verify"
    if rel is None or not rel.startswith(f"{lay.CHECKPOINT}/"):
        _fail(c, f"{lay.RECORD}: no valid checkpoint dir recorded ({ck.get('dir')!r})")
        return
    path = lay.root / rel
    if not path.is_dir() or path.is_symlink():
        _fail(c, f"{rel}: missing")
        return
    try:
        manifest = verify_checkpoint(path)
        sha = checkpoint_identity(path)
    except (CheckpointFormatError, OSError) as exc:
        _fail(c, f"{rel}: the checkpoint's own verify failed: {exc}")
        return
    if sha != ck.get("manifest_sha256"):
        _fail(
            c, f"{rel}/MANIFEST.json: sha256 {sha[:16]}... is not the recorded {str(ck.get('manifest_sha256'))[:16]}..."
        )
    if manifest.get("step") != ck.get("step"):
        _fail(c, f"{rel}: step {manifest.get('step')} is not the recorded step {ck.get('step')}")
    c["detail"] = (
        f"step {manifest.get('step')}, {manifest.get('world_size')} shard(s): structure and every crc32 verify; "
        f"manifest sha256 {sha[:16]}..."
    )


def _check_approvals(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check) -> tp.List[tp.Dict[str, tp.Any]]:
    rec = record.get("approvals") if isinstance(record.get("approvals"), dict) else {}
    entries, problems = verify_chain(lay.approvals)
    for p in problems:
        _fail(c, f"{lay.rel(lay.approvals)}: {p}")
    head = entries[-1]["entry_hash"] if entries else None
    if rec.get("entries") != len(entries) or rec.get("head") != head:
        _fail(
            c,
            f"the log holds {len(entries)} entries (head {str(head)[:16]}), the bundle recorded {rec.get('entries')} "
            f"(head {str(rec.get('head'))[:16]}): entries removed or added after the bundle was written",
        )
    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    for e in entries:
        named = (e.get("checkpoint") or {}).get("manifest_sha256") if isinstance(e.get("checkpoint"), dict) else None
        if e.get("step") == ck.get("step") and named != ck.get("manifest_sha256"):
            _fail(
                c,
                f"seq {e.get('seq')} {e.get('decision')} step {e.get('step')} names checkpoint {str(named)[:16]}..., "
                f"not the bundled one ({str(ck.get('manifest_sha256'))[:16]}...): that step was saved again since",
            )
    on_step = [e for e in entries if e.get("step") == ck.get("step")]
    last = f"; step {ck.get('step')}: {on_step[-1].get('decision')} by {on_step[-1].get('by')}" if on_step else ""
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    c["detail"] = (f"{count}, chain intact" if c["ok"] else count) + last
    if not entries:
        c["detail"] = "no approvals recorded"
    return entries


def _check_archive_checkpoint(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check, scan: _Scan) -> None:
    """A tar's checkpoint, from the stream: its manifest (read and validated by the checkpoint reader from the
    scratch copy) against the record, and every shard's size and crc32 (computed as it streamed) against the
    manifest. The shards' structure is checked where they are unpacked (reproduce verifies its placed copy)."""
    from hpctrain.ckpt import read_manifest

    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    rel = _safe_rel(ck.get("dir"))
    c["detail"] = "does not verify"
    if rel is None or not rel.startswith(f"{lay.CHECKPOINT}/") or rel.count("/") != 1:
        _fail(c, f"{lay.RECORD}: no valid checkpoint dir recorded ({ck.get('dir')!r})")
        return
    if f"{rel}/MANIFEST.json" not in scan.found:
        _fail(
            c, f"{rel}: missing" if not any(r.startswith(rel + "/") for r in scan.found) else f"{rel}: no MANIFEST.json"
        )
        return
    try:
        manifest = read_manifest(lay.root / rel)
        sha = checkpoint_identity(lay.root / rel)
    except (CheckpointFormatError, OSError) as exc:
        _fail(c, f"{rel}: the checkpoint's own verify failed: {exc}")
        return
    if sha != ck.get("manifest_sha256"):
        _fail(
            c, f"{rel}/MANIFEST.json: sha256 {sha[:16]}... is not the recorded {str(ck.get('manifest_sha256'))[:16]}..."
        )
    if manifest.get("step") != ck.get("step"):
        _fail(c, f"{rel}: step {manifest.get('step')} is not the recorded step {ck.get('step')}")
    for shard in manifest["shards"]:
        srel = f"{rel}/{shard['file']}"
        got = scan.found.get(srel)
        if got is None:
            _fail(c, f"{srel}: missing (the checkpoint's manifest names it)")
        elif got[1] != shard["bytes"]:
            _fail(c, f"{srel}: {got[1]} bytes, the checkpoint's manifest says {shard['bytes']} (truncated or swapped)")
        elif scan.crc.get(srel) != shard["crc32"]:
            _fail(c, f"{srel}: checksum mismatch (corrupted shard, or one from another checkpoint)")
    if c["ok"]:
        c["detail"] = (
            f"step {manifest.get('step')}, {manifest.get('world_size')} shard(s): every size and crc32 verify "
            f"(streamed); manifest sha256 {sha[:16]}..."
        )


def _snapshot_problems(
    rel: str,
    doc: tp.Mapping[str, tp.Any],
    fmt: int,
    snap_rel: str,
    snapshot: tp.Optional[tp.Mapping[str, tp.Any]],
    snapshot_error: tp.Optional[str],
    bundled: bool,
) -> tp.List[str]:
    """How the bundled code snapshot disagrees with what the identity record ``rel`` recorded of it."""
    code = doc.get("code") if isinstance(doc.get("code"), dict) else {}
    rec = code.get("snapshot") if isinstance(code.get("snapshot"), dict) else None
    out: tp.List[str] = []
    if rec is None or not (rec.get("sha256") or rec.get("content_sha256")):
        if fmt >= 2 and bundled:
            out.append(f"{snap_rel}: {rel} records no snapshot, yet the bundle holds one (added after the run)")
        return out
    if not bundled:
        out.append(f"{snap_rel}: missing ({rel} records the code snapshot {str(rec.get('sha256'))[:16]}...)")
        return out
    if snapshot is None:
        out.append(f"{snap_rel}: the code snapshot cannot be read ({shorten(snapshot_error or 'unreadable', 160)})")
        return out
    if isinstance(rec.get("sha256"), str) and rec["sha256"] != snapshot["sha256"]:
        out.append(
            f"{snap_rel}: sha256 {snapshot['sha256'][:16]}... is not the {rec['sha256'][:16]}... that {rel} records"
        )
    if fmt >= 2 and rec.get("content_sha256") != snapshot["content_sha256"]:
        out.append(
            f"{snap_rel}: its content hashes to {snapshot['content_sha256'][:16]}..., {rel} records "
            f"{str(rec.get('content_sha256'))[:16]}...: the code in the snapshot is not the code the run recorded"
        )
    return out


def _check_identity(
    lay: BundleLayout,
    record: tp.Mapping[str, tp.Any],
    c: Check,
    entries: tp.Sequence[tp.Mapping[str, tp.Any]],
    snapshot: tp.Optional[tp.Mapping[str, tp.Any]] = None,
    snapshot_error: tp.Optional[str] = None,
) -> None:
    listed = record.get("identity_records") if isinstance(record.get("identity_records"), list) else []
    snap_rel = lay.rel(lay.code_snapshot)
    bundled = snapshot is not None or snapshot_error is not None
    if not listed:
        c["detail"] = "no identity manifest in the bundle (a run from before identity capture)"
        c["warnings"].append(c["detail"])
        if bundled:
            c["warnings"].append(f"{snap_rel}: no identity record binds it: it is checked by its file hash only")
        return
    seen: tp.Dict[str, tp.Any] = {}
    loaded: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    recomputed = 0
    older: tp.List[str] = []
    for item in listed:
        rel = _safe_rel((item or {}).get("file") if isinstance(item, dict) else None)
        if rel is None:
            _fail(c, f"{lay.RECORD}: an identity record entry without a valid file: {shorten(item, 80)}")
            continue
        problems: tp.List[str] = []
        doc = read_json(lay.root / rel, problems, limit=RECORD_LIMIT)
        if doc is None:
            _fail(c, f"{rel}: unreadable ({problems[0] if problems else 'missing'})")
            continue
        loaded[rel] = doc
        value = doc.get("identity")
        if value != item.get("identity"):
            _fail(
                c, f"{rel}: identity {str(value)[:16]} is not the {str(item.get('identity'))[:16]} recorded at bundling"
            )
        if not isinstance(value, str):
            _fail(c, f"{rel}: records no identity")
            continue
        seen[rel] = value
        try:
            fmt = identity_format(doc)
            again = identity_hash(doc)
        except Exception as exc:  # noqa: BLE001 - recorded data of any shape: a failed check, never a traceback
            _fail(c, f"{rel}: the identity cannot be recomputed ({shorten(exc, 160)})")
            continue
        recomputed += 1
        if again != value:
            _fail(
                c,
                f"{rel}: recorded identity {value[:16]}..., recomputed {again[:16]}... from its parts: the manifest "
                "was edited",
            )
        if fmt < 2:
            older.append(rel)
        for problem in _snapshot_problems(rel, doc, fmt, snap_rel, snapshot, snapshot_error, bundled):
            _fail(c, problem)
    if older:
        c["warnings"].append(
            f"{', '.join(older)}: identity format 1 (written before hpctrain bound the code snapshot into the "
            f"identity): {snap_rel} is checked against its recorded sha256 only, an edit inside it with that hash "
            "fixed up would not change the identity"
        )
    attempts = [v for r, v in seen.items() if not r.endswith("/submit.json")]
    if len(set(attempts)) > 1:
        c["warnings"].append(
            "the identity changed between attempts ("
            + ", ".join(f"{Path(r).stem} {v[:12]}" for r, v in seen.items() if not r.endswith("/submit.json"))
            + "): code, config, data or environment changed across a restart"
        )
    newest_src = _safe_rel(record.get("run_identity_source"))
    if record.get("run_identity") is not None and record.get("run_identity") not in seen.values():
        _fail(
            c,
            f"{lay.RECORD}: run identity {str(record.get('run_identity'))[:16]} is in no identity manifest of the "
            "bundle",
        )
    known = set(seen.values())
    for e in entries:
        ident = e.get("run_identity")
        src = _safe_rel(e.get("run_identity_source"))
        if ident is not None and src in seen and seen[src] != ident:
            _fail(
                c,
                f"{lay.rel(lay.approvals)}: seq {e.get('seq')} was made for run identity {str(ident)[:16]} of {src}, "
                f"which now records {str(seen[src])[:16]}: that record changed after the approval",
            )
        elif ident is not None and known and ident not in known:
            _fail(
                c,
                f"{lay.rel(lay.approvals)}: seq {e.get('seq')} was made for run identity {str(ident)[:16]}, which "
                "no identity manifest here holds",
            )
    # the derived parts agree with the manifest they were derived from
    parts = record.get("parts") if isinstance(record.get("parts"), dict) else {}
    source = _safe_rel(parts.get("identity_source"))
    doc = loaded.get(source) if source else None
    if source and doc is None:
        _fail(c, f"{lay.RECORD}: the lock and fingerprint came from {source}, which is not a readable manifest here")
    if doc is not None:
        lock = records.requirements_lock(doc, newest_src or "")
        lock_rel = _safe_rel(parts.get("environment_lock"))
        if lock is not None or lock_rel is not None:
            try:
                text = read_bounded(lay.root / lock_rel, limit=RECORD_LIMIT)[0].decode() if lock_rel else None
            except (OSError, UnicodeDecodeError):
                text = None
            if text != lock:
                _fail(c, f"{lock_rel or 'environment/requirements.lock'}: does not match the manifest's distributions")
        fp_rel = _safe_rel(parts.get("data_fingerprint"))
        if fp_rel is not None:
            fp = read_json(lay.root / fp_rel, [])
            if fp is None or fp.get("data") != doc.get("data"):
                _fail(c, f"{fp_rel}: does not match the manifest's data section")
    _check_submission(lay, c, loaded)
    c["detail"] = (
        f"{len(listed)} manifest(s), run identity {str(record.get('run_identity'))[:16]}...: {recomputed} "
        "recomputed from their parts" + (f", {len(older)} of format 1" if older else "")
    )


def _check_submission(lay: BundleLayout, c: Check, loaded: tp.Mapping[str, tp.Mapping[str, tp.Any]]) -> None:
    """What reproduce resubmits (``run/submission.json``'s entry and its arguments) is what some identity record
    of the bundle ran with: an entry or argument edited there would run unannounced."""
    sub = read_json(lay.submission, []) if os.path.lexists(lay.submission) else None
    config = (sub or {}).get("config")
    if not isinstance(config, dict):
        return
    mine = (
        config.get("entry"),
        list(config.get("entry_args") or []) if isinstance(config.get("entry_args"), list) else None,
    )
    theirs = []
    for doc in loaded.values():
        cfg = doc.get("config") if isinstance(doc.get("config"), dict) else None
        if cfg and cfg.get("entry") is not None:
            theirs.append((cfg.get("entry"), list(cfg.get("entry_args") or [])))
    if theirs and mine not in theirs:
        _fail(
            c,
            f"{lay.rel(lay.submission)}: entry {shorten(mine[0], 60)} with arguments {shorten(mine[1], 80)} is in no "
            "identity record of the bundle (edited after the run?)",
        )


def _check_crate(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check, listed: tp.Sequence[str]) -> None:
    doc = read_json(lay.metadata, [])
    graph = (doc or {}).get("@graph")
    if not isinstance(graph, list):
        _fail(c, f"{lay.METADATA}: missing or not RO-Crate JSON-LD")
        return
    by_id = {e.get("@id"): e for e in graph if isinstance(e, dict)}
    root = by_id.get("./") or {}
    parts = root.get("hasPart") or []
    parts = parts if isinstance(parts, list) else [parts]
    named = {p.get("@id") for p in parts if isinstance(p, dict)}
    for rel in listed:
        if rel not in named and rel != lay.METADATA:
            _fail(c, f"{lay.METADATA}: the root does not list {rel}")
    actions = [e for e in graph if isinstance(e, dict) and e.get("@type") == "CreateAction"]
    recorded = record.get("attempts") if isinstance(record.get("attempts"), list) else []
    if len(actions) != len(recorded):
        _fail(c, f"{lay.METADATA}: {len(actions)} CreateAction(s) for {len(recorded)} recorded attempt(s)")
    c["detail"] = f"RO-Crate 1.1, {len(actions)} CreateAction(s) (one per attempt), {len(named)} parts"


def report_json(report: tp.Mapping[str, tp.Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
