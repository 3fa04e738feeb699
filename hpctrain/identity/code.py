"""The code of a run: what git says about the entry's repository (and hpctrain's own), or a hash of the files.

Stdlib only (the login node runs this at every submission; nothing here imports torch or the user's code).

For a git repository, :func:`capture_repository` records the commit, branch, remote URLs with their
credentials stripped (:func:`hpctrain.identity.redact.strip_credentials`), the dirty flag with the dirty
files, ``git diff HEAD --binary`` (inline below :data:`DIFF_INLINE_LIMIT`; its sha256 and size always),
every changed tracked file and every untracked file (``git ls-files --others --exclude-standard``) with its
size and sha256. Outside a git repository (or where git is missing, refuses the directory, or ignores the
file), :func:`capture_files` hashes the entry's package files instead: a sorted walk, names and contents.
The private keys of a capture (the diff and file bytes) are for the code snapshot,
:mod:`hpctrain.identity.snapshot` (its writer and its reader, ``write_snapshot`` and ``restore_snapshot``);
:func:`public_code` is what the manifest keeps.

Files that look like credentials (:class:`hpctrain.identity.redact.SecretRule`: their name, the user's
``[run] secret_patterns``, a private key's header) are listed and hashed, never kept: their entries say
``withheld`` (and why), their bytes are in no private key, and their changes are left out of the stored diff.

File names are recorded losslessly: a name that is not UTF-8 (git and the file system give bytes) is
``path`` with each byte that is not UTF-8 written ``\\xNN``, plus ``path_hex``, the name's bytes in hex, which
is the authority (:func:`name_fields`, :func:`name_of`); a symbolic link's target likewise (``symlink`` and
``symlink_hex``). Every other text of a record that is not UTF-8 is written with ``\\xNN`` escapes
(:func:`json_safe`): a record is always valid UTF-8 JSON.

git is reached through one seam, :class:`Git`: a subprocess with a timeout, no optional locks (never
competes with the user's own ``git`` for ``index.lock``), no pager, no external diff or textconv drivers.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import threading
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain._entry import entry_location
from hpctrain._files import sha256_fd, shorten
from hpctrain.identity.redact import (
    DIFF_KEY_REGEX,
    HEAD_BYTES,
    SecretRule,
    active_rule,
    redact_argv,
    strip_credentials,
)

__all__ = [
    "Git",
    "GitResult",
    "DIFF_INLINE_LIMIT",
    "UNTRACKED_CONTENT_LIMIT",
    "HASH_LIMIT",
    "MAX_FILES",
    "strip_credentials",
    "name_fields",
    "name_of",
    "json_safe",
    "shown_name",
    "files_digest",
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
def name_fields(name: str, key: str = "path") -> tp.Dict[str, str]:
    """``{key: name}`` for a name as Python has it from git or the file system (bytes that are not UTF-8 are
    lone surrogates, ``surrogateescape``); for a name that is not UTF-8, ``key`` shows each such byte as
    ``\\xNN`` and ``<key>_hex`` holds the name's bytes (the authority: :func:`name_of`)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return {key: json_safe(name)}
        return {key: raw.decode("utf-8", "backslashreplace"), f"{key}_hex": raw.hex()}
    return {key: name}


def name_of(record: tp.Mapping[str, tp.Any], key: str = "path") -> str:
    """The name :func:`name_fields` recorded, as the file system takes it (``os.fsencode`` gives its bytes)."""
    hexed = record.get(f"{key}_hex")
    if isinstance(hexed, str):
        try:
            return bytes.fromhex(hexed).decode("utf-8", "surrogateescape")
        except ValueError:
            pass
    return str(record.get(key))


def _ident_name(record: tp.Mapping[str, tp.Any]) -> str:
    """A recorded name for the identity: ``path``, and for a name that is not UTF-8 its bytes too (a name
    that shows the same is another name)."""
    hexed = record.get("path_hex")
    return f"{record.get('path')}\0{hexed}" if hexed else str(record.get("path"))


def json_safe(value: tp.Any) -> tp.Any:
    """``value`` with every string that holds bytes which are not UTF-8 (lone surrogates) written with
    ``\\xNN`` escapes, in dict keys too: what JSON encoded as UTF-8 can hold."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a surrogate no file system byte decodes to
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def shown_name(name: str) -> str:
    """A recorded name as one line of a message (a newline or another control character escaped)."""
    name = json_safe(name)
    return name if name.isprintable() else repr(name)[1:-1]


def files_digest(entries: tp.Iterable[tp.Tuple[str, tp.Any]]) -> str:
    """The sha256 of a package walk (``kind: files``): for each ``(name, sha256 or size)``, in name order, the
    name's bytes, NUL, the value, newline. :func:`capture_files` computes it; the snapshot's reader recomputes it
    from the record (without the files that were withheld)."""
    overall = hashlib.sha256()
    for rel, value in entries:
        overall.update(os.fsencode(rel) + b"\0" + str(value).encode() + b"\n")
    return overall.hexdigest()


def _hash_file(path: Path, *, keep: int = 0, limit: int = HASH_LIMIT) -> tp.Dict[str, tp.Any]:
    """``{size, sha256 | None, mode, symlink?}`` of one file without following a symlink or blocking on a FIFO;
    ``"_content"`` holds the bytes when the file has at most ``keep`` of them, ``"_head"`` its first
    :data:`hpctrain.identity.redact.HEAD_BYTES` (for the secret rule)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        return {
            **name_fields(target, "symlink"),
            "sha256": hashlib.sha256(os.fsencode(target)).hexdigest(),
            "size": len(target),
        }
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
    head = bytearray()
    whole = st.st_size <= keep

    def each(piece: memoryview) -> None:
        if len(head) < HEAD_BYTES:
            head.extend(piece[: HEAD_BYTES - len(head)])
        if whole:
            kept.append(bytes(piece))

    try:
        out["sha256"], _ = sha256_fd(fd, block=_BLOCK, each=each)
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "size": int(st.st_size)}
    finally:
        os.close(fd)
    out["_head"] = bytes(head)
    if whole:
        out["_content"] = b"".join(kept)
    return out


def _withhold(rule: SecretRule, rel: str, info: tp.Dict[str, tp.Any]) -> tp.Optional[str]:
    """Why the file ``rel`` hashed into ``info`` is withheld (its ``_content`` is dropped then), or None. A
    symbolic link is its target's text, recorded anyway: never withheld."""
    if "symlink" in info:
        return None
    why = rule.file(rel, info.get("_head"))
    if why:
        info.pop("_content", None)
    return why


def _public(entry: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


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
            out[json_safe(name)] = json_safe(strip_credentials(url.text()))
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
    where: tp.Union[str, Path],
    *,
    git: tp.Optional[Git] = None,
    keep_bytes: int = UNTRACKED_CONTENT_LIMIT,
    secret_patterns: tp.Optional[tp.Sequence[str]] = None,
) -> tp.Dict[str, tp.Any]:
    """The git record of the work tree holding ``where``, or ``{"kind": "none", "reason": ...}`` outside one.

    Keys starting with ``_`` (the diff bytes, the untracked and changed files' contents) are for
    :func:`hpctrain.identity.snapshot.write_snapshot` and never written to the manifest. Files that look like
    credentials (``secret_patterns``: the user's deny-list, default the one in effect,
    :func:`hpctrain.identity.redact.active_rule`) are listed and hashed with ``withheld``; their bytes and their
    part of the diff are not kept (``diff.sha256`` stays the whole diff's: the identity does not depend on the
    rule; ``diff.stored_sha256`` is the stored diff's)."""
    git = git or Git()
    rule = active_rule(secret_patterns)
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
        **name_fields(str(root), "root"),
        "commit": commit,
        "branch": json_safe(branch.text()) if branch.ok and branch.text() else None,
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
        entry: tp.Dict[str, tp.Any] = {**name_fields(rel), "status": status, "_name": rel}
        why = rule.name(rel)
        if status != "D":
            info = _hash_file(root / rel, keep=HASH_LIMIT)
            if "error" in info and (root / rel).is_dir():
                continue  # a submodule's gitlink
            why = _withhold(rule, rel, info)
            entry.update(info)
        if why:
            entry["withheld"] = why
        modified.append(entry)
    stored_diff = diff
    if commit is not None and diff:
        stored_diff = _diff_without_secrets(git, root, diff, modified)
    others = git.run(root, "ls-files", "-z", "--others", "--exclude-standard")
    untracked_names, run_dirs = _without_run_dirs(root, _split_z(others.stdout) if others.ok else [])
    untracked: tp.List[tp.Dict[str, tp.Any]] = []
    for rel in sorted(untracked_names)[:MAX_FILES]:
        info = _hash_file(root / rel, keep=0 if rule.name(rel) else keep_bytes)
        why = _withhold(rule, rel, info)
        untracked.append({**name_fields(rel), **info, "stored": "_content" in info, "_name": rel})
        if why:
            untracked[-1]["withheld"] = why
    dirty = sorted({m["path"] for m in modified} | {name_fields(n)["path"] for n in untracked_names})
    withheld = sorted(e["path"] for e in modified + untracked if e.get("withheld"))
    diff_record: tp.Dict[str, tp.Any] = {
        "sha256": hashlib.sha256(diff).hexdigest(),
        "bytes": len(diff),
        "inline_limit_bytes": DIFF_INLINE_LIMIT,
        **_inline(stored_diff),
    }
    if stored_diff is not diff:
        diff_record.update(
            stored_sha256=hashlib.sha256(stored_diff).hexdigest(),
            stored_bytes=len(stored_diff),
            withheld=sorted(m["path"] for m in modified if m.get("withheld")),
        )
    record.update(
        dirty=bool(dirty),
        dirty_files=dirty[:200],
        dirty_count=len(dirty),
        diff=diff_record,
        modified=[_public(m) for m in modified],
        untracked=[_public(u) for u in untracked],
        untracked_count=len(untracked_names),
        untracked_run_dirs_skipped=[name_fields(d)["path"] for d in run_dirs[:50]],
        untracked_content_limit_bytes=keep_bytes,
        hash_limit_bytes=HASH_LIMIT,
        seconds=round(time.perf_counter() - started, 4),
        _diff=stored_diff,
        _modified={m["_name"]: m["_content"] for m in modified if "_content" in m},
        _untracked={u["_name"]: u["_content"] for u in untracked if "_content" in u},
    )
    if withheld:
        record["withheld"] = withheld
    if rule.patterns:
        record["secret_patterns"] = list(rule.patterns)
    return record


def _diff_without_secrets(git: Git, root: Path, diff: bytes, modified: tp.List[tp.Dict[str, tp.Any]]) -> bytes:
    """``diff`` (``git diff HEAD --binary``) without the changes of the withheld files: those ``modified``
    already marks, and (marked here) those whose diff adds or removes a private key's header line. ``diff``
    itself when nothing is withheld."""
    if b"PRIVATE KEY" in diff:
        found = git.run(
            root,
            "diff",
            "HEAD",
            "--name-only",
            "-z",
            "--no-renames",
            "--no-ext-diff",
            "--no-textconv",
            "--ignore-submodules",
            f"-G{DIFF_KEY_REGEX}",
        )
        keys = set(_split_z(found.stdout)) if found.ok else set()
        for m in modified:
            if m["_name"] in keys and not m.get("withheld") and "symlink" not in m:
                m["withheld"] = "its diff holds a private key"
                m.pop("_content", None)
    hidden = [m["_name"] for m in modified if m.get("withheld")]
    if not hidden:
        return diff
    res = git.run(
        root,
        "diff",
        "HEAD",
        "--binary",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--ignore-submodules",
        "--",
        ".",
        *(f":(exclude,literal){name}" for name in hidden),
    )
    if not res.ok:  # never store a diff that may hold them: the changed files' own copies rebuild the tree
        return b""
    return res.stdout


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


def capture_files(
    root: tp.Union[str, Path], *, reason: str = "", secret_patterns: tp.Optional[tp.Sequence[str]] = None
) -> tp.Dict[str, tp.Any]:
    """``{"kind": "files", "sha256": ...}``: a sha256 over the sorted walk of ``root`` (a package directory or
    one module file): each file's relative name, then its own sha256 (:func:`files_digest`). ``__pycache__`` and
    VCS folders are skipped; symlinks are hashed as their target text, never followed. Files that look like
    credentials are hashed and marked ``withheld`` (the snapshot leaves them out)."""
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
    rule = active_rule(secret_patterns)
    digest: tp.List[tp.Tuple[str, tp.Any]] = []
    files: tp.List[tp.Dict[str, tp.Any]] = []
    for rel in names[:MAX_FILES]:
        info = _hash_file(base / rel)
        digest.append((rel, info.get("sha256") or info.get("size")))
        why = _withhold(rule, rel, info)
        files.append({**name_fields(rel), **_public(info), **({"withheld": why} if why else {})})
    withheld = [f["path"] for f in files if f.get("withheld")]
    return {
        "kind": "files",
        **name_fields(str(root), "root"),
        "reason": json_safe(reason),
        **({"withheld": withheld} if withheld else {}),
        "sha256": files_digest(digest),
        "file_count": len(names),
        "files": files,
        "hash_limit_bytes": HASH_LIMIT,
        "seconds": round(time.perf_counter() - started, 4),
    }


# ----------------------------------------------------------------------------------------------- both
def _capture_at(where: Path, fallback_root: Path, git: Git, patterns: tp.Sequence[str]) -> tp.Dict[str, tp.Any]:
    record = capture_repository(where, git=git, secret_patterns=patterns)
    if record["kind"] == "none":
        return capture_files(fallback_root, reason=record["reason"], secret_patterns=patterns)
    return record


def capture_code(
    entry: tp.Optional[str],
    *,
    argv: tp.Sequence[str] = (),
    entry_args: tp.Sequence[str] = (),
    git: tp.Optional[Git] = None,
    secret_patterns: tp.Optional[tp.Sequence[str]] = None,
) -> tp.Dict[str, tp.Any]:
    """The ``code`` section: the entry's repository (or its package files) and hpctrain's own, the entry point
    and the command line (secret values redacted: :func:`hpctrain.identity.redact.redact_argv`). Private keys
    (``_diff`` ...) stay inside, for :func:`hpctrain.identity.snapshot.write_snapshot`. ``secret_patterns``: the
    user's deny-list (default: the one in effect, :func:`hpctrain.identity.redact.using_patterns`)."""
    import hpctrain

    git = git or Git()
    patterns = active_rule(secret_patterns).patterns
    started = time.perf_counter()
    repos: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    file, root, why = entry_location(entry) if entry else (None, None, "no entry")
    if file is not None and root is not None:
        repos["entry"] = _capture_at(file, root, git, patterns)
    else:
        repos["entry"] = {"kind": "unavailable", "reason": why}
    package = Path(hpctrain.__file__).resolve().parent
    entry_root = name_of(repos["entry"], "root") if repos["entry"].get("kind") == "git" else None
    here, why = _repo_root(git, package)
    if here is not None and entry_root is not None and str(here) == entry_root:
        repos["hpctrain"] = {"kind": "same", "same_as": "entry", **name_fields(entry_root, "root")}
    elif here is not None:
        repos["hpctrain"] = capture_repository(package, git=git, secret_patterns=patterns)
    else:
        repos["hpctrain"] = capture_files(package, reason=why, secret_patterns=patterns)
    return {
        "entry": json_safe(entry),
        "entry_file": json_safe(str(file)) if file else None,
        "entry_args": json_safe(redact_argv(entry_args)),
        "argv": json_safe(redact_argv(argv)),
        "repositories": repos,
        "seconds": round(time.perf_counter() - started, 4),
    }


def public_code(code: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    """The ``code`` section without the private bytes (what goes into the manifest), valid UTF-8 throughout."""
    out = dict(code)
    out["repositories"] = {name: _public(r) for name, r in code.get("repositories", {}).items()}
    return json_safe(out)


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
                "modified": sorted(
                    (_ident_name(m), m.get("status"), m.get("sha256")) for m in repo.get("modified", [])
                ),
                "untracked": sorted(
                    (_ident_name(u), u.get("sha256"), u.get("size")) for u in repo.get("untracked", [])
                ),
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
            files = [shown_name(f) for f in repo.get("dirty_files", [])]
            shown = ", ".join(files[:8]) + (f" (+{repo['dirty_count'] - 8} more)" if repo["dirty_count"] > 8 else "")
            phrases.append(f"{'the entry' if name == 'entry' else name}'s repository {repo['root']} is dirty: {shown}")
    return phrases
