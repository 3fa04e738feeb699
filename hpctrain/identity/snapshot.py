"""The code snapshot: :func:`write_snapshot` writes a run's captured code as a tar.gz, :func:`restore_snapshot`
rebuilds and checks the working tree from it.

Stdlib only, like :mod:`hpctrain.identity.code`, whose capture (:func:`hpctrain.identity.code.capture_code`,
with its private keys) this writes and whose :func:`capture_repository` and :func:`capture_files` check what is
read back.

:func:`write_snapshot` turns either kind of capture into a tar.gz that can rebuild the tree without git and
without the repository: ``git archive HEAD``, the binary diff, the changed files as they are in the working
tree, the untracked files up to :data:`hpctrain.identity.code.UNTRACKED_CONTENT_LIMIT` bytes each (the limit
is recorded), or the hashed package files. :func:`restore_snapshot` unpacks it member by member (nothing
outside the tree, no ``.git``), re-creates the archived commit, lays the changes over it and compares every
hash with the record. Nothing in a snapshot is executed.

Nothing that looks like a credential is stored (:mod:`hpctrain.identity.redact`): the capture marks the changed
and untracked files it withholds, and :func:`write_snapshot` leaves out of ``git archive``'s stream every
committed file whose name or first bytes the same rule matches; the names and hashes are recorded
(``MANIFEST.json`` ``withheld_from_tree``, and ``withheld`` in what it returns), one warning line says which,
and the reader restores the rest and notes each withheld file. File names are bytes: the tar members carry
them exactly (pax ``hdrcharset=BINARY`` where they are not UTF-8), the records through ``path_hex``.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import fsync_dir
from hpctrain._files import shorten
from hpctrain.errors import UsageError
from hpctrain.identity.code import (
    _BLOCK,
    Git,
    _hash_file,
    _public,
    capture_files,
    capture_repository,
    files_digest,
    json_safe,
    name_fields,
    name_of,
    shown_name,
)
from hpctrain.identity.redact import HEAD_BYTES, SecretRule, active_rule

__all__ = ["write_snapshot", "restore_snapshot"]


# ----------------------------------------------------------------------------------------------- snapshot
def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _copy_git_archive(
    out: tp.BinaryIO, git: Git, root: str, commit: str, prefix: str, scratch: Path, rule: SecretRule
) -> tp.List[tp.Dict[str, tp.Any]]:
    """Append ``git archive --prefix=<prefix> <commit>`` to the uncompressed tar stream ``out``, without its
    end-of-archive blocks (the snapshot's own members and end follow), and without the committed files ``rule``
    withholds (by name, or by their first bytes); returns those (name, sha256, size, why). The archive is
    spooled to ``scratch`` and only its headers and each file's first bytes are parsed: git writes the bytes,
    zlib compresses them, and Python copies them by byte range."""
    with open(scratch, "wb") as spool:
        proc = git.stream(root, "archive", "--format=tar", f"--prefix={prefix}", commit)
        try:
            shutil.copyfileobj(proc.stdout, spool, _BLOCK)
        finally:
            proc.stdout.close()
            err = proc.stderr.read().decode("utf-8", "replace")
            proc.stderr.close()
            rc = proc.wait()
            proc._hpctrain_timer.cancel()
    if rc != 0:
        raise OSError(f"git archive {commit[:12]} in {root} failed: {shorten(err, 200) or f'exit {rc}'}")
    with tarfile.open(scratch, "r:") as tar:
        members = list(tar)  # headers only: TarFile.offset ends up just past the last member's data
        end = tar.offset
    withheld: tp.List[tp.Dict[str, tp.Any]] = []
    skip: tp.List[tp.Tuple[int, int]] = []  # byte ranges of withheld members (their headers, pax ones too, and data)
    with open(scratch, "rb") as spool:
        for i, member in enumerate(members):
            if not member.isreg() or not member.name.startswith(prefix):
                continue
            rel = member.name[len(prefix) :]
            why = rule.name(rel)
            if why is None:
                spool.seek(member.offset_data)
                why = rule.content(spool.read(min(member.size, HEAD_BYTES)))
            if why is None:
                continue
            spool.seek(member.offset_data)
            h, left = hashlib.sha256(), member.size
            while left:
                piece = spool.read(min(_BLOCK, left))
                if not piece:
                    break
                h.update(piece)
                left -= len(piece)
            withheld.append({**name_fields(rel), "sha256": h.hexdigest(), "size": member.size, "withheld": why})
            skip.append((member.offset, members[i + 1].offset if i + 1 < len(members) else end))
        spool.seek(0)
        position = 0
        for start, stop in [*skip, (end, end)]:
            _copy_range(spool, out, start - position, f"git archive {commit[:12]} in {root} ended early")
            spool.seek(stop)
            position = stop
    return withheld


def _copy_range(src: tp.BinaryIO, out: tp.BinaryIO, count: int, early: str) -> None:
    remaining = count
    while remaining > 0:
        block = src.read(min(_BLOCK, remaining))
        if not block:
            raise OSError(early)
        out.write(block)
        remaining -= len(block)


def _add_repository(
    tar: tarfile.TarFile, name: str, repo: tp.Mapping[str, tp.Any], from_tree: tp.Sequence[tp.Mapping[str, tp.Any]]
) -> None:
    manifest = json_safe(_public(dict(repo)))
    if from_tree:
        manifest["withheld_from_tree"] = list(from_tree)
    if repo.get("kind") == "git":
        manifest["diff"] = {k: v for k, v in manifest.get("diff", {}).items() if k not in ("text", "base64")}
        _add_bytes(tar, f"{name}/diff.patch", repo.get("_diff", b""))
        for rel, content in sorted(repo.get("_modified", {}).items()):
            _add_bytes(tar, f"{name}/worktree/{rel}", content)
        for rel, content in sorted(repo.get("_untracked", {}).items()):
            _add_bytes(tar, f"{name}/untracked/{rel}", content)
    elif repo.get("kind") == "files":
        root = Path(name_of(repo, "root"))
        base = root.parent if root.is_file() else root
        for f in repo.get("files", []):
            if f.get("sha256") and "symlink" not in f and not f.get("withheld"):
                rel = name_of(f)
                tar.add(str(base / rel), arcname=f"{name}/files/{rel}", recursive=False)
    _add_bytes(tar, f"{name}/MANIFEST.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


_README = b"""hpctrain code snapshot (hpctrain.identity.snapshot.write_snapshot)

For each repository (entry/, and hpctrain/ when hpctrain is not in the entry's repository):
  git:    tree/       git archive of the recorded commit (MANIFEST.json: commit, branch, remotes)
          diff.patch  git diff HEAD --binary at capture time (git apply --binary diff.patch in tree/)
          worktree/   the changed tracked files as they were (status M/A/T in MANIFEST.json "modified";
                      status D: delete that path) - copying them over tree/ gives the same result
          untracked/  untracked files up to untracked_content_limit_bytes each (all are listed, hashed)
  files:  files/      the package files that were hashed (MANIFEST.json "files", "sha256")
Files that look like credentials are never stored: MANIFEST.json lists them with their sha256 and
"withheld" (changed and untracked ones in "modified"/"untracked", committed ones in "withheld_from_tree").
A name that is not UTF-8 is "path" with \\xNN escapes and "path_hex" (its bytes, in hex) in MANIFEST.json.
"""


def write_snapshot(
    path: tp.Union[str, Path],
    code: tp.Mapping[str, tp.Any],
    *,
    git: tp.Optional[Git] = None,
    warn: tp.Optional[tp.Callable[[str], None]] = None,
) -> tp.Dict[str, tp.Any]:
    """Write the code snapshot tar.gz to ``path`` durably (tmp, fsync, rename, fsync the directory); returns
    ``{sha256, bytes, seconds}`` for the manifest, and ``withheld`` (``[{repository, path, sha256, size,
    withheld, where}]``) when files that look like credentials were left out: then ``warn`` (default: standard
    error) gets one line naming them. Needs the private keys of
    :func:`hpctrain.identity.code.capture_code`'s result."""
    git = git or Git()
    started = time.perf_counter()
    path = Path(path)
    token = f"{os.getpid()}-{os.urandom(8).hex()}"
    tmp = path.with_name(f".{path.name}.tmp-{token}")
    scratch = path.with_name(f".{path.name}.archive-{token}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    repos = code.get("repositories", {})
    from_tree: tp.Dict[str, tp.List[tp.Dict[str, tp.Any]]] = {}
    try:
        with os.fdopen(fd, "wb") as raw:
            h = _HashingWriter(raw)
            with gzip.GzipFile(fileobj=h, mode="wb", compresslevel=1, mtime=0) as gz:
                for name, repo in repos.items():
                    if repo.get("kind") == "git" and repo.get("commit"):
                        rule = active_rule(repo.get("secret_patterns"))
                        root = name_of(repo, "root")
                        from_tree[name] = _copy_git_archive(
                            gz, git, root, repo["commit"], f"{name}/tree/", scratch, rule
                        )
                with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    _add_bytes(tar, "README", _README)
                    for name, repo in repos.items():
                        if repo.get("kind") in ("git", "files"):
                            _add_repository(tar, name, repo, from_tree.get(name, ()))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        scratch.unlink(missing_ok=True)
    out: tp.Dict[str, tp.Any] = {
        "sha256": h.sha256.hexdigest(),
        "bytes": h.size,
        "seconds": round(time.perf_counter() - started, 4),
    }
    withheld = _withheld(repos, from_tree)
    if withheld:
        out["withheld"] = withheld
        (warn or _warn)(withheld_warning(withheld))
    return out


def _withheld(
    repos: tp.Mapping[str, tp.Mapping[str, tp.Any]], from_tree: tp.Mapping[str, tp.Sequence[tp.Mapping[str, tp.Any]]]
) -> tp.List[tp.Dict[str, tp.Any]]:
    """Every file a snapshot left out as a credential: ``{repository, path(, path_hex), sha256, size, withheld,
    where}`` (where: ``modified``, ``untracked``, ``files`` or ``commit``)."""
    out: tp.List[tp.Dict[str, tp.Any]] = []
    for name, repo in repos.items():
        lists = [(where, repo.get(where) or []) for where in ("modified", "untracked", "files")]
        for where, entries in [*lists, ("commit", from_tree.get(name) or [])]:
            for e in entries:
                if isinstance(e, dict) and e.get("withheld"):
                    keep = ("path", "path_hex", "sha256", "size", "withheld")
                    out.append({"repository": name, **{k: e[k] for k in keep if k in e}, "where": where})
    return json_safe(out)


def withheld_warning(withheld: tp.Sequence[tp.Mapping[str, tp.Any]], show: int = 10) -> str:
    """The one line that names the files a snapshot did not store."""
    names: tp.List[str] = []
    for w in withheld:
        shown = shown_name(str(w.get("path")))
        shown = shown if w.get("repository") == "entry" else f"{w.get('repository')}:{shown}"
        if shown not in names:
            names.append(shown)
    more = f" (+{len(names) - show} more)" if len(names) > show else ""
    files = "1 file that looks" if len(names) == 1 else f"{len(names)} files that look"
    return (
        f"hpctrain: {files} like credentials were not stored in the code snapshot (names and hashes recorded): "
        f"{', '.join(names[:show])}{more}"
    )


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``raw``."""

    def __init__(self, raw: tp.BinaryIO) -> None:
        self.raw, self.sha256, self.size = raw, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: tp.Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.size += len(view)
        self.raw.write(view)
        return len(view)


# ----------------------------------------------------------------------------------------------- reading it back
RESTORE_LIMIT = 16 << 30
"""Bytes a snapshot may unpack to at most (a damaged or forged tar must not fill the disk)."""
_WITHHELD = "withheld from the snapshot as a credential"
_REBUILT_BY = "hpctrain reproduce"
_REBUILT_EMAIL = "reproduce@hpctrain.invalid"
_REBUILT_DATE = "946684800 +0000"  # 2000-01-01: the re-created commit's id depends on the tree alone


def _snapshot_rel(name: str) -> tp.Optional[tp.Tuple[str, ...]]:
    """The parts of a relative name, or None when it could leave its tree or reach into a ``.git`` directory."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts or any(p == ".." or p.lower() == ".git" for p in parts):
        return None
    return parts


def _inside(root: Path, path: Path) -> bool:
    """``path`` resolves inside ``root``: no symbolic link on the way leads out of the tree."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top + os.sep)


def _place(
    root: Path,
    rel: str,
    *,
    source: tp.Optional[Path] = None,
    link: tp.Optional[str] = None,
    executable: tp.Any = False,
) -> tp.Optional[str]:
    """Write one file of a rebuilt tree (a copy of ``source``, or a symbolic link to ``link``), replacing what is
    there, never through a link that leads out of ``root``; None, or why it was not written."""
    parts = _snapshot_rel(rel)
    if parts is None:
        return f"{shorten(rel, 120)!r}: a path outside the tree; not restored"
    target = root.joinpath(*parts)
    if not _inside(root, target.parent):
        return f"{rel}: its directory leads outside the tree through a symbolic link; not restored"
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()
    if link is not None:
        os.symlink(link, target)
        return None
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with open(source, "rb") as src, os.fdopen(os.open(target, flags, 0o755 if executable else 0o644), "wb") as dst:
        shutil.copyfileobj(src, dst, _BLOCK)
    return None


def _unpack(snapshot: Path, staging: Path) -> tp.Tuple[tp.Dict[str, tp.Optional[str]], tp.List[str]]:
    """Unpack the snapshot into ``staging`` member by member through tarfile's ``data`` filter (no absolute
    paths, nothing outside, no devices, links only inside); ``({repository: the commit its git archive names},
    notes)``. A member the filter refuses (a link out of the tree) is left out and named."""
    commits: tp.Dict[str, tp.Optional[str]] = {}
    notes: tp.List[str] = []
    total = 0
    with tarfile.open(snapshot, "r:gz") as tar:
        for member in tar:
            parts = _snapshot_rel(member.name)
            if parts is None:
                top = member.name.lstrip("/").split("/", 1)[0]
                notes.append(
                    f"{top}: snapshot member {shorten(member.name, 120)!r}: outside the tree or in .git; skipped"
                )
                continue
            if len(parts) >= 2 and parts[1] == "tree" and parts[0] not in commits:
                commits[parts[0]] = tar.pax_headers.get("comment")  # git archive's global header names the commit
            total += max(0, member.size)
            if total > RESTORE_LIMIT:
                raise UsageError(f"{snapshot}: unpacks to more than {RESTORE_LIMIT} bytes; not a code snapshot")
            try:
                tar.extract(member, staging, filter="data")
            except tarfile.FilterError as exc:
                notes.append(f"{parts[0]}: {shown_name('/'.join(parts[2:]) or member.name)}: not restored ({exc})")
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise
                notes.append(
                    f"{parts[0]}: {shorten(shown_name('/'.join(parts[2:])), 120)}: not restored (name too long)"
                )
    return commits, notes


def _recreate_commit(git: Git, tree: Path, commit: tp.Optional[str]) -> tp.Tuple[tp.Optional[str], str]:
    """Make ``tree`` (the archived commit's files) a git repository whose HEAD holds exactly them: one new
    commit standing in for ``commit``, with a fixed author and date (its id depends on the tree alone), no
    hooks, no templates, no signing. ``(the new commit, why not)``."""
    env = dict(
        git.env(),
        GIT_AUTHOR_NAME=_REBUILT_BY,
        GIT_AUTHOR_EMAIL=_REBUILT_EMAIL,
        GIT_AUTHOR_DATE=_REBUILT_DATE,
        GIT_COMMITTER_NAME=_REBUILT_BY,
        GIT_COMMITTER_EMAIL=_REBUILT_EMAIL,
        GIT_COMMITTER_DATE=_REBUILT_DATE,
    )
    safe = ["-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "core.fsmonitor=false"]
    message = f"hpctrain reproduce: the tree of commit {commit or '(none recorded)'}"
    out = b""
    for args in (
        ["init", "-q", "--template=", "-b", "main"],
        [*safe, "add", "-A", "-f", "."],
        [*safe, "commit", "-q", "--no-verify", "--allow-empty", "-m", message],
        ["rev-parse", "HEAD"],
    ):
        git.calls += 1
        try:
            proc = subprocess.run(
                git._argv(tree, args), stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=git.timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"git {args[-1]}: {exc}"
        if proc.returncode != 0:
            verb = next(a for a in args if a in ("init", "add", "commit", "rev-parse"))
            return None, f"git {verb}: {shorten(proc.stderr.decode('utf-8', 'replace').strip(), 200)}"
        out = proc.stdout
    return out.decode().strip(), ""


def _snapshot_manifest(path: Path) -> tp.Dict[str, tp.Any]:
    from hpctrain._files import NotReadable, read_bounded

    try:
        value = json.loads(read_bounded(path, limit=64 << 20)[0])
    except (FileNotFoundError, NotReadable, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def restore_snapshot(
    snapshot: tp.Union[str, Path],
    dest: tp.Union[str, Path],
    *,
    recorded: tp.Optional[tp.Mapping[str, tp.Mapping[str, tp.Any]]] = None,
    git: tp.Optional[Git] = None,
    init_git: bool = True,
) -> tp.Dict[str, tp.Dict[str, tp.Any]]:
    """Rebuild every repository of a code snapshot (:func:`write_snapshot`'s tar.gz) as ``dest/<name>/``, the
    working tree as it was captured, and check it against the code section's hashes. Nothing is executed.

    ``recorded``: the identity manifest's ``code.repositories`` to check against (default: the snapshot's own
    ``MANIFEST.json``). A git capture: the archived commit is unpacked and (``init_git``, git available) made a
    git repository with one re-created commit of it, so that ``git diff HEAD`` in the rebuilt tree shows the
    uncommitted changes the run had; the changed files are laid over it, the deleted ones removed, the stored
    untracked files added; every changed and untracked file's sha256 is compared with the recorded one, and the
    tree is captured again (:func:`capture_repository`) to compare the diff's sha256. A ``files`` capture: the
    package files go under the package's name (``dest/<name>/<package>/``) and their combined sha256
    (:func:`capture_files`) is compared.

    Returns ``{name: {"kind", "tree", "commit", "archive_commit", "rebuilt_commit", "checked", "problems",
    "notes", ...}}``. ``problems``: the tree is not the recorded one (a hash that differs, a file the record says
    the snapshot holds and it does not). ``notes``: what could not be restored or checked (untracked files over
    the size limit were never stored; a diff whose text a git setting changed)."""
    import zlib

    git = git or Git()
    snapshot, dest = Path(snapshot), Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest}: not empty; the code is rebuilt into a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    staging = dest / f".unpack-{os.getpid()}-{os.urandom(4).hex()}"
    staging.mkdir()
    try:
        try:
            commits, unpack_notes = _unpack(snapshot, staging)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise UsageError(f"{snapshot}: not a readable code snapshot ({shorten(exc, 160)})") from None
        out: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
        for src in sorted(p for p in staging.iterdir() if p.is_dir() and not p.is_symlink()):
            own = _snapshot_manifest(src / "MANIFEST.json")
            repo = dict((recorded or {}).get(src.name) or own)
            if repo.get("kind") == "files":
                result = _restore_files(src.name, repo, src, dest / src.name)
            else:
                result = _restore_git(src.name, repo, own, src, dest / src.name, git, init_git, commits.get(src.name))
            result["notes"] = [n for n in unpack_notes if n.startswith(f"{src.name}:")] + result["notes"]
            out[src.name] = result
        for name, repo in (recorded or {}).items():
            if name not in out and repo.get("kind") in ("git", "files"):
                problem = f"{name}: recorded, but the snapshot holds no {name}/"
                out[name] = {"kind": repo.get("kind"), "tree": None, "checked": 0, "notes": [], "problems": [problem]}
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _restore_files(name: str, repo: tp.Mapping[str, tp.Any], src: Path, tree: Path) -> tp.Dict[str, tp.Any]:
    root = name_of(repo, "root") if repo.get("root") else ""
    base = os.path.basename(root.rstrip("/")) or "package"
    listed = [f for f in repo.get("files") or [] if isinstance(f, dict)]
    single = root.endswith(".py") and [name_of(f) for f in listed] == [base]
    tree.mkdir(parents=True, exist_ok=True)
    files = tree if single else tree / base
    if (src / "files").is_dir():
        if single:
            for item in (src / "files").iterdir():
                os.replace(item, tree / item.name)
        else:
            os.replace(src / "files", files)
    files.mkdir(parents=True, exist_ok=True)
    problems: tp.List[str] = []
    notes: tp.List[str] = []
    for f in listed:  # symbolic links are recorded (their target), not stored
        if "symlink" in f:
            why = _place(files, name_of(f), link=name_of(f, "symlink"))
            if why:
                problems.append(f"{name}: {why}")
        elif f.get("withheld"):
            notes.append(f"{name}: {shown_name(str(f.get('path')))}: {_WITHHELD} ({f['withheld']}): not restored")
        elif not f.get("sha256"):
            notes.append(
                f"{name}: {shown_name(str(f.get('path')))}: not stored "
                f"({f.get('not_hashed') or f.get('error') or 'no hash'})"
            )
    again = capture_files(tree / base if single else files)
    want = repo.get("sha256")
    if any(f.get("withheld") for f in listed) and len(listed) == repo.get("file_count"):
        # the package without the withheld files: the recorded walk's digest, recomputed from its record
        want = files_digest((name_of(f), f.get("sha256") or f.get("size")) for f in listed if not f.get("withheld"))
    if again["sha256"] != want:
        problems.append(
            f"{name}: the rebuilt package files hash to {again['sha256'][:16]}..., the record says "
            f"{str(want)[:16]}... ({again['file_count']} files rebuilt, {len(listed)} recorded)"
        )
    return {
        "kind": "files",
        "tree": str(tree),
        "package_root": str(tree / base),
        "files_sha256": again["sha256"],
        "checked": again["file_count"],
        "problems": problems,
        "notes": notes,
    }


def _restore_git(
    name: str,
    repo: tp.Mapping[str, tp.Any],
    own: tp.Mapping[str, tp.Any],
    src: Path,
    tree: Path,
    git: Git,
    init_git: bool,
    archive_commit: tp.Optional[str],
) -> tp.Dict[str, tp.Any]:
    problems: tp.List[str] = []
    notes: tp.List[str] = []
    commit = repo.get("commit")
    if repo.get("kind") != "git":
        problems.append(f"{name}: recorded as {repo.get('kind')!r}, but the snapshot holds {name}/")
    if own and own.get("commit") != commit:
        problems.append(f"{name}: the snapshot's manifest names commit {own.get('commit')}, the record {commit}")
    if commit and archive_commit and archive_commit != commit:
        problems.append(f"{name}: the archived tree is of commit {archive_commit}, the record names {commit}")
    if (src / "tree").is_dir():
        os.replace(src / "tree", tree)
    else:
        if commit:
            problems.append(f"{name}: the snapshot holds no tree of commit {commit}")
        tree.mkdir(parents=True, exist_ok=True)
    rebuilt = None
    if init_git:
        rebuilt, why = _recreate_commit(git, tree, commit)
        if rebuilt is None:
            notes.append(f"{name}: not made a git repository ({why}); the files are rebuilt all the same")
    checked = 0
    for w in own.get("withheld_from_tree") or []:
        if isinstance(w, dict):
            notes.append(
                f"{name}: {shown_name(str(w.get('path')))}: committed, {_WITHHELD} ({w.get('withheld')}): not restored"
            )
    for m in repo.get("modified") or []:
        rel = name_of(m)
        if _snapshot_rel(rel) is None:
            problems.append(f"{name}: {shorten(shown_name(rel), 120)!r}: a path outside the tree; not restored")
            continue
        if m.get("withheld") and m.get("status") != "D":
            notes.append(
                f"{name}: {shown_name(rel)}: changed, {_WITHHELD} ({m['withheld']}): not restored "
                "(the committed version, unless withheld too, is in the tree)"
            )
            continue
        if m.get("status") == "D":
            target = tree.joinpath(*(_snapshot_rel(rel) or ()))
            if _inside(tree, target.parent) and os.path.lexists(target):
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            if os.path.lexists(target):
                problems.append(f"{name}: {shown_name(rel)}: deleted in the run's tree, still here")
            checked += 1
            continue
        stored = src / "worktree" / rel
        if "symlink" in m:
            why = _place(tree, rel, link=name_of(m, "symlink"))
        elif stored.is_file() and not stored.is_symlink():
            why = _place(tree, rel, source=stored, executable=m.get("executable"))
        elif "error" in m or not m.get("sha256"):
            notes.append(
                f"{name}: {shown_name(rel)}: changed, never stored ({m.get('error') or m.get('not_hashed')}); "
                "the committed version is in the tree"
            )
            continue
        else:
            why = f"{shown_name(rel)}: changed ({m.get('status')}), but the snapshot does not hold it"
        if why:
            problems.append(f"{name}: {why}")
            continue
        checked += _check_hash(name, tree, rel, m, problems, notes)
    for u in repo.get("untracked") or []:
        rel = name_of(u)
        if _snapshot_rel(rel) is None:
            problems.append(f"{name}: {shorten(shown_name(rel), 120)!r}: a path outside the tree; not restored")
            continue
        stored = src / "untracked" / rel
        if "symlink" in u:
            why = _place(tree, rel, link=name_of(u, "symlink"))
        elif u.get("withheld"):
            notes.append(f"{name}: untracked {shown_name(rel)}: {_WITHHELD} ({u['withheld']}): not restored")
            continue
        elif u.get("stored") and stored.is_file() and not stored.is_symlink():
            why = _place(tree, rel, source=stored, executable=u.get("executable"))
        elif u.get("stored"):
            why = f"{shown_name(rel)}: untracked and recorded as stored, but the snapshot does not hold it"
        else:
            notes.append(
                f"{name}: untracked {shown_name(rel)} ({u.get('size')} bytes) was over the snapshot's limit of "
                f"{repo.get('untracked_content_limit_bytes')} bytes: not restored"
            )
            continue
        if why:
            problems.append(f"{name}: {why}")
            continue
        checked += _check_hash(name, tree, rel, u, problems, notes)
    extra = int(repo.get("untracked_count") or 0) - len(repo.get("untracked") or [])
    if extra > 0:
        notes.append(f"{name}: {extra} more untracked file(s) were only counted, never stored: not restored")
    result: tp.Dict[str, tp.Any] = {
        "kind": "git",
        "tree": str(tree),
        "commit": commit,
        "archive_commit": archive_commit,
        "rebuilt_commit": rebuilt,
        "checked": checked,
    }
    if rebuilt is not None:  # the rebuilt tree captured the way a submission captures code
        got = (capture_repository(tree, git=git).get("diff") or {}).get("sha256")
        recorded_diff = repo.get("diff") or {}
        want = recorded_diff.get("stored_sha256") or recorded_diff.get("sha256")  # the diff the snapshot holds
        result.update(diff_sha256=got, diff_matches=got == want)
        if got != want:
            notes.append(
                f"{name}: git diff HEAD of the rebuilt tree hashes to {str(got)[:16]}..., the recorded diff to "
                f"{str(want)[:16]}... (the file hashes are the authority: a git setting can change a diff's text)"
            )
    result.update(problems=problems, notes=notes)
    return result


def _check_hash(
    name: str, tree: Path, rel: str, rec: tp.Mapping[str, tp.Any], problems: tp.List[str], notes: tp.List[str]
) -> int:
    want = rec.get("sha256")
    if not want:
        notes.append(
            f"{name}: {shown_name(rel)}: no sha256 recorded ({rec.get('not_hashed') or rec.get('error') or 'unknown'})"
        )
        return 0
    got = _hash_file(tree / rel).get("sha256")
    if got != want:
        problems.append(f"{name}: {shown_name(rel)}: sha256 {str(got)[:16]}... is not the recorded {want[:16]}...")
    return 1
