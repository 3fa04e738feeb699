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

The report also names the image a containerised run ran in (``container``: image, runtime and version, digest,
mounts, from ``identity/submit.json``): what ``reproduce`` checks the image's current digest against.

Nothing in a bundle is executed or imported: JSON is parsed, the code snapshot is hashed, never unpacked.

A bundle **tar** (``.tar``, ``.tar.gz``, ...) is streamed once, never unpacked: every member hashed as it is
read; the records the checks parse (everything but the checkpoint's shards and the code snapshot, at most
:data:`KEEP_LIMIT` bytes) held and written to a private temporary directory for the checks; the shards' sizes
and crc32s checked from the stream. A member is refused at its header, and the tar not read further, when it is
a link, a device or any non-regular file, an absolute or ``..`` path, outside the top directory, a second
member of one name, not in ``MANIFEST.sha256`` (once that was read), larger than the size the crate records,
or would take the tar past :data:`ARCHIVE_RATIO` times its size unpacked. :func:`extract_verified` unpacks a
verified tar's members (what reproduce needs), checking each against the verified file list as it writes.

Here: the entry and the orchestration of the checks. The tar's stream and its bounds:
:mod:`hpctrain.bundle._archive`; each check: :mod:`hpctrain.bundle._checks`; the file list and one check's
report: :mod:`hpctrain.bundle._listing`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import typing as tp
from pathlib import Path

from hpctrain.bundle._archive import (  # the bounds stay importable from here, where the docstring names them
    ARCHIVE_FLOOR,  # noqa: F401
    ARCHIVE_RATIO,  # noqa: F401
    KEEP_LIMIT,  # noqa: F401
    SNAPSHOT_RATIO,  # noqa: F401
    Scan,
    extract_verified,
    is_tar,
)
from hpctrain.bundle._checks import (
    check_approvals,
    check_archive_checkpoint,
    check_archive_files,
    check_checkpoint,
    check_crate,
    check_files,
    check_identity,
    snapshot_of,
)
from hpctrain.bundle._listing import Check, fail, new_check
from hpctrain.bundle.layout import ARCHIVE_SUFFIXES, BUNDLE_SCHEMA, BundleLayout
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import read_json

__all__ = ["verify_bundle", "extract_verified", "Check"]


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
    if not (p.name.endswith(ARCHIVE_SUFFIXES) or is_tar(p)):
        raise UsageError(f"BUNDLE {p} is neither a bundle directory nor a tar of one")
    return _verify_archive(p)


def _verify_archive(p: Path) -> tp.Dict[str, tp.Any]:
    scan = Scan(p).run()
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

    def __init__(self, scan: Scan) -> None:
        self.scan = scan


# ---------------------------------------------------------------------------------------------- the checks
def _verify_dir(root: Path, shown: Path, fmt: str, source: tp.Optional[_ArchiveSource] = None) -> tp.Dict[str, tp.Any]:
    lay = BundleLayout(root)
    if source is None and not os.path.lexists(lay.file_list) and not os.path.lexists(lay.record):
        raise UsageError(f"BUNDLE {shown}: no {lay.FILE_LIST} and no {lay.RECORD}: not an hpctrain bundle")
    if source is not None and not {lay.FILE_LIST, lay.RECORD} & set(source.scan.found):
        if source.scan.refused is None:
            raise UsageError(f"BUNDLE {shown}: no {lay.FILE_LIST} and no {lay.RECORD}: not an hpctrain bundle")
    files = check_files(lay) if source is None else check_archive_files(lay, source.scan)
    record_problems: tp.List[str] = []
    record = read_json(lay.record, record_problems)
    why = ""
    if record is None or record.get("schema") != BUNDLE_SCHEMA:
        why = record_problems[0] if record_problems else f"{lay.RECORD} missing or not a {BUNDLE_SCHEMA} record"
        record = None
    if source is not None and source.scan.refused is not None:
        record, why = None, "the tar was not read to its end (see files)"
    checks = [files]
    ck, approvals, identity, crate = (new_check(n) for n in ("checkpoint", "approvals", "identity", "crate"))
    if record is None:
        for c in (ck, approvals, identity, crate):
            fail(c, f"not checked: {why}")
        entries: tp.List[tp.Dict[str, tp.Any]] = []
    else:
        if source is None:
            check_checkpoint(lay, record, ck)
            snapshot, snapshot_error = snapshot_of(lay)
        else:
            check_archive_checkpoint(lay, record, ck, source.scan)
            snapshot, snapshot_error = source.scan.snapshot, source.scan.snapshot_error
        entries = check_approvals(lay, record, approvals)
        check_identity(lay, record, identity, entries, snapshot, snapshot_error)
        check_crate(lay, record, crate, files.get("listed", []))
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
        "container": recorded_container(lay),
    }


def recorded_container(lay: BundleLayout) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The image the run's tasks ran in, as its submit identity recorded it (None: no container): image, runtime
    and version, digest (None: a registry reference resolved on the node), mounts."""
    doc = read_json(lay.identity_submit, []) if lay.identity_submit.is_file() else None
    container = (doc or {}).get("container")
    if not isinstance(container, dict):
        return None
    keys = ("image", "runtime", "version", "kind", "digest", "repo_digest", "path", "mounts")
    return {k: container.get(k) for k in keys if k in container}


def report_json(report: tp.Mapping[str, tp.Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
