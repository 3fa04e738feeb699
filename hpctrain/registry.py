"""The per-user run registry: one JSON line per submitted run, appended to ``$HPCTRAIN_HOME/runs.jsonl``.

Why a file and not a server: a login node has a home directory and nothing else one can count on; a plain
append-only file needs no daemon, survives upgrades, and reads with ``jq``. It is what lets
``python -m hpctrain runs`` list *every* run of a user, wherever its run directory is, without scanning the
file system: each ``submit`` (``reproduce``, and each task of a sweep) adds one line naming the run
directory and its job; everything else about a run is read from the run directory itself.

Concurrency: several login shells may submit at the same instant. Each record is written with one
``write`` on an ``O_APPEND`` descriptor while holding an exclusive ``fcntl.flock`` on the file, then
``fsync``-ed, so two records never interleave and a crash leaves at most one torn *last* line. A torn or
otherwise invalid line is skipped when reading, with ONE warning line on stderr for the whole file; the
next append starts on a new line, so one torn record never damages the next.

The registry is an index, not the truth: a line is never rewritten or removed, a run directory moved or
deleted since is shown as missing by ``runs``. Stdlib and the ground floor only (the login-node tools
import it; no torch).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._procs import user_name

__all__ = [
    "HOME_ENV",
    "SCHEMA",
    "KINDS",
    "Registered",
    "hpctrain_home",
    "registry_path",
    "record_run",
    "read_runs",
]

HOME_ENV = "HPCTRAIN_HOME"
"""The environment variable naming hpctrain's per-user directory (default ``~/.hpctrain``)."""
SCHEMA = "hpctrain.registry/1"
"""The ``schema`` field of every registry line."""
KINDS = ("submit", "reproduce", "sweep-task")
"""How a run came to be: ``submit`` (``python -m hpctrain.submit``), ``reproduce`` (a reproduction of a
bundle), ``sweep-task`` (one task of a sweep's job array; its line also names the sweep directory)."""
FILE_NAME = "runs.jsonl"
LINE_LIMIT = 64 * 1024
"""A record longer than this is refused (a name of megabytes is a mistake, and a short line is one write)."""
LOCK_TIMEOUT_S = 10.0
"""How long a writer waits for the lock (another shell appending takes milliseconds; a stuck NFS lock
must not hang a submit: after this the record is not written and the submit says so in one line)."""
READ_LOCK_TIMEOUT_S = 2.0
"""How long a reader waits for a writer to finish its line; then it reads anyway (a torn line is skipped)."""


class Registered(tp.NamedTuple):
    """One line of the registry (what :func:`read_runs` returns, oldest first)."""

    run_dir: str
    """Absolute path of the run directory, as it was at submission."""
    job_id: tp.Optional[str]
    """Slurm's job id (``A_T`` for an array task), or the local job's id."""
    name: str
    """The job name (``--job-name``)."""
    cluster: str
    """``slurm`` or ``local``."""
    submitted_at: tp.Optional[float]
    """Unix time of the submission."""
    user: str
    kind: str
    """One of :data:`KINDS` (another word, from a newer hpctrain, is kept as written)."""
    sweep: tp.Optional[str] = None
    """The sweep directory of a ``sweep-task``; None otherwise."""
    host: tp.Optional[str] = None
    """The login node that submitted it."""

    def as_dict(self) -> tp.Dict[str, tp.Any]:
        return dict(self._asdict())


def hpctrain_home() -> Path:
    """``$HPCTRAIN_HOME``, else ``~/.hpctrain``: the per-user directory (created only when written to)."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".hpctrain"


def registry_path() -> Path:
    """The registry file: ``$HPCTRAIN_HOME/runs.jsonl``."""
    return hpctrain_home() / FILE_NAME


def _lock(fd: int, how: int, timeout_s: float) -> bool:
    """``flock(fd, how)``, retried without blocking for up to ``timeout_s``; False when it was not got."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _append(path: Path, line: bytes) -> None:
    """Append ``line`` (ending in a newline) to ``path`` under an exclusive lock, one write, then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not _lock(fd, fcntl.LOCK_EX, LOCK_TIMEOUT_S):
            raise OSError(errno.ETIMEDOUT, f"the lock on {path} was not free within {LOCK_TIMEOUT_S:.0f} s")
        try:
            size = os.fstat(fd).st_size
            # a writer that died mid-line left no newline: start on a line of our own, so only its line is torn
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            view = memoryview(line)
            while view:  # one write in practice; a short write (a full disk, a signal) continues where it stopped
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def record_run(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    job_id: tp.Any,
    *,
    name: str,
    cluster: str,
    kind: str = "submit",
    sweep: tp.Optional[tp.Union[str, "os.PathLike[str]"]] = None,
    submitted_at: tp.Optional[float] = None,
    path: tp.Optional[Path] = None,
    strict: bool = False,
) -> tp.Optional[Path]:
    """Append one line for a run that was just submitted; returns the registry's path.

    Called once per run, after the submission succeeded (``hpctrain.submit``'s backend; a sweep calls it once
    per task with ``kind="sweep-task"`` and ``sweep=`` its directory). The registry is a convenience: a write
    that fails (a read-only or full home, a stuck lock) must never fail the submission that already
    happened, so it is one warning line on stderr and None; ``strict=True`` raises the OSError instead.
    ``path`` replaces :func:`registry_path` (tests)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    target = path if path is not None else registry_path()
    record: tp.Dict[str, tp.Any] = {
        "schema": SCHEMA,
        "run_dir": os.path.abspath(os.fspath(run_dir)),
        "job_id": None if job_id is None else str(job_id),
        "name": str(name),
        "cluster": str(cluster),
        "submitted_at": time.time() if submitted_at is None else float(submitted_at),
        "user": user_name(),
        "kind": kind,
        "host": socket.gethostname(),
    }
    if sweep is not None:
        record["sweep"] = os.path.abspath(os.fspath(sweep))
    line = (json.dumps(record, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n").encode()
    try:
        if len(line) > LINE_LIMIT:
            raise OSError(errno.E2BIG, f"the record is {len(line)} bytes, over {LINE_LIMIT}")
        _append(target, line)
    except OSError as exc:
        if strict:
            raise
        why = exc.strerror or str(exc)
        print(
            f"hpctrain: warning: run not added to the registry {target} ({why}); `runs` will not list it",
            file=sys.stderr,
        )
        return None
    return target


def _entry(value: tp.Any) -> tp.Optional[Registered]:
    """A registry line's object as :class:`Registered`; None when it is not one (wrong types, no run_dir)."""
    if not isinstance(value, dict):
        return None
    run_dir, job = value.get("run_dir"), value.get("job_id")
    if not isinstance(run_dir, str) or not run_dir or not (job is None or isinstance(job, (str, int))):
        return None
    when = value.get("submitted_at")
    when = float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None

    def text(key: str, default: str = "") -> str:
        v = value.get(key)
        return v if isinstance(v, str) else default

    sweep = value.get("sweep")
    return Registered(
        run_dir=run_dir,
        job_id=None if job is None else str(job),
        name=text("name"),
        cluster=text("cluster", "slurm"),
        submitted_at=when,
        user=text("user"),
        kind=text("kind", "submit"),
        sweep=sweep if isinstance(sweep, str) else None,
        host=value.get("host") if isinstance(value.get("host"), str) else None,
    )


def read_runs(path: tp.Optional[Path] = None, *, warn: tp.Optional[tp.TextIO] = None) -> tp.List[Registered]:
    """Every run in the registry, oldest first (a run submitted again with ``--resume`` appears once per
    submission; the caller keeps the newest). A missing registry (or directory) is no runs. Lines that are
    not a record (the torn last line of a writer that died, damage) are skipped with ONE warning line on
    ``warn`` (stderr) naming how many and the first; a registry that cannot be read is one warning and []."""
    target = path if path is not None else registry_path()
    out = warn if warn is not None else sys.stderr
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        print(f"hpctrain: warning: cannot read the run registry {target} ({exc.strerror or exc})", file=out)
        return []
    try:
        # a shared lock: no half-written record is read (a writer holds it for milliseconds; never wait long)
        locked = _lock(fd, fcntl.LOCK_SH, READ_LOCK_TIMEOUT_S)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        print(f"hpctrain: warning: cannot read the run registry {target} ({exc.strerror or exc})", file=out)
        return []
    finally:
        os.close(fd)
    runs: tp.List[Registered] = []
    bad: tp.List[int] = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            entry = _entry(json.loads(raw))
        except (ValueError, UnicodeDecodeError, RecursionError):
            entry = None
        if entry is None:
            bad.append(n)
        else:
            runs.append(entry)
    if bad:
        torn = " (the last one torn: its writer died)" if bad[-1] == n and not data.endswith(b"\n") else ""
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        print(f"hpctrain: warning: {target}: skipped line {bad[0]}{more}: not a run record{torn}", file=out)
    return runs
