"""Read-ahead of a restore's shard files: the disk streams them while the restore parses, exchanges and plans.

A restore reads its bytes only once it knows where every tensor lies: the headers parsed, the index exchanged, the
plan made (tens of milliseconds of CPU a rank for 4000 tensors). On a disk or a parallel filesystem the device is
idle meanwhile. :func:`readahead` asks the kernel (``POSIX_FADV_WILLNEED``) to start reading the files this rank
will read as soon as its share of the headers is parsed, from a thread of its own (the call blocks while the
device's queue is full: a shard of gigabytes would hold the restore for most of its read), so that the read finds
them in the page cache or on their way. The thread asks for :data:`STEP_BYTES` at a time and stops between two
steps when the restore is done with the step (:meth:`Readahead.stop`): a restore that fails before it reads never
waits for a whole shard to be read ahead. A hint only: the restore never waits for it to take effect, no error of
it is raised, and on tmpfs, whose files are memory already, the kernel ignores it. docs/checkpoint.md, "Where a
restore's time goes", has what it is worth.
"""

from __future__ import annotations

import logging
import os
import threading
import typing as tp
from pathlib import Path

from hpctrain.ckpt._reader import open_regular, read_manifest

__all__ = ["Advise", "Readahead", "STEP_BYTES", "readahead", "shards_to_read_ahead"]

log = logging.getLogger("hpctrain.ckpt")

Advise = tp.Callable[[int, Path, int, int], None]
"""What the thread does with each step of a file it opened: ``(descriptor, path, offset, length)``. The default asks
the kernel to read that range (``posix_fadvise(fd, offset, length, POSIX_FADV_WILLNEED)``); tests pass one that
records instead."""

STEP_BYTES = 64 << 20
"""The bytes the thread asks for at a time: the most a stopped hint still asks the kernel for (a step returns once
it is queued; a device whose queue holds this much returns at once)."""


def _willneed(fd: int, path: Path, offset: int, length: int) -> None:
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


def shards_to_read_ahead(saved_world: int, rank: int, world: int, mode: str) -> tp.List[int]:
    """The shards worth reading ahead on ``rank`` of ``world`` for a restore in ``mode`` of a checkpoint saved by
    ``saved_world`` ranks: every one for ``read_all`` and for a world of one (this rank reads them all); for
    ``read_once`` the shard this rank wrote when the world is the one that saved it (its part of the packed buffer
    is that shard's bytes, as the save cut the same state into the same parts: ``_state.split_replicated``), none
    for another world (which files its part falls in is known only from the plan, and on several hosts a wrong guess
    reads a part that another host reads, over the network, for nothing)."""
    if mode == "read_all" or world == 1:
        return list(range(saved_world))
    if mode == "read_once" and saved_world == world and 0 <= rank < world:
        return [rank]
    return []


class Readahead:
    """The running hint (:func:`readahead`): :meth:`stop` once the restore is done with its step."""

    def __init__(self, thread: tp.Optional[threading.Thread] = None, done: tp.Optional[threading.Event] = None) -> None:
        self._thread, self._done = thread, done

    def wait(self, timeout: tp.Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the hint to end on its own (every step asked for); whether it has.
        For tests and tools: a restore calls :meth:`stop`."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def stop(self) -> None:
        """End the hint: no step is asked for after this, and its thread has ended when this returns (after the step
        it was asking for, if any). Idempotent."""
        if self._done is not None:
            self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def readahead(
    ckpt_dir: Path,
    manifest: tp.Optional[tp.Dict[str, tp.Any]],
    rank: int,
    world: int,
    mode: str,
    *,
    advise: tp.Optional[Advise] = None,
    step_bytes: int = STEP_BYTES,
) -> Readahead:
    """Start reading ahead (in a thread) the shard files of ``ckpt_dir`` that rank ``rank`` of ``world`` is about to
    read in ``mode`` (:func:`shards_to_read_ahead`). ``manifest``: the step's manifest when the caller has read it
    (else the thread reads it; nothing is read ahead when it cannot). A file that is not a regular file (a FIFO, a
    symbolic link) is never opened for it; any error ends the hint, silently: the restore finds and reports it.
    ``step_bytes``: :data:`STEP_BYTES` (tests take smaller steps)."""
    if advise is None and not hasattr(os, "posix_fadvise"):  # pragma: no cover - not on Linux
        return Readahead()
    done = threading.Event()

    def run() -> None:
        try:
            m = manifest if manifest is not None else read_manifest(ckpt_dir)
            shards = m["shards"]
            for i in shards_to_read_ahead(len(shards), rank, world, mode):
                path = ckpt_dir / shards[i]["file"]
                with open_regular(path) as f:
                    size = os.fstat(f.fileno()).st_size
                    for offset in range(0, size, step_bytes):
                        if done.is_set():
                            return
                        (advise or _willneed)(f.fileno(), path, offset, min(step_bytes, size - offset))
        except Exception as exc:  # noqa: BLE001 - a hint: whatever is wrong, the restore itself reports it
            log.debug("hpctrain.ckpt: no read-ahead of %s: %s", ckpt_dir.name, exc)

    thread = threading.Thread(target=run, name="hpctrain-ckpt-readahead", daemon=True)
    thread.start()
    return Readahead(thread, done)
