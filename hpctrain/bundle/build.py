"""``python -m hpctrain bundle RUN_DIR -o OUT``: write a run's recoverable training bundle (stdlib only).

Built in a hidden temporary directory beside OUT (``.OUT.tmp-<pid>-<hex>``, same filesystem), every file
fsynced, then renamed to OUT with ``RENAME_NOREPLACE``: a reader never sees half a bundle, and an existing
OUT is never replaced (it is refused before any work, and the final rename refuses a racing one). With
``--tar`` the tree is written into one uncompressed tar (shards do not compress; a plain tar can be read
member by member) the same way. The layout is :class:`hpctrain.bundle.layout.BundleLayout`'s.

The checkpoint is hard-linked when the run and the bundle share a filesystem (committed shards are never
written again, so the link is as good as a copy, and free; ``--copy`` copies instead, for a bundle that must
not share blocks with the run), else copied; either way the bundled copy is checked with the checkpoint's
own ``verify`` (structure and every shard's crc32) and its manifest's sha256 compared with the source's.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
import socket
import tarfile
import time
import typing as tp
from pathlib import Path

from hpctrain import __version__
from hpctrain.approvals import (
    attempt_keys,
    checkpoint_identity,
    choose_checkpoint,
    verify_chain,
)
from hpctrain.bundle import _records as records
from hpctrain.bundle._io import (
    copy_file,
    fsync_tree,
    hash_file,
    link_or_copy,
    regular_files,
    rename_noreplace,
    write_new,
)
from hpctrain.bundle.attempts import summary as attempt_summary
from hpctrain.bundle.crate import build_crate, command_line, crate_gaps, iso, preview_html
from hpctrain.bundle.layout import BUNDLE_SCHEMA, BundleLayout
from hpctrain.errors import CheckpointFormatError, HpctrainError, UsageError
from hpctrain.run import attempts as run_attempts
from hpctrain.run import checkpoint_ownership, is_run_dir, nested, run_self
from hpctrain.rundir import RunDir, read_json, read_jsonl

__all__ = ["build_bundle", "SELF_LINE", "file_list_text", "hpctrain_url"]

SELF_LINE = "# sha256 of the lines above: "
"""The last line of MANIFEST.sha256: so that a change to the list itself names the list."""
METRICS_TAIL = 8 << 20


def hpctrain_url(identity: tp.Optional[tp.Mapping[str, tp.Any]] = None) -> str:
    """An absolute URL for hpctrain (the crate's id for it): the installed distribution's project URL, else the
    web remote of hpctrain's own repository in the identity record, else its PyPI release URL."""
    import importlib.metadata as md

    try:
        meta = md.metadata("hpctrain")
        urls = [u.split(",", 1)[-1].strip() for u in (meta.get_all("Project-URL") or [])]
        for url in [meta.get("Home-page"), *urls]:
            if isinstance(url, str) and url.startswith(("https://", "http://")):
                return url
    except md.PackageNotFoundError:
        pass
    remote = records.hpctrain_code(identity)
    url = records.http_url(remote.get("remote_url"))
    return url or f"https://pypi.org/project/hpctrain/{__version__}/"


def file_list_text(entries: tp.Sequence[tp.Tuple[str, str]]) -> str:
    """``sha256sum`` lines (sorted by path) and the self line over them."""
    import hashlib

    body = "".join(f"{sha}  {rel}\n" for rel, sha in sorted(entries))
    return body + SELF_LINE + hashlib.sha256(body.encode()).hexdigest() + "\n"


def _tmp_beside(out: Path) -> Path:
    return out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}")


def build_bundle(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    out: tp.Union[str, "os.PathLike[str]"],
    *,
    step: tp.Optional[int] = None,
    tar: bool = False,
    copy: bool = False,
    license: tp.Optional[str] = None,
    team_url: tp.Optional[str] = None,
    checkpoint_dir: tp.Optional[tp.Union[str, "os.PathLike[str]"]] = None,
    now: tp.Optional[float] = None,
) -> tp.Dict[str, tp.Any]:
    """Write the bundle of ``run_dir`` at ``out`` and return a summary (what ``--json`` prints).

    ``checkpoint_dir``: where the run's checkpoints are, when not where it recorded them (a moved run); the
    bundled checkpoint must belong to the run either way (:func:`hpctrain.run.choose_checkpoint`)."""
    paths = RunDir(run_dir)
    out = Path(out)
    if not paths.root.is_dir():
        raise UsageError(f"RUN_DIR {paths.root} is not a directory")
    if not is_run_dir(paths):
        raise UsageError(f"RUN_DIR {paths.root} holds nothing a run writes: not a run")
    if os.path.lexists(out):
        raise UsageError(f"-o {out} already exists; a bundle never overwrites: choose a new path")
    _refuse_nested(out, paths.root, "the run directory")
    if team_url is not None and not team_url.startswith(("https://", "http://")):
        raise UsageError(f"--team-url must be an http(s) URL, got {team_url!r}")
    _refuse_damaged_identity(paths)
    chosen = choose_checkpoint(paths, step, checkpoint_dir=checkpoint_dir, what="to bundle")
    _refuse_nested(out, chosen.dir, "the run's checkpoint directory")
    try:
        source_sha = checkpoint_identity(chosen.path)
    except CheckpointFormatError as exc:
        raise HpctrainError(f"checkpoint step {chosen.step}: {exc}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_beside(out)
    tree = tmp if not tar else tmp.with_name(tmp.name + ".d")
    try:
        try:
            summary = _build_tree(paths, BundleLayout(tree), chosen, source_sha, copy, tar, license, team_url, now)
            if tar:
                _write_tar(tree, tmp, out, summary["created"])
                shutil.rmtree(tree)
            else:
                fsync_tree(tree)
        except FileNotFoundError as exc:
            if str(chosen.path) in str(exc.filename):
                raise HpctrainError(
                    f"checkpoint step {chosen.step} disappeared while it was bundled (retention removed it?); "
                    "try again, or choose another --step"
                ) from None
            raise HpctrainError(f"bundling failed: {exc.filename}: {exc.strerror}") from None
        except OSError as exc:  # ENOSPC, EACCES, EDQUOT...: one line, and the temporary is removed
            raise HpctrainError(f"bundling failed: {exc.filename or out}: {exc.strerror or exc}") from None
        try:
            rename_noreplace(tmp, out)
        except FileExistsError:
            raise UsageError(f"-o {out} appeared while the bundle was written; it was left alone") from None
    except BaseException:
        for leftover in (tmp, tree):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            elif os.path.lexists(leftover):
                leftover.unlink()
        raise
    summary["bundle"] = str(out)
    summary["format"] = "tar" if tar else "directory"
    summary["bytes_on_disk"] = out.stat().st_size if tar else summary["bytes"]
    return summary


def _refuse_nested(out: Path, source: Path, what: str) -> None:
    """One UsageError line when the bundle would be written inside ``source`` or hold it (symlinks resolved)."""
    how = nested(out, source)
    if how == "inside":
        raise UsageError(f"-o {out} is inside {what} {source}: write the bundle outside the run it is made of")
    if how == "contains":
        raise UsageError(f"-o {out} contains {what} {source}: write the bundle beside the run, not around it")


def _refuse_damaged_identity(paths: RunDir) -> None:
    """One HpctrainError line when an identity manifest of the run cannot be read (truncated, not JSON): the bundle
    would carry it and never verify."""
    for path in [paths.identity_submit, *(paths.identity_attempt(*k) for k in attempt_keys(paths))]:
        problems: tp.List[str] = []
        read_json(path, problems)
        if problems:
            why = problems[0].split(": ", 1)[-1].removesuffix("; ignored")
            raise HpctrainError(
                f"identity manifest {path} is damaged ({why}): a bundle of it would not verify; restore it, or move "
                "it aside (keep it: it is evidence) to bundle the run without it"
            )


def _newest_identity(
    paths: RunDir, keys: tp.Sequence[tp.Tuple[str, int]]
) -> tp.Tuple[
    tp.Optional[tp.Dict[str, tp.Any]], tp.Optional[str], tp.Dict[tp.Tuple[str, int], tp.Dict[str, tp.Any]], tp.List[str]
]:
    problems: tp.List[str] = []
    by_attempt: tp.Dict[tp.Tuple[str, int], tp.Dict[str, tp.Any]] = {}
    for key in keys:
        rec = read_json(paths.identity_attempt(*key), problems)
        if rec is not None:
            by_attempt[key] = rec
    submit = read_json(paths.identity_submit, problems)
    for key in reversed(keys):
        if key in by_attempt:
            return by_attempt[key], os.path.relpath(paths.identity_attempt(*key), paths.root), by_attempt, problems
    if submit is not None:
        return submit, os.path.relpath(paths.identity_submit, paths.root), by_attempt, problems
    return None, None, by_attempt, problems


def _build_tree(
    paths: RunDir,
    lay: BundleLayout,
    chosen: tp.Any,
    source_sha: str,
    copy: bool,
    tar: bool,
    license: tp.Optional[str],
    team_url: tp.Optional[str],
    now: tp.Optional[float],
) -> tp.Dict[str, tp.Any]:
    created = time.time() if now is None else now
    lay.root.mkdir()
    hashes: tp.Dict[str, str] = {}
    notes: tp.List[str] = []
    parts: tp.Dict[str, str] = {}

    def take(src: Path, dst: Path, part: tp.Optional[str] = None) -> bool:
        if not os.path.lexists(src):
            return False
        sha, _ = copy_file(src, dst)
        hashes[lay.rel(dst)] = sha
        if part:
            parts[part] = lay.rel(dst)
        return True

    def put(dst: Path, text: str, part: tp.Optional[str] = None) -> None:
        sha, _ = write_new(dst, text.encode())
        hashes[lay.rel(dst)] = sha
        if part:
            parts[part] = lay.rel(dst)

    # --- the run's records
    for src, dst, part in (
        (paths.submission, lay.submission, "submission"),
        (paths.sbatch_script, lay.sbatch_script, "sbatch_script"),
        (paths.ledger, lay.ledger, "ledger"),
        (paths.metrics, lay.metrics, "metrics"),
        (paths.approvals, lay.approvals, "approvals"),
        (paths.code_snapshot, lay.code_snapshot, "code_snapshot"),
        (paths.data_cache, lay.data_cache, "data_cache"),
    ):
        if not take(src, dst, part) and part in ("submission", "ledger", "metrics", "code_snapshot"):
            notes.append(f"no {os.path.relpath(src, paths.root)} in the run")
    n = 0
    while os.path.lexists(paths.previous_submission(n)):
        take(paths.previous_submission(n), lay.previous_submission(n))
        n += 1

    # --- identity manifests, environment lock, data fingerprint
    keys = attempt_keys(paths)
    newest, newest_src, by_attempt, problems = _newest_identity(paths, keys)
    notes += problems
    identity_files = []
    if take(paths.identity_submit, lay.identity_submit, "identity_submit"):
        sub = read_json(lay.identity_submit, [])
        identity_files.append(
            {"file": lay.rel(lay.identity_submit), "kind": "submit", "identity": (sub or {}).get("identity")}
        )
    for job, restart in keys:
        dst = lay.identity_attempt(job, restart)
        if take(paths.identity_attempt(job, restart), dst):
            identity_files.append(
                {
                    "file": lay.rel(dst),
                    "kind": "attempt",
                    "job_id": job,
                    "restart_count": restart,
                    "identity": by_attempt.get((job, restart), {}).get("identity"),
                }
            )
    if not identity_files:
        notes.append("no identity manifest in the run (a run from before identity capture)")
    newest_key = next((k for k in reversed(keys) if k in by_attempt), None)
    if newest is not None:  # the manifest the lock and the fingerprint are derived from, inside the bundle
        parts["identity_source"] = lay.rel(lay.identity_attempt(*newest_key) if newest_key else lay.identity_submit)
    run_identity = (newest or {}).get("identity") if isinstance((newest or {}).get("identity"), str) else None
    lock = records.requirements_lock(newest, newest_src or "")
    if lock is not None:
        put(lay.requirements_lock, lock, "environment_lock")
    elif newest is not None:
        notes.append("the identity manifest records no installed distributions: no requirements.lock")
    if newest is not None and isinstance(newest.get("data"), dict):
        fingerprint = {"schema": "hpctrain.bundle.data/1", "source": newest_src, "data": newest["data"]}
        put(lay.data_fingerprint, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n", "data_fingerprint")
    elif newest is not None:
        notes.append("the identity manifest records no input data files (an entry without HDF5 data): no fingerprint")

    # --- the checkpoint
    ck_dir = lay.checkpoint(chosen.path.name)
    link = "hardlink"
    files, other = regular_files(chosen.path)
    if other:
        raise HpctrainError(f"{chosen.path}: holds {other[0].name}, not a regular file; not bundled")
    for f in files:
        how = link_or_copy(f, ck_dir / f.relative_to(chosen.path), copy=copy)
        link = "copy" if how == "copy" else link
    from hpctrain.ckpt import verify as verify_checkpoint

    try:
        manifest = verify_checkpoint(ck_dir)
        bundled_sha = checkpoint_identity(ck_dir)
    except CheckpointFormatError as exc:
        raise HpctrainError(f"the bundled checkpoint of step {chosen.step} does not verify: {exc}") from None
    if bundled_sha != source_sha:
        raise HpctrainError(f"checkpoint step {chosen.step} changed while it was bundled (re-saved?); try again")
    owned = checkpoint_ownership(
        manifest, run_self(paths), chosen.path
    )  # the copy's own manifest: what the bundle holds
    if not owned.belongs:
        raise UsageError(f"{owned.why}; pass --checkpoint-dir DIR to name this run's checkpoints")
    notes += chosen.notes

    # --- attempts, approvals
    # from the bundled copies, so that the record describes exactly what the bundle holds (a live run moves on)
    ledger, _ = read_jsonl(lay.ledger)
    metrics, bad = read_jsonl(lay.metrics)
    if bad and not metrics:
        metrics, _ = read_jsonl(lay.metrics, tail_bytes=METRICS_TAIL)
    attempts = run_attempts(ledger, metrics)
    entries, chain_problems = verify_chain(lay.approvals)
    if chain_problems:
        notes.append(f"the approval log does not verify: {chain_problems[0]}")
    submission = read_json(lay.submission, []) or {}
    owner = records.read_ownership(newest)
    if team_url:
        owner["team_url"] = team_url
    config = submission.get("config") if isinstance(submission.get("config"), dict) else {}
    if isinstance(config.get("account"), str):  # the crate's organisation when no team is recorded
        owner["account"] = config["account"]
    user = _user()
    record: tp.Dict[str, tp.Any] = {
        "schema": BUNDLE_SCHEMA,
        "created": created,
        "created_utc": iso(created),
        "created_by": {"user": user, "host": socket.gethostname()},
        "hpctrain_version": __version__,
        "source_run": str(paths.root.resolve()),
        "run_name": paths.root.resolve().name,
        "user": user,
        "checkpoint": {
            "dir": lay.rel(ck_dir),
            "step": chosen.step,
            "manifest_sha256": bundled_sha,
            "world_size": manifest.get("world_size"),
            "link": "copied into the tar" if tar else link,
            "source": str(chosen.path.resolve()),
            "source_dir": chosen.how,
            "run_identity": chosen.identity,
            "ownership": "checked: its manifest's run identity or job id is this run's"
            if owned.checked
            else "not checked: " + owned.why,
        },
        "run_identity": run_identity,
        "run_identity_source": newest_src,
        "identity_records": identity_files,
        "parts": parts,
        "approvals": {
            "file": parts.get("approvals"),
            "entries": len(entries),
            "head": entries[-1]["entry_hash"] if entries else None,
        },
        "attempts": [attempt_summary(a) for a in attempts],
        "submission": {k: submission.get(k) for k in ("job_id", "cluster", "argv", "world_size") if k in submission},
        "license": license,
        "notes": notes,
    }
    put(lay.record, json.dumps(record, indent=2, sort_keys=True) + "\n")
    put(lay.readme, _readme(record, owner))

    # --- the crate (lists every file; sizes of those it cannot know yet are left out)
    on_disk, _ = regular_files(lay.root)
    for f in on_disk:
        rel = lay.rel(f)
        if rel not in hashes:
            hashes[rel] = hash_file(f)[0]
    sizes = {lay.rel(f): f.stat().st_size for f in on_disk}
    listed = sorted(sizes.items()) + [(lay.PREVIEW, None), (lay.FILE_LIST, None)]
    torch_version = records.version_of(records.section(newest, "runtime").get("torch"))
    crate = build_crate(
        record=record,
        files=listed,
        attempts=attempts,
        identity=newest,
        attempt_identity=by_attempt,
        owner=owner,
        license=license,
        hpctrain_version=__version__,
        hpctrain_url=hpctrain_url(newest),
        torch_version=torch_version,
        container=(read_json(lay.identity_submit, []) or {}).get("container") if lay.identity_submit.exists() else None,
    )
    notes += crate_gaps(crate)
    put(lay.preview, preview_html(crate, record))
    put(lay.metadata, json.dumps(crate, indent=2, ensure_ascii=False) + "\n")
    write_new(lay.file_list, file_list_text(list(hashes.items())).encode())
    return {
        "created": created,
        "files": len(hashes) + 1,
        "bytes": sum(f.stat().st_size for f in regular_files(lay.root)[0]),
        "checkpoint": record["checkpoint"],
        "run_identity": run_identity,
        "attempts": len(attempts),
        "approvals": record["approvals"],
        "notes": notes,
    }


def _user() -> tp.Optional[str]:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def _write_tar(tree: Path, tmp: Path, out: Path, created: float) -> None:
    """One uncompressed tar: a top directory named after OUT, sorted members, no owners, fixed times."""
    top = out.name[:-4] if out.name.endswith(".tar") else out.name
    mtime = int(created)

    def info(name: str, kind: bytes, size: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.size, ti.mtime = kind, size, mtime
        ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    with open(tmp, "xb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            tf.addfile(info(top, tarfile.DIRTYPE))
            for dirpath, dirnames, filenames in os.walk(tree):
                dirnames.sort()
                here = Path(dirpath).relative_to(tree)
                for d in dirnames:
                    tf.addfile(info(f"{top}/{(here / d).as_posix()}", tarfile.DIRTYPE))
                for name in sorted(filenames):
                    with open(Path(dirpath) / name, "rb") as src:
                        size = os.fstat(src.fileno()).st_size
                        tf.addfile(info(f"{top}/{(here / name).as_posix()}", tarfile.REGTYPE, size), src)
        raw.flush()
        os.fsync(raw.fileno())


def _md(text: tp.Any) -> str:
    """Recorded text inside a Markdown code span: backticks and newlines cannot break out of it."""
    value = " ".join(str(text).split()).replace("`", "'")
    return f"`{value}`" if value else "(none)"


def _readme(record: tp.Mapping[str, tp.Any], owner: tp.Mapping[str, tp.Optional[str]]) -> str:
    ck = record["checkpoint"]
    parts = record["parts"]
    command = command_line(record)
    lines = [
        f"# hpctrain bundle of run {_md(record['run_name'])}, checkpoint step {ck['step']}",
        "",
        f"Written {record['created_utc']} by hpctrain {record['hpctrain_version']} from {_md(record['source_run'])}.",
        f"Owner {_md(owner.get('owner') or 'not recorded')}, team {_md(owner.get('team') or 'not recorded')}; "
        f"notes {_md(owner.get('notes') or '')}.",
        f"Run identity {_md(record.get('run_identity') or 'not recorded')}.",
        "",
        "## Verify",
        "",
        "```bash",
        "python -m hpctrain bundle verify .   # every file's sha256, the checkpoint's own verify, approvals, identity",
        "sha256sum -c MANIFEST.sha256         # the files alone, without hpctrain",
        "```",
        "",
        "Open `ro-crate-preview.html` in a browser (offline) for what ran: one entry per Slurm attempt.",
        "",
        "## Reproduce",
        "",
        "1. Unpack the code: `mkdir code-tree && tar -xzf code/snapshot.tar.gz -C code-tree` "
        + ("" if parts.get("code_snapshot") else "(this run recorded no snapshot)"),
        "2. Recreate the environment: `pip install -r environment/requirements.lock` "
        + ("" if parts.get("environment_lock") else "(this run recorded no distributions)"),
        (
            "3. Check your copy of the data against `data/fingerprint.json` (`python -m hpctrain data hash FILE`)."
            if parts.get("data_fingerprint")
            else "3. The run recorded no input data files: nothing to fetch."
        ),
        "4. Submit the same run from the unpacked tree"
        + (f" (it was submitted as {_md(command)})" if command else "")
        + f"; to continue from the bundled checkpoint instead, copy `{ck['dir']}` into a new checkpoint "
        "directory and pass that as `--ckpt-dir` (never train inside the bundle: new checkpoints would land in "
        "it). On the same number of ranks a resumed run continues bit for bit.",
        "",
        "hpctrain's `reproduce` command, where your hpctrain has it (`python -m hpctrain --help`), does these steps.",
        "",
        "## What is inside",
        "",
        "See `bundle.json` (where each part is) and `MANIFEST.sha256` (every file and its sha256).",
        "",
    ]
    return "\n".join(lines)
