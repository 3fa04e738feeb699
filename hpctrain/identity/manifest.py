"""The run identity manifest: written at submit (login node) and again by rank 0 at every start.

Plain JSON in the run directory (:class:`~hpctrain.rundir.RunDir` names every file), written atomically:

- :func:`capture_submit` (login node, no torch): code + config + runtime + ownership ->
  ``RunDir.identity_submit`` and the code snapshot ``RunDir.code_snapshot``; a run continued with
  ``submit --resume`` keeps the first of both (the new capture is compared with it and returned).
- :func:`capture_start` (rank 0, after the process group is up): the same on the node ->
  ``RunDir.identity_attempt(job, restart)``. The code is captured again where the entry's repository is
  visible (and compared with the submit record), else the submit record's code section is reused.
- :func:`record_data` / :func:`record_config` (the Trainer, rank 0): add the data fingerprint and the
  training config to this attempt's record (atomic rewrite). A data change since the previous attempt
  (cheap tier, then sampled content) is one :class:`~hpctrain.errors.UsageError` line unless accepted;
  an accepted change is recorded.

The **identity** is :func:`identity_hash`: the sha256 of the canonical JSON of the per-section digests of
code, config, data and runtime essentials (see :func:`section_essentials`); never times, host names, pids,
paths or Slurm ids. It is the one function that computes an identity: at capture, and when ``bundle verify``
recomputes it from a bundled record. Since :data:`IDENTITY_FORMAT` 2 the code section binds the code
snapshot's content (:func:`snapshot_digest`: every member's name, kind and sha256, not times or owners), so an
edit inside the snapshot is a different identity; records written before it (no ``identity_format``: format 1)
keep their identity, computed as it was then. Every record carries ``identity``, ``identity_sections`` and
``previous``: which earlier attempt it was compared with and which sections changed (:func:`current_identity`,
:func:`attempt_history`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
import time
import typing as tp
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain._files import shorten
from hpctrain._procs import user_name
from hpctrain.errors import UsageError
from hpctrain.identity.code import Git, capture_code, code_essentials, dirty_summary, public_code
from hpctrain.identity.runtime import capture_runtime, runtime_essentials
from hpctrain.identity.snapshot import write_snapshot
from hpctrain.rundir import RunDir, attempt_label, dumps_record, read_json

__all__ = [
    "SCHEMA",
    "SECTIONS",
    "IDENTITY_FORMAT",
    "RunIdentity",
    "SnapshotUnreadable",
    "snapshot_digest",
    "identity_format",
    "canonical_json",
    "section_essentials",
    "section_digests",
    "identity_hash",
    "ownership_record",
    "require_clean",
    "capture_submit",
    "capture_start",
    "record_data",
    "record_config",
    "current_identity",
    "attempt_history",
]

SCHEMA = "hpctrain.identity/1"
SECTIONS = ("code", "config", "data", "runtime")
IDENTITY_FORMAT = 2
"""How :func:`identity_hash` combines the sections (the record's ``identity_format``; absent: 1). 1: code,
config, data and runtime essentials. 2: the same, and the code section binds the code snapshot's content hash
(``code.snapshot.content_sha256``, :func:`snapshot_digest`)."""
SNAPSHOT_DIGEST_LIMIT = 16 << 30
"""Bytes a code snapshot may unpack to when it is hashed (the snapshot reader's own bound)."""
SNAPSHOT_MEMBERS_LIMIT = 1_000_000
SNAPSHOT_MANIFEST_LIMIT = 16 << 20
CONFIG_KEYS = ("entry", "entry_args", "world_size", "gpus_per_node", "train", "seed")
"""The config essentials: what the ranks compute with. Scheduling (time, partition, account, requeues), names
and paths (job name, run directory) and ownership do not change a result, so they are recorded but not hashed."""
STRUCTURE_FILES_LIMIT = 256
"""With more input files than this, an attempt record keeps each file's structure hash, not the structure (a
change is then reported as "HDF5 structure changed" without the field that did)."""
_LATE = ("train", "seed")  # config keys the Trainer records after the start capture


def canonical_json(obj: tp.Any) -> bytes:
    """Sorted keys, no spaces, UTF-8, no NaN: the bytes hashed for an identity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _sha(obj: tp.Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


# ----------------------------------------------------------------------------------------------- identity
def _config_essentials(config: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Any:
    if not config:
        return None
    return {k: config.get(k) for k in CONFIG_KEYS}


def _data_essentials(data: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Any:
    if not data or not isinstance(data.get("files"), list):
        return None
    from hpctrain.data.fingerprint import essentials

    return [essentials(f) for f in data["files"]]


def identity_format(manifest: tp.Mapping[str, tp.Any]) -> int:
    """The record's :data:`IDENTITY_FORMAT` (1 when it names none: written before format 2). ValueError for a
    format this hpctrain does not know (a newer one, or not a positive integer)."""
    value = manifest.get("identity_format", 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= IDENTITY_FORMAT:
        raise ValueError(
            f"identity format {str(value)[:20]!r} is not one this hpctrain knows (1..{IDENTITY_FORMAT}); "
            "upgrade hpctrain to recompute it"
        )
    return value


def _snapshot_binding(code: tp.Any) -> tp.Optional[str]:
    snap = code.get("snapshot") if isinstance(code, dict) else None
    value = snap.get("content_sha256") if isinstance(snap, dict) else None
    return value if isinstance(value, str) else None


def section_essentials(manifest: tp.Mapping[str, tp.Any], fmt: tp.Optional[int] = None) -> tp.Dict[str, tp.Any]:
    """Per section, what makes the identity (None: not recorded yet), as identity format ``fmt`` (default: the
    record's own) defines it."""
    fmt = identity_format(manifest) if fmt is None else fmt
    code = code_essentials(manifest.get("code"))
    if fmt >= 2 and code is not None:
        code = {"repositories": code, "snapshot": _snapshot_binding(manifest.get("code"))}
    return {
        "code": code,
        "config": _config_essentials(manifest.get("config")),
        "data": _data_essentials(manifest.get("data")),
        "runtime": runtime_essentials(manifest.get("runtime")),
    }


def section_digests(manifest: tp.Mapping[str, tp.Any], fmt: tp.Optional[int] = None) -> tp.Dict[str, tp.Optional[str]]:
    return {k: None if v is None else _sha(v) for k, v in section_essentials(manifest, fmt).items()}


def identity_hash(manifest: tp.Mapping[str, tp.Any]) -> str:
    """The run's identity: sha256 of the canonical JSON of the section digests (code, config, data, runtime
    essentials; from format 2 the code section includes the code snapshot's content hash). Equal manifests of the
    same code, config, data and environment give the same identity on any host, at any time, in any run
    directory. The one function that computes an identity: capture writes it, ``bundle verify`` recomputes it.
    ValueError for a record of an identity format this hpctrain does not know."""
    fmt = identity_format(manifest)
    if fmt == 1:  # as records written before format 2 computed it: their identities stay what they were
        return _sha({"schema": SCHEMA, "sections": section_digests(manifest, 1)})
    return _sha({"schema": SCHEMA, "format": fmt, "sections": section_digests(manifest, fmt)})


# ----------------------------------------------------------------------------------------------- snapshot digest
class SnapshotUnreadable(ValueError):
    """The code snapshot cannot be hashed: not a tar.gz, damaged, or over the bounds (one line)."""


class _Counting:
    """A read-only file over ``raw`` that hashes and counts the bytes passed on (the snapshot's own sha256)."""

    def __init__(self, raw: tp.BinaryIO) -> None:
        self.raw, self.sha256, self.size = raw, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha256.update(data)
        self.size += len(data)
        return data


def _member_manifest(name: str, data: bytes) -> tp.Any:
    """A repository's ``MANIFEST.json`` inside the snapshot, as what of it defines the code (its commit, diff
    and file hashes: :func:`code_essentials`), not its paths or times; an unreadable one by its bytes."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return ["bytes", hashlib.sha256(data).hexdigest()]
    try:
        return ["manifest", _sha(code_essentials({"repositories": {name.split("/", 1)[0]: doc}}))]
    except (TypeError, KeyError, AttributeError, ValueError):
        return ["bytes", hashlib.sha256(data).hexdigest()]


def snapshot_digest(
    source: tp.Union[str, "os.PathLike[str]", tp.BinaryIO], *, limit: int = SNAPSHOT_DIGEST_LIMIT
) -> tp.Dict[str, tp.Any]:
    """``{"sha256", "bytes", "content_sha256", "members"}`` of a code snapshot (a path or a readable binary
    stream), read once, member by member, never unpacked. ``sha256``/``bytes``: of the tar.gz itself;
    ``content_sha256``: of what it holds: every member's name, kind (file, executable bit, link target) and
    sha256, sorted by name; times, owners and compression are left out, so the same code gives the same hash
    whenever and wherever it was archived. A repository's ``MANIFEST.json`` counts by its code essentials.
    :class:`SnapshotUnreadable` (one line) for a damaged snapshot or one over ``limit`` bytes unpacked."""
    opened = None
    if isinstance(source, (str, os.PathLike)):
        opened = open(os.fspath(source), "rb")  # noqa: SIM115 - closed below
        raw: tp.BinaryIO = opened
    else:
        raw = source
    counting = _Counting(raw)
    entries: tp.List[tp.List[tp.Any]] = []
    total = 0
    try:
        with tarfile.open(fileobj=counting, mode="r|gz") as tar:  # type: ignore[call-overload]
            for m in tar:
                if len(entries) >= SNAPSHOT_MEMBERS_LIMIT:
                    raise SnapshotUnreadable(f"more than {SNAPSHOT_MEMBERS_LIMIT} members; not a code snapshot")
                name = _lossless(m.name)
                if m.isreg():
                    total += m.size
                    if total > limit:
                        raise SnapshotUnreadable(f"unpacks to more than {limit} bytes; not a code snapshot")
                    src = tar.extractfile(m)
                    assert src is not None
                    parts = [p for p in m.name.split("/") if p not in ("", ".")]
                    if len(parts) == 2 and parts[1] == "MANIFEST.json" and m.size <= SNAPSHOT_MANIFEST_LIMIT:
                        entries.append([name, *_member_manifest(m.name, src.read())])
                        continue
                    h = hashlib.sha256()
                    while True:
                        block = src.read(1 << 20)
                        if not block:
                            break
                        h.update(block)
                    entries.append([name, "file", bool(m.mode & 0o111), h.hexdigest()])
                elif m.issym() or m.islnk():
                    entries.append([name, "symlink" if m.issym() else "hardlink", _lossless(m.linkname)])
                elif not m.isdir():
                    entries.append([name, "special", m.type.decode("latin-1")])
        while counting.read(1 << 20):  # what follows the end-of-archive blocks is part of the file's sha256
            pass
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise SnapshotUnreadable(f"not a readable code snapshot ({shorten(str(exc), 160)})") from None
    finally:
        if opened is not None:
            opened.close()
    entries.sort(key=lambda e: json.dumps(e, sort_keys=True))
    return {
        "sha256": counting.sha256.hexdigest(),
        "bytes": counting.size,
        "content_sha256": _sha({"snapshot_content": 1, "members": entries}),
        "members": len(entries),
    }


def _lossless(name: str) -> tp.Union[str, tp.Dict[str, str]]:
    """A tar member's name as JSON can hold it: the name itself, or ``{"hex": ...}`` of its bytes for a name that
    is not UTF-8 (tarfile hands those over as lone surrogates, which no JSON encoder writes)."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return {"hex": name.encode("utf-8", "surrogateescape").hex()}


def _bind_snapshot(snapshot: tp.Dict[str, tp.Any], path: Path) -> tp.Dict[str, tp.Any]:
    """The snapshot record with its content hash (what the identity binds), read back from ``path``."""
    try:
        digest = snapshot_digest(path)
    except (SnapshotUnreadable, OSError) as exc:
        return {**snapshot, "content_sha256": None, "digest_error": shorten(str(exc), 300)}
    if snapshot.get("sha256") not in (None, digest["sha256"]):  # changed between its write and this read
        return {**snapshot, "content_sha256": None, "digest_error": "the snapshot changed after it was written"}
    return {
        **snapshot,
        "sha256": digest["sha256"],
        "bytes": digest["bytes"],
        "content_sha256": digest["content_sha256"],
    }


@dataclass(frozen=True)
class RunIdentity:
    """An attempt's identity and how it compares with the previous attempt's (for ledger, metrics, status)."""

    identity: str
    path: Path
    sections: tp.Mapping[str, tp.Optional[str]]
    previous_attempt: tp.Optional[str] = None
    """``<job>-r<restart>`` of the attempt compared with (None: the first attempt)."""
    previous_identity: tp.Optional[str] = None
    changed: tp.Tuple[str, ...] = ()
    """Sections that differ from the previous attempt's (only those recorded in both)."""
    details: tp.Tuple[str, ...] = ()
    data_change_accepted: bool = False
    extra: tp.Mapping[str, tp.Any] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.identity[:12]

    def as_record(self) -> tp.Dict[str, tp.Any]:
        """What a ledger, metrics or checkpoint record carries: small and JSON-able."""
        return {
            "identity": self.identity,
            "identity_changed": list(self.changed),
            "previous_identity": self.previous_identity,
            "data_change_accepted": self.data_change_accepted,
        }


def _run_identity(path: Path, manifest: tp.Mapping[str, tp.Any]) -> RunIdentity:
    prev = manifest.get("previous") or {}
    data = manifest.get("data") or {}
    return RunIdentity(
        identity=str(manifest.get("identity")),
        path=path,
        sections=dict(manifest.get("identity_sections") or {}),
        previous_attempt=prev.get("attempt"),
        previous_identity=prev.get("identity"),
        changed=tuple(prev.get("changed") or ()),
        details=tuple(prev.get("details") or ()),
        data_change_accepted=bool(data.get("accepted_change")),
    )


# ----------------------------------------------------------------------------------------------- ownership


def ownership_record(
    owner: tp.Optional[str] = None, team: tp.Optional[str] = None, notes: tp.Optional[str] = None
) -> tp.Dict[str, tp.Any]:
    """``{"owner", "owner_source", "team", "notes"}``: the owner given, else the user running this."""
    return {
        "owner": owner or user_name(),
        "owner_source": "config" if owner else "user",
        "team": team,
        "notes": notes,
    }


# ----------------------------------------------------------------------------------------------- comparing
def _label(record: tp.Mapping[str, tp.Any]) -> str:
    a = record.get("attempt") or {}
    restart = a.get("restart_count")
    return attempt_label(a.get("job_id"), restart if isinstance(restart, int) else None)


def _code_differences(old: tp.Any, new: tp.Any) -> tp.List[str]:
    a, b = code_essentials(old) or {}, code_essentials(new) or {}
    out: tp.List[str] = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name) or {}, b.get(name) or {}
        if x == y:
            continue
        mine: tp.List[str] = []
        if x.get("commit") != y.get("commit"):
            mine.append(f"{name} commit {str(x.get('commit'))[:12]} -> {str(y.get('commit'))[:12]}")
        if x.get("diff_sha256") != y.get("diff_sha256") or x.get("modified") != y.get("modified"):
            mine.append(f"{name} uncommitted changes differ")
        if x.get("untracked") != y.get("untracked"):
            mine.append(f"{name} untracked files differ")
        if x.get("files_sha256") != y.get("files_sha256"):
            mine.append(f"{name} package files differ")
        out += mine or [f"{name} code differs"]
    return out


def _dict_differences(label: str, old: tp.Any, new: tp.Any, limit: int = 4) -> tp.List[str]:
    old, new = old if isinstance(old, dict) else {}, new if isinstance(new, dict) else {}
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    out = [
        f"{label} {k}: {shorten(json.dumps(old.get(k)), 40)} -> {shorten(json.dumps(new.get(k)), 40)}"
        for k in keys[:limit]
    ]
    if len(keys) > limit:
        out.append(f"{label}: {len(keys) - limit} more")
    return out


def _comparable(section: str, cur: tp.Any, prev: tp.Any) -> tp.Any:
    """The previous attempt's essentials as comparable with this one's: config keys the Trainer has not
    recorded here yet are left out of both."""
    if section == "config" and isinstance(cur, dict) and isinstance(prev, dict):
        return {k: (None if k in _LATE and cur.get(k) is None else v) for k, v in prev.items()}
    return prev


def _compare(manifest: tp.Mapping[str, tp.Any], earlier: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """Which sections differ from the newest earlier attempt that recorded each one."""
    if not earlier:
        return {"attempt": None, "identity": None, "changed": [], "details": []}
    changed: tp.List[str] = []
    details: tp.List[str] = []
    for section in SECTIONS:
        if section_essentials(manifest)[section] is None:
            continue
        for rec in earlier:
            fmt = min(_format_or_1(manifest), _format_or_1(rec))  # an upgrade between attempts is no change
            mine = section_essentials(manifest, fmt)
            theirs = section_essentials(rec, fmt)[section]
            if theirs is None:
                continue
            if _sha(_comparable(section, mine[section], theirs)) != _sha(mine[section]):
                changed.append(section)
                if section == "code":
                    details += _code_differences(rec.get("code"), manifest.get("code"))
                elif section == "config":
                    details += _dict_differences("config", _comparable(section, mine[section], theirs), mine[section])
                elif section == "runtime":
                    details += _dict_differences("runtime", theirs.get("distributions"), mine[section]["distributions"])
                    for k in ("python", "hpctrain"):
                        if theirs.get(k) != mine[section].get(k):
                            details.append(f"runtime {k}: {theirs.get(k)} -> {mine[section].get(k)}")
                else:
                    details.append("data fingerprint differs")
            break
    return {
        "attempt": _label(earlier[0]),
        "identity": earlier[0].get("identity"),
        "changed": changed,
        "details": details,
    }


def _format_or_1(record: tp.Mapping[str, tp.Any]) -> int:
    try:
        return identity_format(record)
    except ValueError:
        return 1


def _attempts(paths: RunDir) -> tp.List[tp.Tuple[Path, tp.Dict[str, tp.Any]]]:
    """Every attempt record of the run, oldest first (by capture time)."""
    found: tp.List[tp.Tuple[Path, tp.Dict[str, tp.Any]]] = []
    if not paths.identity.is_dir():
        return found
    skip = {paths.identity_submit.name, paths.data_cache.name}
    for path in paths.identity.glob("*.json"):
        if path.name in skip:
            continue
        rec = read_json(path, [])
        if rec is not None and rec.get("schema") == SCHEMA and rec.get("kind") == "attempt":
            found.append((path, rec))
    found.sort(key=lambda pr: (float(pr[1].get("captured_at") or 0), pr[0].name))
    return found


def _earlier(paths: RunDir, path: Path, manifest: tp.Mapping[str, tp.Any]) -> tp.List[tp.Dict[str, tp.Any]]:
    """Attempt records captured before ``manifest``, newest first."""
    mine = float(manifest.get("captured_at") or time.time())
    return [
        r for p, r in reversed(_attempts(paths)) if p.name != path.name and float(r.get("captured_at") or 0) <= mine
    ]


def _write(paths: RunDir, path: Path, manifest: tp.Dict[str, tp.Any]) -> RunIdentity:
    manifest["identity_sections"] = section_digests(manifest)
    manifest["identity"] = identity_hash(manifest)
    manifest["previous"] = _compare(manifest, _earlier(paths, path, manifest))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, manifest)
    return _run_identity(path, manifest)


# ----------------------------------------------------------------------------------------------- submit
def _config_from(cfg: tp.Any) -> tp.Dict[str, tp.Any]:
    return {
        "submit": cfg.to_dict(),
        "entry": cfg.entry,
        "entry_args": list(cfg.entry_args),
        "world_size": cfg.world_size,
        "gpus_per_node": cfg.gpus_per_node,
        "train": None,
        "seed": None,
    }


def require_clean(code: tp.Mapping[str, tp.Any]) -> None:
    """One UsageError line naming the dirty files when a captured repository is dirty (``--require-clean``)."""
    dirty = dirty_summary(code)
    if dirty:
        raise UsageError(f"--require-clean: {'; '.join(dirty)}; commit or stash the changes (or drop --require-clean)")


def capture_submit(
    cfg: tp.Any,
    argv: tp.Sequence[str],
    run_dir: tp.Union[str, Path],
    *,
    git: tp.Optional[Git] = None,
    container: tp.Optional[tp.Mapping[str, tp.Any]] = None,
) -> tp.Dict[str, tp.Any]:
    """Capture the submit-time manifest (login node, no torch) and write it, with the code snapshot, unless
    the run directory holds them already (``--resume`` keeps the first; the result then says how this capture
    differs from it under ``differs_from_first``). Returns the manifest (``written``: whether it was written).

    ``cfg.require_clean``: a dirty repository is a UsageError before anything is written. ``container``: the
    image the tasks run in (:func:`hpctrain._container.image_record`: image, digest, runtime and version, mounts).
    """
    started = time.perf_counter()
    git = git or Git()
    paths = RunDir(run_dir)
    code = capture_code(cfg.entry, argv=argv, entry_args=cfg.entry_args, git=git)
    if getattr(cfg, "require_clean", False):
        require_clean(code)
    code_s = time.perf_counter() - started
    manifest: tp.Dict[str, tp.Any] = {
        "schema": SCHEMA,
        "kind": "submit",
        "identity_format": IDENTITY_FORMAT,
        "captured_at": time.time(),
        "code": public_code(code),
        "config": _config_from(cfg),
        "data": None,
        "runtime": capture_runtime(node=False),
        "ownership": ownership_record(
            getattr(cfg, "owner", None), getattr(cfg, "team", None), getattr(cfg, "notes", None)
        ),
    }
    if container is not None:
        manifest["container"] = dict(container)
    runtime_s = time.perf_counter() - started - code_s
    first = read_json(paths.identity_submit, []) if paths.identity_submit.exists() else None
    written = first is None and not paths.identity_submit.exists()
    if written:
        paths.identity.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(paths.code_snapshot, paths.root)
        if paths.code_snapshot.exists():
            kept = {"path": rel, "kept": "an earlier snapshot was kept"}
            manifest["code"]["snapshot"] = _bind_snapshot(kept, paths.code_snapshot)
        else:
            try:
                written_snapshot = {"path": rel, **write_snapshot(paths.code_snapshot, code, git=git)}
            except (OSError, EOFError, ValueError) as exc:  # git archive failed: the manifest still lists every hash
                manifest["code"]["snapshot"] = {"path": None, "error": shorten(str(exc), 300)}
            else:  # the content hash the identity binds, read back from what was written
                manifest["code"]["snapshot"] = _bind_snapshot(written_snapshot, paths.code_snapshot)
    elif first is not None and isinstance(first.get("code"), dict) and "snapshot" in first["code"]:
        manifest["code"]["snapshot"] = first["code"]["snapshot"]  # --resume keeps the first snapshot: the same one
    manifest["identity_sections"] = section_digests(manifest)
    manifest["identity"] = identity_hash(manifest)
    manifest["capture_s"] = round(time.perf_counter() - started, 4)
    manifest["timings"] = {
        "code_s": round(code_s, 4),
        "runtime_s": round(runtime_s, 4),
        "snapshot_s": (manifest["code"].get("snapshot") or {}).get("seconds"),
    }
    if written:
        atomic_write_json(paths.identity_submit, manifest)
    elif first is not None:
        old = first.get("identity_sections") or {}
        mine = section_digests(manifest, _format_or_1(first))  # as the first record's format computed its sections
        manifest["differs_from_first"] = [s for s in SECTIONS if old.get(s) != mine.get(s)]
        manifest["first_identity"] = first.get("identity")
    manifest["written"] = written
    manifest["path"] = str(paths.identity_submit)
    return manifest


# ----------------------------------------------------------------------------------------------- start
def capture_start(
    run_dir: tp.Union[str, Path],
    *,
    job_id: str,
    restart_count: int,
    entry: tp.Optional[str] = None,
    entry_args: tp.Sequence[str] = (),
    world_size: tp.Optional[int] = None,
    gpus_per_node: tp.Optional[int] = None,
    hostnames: tp.Sequence[str] = (),
    launcher: tp.Optional[str] = None,
    backend: tp.Optional[str] = None,
    device: tp.Optional[str] = None,
    cpu_threads: tp.Optional[int] = None,
    git: tp.Optional[Git] = None,
) -> tp.Dict[str, tp.Any]:
    """Capture this attempt's manifest on rank 0 (torch is probed) and write ``RunDir.identity_attempt``.

    Returns the manifest; ``previous.changed`` names the sections that differ from the previous attempt and
    ``code.vs_submit`` whether the code that runs is the code that was submitted."""
    started = time.perf_counter()
    paths = RunDir(run_dir)
    submit = read_json(paths.identity_submit, []) or {}
    submission = read_json(paths.submission, []) or {}
    submitted = submission.get("config") if isinstance(submission.get("config"), dict) else None
    entry = entry or (submitted or {}).get("entry")
    code = public_code(capture_code(entry, argv=sys.argv, entry_args=entry_args, git=git))
    code_s = time.perf_counter() - started
    if code["repositories"]["entry"].get("kind") == "unavailable" and isinstance(submit.get("code"), dict):
        why = code["repositories"]["entry"].get("reason")
        code = dict(submit["code"], reused_from_submit=f"the entry is not visible from this node ({why})")
    elif isinstance(submit.get("code"), dict):
        diffs = _code_differences(submit["code"], code)
        code["vs_submit"] = {"same": not diffs, "differences": diffs}
        if isinstance(submit["code"].get("snapshot"), dict):  # what reproduce rebuilds: bound into this identity
            code["snapshot"] = submit["code"]["snapshot"]
    manifest: tp.Dict[str, tp.Any] = {
        "schema": SCHEMA,
        "kind": "attempt",
        "identity_format": IDENTITY_FORMAT,
        "captured_at": time.time(),
        "attempt": {
            "job_id": str(job_id),
            "restart_count": int(restart_count),
            "launcher": launcher,
            "backend": backend,
            "device": device,
            "world_size": world_size,
            "hostnames": list(hostnames),
            "pid": os.getpid(),
            # CPU threads per rank: the order of a CPU reduction's partial sums, so the last bits of a CPU
            # loss curve (reproduce gives the job the same count)
            "cpu_threads": cpu_threads,
        },
        "code": code,
        "config": {
            "submit": submitted,
            "entry": entry,
            "entry_args": list(entry_args),
            "world_size": world_size,
            "gpus_per_node": gpus_per_node,
            "train": None,
            "seed": None,
        },
        "data": None,
        "runtime": capture_runtime(node=True, hostnames=hostnames),
        "ownership": submit.get("ownership") or ownership_record(),
    }
    manifest["capture_s"] = round(time.perf_counter() - started, 4)
    manifest["timings"] = {"code_s": round(code_s, 4), "runtime_s": round(manifest["capture_s"] - code_s, 4)}
    path = paths.identity_attempt(str(job_id), int(restart_count))
    _write(paths, path, manifest)
    return manifest


def _load_attempt(paths: RunDir, job_id: str, restart_count: int) -> tp.Tuple[Path, tp.Dict[str, tp.Any]]:
    path = paths.identity_attempt(str(job_id), int(restart_count))
    problems: tp.List[str] = []
    rec = read_json(path, problems)
    if rec is None or rec.get("schema") != SCHEMA:  # capture_start did not run (or failed): start a record here
        rec = {
            "schema": SCHEMA,
            "kind": "attempt",
            "identity_format": IDENTITY_FORMAT,
            "captured_at": time.time(),
            "attempt": {"job_id": str(job_id), "restart_count": int(restart_count)},
            "code": None,
            "config": None,
            "data": None,
            "runtime": None,
            "ownership": None,
            "note": "no start capture for this attempt" + (f" ({problems[0]})" if problems else ""),
        }
    return path, rec


# ----------------------------------------------------------------------------------------------- data, config
def _match(
    old: tp.Sequence[tp.Any], new: tp.Sequence[tp.Any]
) -> tp.Tuple[tp.List[tp.Tuple[tp.Any, tp.Any]], tp.List[str], tp.List[str]]:
    """Pairs of (old, new) fingerprints of the same file: by file name when names are unique, else by position."""

    def name(f: tp.Any) -> str:
        return str((f.get("cheap") or {}).get("name"))

    a, b = [name(f) for f in old], [name(f) for f in new]
    if len(set(a)) == len(a) and len(set(b)) == len(b):
        by_a, by_b = dict(zip(a, old)), dict(zip(b, new))
        pairs = [(by_a[n], by_b[n]) for n in b if n in by_a]
        return pairs, [n for n in b if n not in by_a], [n for n in a if n not in by_b]
    pairs = list(zip(old, new))
    return pairs, b[len(a) :], a[len(b) :]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _add_staged(prints: tp.List[tp.Dict[str, tp.Any]]) -> None:
    """Where this node's loader reads a file from instead (``submit --stage``): the fingerprint stays the original's
    (the stage step verified the copy against it), so the identity is the same data; ``staged`` is not essential."""
    from hpctrain.data.stage import staged_map

    staged = staged_map()
    for p in prints:
        entry = staged.get(os.path.realpath(p["cheap"]["path"]))
        if entry is not None:
            p["staged"] = {"to": entry["local"], "reused": entry["reused"], "sha256": entry["sha256"]}


def record_data(
    run_dir: tp.Union[str, Path],
    job_id: str,
    restart_count: int,
    files: tp.Sequence[tp.Union[str, "os.PathLike[str]"]],
    *,
    accept_change: bool = False,
    accept_hint: str = "accept_change=True",
    k: tp.Optional[int] = None,
) -> RunIdentity:
    """Fingerprint ``files`` (cheap tier; content tier from ``RunDir.data_cache`` when the cheap tier is
    unchanged) into this attempt's record, and compare with the newest earlier attempt that recorded data.

    A change (file added/removed, size, HDF5 structure, sampled content) raises one UsageError line naming the
    file, what changed, and ``accept_hint`` (how the caller's user accepts it); nothing is recorded as this
    attempt's data then, so the next attempt compares with the same data again. With ``accept_change`` the
    change is recorded under ``data.accepted_change`` (from which attempt, what, when, by whom)."""
    from hpctrain.data import fingerprint as fp

    started = time.perf_counter()
    paths = RunDir(run_dir)
    path, manifest = _load_attempt(paths, job_id, restart_count)
    prints = fp.fingerprint_files(
        [os.fspath(f) for f in files], cache_path=str(paths.data_cache), k=k if k is not None else fp.SAMPLE_K
    )
    _add_staged(prints)
    if len(prints) > STRUCTURE_FILES_LIMIT:  # keep the record far below the run directory's read bound
        for p in prints:
            p["cheap"]["structure"] = None
            p["cheap"]["structure_omitted"] = True
    data: tp.Dict[str, tp.Any] = {
        "files": prints,
        "content_cached": all(p["cached"] for p in prints),
        "bytes_read": sum(0 if p["cached"] else (p["content"] or {}).get("bytes_read", 0) for p in prints),
    }
    base = next((r for r in _earlier(paths, path, manifest) if isinstance(r.get("data"), dict)), None)
    if base is not None:
        pairs, added, removed = _match(base["data"].get("files") or [], prints)
        changes: tp.List[tp.Tuple[str, tp.List[str]]] = []
        notes: tp.List[str] = []
        if added or removed:
            what = "; ".join(
                filter(
                    None,
                    [f"added {', '.join(added)}" if added else "", f"removed {', '.join(removed)}" if removed else ""],
                )
            )
            changes.append((", ".join(added + removed), [f"input files {what}"]))
        for old, new in pairs:
            found, note = fp.compare(old, new)
            if found:
                changes.append((new["cheap"]["path"], found))
            notes += [f"{new['cheap']['name']}: {n}" for n in note]
        data["compared_with"] = {"attempt": _label(base), "notes": notes}
        if changes:
            label = _label(base)
            if not accept_change:
                manifest["data_refused"] = {"at": time.time(), "compared_with": label, "changes": changes}
                manifest["data"] = None
                _write(paths, path, manifest)
                file, what = changes[0]
                more = f" (+{len(changes) - 1} more file(s) changed)" if len(changes) > 1 else ""
                raise UsageError(
                    _one_line(
                        f"{file}: the input data changed since attempt {label} ({'; '.join(what[:3])}"
                        f"{f'; {len(what) - 3} more' if len(what) > 3 else ''}){more}; "
                        f"{accept_hint} trains on it anyway (the acceptance is recorded)"
                    )
                )
            data["accepted_change"] = {"from_attempt": label, "changes": changes, "at": time.time(), "by": user_name()}
    data["seconds"] = round(time.perf_counter() - started, 4)
    manifest["data"] = data
    manifest.pop("data_refused", None)
    return _write(paths, path, manifest)


def record_config(
    run_dir: tp.Union[str, Path],
    job_id: str,
    restart_count: int,
    *,
    train: tp.Optional[tp.Mapping[str, tp.Any]] = None,
    seed: tp.Optional[int] = None,
) -> RunIdentity:
    """Add the training config the Trainer runs with (a mapping, e.g. ``dataclasses.asdict(TrainConfig)``;
    values JSON cannot hold become strings) and the seed to this attempt's record; returns the identity."""
    paths = RunDir(run_dir)
    path, manifest = _load_attempt(paths, job_id, restart_count)
    config = dict(manifest.get("config") or {})
    config["train"] = None if train is None else json.loads(dumps_record(train))
    config["seed"] = seed
    manifest["config"] = config
    return _write(paths, path, manifest)


def current_identity(run_dir: tp.Union[str, Path], job_id: str, restart_count: int) -> tp.Optional[RunIdentity]:
    """This attempt's identity as last written (None: no record)."""
    path = RunDir(run_dir).identity_attempt(str(job_id), int(restart_count))
    rec = read_json(path, [])
    if rec is None or rec.get("schema") != SCHEMA or not rec.get("identity"):
        return None
    return _run_identity(path, rec)


def attempt_history(run_dir: tp.Union[str, Path]) -> tp.List[tp.Dict[str, tp.Any]]:
    """One entry per attempt, oldest first: ``{attempt, identity, changed, details, data_change_accepted,
    captured_at}`` (what ``status`` shows: a restart whose identity changed is marked, not silently mixed)."""
    out = []
    for path, rec in _attempts(RunDir(run_dir)):
        ident = _run_identity(path, rec)
        out.append(
            {
                "attempt": _label(rec),
                "identity": ident.identity,
                "changed": list(ident.changed),
                "details": list(ident.details),
                "data_change_accepted": ident.data_change_accepted,
                "captured_at": rec.get("captured_at"),
            }
        )
    return out
