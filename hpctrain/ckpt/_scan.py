"""What a checkpoint directory holds, which temporaries may still be live, retention. Pure stdlib (login nodes).

Clean-up never removes what may still be in use or the only copy of a step:

* a save's temporary directory holds one small owner file per rank (:data:`OWNER_PREFIX`: host, pid,
  job id, start time). It is removed only when every owner is provably gone (same host, pid not
  running), when it belongs to an earlier restart of the caller's own job, or when nothing in it
  changed for ``older_than_s`` (default :data:`ABANDONED_AFTER_S`);
* a re-save moves the previous copy of a step aside as ``step-N.replaced-*`` before renaming the new
  one into place; :func:`settle_replaced` deletes that copy once a committed ``step-N`` exists again,
  and renames it back when none does (the save died between its two renames);
* a leftover temporary file of an atomic write (``.LATEST.tmp-*``) is removed once older than the bound.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import socket
import stat
import threading
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain._atomic import TMP_NAME
from hpctrain._procs import pid_alive
from hpctrain.ckpt._format import CheckpointFormatError, parse_name, step_name
from hpctrain.ckpt._reader import open_regular, read_manifest

__all__ = [
    "ABANDONED_AFTER_S",
    "OWNER_PREFIX",
    "Entry",
    "scan",
    "owner_record",
    "plan_retention",
    "settle_replaced",
    "stale_write_files",
    "Deleter",
    "remove_dir",
]

log = logging.getLogger("hpctrain.ckpt")

from hpctrain.ckpt.config import ABANDONED_AFTER_S  # noqa: E402 - the one definition

"""A temporary whose owner cannot be proven gone is left alone until nothing in it changed for this long."""
OWNER_PREFIX = ".owner-r"
"""``.owner-r<rank>.json`` in a save's temporary directory: who is writing it."""
_MAX_OWNER_BYTES = 4096
_TMP_TAG = re.compile(r"^j(?P<job>[A-Za-z0-9_]+)-r(?P<restart>\d+)-")
_WRITE_TMP = TMP_NAME  # hpctrain._atomic owns its temporary names


@dataclass
class Entry:
    name: str
    step: int
    status: str
    """committed | incomplete (final name without a valid manifest) | in-progress (tmp that may be live) |
    abandoned (tmp, provably dead or stale) | replaced (previous copy of a re-saved step) | quarantined | deleting"""
    path: Path
    manifest: tp.Optional[tp.Dict[str, tp.Any]] = None
    error: str = ""
    """Why a dir is incomplete, or why a tmp dir counts as in-progress/abandoned."""

    @property
    def bytes(self) -> int:
        if self.manifest:
            return sum(s["bytes"] for s in self.manifest["shards"])
        try:
            return sum(os.lstat(p).st_size for p in self.path.iterdir())
        except OSError:
            return 0

    @property
    def mtime(self) -> float:
        if self.manifest and "time" in self.manifest:
            return float(self.manifest["time"])
        try:
            return os.lstat(self.path).st_mtime
        except OSError:
            return 0.0


def owner_record(rank: int, job_id: str, restart_count: int) -> bytes:
    """The content of this process's owner file in a save's temporary directory."""
    rec = {"host": socket.gethostname(), "pid": os.getpid(), "rank": rank, "job_id": job_id}
    rec.update(restart_count=restart_count, started=time.time())
    return json.dumps(rec).encode()


def _pid_running(pid: int) -> bool:
    return pid_alive(pid) is not False  # a pid we cannot judge: assume it is running


def _tmp_liveness(
    path: Path, older_than_s: float, job: tp.Optional[tp.Tuple[str, int]], now: float
) -> tp.Tuple[bool, str]:
    """(may be live, why) for a save's temporary directory."""
    m = _TMP_TAG.match(path.name.split(".tmp-", 1)[-1])
    if job is not None and job[0] and m and m["job"] == job[0] and int(m["restart"]) < job[1]:
        return False, f"left by restart {m['restart']} of this job"
    try:
        newest = os.lstat(path).st_mtime
        owners = []
        for name in os.listdir(path):
            newest = max(newest, os.lstat(path / name).st_mtime)
            if name.startswith(OWNER_PREFIX):
                try:
                    with open_regular(path / name) as f:
                        owners.append(json.loads(f.read(_MAX_OWNER_BYTES)))
                except (CheckpointFormatError, OSError, ValueError, RecursionError):
                    owners.append(None)  # unreadable: cannot prove its writer gone
    except FileNotFoundError:
        return False, "gone"
    except OSError as exc:
        return True, f"cannot inspect: {exc.strerror or exc}"
    age = now - newest
    if age > older_than_s:
        return False, f"untouched for {age:.0f}s"
    host = socket.gethostname()
    if owners and all(
        isinstance(o, dict) and o.get("host") == host and type(o.get("pid")) is int and not _pid_running(o["pid"])
        for o in owners
    ):
        return False, "its writers are no longer running"
    who = ", ".join(
        f"{o.get('host')}:{o.get('pid')}" for o in owners[:3] if isinstance(o, dict)
    )  # shown to the user: who may still be writing
    return True, f"written to {age:.0f}s ago" + (f" by {who}" if who else "")


def scan(
    root: tp.Union[str, os.PathLike],
    *,
    read_manifests: bool = True,
    older_than_s: float = ABANDONED_AFTER_S,
    job: tp.Optional[tp.Tuple[str, int]] = None,
) -> tp.List[Entry]:
    """Every hpctrain entry under ``root`` sorted by step.

    A final-named dir counts as committed only with a valid manifest (the name alone proves nothing);
    one bad manifest makes that entry incomplete and hides nothing else. Symbolic links and anything
    that is not a directory are ignored. ``job`` = (job id, restart count) of the caller: temporaries
    of its earlier restarts are abandoned whatever their age.
    """
    root = Path(root)
    out: tp.List[Entry] = []
    now = time.time()
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        parsed = parse_name(name)
        if parsed is None:
            continue
        try:
            if not stat.S_ISDIR(os.lstat(root / name).st_mode):
                continue
        except OSError:
            continue
        step, kind = parsed
        entry = Entry(name, step, kind, root / name)
        if kind == "tmp":
            live, entry.error = _tmp_liveness(entry.path, older_than_s, job, now)
            entry.status = "in-progress" if live else "abandoned"
        elif kind == "committed":
            if read_manifests:
                try:
                    entry.manifest = read_manifest(entry.path)
                except CheckpointFormatError as exc:
                    entry.status, entry.error = "incomplete", str(exc)
            elif not os.path.lexists(entry.path / "MANIFEST.json"):
                entry.status = "incomplete"
        out.append(entry)
    out.sort(key=lambda e: (e.step, e.name))
    return out


def stale_write_files(root: tp.Union[str, os.PathLike], older_than_s: float = ABANDONED_AFTER_S) -> tp.List[Path]:
    """Temporary files of atomic writes (``.LATEST.tmp-*``) that a killed process left in ``root``."""
    root = Path(root)
    out = []
    now = time.time()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        if _WRITE_TMP.match(name):
            try:
                st = os.lstat(root / name)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) and now - st.st_mtime > older_than_s:
                out.append(root / name)
    return sorted(out)


def plan_retention(entries: tp.Sequence[Entry], keep_last: int, keep_every: int = 0) -> tp.List[Entry]:
    """Committed entries to delete: all but the newest ``keep_last`` and those with ``step % keep_every == 0``.

    Only committed checkpoints count; the newest committed one is never returned.
    """
    committed = sorted((e for e in entries if e.status == "committed"), key=lambda e: e.step)
    if not committed or keep_last <= 0:
        return []
    keep = {e.step for e in committed[-keep_last:]} | {committed[-1].step}
    if keep_every > 0:
        keep |= {e.step for e in committed if e.step % keep_every == 0}
    return [e for e in committed if e.step not in keep]


def settle_replaced(
    root: tp.Union[str, os.PathLike], entries: tp.Sequence[Entry], *, dry_run: bool = False
) -> tp.Tuple[tp.List[Entry], tp.List[Entry]]:
    """(deleted, restored): previous copies of re-saved steps. A copy is deleted only when a committed
    ``step-N`` exists; with no ``step-N`` at all (the re-save died between its renames) the newest copy
    is renamed back to ``step-N``. With an incomplete ``step-N`` both are kept for a human to judge."""
    root = Path(root)
    committed = {e.step for e in entries if e.status == "committed"}
    taken = {e.step for e in entries if e.status in ("committed", "incomplete")}
    deleted, restored = [], []
    replaced = sorted((e for e in entries if e.status == "replaced"), key=lambda e: e.mtime, reverse=True)
    for e in replaced:
        if e.step in committed:
            deleted.append(e)
            if not dry_run:
                remove_dir(e.path)
        elif e.step not in taken:
            taken.add(e.step)
            restored.append(e)
            if not dry_run:
                try:
                    os.rename(e.path, root / step_name(e.step))
                    log.warning(
                        "hpctrain.ckpt: a re-save of step %d was interrupted; the previous copy is back", e.step
                    )
                except OSError as exc:  # someone else restored or re-saved it meanwhile
                    log.warning("hpctrain.ckpt: could not restore %s: %s", e.path, exc)
    return deleted, restored


def remove_dir(path: Path) -> None:
    """Rename out of the committed namespace first (atomic), then delete: a half-deleted checkpoint
    can never look committed."""
    parsed = parse_name(path.name)
    target = path
    if parsed is not None and parsed[1] != "deleting":
        target = path.with_name(f"{path.name.split('.', 1)[0]}.deleting-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return
    shutil.rmtree(target, ignore_errors=True)


class Deleter:
    """One daemon thread that deletes directories (and plans retention) in the background: never blocks a save."""

    def __init__(self) -> None:
        self._q: "queue.Queue[tp.Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="hpctrain-ckpt-gc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                item() if callable(item) else remove_dir(item)
            except Exception as exc:  # noqa: BLE001 - gc must never kill training
                log.warning("hpctrain.ckpt: could not delete %s: %s", item, exc)
            finally:
                self._q.task_done()

    def submit(self, item: tp.Union[Path, tp.Callable[[], None]]) -> None:
        """A directory to delete, or a callable to run (a retention pass)."""
        self._q.put(item)

    def join(self) -> None:
        """Wait until everything submitted so far is deleted."""
        self._q.join()

    def close(self) -> None:
        """Finish what was submitted, then stop the thread."""
        self._q.put(None)
        self._thread.join()
