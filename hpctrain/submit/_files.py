"""Reading user-named files and checking user-named paths on the login node without hanging or crashing.

A FIFO named as a config file would block ``open()`` forever, a directory raises IsADirectoryError, and a
path component over the filesystem's name limit only fails when something finally creates it (after the
job was half set up). These helpers turn each case into one :class:`UsageError` naming the option.
"""

from __future__ import annotations

import os
import stat
import typing as tp
from pathlib import Path

from hpctrain.errors import UsageError

__all__ = ["read_regular_file", "check_path_limits", "shorten", "NAME_MAX", "PATH_MAX"]

# Linux's limits; used when pathconf cannot answer (the directory does not exist yet).
NAME_MAX = 255
PATH_MAX = 4096


def read_regular_file(path: tp.Union[str, Path], *, what: str, limit: int = 1 << 20) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Opened with O_NONBLOCK so that a FIFO cannot block the open, then checked with fstat on the
    descriptor (not a separate stat of the name, which could be swapped in between).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{what} {shorten(path)}: cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise UsageError(f"{what} {shorten(path)} is {kind}; name a regular file")
        if st.st_size > limit:
            raise UsageError(f"{what} {shorten(path)} is {st.st_size} bytes; at most {limit} are read")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)[: limit + 1]
    except OSError as exc:
        raise UsageError(f"{what} {shorten(path)}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _limit(path: Path, name: str, default: int) -> int:
    """``pathconf`` of the nearest existing ancestor (the limits of the filesystem it will live on)."""
    for parent in (path, *path.parents):
        try:
            return int(os.pathconf(parent, name))
        except (OSError, ValueError):
            continue
    return default


def check_path_limits(path: Path, *, what: str) -> None:
    """Refuse a path the filesystem cannot hold: a component over NAME_MAX bytes or a total over PATH_MAX."""
    raw = os.fsencode(path)
    name_max = _limit(path, "PC_NAME_MAX", NAME_MAX)
    for part in raw.split(b"/"):
        if len(part) > name_max:
            raise UsageError(
                f"{what}: the path component {shorten(os.fsdecode(part))!r} is {len(part)} bytes; "
                f"this filesystem allows {name_max}: use a shorter name"
            )
    path_max = _limit(path, "PC_PATH_MAX", PATH_MAX)
    if len(raw) >= path_max:
        raise UsageError(f"{what}: the path is {len(raw)} bytes; this system allows {path_max - 1}: use a shorter one")


def shorten(text: tp.Any, keep: int = 60) -> str:
    """User text cut for an error line (a 5000-character name must not become a 5000-character error)."""
    text = str(text)
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"
