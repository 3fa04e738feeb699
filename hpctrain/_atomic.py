"""Durable writes: tmp file, flush, fsync, rename, fsync the directory.

Every manifest, pointer, record and marker hpctrain writes goes through here, so a crash at any
instant leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import typing as tp
from pathlib import Path

__all__ = [
    "fsync_dir",
    "atomic_write_bytes",
    "atomic_write_chunks",
    "atomic_write_text",
    "atomic_write_json",
    "TMP_NAME",
    "tmp_path",
]

TMP_NAME = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]+$")
"""The temporary files of :func:`atomic_write_bytes` (``.NAME.tmp-<pid>-<hex>``): what a killed writer
leaves behind and the checkpoint clean-up removes once stale."""


def tmp_path(path: Path) -> Path:
    """A fresh temporary name beside ``path``, matching :data:`TMP_NAME`."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")


def fsync_dir(path: tp.Union[str, os.PathLike]) -> None:
    """fsync a directory so that a rename or create inside it survives a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: tp.Union[str, os.PathLike], data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The temporary file ``.NAME.tmp-<pid>-<random hex>`` is created with ``O_CREAT | O_EXCL |
    O_NOFOLLOW``: its name cannot be guessed in advance, and a file or symlink planted there makes the
    write fail instead of redirecting it. It lives in the same directory so the rename stays on one
    filesystem (atomic on POSIX, Lustre and GPFS). A killed writer leaves it behind; the checkpoint
    clean-up removes such files once stale.
    """
    atomic_write_chunks(path, (data,), mode)


def atomic_write_chunks(path: tp.Union[str, os.PathLike], chunks: tp.Iterable[bytes], mode: int = 0o644) -> int:
    """:func:`atomic_write_bytes` for data that does not fit in memory (a staged input file): the chunks are
    written in order to the temporary file, which is renamed over ``path`` only after the last one is written and
    fsynced. An exception from ``chunks`` removes the temporary file and leaves ``path`` as it was. Returns the
    bytes written."""
    path = Path(path)
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    total = 0
    try:
        for data in chunks:
            view = memoryview(data)
            total += len(view)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return total


def atomic_write_text(path: tp.Union[str, os.PathLike], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: tp.Union[str, os.PathLike], obj: tp.Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
