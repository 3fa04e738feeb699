"""Reading files that a user or a damaged run directory names, without hanging or crashing (stdlib only).

A FIFO named as a config file (or left where a record should be) would block ``open()`` forever, a
directory raises IsADirectoryError, ``/dev/zero`` never ends, and a path component over the filesystem's
name limit only fails when something finally creates it (after the job was half set up).
:func:`read_bounded` is the one reader for all of these: non-blocking open, regular files only (checked
on the descriptor), a byte bound. :func:`read_regular_file` turns its refusals into one
:class:`UsageError` naming the option; the run-directory readers (:mod:`hpctrain.rundir`) into warnings.
"""

from __future__ import annotations

import hashlib
import os
import stat
import typing as tp
from pathlib import Path

from hpctrain.errors import UsageError

__all__ = [
    "NotReadable",
    "read_bounded",
    "sha256_fd",
    "read_regular_file",
    "check_path_limits",
    "shorten",
    "NAME_MAX",
    "PATH_MAX",
]

# Linux's limits; used when pathconf cannot answer (the directory does not exist yet).
NAME_MAX = 255
PATH_MAX = 4096


class NotReadable(OSError):
    """The path exists but is not a regular file, is over the byte bound, or cannot be read."""


def read_bounded(
    path: tp.Union[str, "os.PathLike[str]"], *, limit: int, tail: tp.Optional[int] = None
) -> tp.Tuple[bytes, int]:
    """``(bytes, offset they start at)`` of the regular file ``path``: the whole file when it holds at most
    ``limit`` bytes, else NotReadable; with ``tail``, only its last ``tail`` bytes (offset > 0 then).

    Opened with O_NONBLOCK so that a FIFO cannot block the open, then checked with fstat on the
    descriptor (not a separate stat of the name, which could be swapped in between). A missing file raises
    FileNotFoundError; every other failure (a directory, a device, a symlink loop, EIO) NotReadable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NotReadable(f"cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable("a directory, not a file" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        start = 0
        if tail is not None and st.st_size > tail:
            start = os.lseek(fd, st.st_size - tail, os.SEEK_SET)
        elif st.st_size > limit:
            raise NotReadable(f"{st.st_size} bytes, over the {limit}-byte bound")
        want = (tail if tail is not None else limit) + 1  # /proc files report size 0: bound what is read
        chunks: tp.List[bytes] = []
        got = 0
        while got < want:
            chunk = os.read(fd, min(1 << 20, want - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got >= want and tail is None:
            raise NotReadable(f"more than {limit} bytes")
        return b"".join(chunks)[: want - 1], start
    except OSError as exc:
        if isinstance(exc, NotReadable):
            raise
        raise NotReadable(f"cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def sha256_fd(
    fd: int, *, block: int = 4 << 20, each: tp.Optional[tp.Callable[[memoryview], None]] = None
) -> tp.Tuple[str, int]:
    """``(sha256 hex, bytes)`` of what is left to read on the open descriptor ``fd``, read in ``block``-byte
    pieces into one reused buffer (no allocation per block: the hash keeps up with ``sha256sum``). ``each``
    sees every piece as it is hashed (to copy it or keep it); the view is only valid during the call.
    The one streaming hash of files: identity, data fingerprints and bundles all hash through it."""
    h, size = hashlib.sha256(), 0
    buf = bytearray(block)
    view = memoryview(buf)
    while True:
        n = os.readv(fd, [buf])
        if not n:
            return h.hexdigest(), size
        h.update(view[:n])
        if each is not None:
            each(view[:n])
        size += n


def read_regular_file(path: tp.Union[str, Path], *, what: str, limit: int = 1 << 20) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes; anything else is one
    :class:`UsageError` naming ``what`` (the option)."""
    try:
        return read_bounded(path, limit=limit)[0]
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except NotReadable as exc:
        text = str(exc)
        if text.startswith("a directory") or text == "not a regular file":
            kind = "a directory" if text.startswith("a directory") else "not a regular file"
            raise UsageError(f"{what} {shorten(path)} is {kind}; name a regular file") from None
        if "bound" in text or text.startswith("more than"):
            raise UsageError(f"{what} {shorten(path)} is {text.split(',')[0]}; at most {limit} are read") from None
        raise UsageError(f"{what} {shorten(path)}: {text}") from None


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
