"""The code of a run: what git says about the entry's repository (and hpctrain's own), or a hash of the files.

Stdlib only (the login node runs this at every submission; nothing here imports torch or the user's code).

For a git repository, :func:`capture_repository` records the commit, branch, remote URLs with their
credentials stripped, the dirty flag with the dirty files, ``git diff HEAD --binary`` (inline below
:data:`DIFF_INLINE_LIMIT`; its sha256 and size always), every changed tracked file and every untracked file
(``git ls-files --others --exclude-standard``) with its size and sha256. Outside a git repository (or
where git is missing, refuses the directory, or ignores the file), :func:`capture_files` hashes the
entry's package files instead: a sorted walk, names and contents. The private keys of a capture (the diff
and file bytes) are for the code snapshot, :mod:`hpctrain.identity.snapshot` (its writer and its reader,
``write_snapshot`` and ``restore_snapshot``, are still importable from here); :func:`public_code` is what the
manifest keeps.

git is reached through one seam, :class:`Git`: a subprocess with a timeout, no optional locks (never
competes with the user's own ``git`` for ``index.lock``), no pager, no external diff or textconv drivers.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import subprocess
import threading
import time
import typing as tp
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from hpctrain._files import sha256_fd, shorten
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
    kept: tp.List[bytes] = []
    try:
        out["sha256"], _ = sha256_fd(
            fd, block=_BLOCK, each=(lambda piece: kept.append(bytes(piece))) if st.st_size <= keep else None
        )
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "size": int(st.st_size)}
    finally:
        os.close(fd)
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
    :func:`hpctrain.identity.snapshot.write_snapshot` and never written to the manifest."""
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
    and the command line. Private keys (``_diff`` ...) stay inside, for
    :func:`hpctrain.identity.snapshot.write_snapshot`."""
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


def __getattr__(name: str) -> tp.Any:
    # The snapshot's writer and reader moved to hpctrain.identity.snapshot, which imports this module's capture
    # and hashing: resolved on first use, so that `from hpctrain.identity.code import write_snapshot` keeps
    # working (and the snapshot README's name for it) without the two modules importing each other at import
    if name in ("write_snapshot", "restore_snapshot"):
        from hpctrain.identity import snapshot

        return getattr(snapshot, name)
    raise AttributeError(f"module 'hpctrain.identity.code' has no attribute {name!r}")
