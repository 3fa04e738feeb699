"""The checks of ``bundle verify``, each on its own report (:data:`hpctrain.bundle._listing.Check`): files,
checkpoint, approvals, identity, crate; of a directory, or of a tar from its stream (:class:`Scan`) and the
scratch copy of its records. What each checks: ``hpctrain.bundle.verify``."""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from hpctrain._files import NotReadable, read_bounded, shorten
from hpctrain.approvals import checkpoint_identity, verify_chain
from hpctrain.bundle import _records as records
from hpctrain.bundle._archive import Scan, snapshot_limit
from hpctrain.bundle._io import hash_file, open_regular, regular_files
from hpctrain.bundle._listing import Check, fail, new_check, parse_listing, safe_rel
from hpctrain.bundle.layout import BundleLayout
from hpctrain.errors import CheckpointFormatError, HpctrainError
from hpctrain.identity.manifest import SnapshotUnreadable, identity_format, identity_hash, snapshot_digest
from hpctrain.rundir import JSONL_LIMIT, RECORD_LIMIT, read_json

__all__ = [
    "check_files",
    "check_archive_files",
    "snapshot_of",
    "check_checkpoint",
    "check_archive_checkpoint",
    "check_approvals",
    "check_identity",
    "check_crate",
]


def compare_listing(
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
            fail(c, f"{rel}: cannot read it ({unreadable[rel]})")
            continue
        if rel not in present:
            if stopped:  # the tar was refused before it reached this member: one line for all of them
                unread += 1
            else:
                fail(c, f"{rel}: missing (listed in {BundleLayout.FILE_LIST})")
            continue
        sha, size = found[rel]
        nbytes += size
        if sha != listed[rel]:
            fail(c, f"{rel}: sha256 mismatch (changed or damaged since the bundle was written)")
    if unread:
        fail(c, f"{unread} listed file(s) not read: the tar was refused before them")
    for rel in sorted(present - set(listed)):
        fail(c, f"{rel}: not in {BundleLayout.FILE_LIST} (added after the bundle was written)")
    good = len([r for r in listed if r in present])
    c["detail"] = f"{len(listed)} files listed, {good} present, {nbytes} bytes hashed"
    if c["ok"]:
        c["detail"] = f"{len(listed)} files, {nbytes} bytes: every sha256 matches, none missing or extra"
    c["listed"] = sorted(listed)


def check_files(lay: BundleLayout) -> Check:
    c = new_check("files")
    try:
        raw, _ = read_bounded(lay.file_list, limit=JSONL_LIMIT)
    except FileNotFoundError:
        fail(c, f"{lay.FILE_LIST}: missing (the file list; nothing can be checked against it)")
        raw = b""
    except NotReadable as exc:
        fail(c, f"{lay.FILE_LIST}: {exc}")
        raw = b""
    listed, problems = parse_listing(raw)
    for problem in problems:
        fail(c, problem)
    try:
        on_disk, other = regular_files(lay.root)
    except OSError as exc:
        fail(c, f"cannot list the bundle ({exc.filename}: {exc.strerror or exc})")
        on_disk, other = [], []
    for o in other:
        fail(c, f"{lay.rel(o)}: a symbolic link or special file (a bundle holds regular files only; not followed)")
    present = {lay.rel(f) for f in on_disk} - {lay.FILE_LIST}
    found: tp.Dict[str, tp.Tuple[str, int]] = {}
    unreadable: tp.Dict[str, str] = {}
    for rel in sorted(present & set(listed)):
        try:
            found[rel] = hash_file(lay.root / rel)
        except (HpctrainError, OSError) as exc:
            unreadable[rel] = str(exc)
    compare_listing(c, listed, found, present, unreadable)
    return c


def check_archive_files(lay: BundleLayout, scan: Scan) -> Check:
    c = new_check("files")
    for problem in scan.problems:
        fail(c, problem)
    raw = scan.kept.get(lay.FILE_LIST, b"")
    if lay.FILE_LIST not in scan.found:
        fail(c, f"{lay.FILE_LIST}: missing (the file list; nothing can be checked against it)")
    elif lay.FILE_LIST not in scan.kept:
        fail(c, f"{lay.FILE_LIST}: over the {JSONL_LIMIT}-byte bound")
    listed, problems = parse_listing(raw)
    for problem in problems:
        fail(c, problem)
    present = set(scan.found) - {lay.FILE_LIST}
    compare_listing(c, listed, scan.found, present, {}, stopped=scan.refused is not None, refused=scan.skipped)
    c["detail"] += f"; streamed from the tar ({scan.bytes_read} bytes), nothing unpacked"
    return c


def snapshot_of(lay: BundleLayout) -> tp.Tuple[tp.Optional[tp.Dict[str, tp.Any]], tp.Optional[str]]:
    """The bundled code snapshot's digest (:func:`hpctrain.identity.manifest.snapshot_digest`), or why not."""
    if not os.path.lexists(lay.code_snapshot):
        return None, None
    try:
        fd = open_regular(lay.code_snapshot)
    except (HpctrainError, OSError) as exc:
        return None, str(exc)
    try:
        with os.fdopen(fd, "rb") as f:
            return snapshot_digest(f, limit=snapshot_limit(os.fstat(f.fileno()).st_size)), None
    except (SnapshotUnreadable, OSError) as exc:
        return None, str(exc)


def _against_record(
    c: Check, rel: str, manifest: tp.Mapping[str, tp.Any], sha: str, ck: tp.Mapping[str, tp.Any]
) -> None:
    """The bundled checkpoint is the one the record names: its manifest's sha256 and its step (directory and tar)."""
    if sha != ck.get("manifest_sha256"):
        fail(
            c, f"{rel}/MANIFEST.json: sha256 {sha[:16]}... is not the recorded {str(ck.get('manifest_sha256'))[:16]}..."
        )
    if manifest.get("step") != ck.get("step"):
        fail(c, f"{rel}: step {manifest.get('step')} is not the recorded step {ck.get('step')}")


def check_checkpoint(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check) -> None:
    from hpctrain.ckpt import verify as verify_checkpoint

    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    rel = safe_rel(ck.get("dir"))
    c["detail"] = "does not verify"
    if rel is None or not rel.startswith(f"{lay.CHECKPOINT}/"):
        fail(c, f"{lay.RECORD}: no valid checkpoint dir recorded ({ck.get('dir')!r})")
        return
    path = lay.root / rel
    if not path.is_dir() or path.is_symlink():
        fail(c, f"{rel}: missing")
        return
    try:
        manifest = verify_checkpoint(path)
        sha = checkpoint_identity(path)
    except (CheckpointFormatError, OSError) as exc:
        fail(c, f"{rel}: the checkpoint's own verify failed: {exc}")
        return
    _against_record(c, rel, manifest, sha, ck)
    c["detail"] = (
        f"step {manifest.get('step')}, {manifest.get('world_size')} shard(s): structure and every crc32 verify; "
        f"manifest sha256 {sha[:16]}..."
    )


def check_approvals(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check) -> tp.List[tp.Dict[str, tp.Any]]:
    rec = record.get("approvals") if isinstance(record.get("approvals"), dict) else {}
    entries, problems = verify_chain(lay.approvals)
    for p in problems:
        fail(c, f"{lay.rel(lay.approvals)}: {p}")
    head = entries[-1]["entry_hash"] if entries else None
    if rec.get("entries") != len(entries) or rec.get("head") != head:
        fail(
            c,
            f"the log holds {len(entries)} entries (head {str(head)[:16]}), the bundle recorded {rec.get('entries')} "
            f"(head {str(rec.get('head'))[:16]}): entries removed or added after the bundle was written",
        )
    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    for e in entries:
        named = (e.get("checkpoint") or {}).get("manifest_sha256") if isinstance(e.get("checkpoint"), dict) else None
        if e.get("step") == ck.get("step") and named != ck.get("manifest_sha256"):
            fail(
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


def check_archive_checkpoint(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check, scan: Scan) -> None:
    """A tar's checkpoint, from the stream: its manifest (read and validated by the checkpoint reader from the
    scratch copy) against the record, and every shard's size and crc32 (computed as it streamed) against the
    manifest. The shards' structure is checked where they are unpacked (reproduce verifies its placed copy)."""
    from hpctrain.ckpt import read_manifest

    ck = record.get("checkpoint") if isinstance(record.get("checkpoint"), dict) else {}
    rel = safe_rel(ck.get("dir"))
    c["detail"] = "does not verify"
    if rel is None or not rel.startswith(f"{lay.CHECKPOINT}/") or rel.count("/") != 1:
        fail(c, f"{lay.RECORD}: no valid checkpoint dir recorded ({ck.get('dir')!r})")
        return
    if f"{rel}/MANIFEST.json" not in scan.found:
        fail(
            c, f"{rel}: missing" if not any(r.startswith(rel + "/") for r in scan.found) else f"{rel}: no MANIFEST.json"
        )
        return
    try:
        manifest = read_manifest(lay.root / rel)
        sha = checkpoint_identity(lay.root / rel)
    except (CheckpointFormatError, OSError) as exc:
        fail(c, f"{rel}: the checkpoint's own verify failed: {exc}")
        return
    _against_record(c, rel, manifest, sha, ck)
    for shard in manifest["shards"]:
        srel = f"{rel}/{shard['file']}"
        got = scan.found.get(srel)
        if got is None:
            fail(c, f"{srel}: missing (the checkpoint's manifest names it)")
        elif got[1] != shard["bytes"]:
            fail(c, f"{srel}: {got[1]} bytes, the checkpoint's manifest says {shard['bytes']} (truncated or swapped)")
        elif scan.crc.get(srel) != shard["crc32"]:
            fail(c, f"{srel}: checksum mismatch (corrupted shard, or one from another checkpoint)")
    if c["ok"]:
        c["detail"] = (
            f"step {manifest.get('step')}, {manifest.get('world_size')} shard(s): every size and crc32 verify "
            f"(streamed); manifest sha256 {sha[:16]}..."
        )


def snapshot_problems(
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


def check_identity(
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
        rel = safe_rel((item or {}).get("file") if isinstance(item, dict) else None)
        if rel is None:
            fail(c, f"{lay.RECORD}: an identity record entry without a valid file: {shorten(item, 80)}")
            continue
        problems: tp.List[str] = []
        doc = read_json(lay.root / rel, problems, limit=RECORD_LIMIT)
        if doc is None:
            fail(c, f"{rel}: unreadable ({problems[0] if problems else 'missing'})")
            continue
        loaded[rel] = doc
        value = doc.get("identity")
        if value != item.get("identity"):
            fail(
                c, f"{rel}: identity {str(value)[:16]} is not the {str(item.get('identity'))[:16]} recorded at bundling"
            )
        if not isinstance(value, str):
            fail(c, f"{rel}: records no identity")
            continue
        seen[rel] = value
        try:
            fmt = identity_format(doc)
            again = identity_hash(doc)
        except Exception as exc:  # noqa: BLE001 - recorded data of any shape: a failed check, never a traceback
            fail(c, f"{rel}: the identity cannot be recomputed ({shorten(exc, 160)})")
            continue
        recomputed += 1
        if again != value:
            fail(
                c,
                f"{rel}: recorded identity {value[:16]}..., recomputed {again[:16]}... from its parts: the manifest "
                "was edited",
            )
        if fmt < 2:
            older.append(rel)
        for problem in snapshot_problems(rel, doc, fmt, snap_rel, snapshot, snapshot_error, bundled):
            fail(c, problem)
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
    newest_src = safe_rel(record.get("run_identity_source"))
    if record.get("run_identity") is not None and record.get("run_identity") not in seen.values():
        fail(
            c,
            f"{lay.RECORD}: run identity {str(record.get('run_identity'))[:16]} is in no identity manifest of the "
            "bundle",
        )
    known = set(seen.values())
    for e in entries:
        ident = e.get("run_identity")
        src = safe_rel(e.get("run_identity_source"))
        if ident is not None and src in seen and seen[src] != ident:
            fail(
                c,
                f"{lay.rel(lay.approvals)}: seq {e.get('seq')} was made for run identity {str(ident)[:16]} of {src}, "
                f"which now records {str(seen[src])[:16]}: that record changed after the approval",
            )
        elif ident is not None and known and ident not in known:
            fail(
                c,
                f"{lay.rel(lay.approvals)}: seq {e.get('seq')} was made for run identity {str(ident)[:16]}, which "
                "no identity manifest here holds",
            )
    # the derived parts agree with the manifest they were derived from
    parts = record.get("parts") if isinstance(record.get("parts"), dict) else {}
    source = safe_rel(parts.get("identity_source"))
    doc = loaded.get(source) if source else None
    if source and doc is None:
        fail(c, f"{lay.RECORD}: the lock and fingerprint came from {source}, which is not a readable manifest here")
    if doc is not None:
        lock = records.requirements_lock(doc, newest_src or "")
        lock_rel = safe_rel(parts.get("environment_lock"))
        if lock is not None or lock_rel is not None:
            try:
                text = read_bounded(lay.root / lock_rel, limit=RECORD_LIMIT)[0].decode() if lock_rel else None
            except (OSError, UnicodeDecodeError):
                text = None
            if text != lock:
                fail(c, f"{lock_rel or 'environment/requirements.lock'}: does not match the manifest's distributions")
        fp_rel = safe_rel(parts.get("data_fingerprint"))
        if fp_rel is not None:
            fp = read_json(lay.root / fp_rel, [])
            if fp is None or fp.get("data") != doc.get("data"):
                fail(c, f"{fp_rel}: does not match the manifest's data section")
    check_submission(lay, c, loaded)
    c["detail"] = (
        f"{len(listed)} manifest(s), run identity {str(record.get('run_identity'))[:16]}...: {recomputed} "
        "recomputed from their parts" + (f", {len(older)} of format 1" if older else "")
    )


def check_submission(lay: BundleLayout, c: Check, loaded: tp.Mapping[str, tp.Mapping[str, tp.Any]]) -> None:
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
        fail(
            c,
            f"{lay.rel(lay.submission)}: entry {shorten(mine[0], 60)} with arguments {shorten(mine[1], 80)} is in no "
            "identity record of the bundle (edited after the run?)",
        )


def check_crate(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check, listed: tp.Sequence[str]) -> None:
    doc = read_json(lay.metadata, [])
    graph = (doc or {}).get("@graph")
    if not isinstance(graph, list):
        fail(c, f"{lay.METADATA}: missing or not RO-Crate JSON-LD")
        return
    by_id = {e.get("@id"): e for e in graph if isinstance(e, dict)}
    root = by_id.get("./") or {}
    parts = root.get("hasPart") or []
    parts = parts if isinstance(parts, list) else [parts]
    named = {p.get("@id") for p in parts if isinstance(p, dict)}
    for rel in listed:
        if rel not in named and rel != lay.METADATA:
            fail(c, f"{lay.METADATA}: the root does not list {rel}")
    actions = [e for e in graph if isinstance(e, dict) and e.get("@type") == "CreateAction"]
    recorded = record.get("attempts") if isinstance(record.get("attempts"), list) else []
    if len(actions) != len(recorded):
        fail(c, f"{lay.METADATA}: {len(actions)} CreateAction(s) for {len(recorded)} recorded attempt(s)")
    c["detail"] = f"RO-Crate 1.1, {len(actions)} CreateAction(s) (one per attempt), {len(named)} parts"
