"""List what a checkpoint directory holds, and retention. Pure stdlib: the CLI uses this on login nodes."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain.ckpt._format import MANIFEST, CheckpointFormatError, parse_name, read_manifest

__all__ = ["Entry", "scan", "committed_steps", "plan_retention", "Deleter", "remove_dir"]

log = logging.getLogger("hpctrain.ckpt")


@dataclass
class Entry:
    name: str
    step: int
    status: str
    """committed | incomplete (final name without a valid manifest) | abandoned (tmp) | quarantined | deleting"""
    path: Path
    manifest: tp.Optional[tp.Dict[str, tp.Any]] = None
    error: str = ""

    @property
    def bytes(self) -> int:
        if self.manifest:
            return sum(s["bytes"] for s in self.manifest["shards"])
        try:
            return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())
        except OSError:
            return 0

    @property
    def mtime(self) -> float:
        if self.manifest and "time" in self.manifest:
            return float(self.manifest["time"])
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0


def scan(root: tp.Union[str, os.PathLike], *, read_manifests: bool = True) -> tp.List[Entry]:
    """Every hpctrain entry under ``root`` sorted by step; a final-named dir counts as committed only
    with a valid manifest (the name alone proves nothing)."""
    root = Path(root)
    out: tp.List[Entry] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        parsed = parse_name(name)
        if parsed is None or not (root / name).is_dir():
            continue
        step, kind = parsed
        entry = Entry(name, step, {"tmp": "abandoned"}.get(kind, kind), root / name)
        if kind == "committed":
            if read_manifests:
                try:
                    entry.manifest = read_manifest(entry.path)
                except CheckpointFormatError as exc:
                    entry.status, entry.error = "incomplete", str(exc)
            elif not (entry.path / MANIFEST).exists():
                entry.status = "incomplete"
        out.append(entry)
    out.sort(key=lambda e: (e.step, e.name))
    return out


def committed_steps(root: tp.Union[str, os.PathLike]) -> tp.List[int]:
    return [e.step for e in scan(root) if e.status == "committed"]


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
            path = self._q.get()
            try:
                if path is None:
                    return
                path() if callable(path) else remove_dir(path)
            except Exception as exc:  # noqa: BLE001 - gc must never kill training
                log.warning("hpctrain.ckpt: could not delete %s: %s", path, exc)
            finally:
                self._q.task_done()

    def submit(self, item: tp.Union[Path, tp.Callable[[], None]]) -> None:
        """A directory to delete, or a callable to run (a retention pass)."""
        self._q.put(item)

    def join(self) -> None:
        """Wait until everything submitted so far is deleted."""
        self._q.join()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
