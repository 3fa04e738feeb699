"""The code of a run: what git says about the entry's repository (and hpctrain's own), or a hash of the files.

Stdlib only (the login node runs this at every submission; nothing here imports torch or the user's code).

For a git repository, :func:`capture_repository` records the commit, branch, remote URLs with their
credentials stripped, the dirty flag with the dirty files, ``git diff HEAD --binary`` (inline below
:data:`DIFF_INLINE_LIMIT`; its sha256 and size always), every changed tracked file and every untracked file
(``git ls-files --others --exclude-standard``) with its size and sha256. Outside a git repository (or
where git is missing, refuses the directory, or ignores the file), :func:`capture_files` hashes the
entry's package files instead: a sorted walk, names and contents. :func:`write_snapshot` turns either
into a tar.gz that can rebuild the tree without git and without the repository: ``git archive HEAD``,
the binary diff, the changed files as they are in the working tree, the untracked files up to
:data:`UNTRACKED_CONTENT_LIMIT` bytes each (the limit is recorded), or the hashed package files.

git is reached through one seam, :class:`Git`: a subprocess with a timeout, no optional locks (never
competes with the user's own ``git`` for ``index.lock``), no pager, no external diff or textconv drivers.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import threading
import time
import typing as tp
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from hpctrain._atomic import fsync_dir
from hpctrain._files import shorten
from hpctrain.errors import UsageError

__all__ = [
    "Git",
    "GitResult",
    "DIFF_INLINE_LIMIT",
    "UNTRACKED_CONTENT_LIMIT",
    "HASH_LIMIT",
    "MAX_FILES",
    "strip_credentials",
    "entry_location",
    "capture_repository",
    "capture_files",
    "capture_code",
    "code_essentials",
    "dirty_summary",
    "write_snapshot",
    "restore_snapshot",
]

DIFF_INLINE_LIMIT = 2 << 20
"""Bytes of ``git diff HEAD --binary`` kept inline in the manifest; a larger diff is in the snapshot only
(the manifest keeps its sha256 and size). Keeps the manifest far below the run directory's record bound."""
UNTRACKED_CONTENT_LIMIT = 1 << 20
"""Untracked files up to this size are stored in the code snapshot; larger ones are listed and hashed only."""
HASH_LIMIT = 64 << 20
"""Files (untracked, changed, or of a package outside git) larger than this are listed with their size but
not hashed: a 50 GB file someone left in the tree must not make every submission read it."""
MAX_FILES = 20_000
"""At most this many untracked (or package) files are listed; the count of the rest is recorded."""
GIT_TIMEOUT_S = 60.0
_BLOCK = 1 << 20


# ----------------------------------------------------------------------------------------------- the seam
@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def text(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape").strip()


class Git:
    """Runs ``git -C <dir> ...``. A missing executable is an unusable git (``available`` False), never an error;
    a command that outlives ``timeout_s`` is killed and reported as failed (returncode -9)."""

    def __init__(self, executable: str = "git", timeout_s: float = GIT_TIMEOUT_S) -> None:
        self.executable = executable
        self.timeout_s = float(timeout_s)
        self.calls = 0

    def env(self) -> tp.Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
        env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", LC_ALL="C")
        return env

    def _argv(self, cwd: tp.Union[str, Path], args: tp.Sequence[str]) -> tp.List[str]:
        return [self.executable, "-C", str(cwd), "-c", "core.quotepath=off", *args]

    def run(self, cwd: tp.Union[str, Path], *args: str) -> GitResult:
        self.calls += 1
        try:
            proc = subprocess.run(
                self._argv(cwd, args),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self.env(),
                timeout=self.timeout_s,
            )
        except FileNotFoundError:
            return GitResult(127, b"", f"{self.executable}: not found")
        except subprocess.TimeoutExpired:
            return GitResult(-9, b"", f"git {' '.join(args[:2])} took more than {self.timeout_s:g} s")
        except OSError as exc:
            return GitResult(126, b"", f"{self.executable}: {exc.strerror or exc}")
        return GitResult(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace").strip())

    def stream(self, cwd: tp.Union[str, Path], *args: str) -> tp.Any:
        """A running ``git ...`` with its stdout as a pipe (``git archive``); killed after ``timeout_s``."""
        self.calls += 1
        proc = subprocess.Popen(
            self._argv(cwd, args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env(),
        )
        timer = threading.Timer(self.timeout_s, proc.kill)
        timer.daemon = True
        timer.start()
        proc._hpctrain_timer = timer  # type: ignore[attr-defined]
        return proc


# ----------------------------------------------------------------------------------------------- helpers
def strip_credentials(url: str) -> str:
    """A remote URL without the secrets people put in them: ``https://user:token@host/x`` -> ``https://host/x``
    (the user goes too on http(s), where it is often a token), a password in any scheme, and a query string
    on http(s) (``?private_token=...``). scp-like ``git@host:org/repo.git`` has no secret and stays."""
    if "://" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return re.sub(r"://[^/@]*@", "://", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        web = parts.scheme.lower() in ("http", "https", "ftp", "ftps")
        if web or ":" in userinfo:
            netloc = host if web else f"{userinfo.split(':', 1)[0]}@{host}"
    query = "" if parts.scheme.lower() in ("http", "https") else parts.query
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _hash_file(path: Path, *, keep: int = 0, limit: int = HASH_LIMIT) -> tp.Dict[str, tp.Any]:
    """``{size, sha256 | None, mode, symlink?}`` of one file without following a symlink or blocking on a FIFO;
    ``"_content"`` holds the bytes when the file has at most ``keep`` of them."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        return {"symlink": target, "sha256": hashlib.sha256(os.fsencode(target)).hexdigest(), "size": len(target)}
    if not stat.S_ISREG(st.st_mode):
        return {"error": "not a regular file", "size": int(st.st_size)}
    out: tp.Dict[str, tp.Any] = {"size": int(st.st_size), "executable": bool(st.st_mode & 0o111)}
    if st.st_size > limit:
        out.update(sha256=None, not_hashed=f"larger than {limit} bytes")
        return out
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "size": int(st.st_size)}
    h = hashlib.sha256()
    kept: tp.List[bytes] = []
    try:
        while True:
            block = os.read(fd, _BLOCK)
            if not block:
                break
            h.update(block)
            if st.st_size <= keep:
                kept.append(block)
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "size": int(st.st_size)}
    finally:
        os.close(fd)
    out["sha256"] = h.hexdigest()
    if st.st_size <= keep:
        out["_content"] = b"".join(kept)
    return out


def _public(entry: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def entry_location(entry: str) -> tp.Tuple[tp.Optional[Path], tp.Optional[Path], str]:
    """``(entry file, package root, why not)`` of ``module:function``, found without importing anything.

    The package root is the top-level package's directory (``mypkg/`` for ``mypkg.sub.train``), or the
    module's own file for a top-level module: what is hashed when the entry lives outside git."""
    from hpctrain._entry import split_entry
    from hpctrain.submit.entry import find_module_file

    try:
        module = split_entry(entry)[0]
        file, _ = find_module_file(module)
    except UsageError as exc:
        return None, None, str(exc)
    if file is None:
        return None, None, f"{entry}: its module has no Python source file"
    path = Path(file).resolve()
    depth = module.count(".")
    root = path if depth == 0 else path.parents[depth - 1]
    if path.name == "__init__.py":  # `--entry pkg:main` names a package
        root = path.parents[depth]
    return path, root, ""


# ----------------------------------------------------------------------------------------------- git
def _split_z(raw: bytes) -> tp.List[str]:
    return [p.decode("utf-8", "surrogateescape") for p in raw.split(b"\0") if p]


def _remotes(git: Git, root: Path) -> tp.Dict[str, str]:
    res = git.run(root, "remote")
    names = res.text().split() if res.ok else []
    out: tp.Dict[str, str] = {}
    for name in names[:20]:
        url = git.run(root, "remote", "get-url", name)
        if url.ok:
            out[name] = strip_credentials(url.text())
    return out


def _repo_root(git: Git, where: Path) -> tp.Tuple[tp.Optional[Path], str]:
    """The work tree holding ``where`` (a file or directory), or None and why not; a path git ignores there
    (an installed package inside a virtual environment kept in a repository) is not part of it."""
    directory = where if where.is_dir() else where.parent
    res = git.run(directory, "rev-parse", "--show-toplevel")
    if not res.ok:
        why = res.stderr.splitlines()[0] if res.stderr else f"git exited {res.returncode}"
        return None, f"not a git repository ({shorten(why, 160)})"
    root = Path(res.text()).resolve()
    ignored = git.run(root, "check-ignore", "-q", "--", str(where))
    if ignored.returncode == 0:
        return None, f"{where} is ignored by the git repository {root}"
    return root, ""


def capture_repository(
    where: tp.Union[str, Path], *, git: tp.Optional[Git] = None, keep_bytes: int = UNTRACKED_CONTENT_LIMIT
) -> tp.Dict[str, tp.Any]:
    """The git record of the work tree holding ``where``, or ``{"kind": "none", "reason": ...}`` outside one.

    Keys starting with ``_`` (the diff bytes, the untracked and changed files' contents) are for
    :func:`write_snapshot` and never written to the manifest."""
    git = git or Git()
    started = time.perf_counter()
    where = Path(where).resolve()
    root, why = _repo_root(git, where)
    if root is None:
        return {"kind": "none", "reason": why}
    head = git.run(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    commit = head.text() if head.ok else None
    branch = git.run(root, "symbolic-ref", "--short", "-q", "HEAD")
    remotes = _remotes(git, root)
    record: tp.Dict[str, tp.Any] = {
        "kind": "git",
        "root": str(root),
        "commit": commit,
        "branch": branch.text() if branch.ok and branch.text() else None,
        "remote_url": remotes.get("origin", next(iter(remotes.values()), None)),
        "remotes": remotes,
    }
    # Tracked changes against HEAD (staged or not), as names and as the binary-safe diff.
    changed: tp.List[tp.Tuple[str, str]] = []
    diff = b""
    if commit is not None:
        ns = git.run(
            root, "diff", "HEAD", "--name-status", "-z", "--no-renames", "--no-ext-diff", "--ignore-submodules"
        )
        if not ns.ok:
            return {"kind": "error", "root": str(root), "reason": f"git diff failed: {shorten(ns.stderr, 200)}"}
        fields = _split_z(ns.stdout)
        changed = [(fields[i][:1], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]
        res = git.run(
            root, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--ignore-submodules"
        )
        if not res.ok:
            return {"kind": "error", "root": str(root), "reason": f"git diff failed: {shorten(res.stderr, 200)}"}
        diff = res.stdout
    else:  # a repository without a commit: everything it tracks counts as added
        ls = git.run(root, "ls-files", "-z", "--cached")
        changed = [("A", p) for p in _split_z(ls.stdout)] if ls.ok else []
    modified: tp.List[tp.Dict[str, tp.Any]] = []
    for status, rel in changed:
        entry: tp.Dict[str, tp.Any] = {"path": rel, "status": status}
        if status != "D":
            info = _hash_file(root / rel, keep=HASH_LIMIT)
            if "error" in info and (root / rel).is_dir():
                continue  # a submodule's gitlink
            entry.update(info)
        modified.append(entry)
    others = git.run(root, "ls-files", "-z", "--others", "--exclude-standard")
    untracked_names, run_dirs = _without_run_dirs(root, _split_z(others.stdout) if others.ok else [])
    untracked: tp.List[tp.Dict[str, tp.Any]] = []
    for rel in sorted(untracked_names)[:MAX_FILES]:
        info = _hash_file(root / rel, keep=keep_bytes)
        untracked.append({"path": rel, **info, "stored": "_content" in info})
    dirty = sorted({m["path"] for m in modified} | set(untracked_names))
    record.update(
        dirty=bool(dirty),
        dirty_files=dirty[:200],
        dirty_count=len(dirty),
        diff={
            "sha256": hashlib.sha256(diff).hexdigest(),
            "bytes": len(diff),
            "inline_limit_bytes": DIFF_INLINE_LIMIT,
            **_inline(diff),
        },
        modified=[_public(m) for m in modified],
        untracked=[_public(u) for u in untracked],
        untracked_count=len(untracked_names),
        untracked_run_dirs_skipped=run_dirs[:50],
        untracked_content_limit_bytes=keep_bytes,
        hash_limit_bytes=HASH_LIMIT,
        seconds=round(time.perf_counter() - started, 4),
        _diff=diff,
        _modified={m["path"]: m["_content"] for m in modified if "_content" in m},
        _untracked={u["path"]: u["_content"] for u in untracked if "_content" in u},
    )
    return record


def _without_run_dirs(root: Path, names: tp.List[str]) -> tp.Tuple[tp.List[str], tp.List[str]]:
    """``names`` without the files inside hpctrain run directories (a folder holding a submission record),
    and those folders. ``runs/`` under the repository, when not ignored, holds this run's own records and
    other runs' checkpoints: they are not code, change at every attempt, and can be gigabytes."""
    from hpctrain.rundir import RunDir

    marker = RunDir.SUBMISSION
    known: tp.Dict[str, bool] = {}

    def is_run(directory: str) -> bool:
        if directory not in known:
            known[directory] = os.path.isfile(os.path.join(root, directory, marker))
        return known[directory]

    kept: tp.List[str] = []
    skipped: tp.Set[str] = set()
    for name in names:
        parts = name.split("/")[:-1]
        hit = next((d for d in ("/".join(parts[: i + 1]) for i in range(len(parts))) if is_run(d)), None)
        if hit is None:
            kept.append(name)
        else:
            skipped.add(hit)
    return kept, sorted(skipped)


def _inline(diff: bytes) -> tp.Dict[str, tp.Any]:
    if not diff:
        return {"text": ""}
    if len(diff) > DIFF_INLINE_LIMIT:
        return {"inline": False}
    try:
        return {"text": diff.decode("utf-8")}
    except UnicodeDecodeError:  # a text file in another encoding: binary-safe in JSON as base64
        return {"base64": base64.b64encode(diff).decode("ascii")}


# ----------------------------------------------------------------------------------------------- not git
_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def capture_files(root: tp.Union[str, Path], *, reason: str = "") -> tp.Dict[str, tp.Any]:
    """``{"kind": "files", "sha256": ...}``: a sha256 over the sorted walk of ``root`` (a package directory or
    one module file): each file's relative name, then its own sha256. ``__pycache__`` and VCS folders are
    skipped; symlinks are hashed as their target text, never followed."""
    started = time.perf_counter()
    root = Path(root)
    names: tp.List[str] = []
    if root.is_file():
        names, base = [root.name], root.parent
    else:
        base = root
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            rel = os.path.relpath(dirpath, root)
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # listed, not entered
            for name in sorted(filenames) + links:
                if not name.endswith((".pyc", ".pyo")):
                    names.append(name if rel == "." else f"{rel}/{name}")
            if len(names) > 2 * MAX_FILES:
                break  # counted roughly beyond the listed ones; a package this large is not code
    names.sort()
    overall = hashlib.sha256()
    files: tp.List[tp.Dict[str, tp.Any]] = []
    for rel in names[:MAX_FILES]:
        info = _hash_file(base / rel)
        overall.update(os.fsencode(rel) + b"\0" + str(info.get("sha256") or info.get("size")).encode() + b"\n")
        files.append({"path": rel, **_public(info)})
    return {
        "kind": "files",
        "root": str(root),
        "reason": reason,
        "sha256": overall.hexdigest(),
        "file_count": len(names),
        "files": files,
        "hash_limit_bytes": HASH_LIMIT,
        "seconds": round(time.perf_counter() - started, 4),
    }


# ----------------------------------------------------------------------------------------------- both
def _capture_at(where: Path, fallback_root: Path, git: Git) -> tp.Dict[str, tp.Any]:
    record = capture_repository(where, git=git)
    if record["kind"] == "none":
        return capture_files(fallback_root, reason=record["reason"])
    return record


def capture_code(
    entry: tp.Optional[str],
    *,
    argv: tp.Sequence[str] = (),
    entry_args: tp.Sequence[str] = (),
    git: tp.Optional[Git] = None,
) -> tp.Dict[str, tp.Any]:
    """The ``code`` section: the entry's repository (or its package files) and hpctrain's own, the entry point
    and the command line. Private keys (``_diff`` ...) stay inside, for :func:`write_snapshot`."""
    import hpctrain

    git = git or Git()
    started = time.perf_counter()
    repos: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    file, root, why = entry_location(entry) if entry else (None, None, "no entry")
    if file is not None and root is not None:
        repos["entry"] = _capture_at(file, root, git)
    else:
        repos["entry"] = {"kind": "unavailable", "reason": why}
    package = Path(hpctrain.__file__).resolve().parent
    entry_root = repos["entry"].get("root") if repos["entry"].get("kind") == "git" else None
    here, why = _repo_root(git, package)
    if here is not None and entry_root is not None and str(here) == entry_root:
        repos["hpctrain"] = {"kind": "same", "same_as": "entry", "root": entry_root}
    elif here is not None:
        repos["hpctrain"] = capture_repository(package, git=git)
    else:
        repos["hpctrain"] = capture_files(package, reason=why)
    return {
        "entry": entry,
        "entry_file": str(file) if file else None,
        "entry_args": list(entry_args),
        "argv": list(argv),
        "repositories": repos,
        "seconds": round(time.perf_counter() - started, 4),
    }


def public_code(code: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    """The ``code`` section without the private bytes (what goes into the manifest)."""
    out = dict(code)
    out["repositories"] = {name: _public(r) for name, r in code.get("repositories", {}).items()}
    return out


def code_essentials(code: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Any:
    """What of the code section makes the identity: per repository, the commit, the diff's sha256 and the
    changed and untracked files' hashes (git), or the files' sha256. Not paths, branches, remotes or times:
    the same code checked out elsewhere, or pushed to another remote, is the same code."""
    if not code:
        return None
    out: tp.Dict[str, tp.Any] = {}
    for name, repo in sorted(code.get("repositories", {}).items()):
        kind = repo.get("kind")
        if kind == "git":
            out[name] = {
                "commit": repo.get("commit"),
                "diff_sha256": (repo.get("diff") or {}).get("sha256"),
                "modified": sorted((m["path"], m.get("status"), m.get("sha256")) for m in repo.get("modified", [])),
                "untracked": sorted((u["path"], u.get("sha256"), u.get("size")) for u in repo.get("untracked", [])),
                "untracked_count": repo.get("untracked_count"),
            }
        elif kind == "files":
            out[name] = {"files_sha256": repo.get("sha256")}
        elif kind == "same":
            out[name] = {"same_as": repo.get("same_as")}
        else:
            out[name] = {"unavailable": True}
    return out


def dirty_summary(code: tp.Mapping[str, tp.Any]) -> tp.List[str]:
    """One phrase per dirty git repository of a ``code`` section: its root and its first dirty files."""
    phrases = []
    for name, repo in code.get("repositories", {}).items():
        if repo.get("kind") == "git" and repo.get("dirty"):
            files = repo.get("dirty_files", [])
            shown = ", ".join(files[:8]) + (f" (+{repo['dirty_count'] - 8} more)" if repo["dirty_count"] > 8 else "")
            phrases.append(f"{'the entry' if name == 'entry' else name}'s repository {repo['root']} is dirty: {shown}")
    return phrases


# ----------------------------------------------------------------------------------------------- snapshot
def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _copy_git_archive(out: tp.BinaryIO, git: Git, root: str, commit: str, prefix: str, scratch: Path) -> None:
    """Append ``git archive --prefix=<prefix> <commit>`` to the uncompressed tar stream ``out``, without its
    end-of-archive blocks (the snapshot's own members and end follow). The archive is spooled to ``scratch``
    and only its headers are parsed (to find where its last member ends): git writes the bytes, zlib
    compresses them, and Python never touches a file's content."""
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
        for _ in tar:  # headers only: TarFile.offset ends up just past the last member's data
            pass
        end = tar.offset
    with open(scratch, "rb") as spool:
        remaining = end
        while remaining:
            block = spool.read(min(_BLOCK, remaining))
            if not block:
                raise OSError(f"git archive {commit[:12]} in {root} ended early")
            out.write(block)
            remaining -= len(block)


def _add_repository(tar: tarfile.TarFile, name: str, repo: tp.Mapping[str, tp.Any]) -> None:
    manifest = _public(dict(repo))
    if repo.get("kind") == "git":
        manifest["diff"] = {k: v for k, v in manifest.get("diff", {}).items() if k not in ("text", "base64")}
        _add_bytes(tar, f"{name}/diff.patch", repo.get("_diff", b""))
        for rel, content in sorted(repo.get("_modified", {}).items()):
            _add_bytes(tar, f"{name}/worktree/{rel}", content)
        for rel, content in sorted(repo.get("_untracked", {}).items()):
            _add_bytes(tar, f"{name}/untracked/{rel}", content)
    elif repo.get("kind") == "files":
        root = Path(repo["root"])
        base = root.parent if root.is_file() else root
        for f in repo.get("files", []):
            if f.get("sha256") and "symlink" not in f:
                tar.add(str(base / f["path"]), arcname=f"{name}/files/{f['path']}", recursive=False)
    _add_bytes(tar, f"{name}/MANIFEST.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


_README = b"""hpctrain code snapshot (hpctrain.identity.code.write_snapshot)

For each repository (entry/, and hpctrain/ when hpctrain is not in the entry's repository):
  git:    tree/       git archive of the recorded commit (MANIFEST.json: commit, branch, remotes)
          diff.patch  git diff HEAD --binary at capture time (git apply --binary diff.patch in tree/)
          worktree/   the changed tracked files as they were (status M/A/T in MANIFEST.json "modified";
                      status D: delete that path) - copying them over tree/ gives the same result
          untracked/  untracked files up to untracked_content_limit_bytes each (all are listed, hashed)
  files:  files/      the package files that were hashed (MANIFEST.json "files", "sha256")
"""


def write_snapshot(
    path: tp.Union[str, Path], code: tp.Mapping[str, tp.Any], *, git: tp.Optional[Git] = None
) -> tp.Dict[str, tp.Any]:
    """Write the code snapshot tar.gz to ``path`` durably (tmp, fsync, rename, fsync the directory); returns
    ``{sha256, bytes, seconds}`` for the manifest. Needs the private keys of :func:`capture_code`'s result."""
    git = git or Git()
    started = time.perf_counter()
    path = Path(path)
    token = f"{os.getpid()}-{os.urandom(8).hex()}"
    tmp = path.with_name(f".{path.name}.tmp-{token}")
    scratch = path.with_name(f".{path.name}.archive-{token}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    repos = code.get("repositories", {})
    try:
        with os.fdopen(fd, "wb") as raw:
            h = _HashingWriter(raw)
            with gzip.GzipFile(fileobj=h, mode="wb", compresslevel=1, mtime=0) as gz:
                for name, repo in repos.items():
                    if repo.get("kind") == "git" and repo.get("commit"):
                        _copy_git_archive(gz, git, repo["root"], repo["commit"], f"{name}/tree/", scratch)
                with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    _add_bytes(tar, "README", _README)
                    for name, repo in repos.items():
                        if repo.get("kind") in ("git", "files"):
                            _add_repository(tar, name, repo)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        scratch.unlink(missing_ok=True)
    return {"sha256": h.sha256.hexdigest(), "bytes": h.size, "seconds": round(time.perf_counter() - started, 4)}


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
                notes.append(f"{parts[0]}: {'/'.join(parts[2:]) or member.name}: not restored ({exc})")
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
    root = str(repo.get("root") or "")
    base = os.path.basename(root.rstrip("/")) or "package"
    listed = [f for f in repo.get("files") or [] if isinstance(f, dict)]
    single = root.endswith(".py") and [f.get("path") for f in listed] == [base]
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
            why = _place(files, str(f.get("path")), link=str(f["symlink"]))
            if why:
                problems.append(f"{name}: {why}")
        elif not f.get("sha256"):
            notes.append(f"{name}: {f.get('path')}: not stored ({f.get('not_hashed') or f.get('error') or 'no hash'})")
    again = capture_files(tree / base if single else files)
    if again["sha256"] != repo.get("sha256"):
        problems.append(
            f"{name}: the rebuilt package files hash to {again['sha256'][:16]}..., the record says "
            f"{str(repo.get('sha256'))[:16]}... ({again['file_count']} files rebuilt, {len(listed)} recorded)"
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
    for m in repo.get("modified") or []:
        rel = str(m.get("path"))
        if _snapshot_rel(rel) is None:
            problems.append(f"{name}: {shorten(rel, 120)!r}: a path outside the tree; not restored")
            continue
        if m.get("status") == "D":
            target = tree.joinpath(*(_snapshot_rel(rel) or ()))
            if _inside(tree, target.parent) and os.path.lexists(target):
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            if os.path.lexists(target):
                problems.append(f"{name}: {rel}: deleted in the run's tree, still here")
            checked += 1
            continue
        stored = src / "worktree" / rel
        if "symlink" in m:
            why = _place(tree, rel, link=str(m["symlink"]))
        elif stored.is_file() and not stored.is_symlink():
            why = _place(tree, rel, source=stored, executable=m.get("executable"))
        elif "error" in m or not m.get("sha256"):
            notes.append(
                f"{name}: {rel}: changed, never stored ({m.get('error') or m.get('not_hashed')}); "
                "the committed version is in the tree"
            )
            continue
        else:
            why = f"{rel}: changed ({m.get('status')}), but the snapshot does not hold it"
        if why:
            problems.append(f"{name}: {why}")
            continue
        checked += _check_hash(name, tree, rel, m, problems, notes)
    for u in repo.get("untracked") or []:
        rel = str(u.get("path"))
        if _snapshot_rel(rel) is None:
            problems.append(f"{name}: {shorten(rel, 120)!r}: a path outside the tree; not restored")
            continue
        stored = src / "untracked" / rel
        if "symlink" in u:
            why = _place(tree, rel, link=str(u["symlink"]))
        elif u.get("stored") and stored.is_file() and not stored.is_symlink():
            why = _place(tree, rel, source=stored, executable=u.get("executable"))
        elif u.get("stored"):
            why = f"{rel}: untracked and recorded as stored, but the snapshot does not hold it"
        else:
            notes.append(
                f"{name}: untracked {rel} ({u.get('size')} bytes) was over the snapshot's limit of "
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
        want = (repo.get("diff") or {}).get("sha256")
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
        notes.append(f"{name}: {rel}: no sha256 recorded ({rec.get('not_hashed') or rec.get('error') or 'unknown'})")
        return 0
    got = _hash_file(tree / rel).get("sha256")
    if got != want:
        problems.append(f"{name}: {rel}: sha256 {str(got)[:16]}... is not the recorded {want[:16]}...")
    return 1
