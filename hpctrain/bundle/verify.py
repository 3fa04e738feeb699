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
* **identity**: each manifest's ``identity`` recomputed (when ``hpctrain.identity`` offers ``identity_hash``),
  else the records checked for agreement; the environment lock and data fingerprint against the manifest
  they came from; an identity that changed between attempts is shown (a warning: it is what happened);
* **crate**: ``ro-crate-metadata.json`` parses, its root lists every file, and it holds one CreateAction per
  recorded attempt (``roc-validator`` checks the rest: ``../shared/tools/rocrate-validate BUNDLE``).

Nothing in a bundle is executed or imported: JSON is parsed, tars are read member by member (regular files
and directories only, no path outside the top directory), the code snapshot is hashed, never unpacked.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tarfile
import tempfile
import typing as tp
from pathlib import Path, PurePosixPath

from hpctrain._files import NotReadable, read_bounded
from hpctrain.approvals import checkpoint_identity, verify_chain
from hpctrain.bundle import _records as records
from hpctrain.bundle._io import hash_file, regular_files
from hpctrain.bundle.build import SELF_LINE
from hpctrain.bundle.layout import BUNDLE_SCHEMA, BundleLayout
from hpctrain.errors import CheckpointFormatError, HpctrainError, UsageError
from hpctrain.rundir import JSONL_LIMIT, RECORD_LIMIT, read_json

__all__ = ["verify_bundle", "Check"]

_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")
MAX_MEMBER_BYTES = 1 << 40
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
    """The report: ``{"bundle", "format", "ok", "checks": [...], "record", "approvals", "attempts"}``.

    :class:`UsageError` when ``path`` is not a bundle (exit 2); a damaged bundle is a report with ``ok``
    False (exit 1), and a tar damaged before its first member one :class:`HpctrainError` (exit 1)."""
    p = Path(path)
    if not os.path.lexists(p):
        raise UsageError(f"BUNDLE {p} does not exist")
    if p.is_dir():
        return _verify_dir(p, p, "directory")
    if not p.is_file():
        raise UsageError(f"BUNDLE {p} is neither a directory nor a tar file")
    if not (p.name.endswith((".tar", ".tar.gz", ".tgz")) or tarfile.is_tarfile(p)):
        raise UsageError(f"BUNDLE {p} is neither a bundle directory nor a tar of one")
    parent = p.resolve().parent
    where = parent if os.access(parent, os.W_OK) else None
    scratch = Path(tempfile.mkdtemp(prefix=".hpctrain-verify-", dir=where))
    try:
        top, problems = _extract(p, scratch)
        if top is None:
            if problems:  # a tar damaged before its first member: a failed check (exit 1), named
                raise HpctrainError(f"BUNDLE {p}: {problems[0]}")
            raise UsageError(f"BUNDLE {p}: a tar without the one top directory a bundle tar holds")
        report = _verify_dir(top, p, "tar")
        if problems:
            files = report["checks"][0]
            for problem in problems:
                _fail(files, problem)
            report["ok"] = False
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract(tar_path: Path, dest: Path) -> tp.Tuple[tp.Optional[Path], tp.List[str]]:
    """Unpack regular files and directories under one top directory; refuse anything else, by name."""
    problems: tp.List[str] = []
    top: tp.Optional[str] = None
    try:
        with tarfile.open(tar_path, "r:*") as tf:
            for m in tf:
                rel = _safe_rel(m.name.rstrip("/"))
                if rel is None:
                    problems.append(f"tar member {m.name!r}: a path outside the bundle; not unpacked")
                    continue
                first = rel.split("/", 1)[0]
                if top is None:
                    top = first
                if first != top:
                    problems.append(f"tar member {m.name!r}: outside the top directory {top}/; not unpacked")
                    continue
                target = dest / rel
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif m.isreg():
                    if m.size > MAX_MEMBER_BYTES:
                        problems.append(f"{rel}: {m.size} bytes in the tar, over the bound; not unpacked")
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(m)
                    assert src is not None
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    try:
                        fd = os.open(target, flags, 0o600)
                    except FileExistsError:
                        problems.append(f"{rel.split('/', 1)[-1]}: twice in the tar")
                        continue
                    with os.fdopen(fd, "wb") as out:
                        shutil.copyfileobj(src, out, 4 << 20)
                else:
                    kind = "a link" if m.issym() or m.islnk() else "not a regular file"
                    problems.append(f"{rel.split('/', 1)[-1] if '/' in rel else rel}: {kind} in the tar; not unpacked")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        problems.append(f"{tar_path.name}: a damaged tar ({str(exc)[:160]}); members after the damage were not read")
    return (dest / top if top is not None and (dest / top).is_dir() else None), problems


# ---------------------------------------------------------------------------------------------- the checks
def _verify_dir(root: Path, shown: Path, fmt: str) -> tp.Dict[str, tp.Any]:
    lay = BundleLayout(root)
    if not os.path.lexists(lay.file_list) and not os.path.lexists(lay.record):
        raise UsageError(f"BUNDLE {shown}: no {lay.FILE_LIST} and no {lay.RECORD}: not an hpctrain bundle")
    files = _check_files(lay)
    record_problems: tp.List[str] = []
    record = read_json(lay.record, record_problems)
    if record is None or record.get("schema") != BUNDLE_SCHEMA:
        why = record_problems[0] if record_problems else f"{lay.RECORD} missing or not a {BUNDLE_SCHEMA} record"
        record = None
    checks = [files]
    ck, approvals, identity, crate = (_check(n) for n in ("checkpoint", "approvals", "identity", "crate"))
    if record is None:
        for c in (ck, approvals, identity, crate):
            _fail(c, f"not checked: {why}")
        entries: tp.List[tp.Dict[str, tp.Any]] = []
    else:
        _check_checkpoint(lay, record, ck)
        entries = _check_approvals(lay, record, approvals)
        _check_identity(lay, record, identity, entries)
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


def _check_files(lay: BundleLayout) -> Check:
    c = _check("files")
    listed: tp.Dict[str, str] = {}
    try:
        raw, _ = read_bounded(lay.file_list, limit=JSONL_LIMIT)
    except FileNotFoundError:
        _fail(c, f"{lay.FILE_LIST}: missing (the file list; nothing can be checked against it)")
        raw = b""
    except NotReadable as exc:
        _fail(c, f"{lay.FILE_LIST}: {exc}")
        raw = b""
    if raw:
        text = raw.decode("utf-8", errors="replace")
        body, _, last = text.rstrip("\n").rpartition("\n")
        body = body + "\n" if body else ""
        expected = hashlib.sha256(body.encode("utf-8", errors="replace")).hexdigest()
        if not last.startswith(SELF_LINE) or last[len(SELF_LINE) :].strip() != expected or "\ufffd" in text:
            _fail(c, f"{lay.FILE_LIST}: edited or damaged (its last line, the sha256 of the list, does not match)")
        for n, line in enumerate(body.splitlines(), start=1):
            m = _LINE.match(line)
            rel = _safe_rel(m.group(2)) if m else None
            if m is None or rel is None:
                _fail(c, f"{lay.FILE_LIST} line {n}: not '<sha256>  <path inside the bundle>' (damaged)")
                continue
            if rel in listed:
                _fail(c, f"{lay.FILE_LIST} line {n}: {rel} listed twice")
            listed[rel] = m.group(1)
    try:
        on_disk, other = regular_files(lay.root)
    except OSError as exc:
        _fail(c, f"cannot list the bundle ({exc.filename}: {exc.strerror or exc})")
        on_disk, other = [], []
    for o in other:
        _fail(c, f"{lay.rel(o)}: a symbolic link or special file (a bundle holds regular files only; not followed)")
    present = {lay.rel(f) for f in on_disk} - {lay.FILE_LIST}
    nbytes = 0
    for rel in sorted(listed):
        if rel not in present:
            _fail(c, f"{rel}: missing (listed in {lay.FILE_LIST})")
            continue
        try:
            sha, size = hash_file(lay.root / rel)
        except (HpctrainError, OSError) as exc:
            _fail(c, f"{rel}: cannot read it ({exc})")
            continue
        nbytes += size
        if sha != listed[rel]:
            _fail(c, f"{rel}: sha256 mismatch (changed or damaged since the bundle was written)")
    for rel in sorted(present - set(listed)):
        _fail(c, f"{rel}: not in {lay.FILE_LIST} (added after the bundle was written)")
    good = len([r for r in listed if r in present])
    c["detail"] = f"{len(listed)} files listed, {good} present, {nbytes} bytes hashed"
    if c["ok"]:
        c["detail"] = f"{len(listed)} files, {nbytes} bytes: every sha256 matches, none missing or extra"
    c["listed"] = sorted(listed)
    return c


def _check_checkpoint(lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check) -> None:
    from hpctrain.ckpt._reader import verify_dir

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
        manifest = verify_dir(path)
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


def _identity_hash() -> tp.Optional[tp.Callable[[tp.Any], str]]:
    if importlib.util.find_spec("hpctrain.identity") is None:
        return None
    try:
        from hpctrain.identity import identity_hash  # type: ignore[attr-defined]
    except ImportError:
        return None
    return tp.cast(tp.Callable[[tp.Any], str], identity_hash)


def _check_identity(
    lay: BundleLayout, record: tp.Mapping[str, tp.Any], c: Check, entries: tp.Sequence[tp.Mapping[str, tp.Any]]
) -> None:
    listed = record.get("identity_records") if isinstance(record.get("identity_records"), list) else []
    if not listed:
        c["detail"] = "no identity manifest in the bundle (a run from before identity capture)"
        c["warnings"].append(c["detail"])
        return
    compute = _identity_hash()
    seen: tp.Dict[str, tp.Any] = {}
    loaded: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    recomputed = 0
    for item in listed:
        rel = _safe_rel((item or {}).get("file") if isinstance(item, dict) else None)
        if rel is None:
            _fail(c, f"{lay.RECORD}: an identity record entry without a valid file: {str(item)[:80]}")
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
        if isinstance(value, str):
            seen[rel] = value
            if compute is not None:
                try:
                    again = compute(doc)
                except Exception as exc:  # noqa: BLE001 - another module's function on recorded data
                    c["warnings"].append(f"{rel}: identity_hash could not recompute it ({type(exc).__name__}: {exc})")
                    continue
                recomputed += 1
                if again != value:
                    _fail(
                        c,
                        f"{rel}: recorded identity {value[:16]}..., recomputed {str(again)[:16]}...: the manifest "
                        "was edited",
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
        if ident is not None and known and ident not in known:
            _fail(
                c,
                f"approval seq {e.get('seq')} was made for run identity {str(ident)[:16]}, which no manifest here "
                "holds",
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
                text = (lay.root / (lock_rel or "")).read_text() if lock_rel else None
            except OSError:
                text = None
            if text != lock:
                _fail(c, f"{lock_rel or 'environment/requirements.lock'}: does not match the manifest's distributions")
        fp_rel = _safe_rel(parts.get("data_fingerprint"))
        if fp_rel is not None:
            fp = read_json(lay.root / fp_rel, [])
            if fp is None or fp.get("data") != doc.get("data"):
                _fail(c, f"{fp_rel}: does not match the manifest's data section")
    how = (
        f"{recomputed} recomputed with hpctrain.identity.identity_hash"
        if compute is not None
        else "recorded values agree (hpctrain.identity.identity_hash not available to recompute)"
    )
    c["detail"] = f"{len(listed)} manifest(s), run identity {str(record.get('run_identity'))[:16]}...: {how}"


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
