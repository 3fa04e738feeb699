"""Safe file plumbing for bundles: regular files only, never follow a link, fsync, no-clobber renames."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import stat
import typing as tp
from pathlib import Path

from hpctrain._atomic import fsync_dir
from hpctrain._files import sha256_fd
from hpctrain.errors import HpctrainError

__all__ = [
    "CHUNK",
    "open_regular",
    "hash_file",
    "copy_file",
    "write_new",
    "link_or_copy",
    "fsync_tree",
    "rename_noreplace",
    "regular_files",
    "HashingReader",
    "archive_compression",
]

CHUNK = 4 << 20
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def open_regular(path: tp.Union[str, "os.PathLike[str]"]) -> int:
    """A read descriptor of the regular file ``path``: a symlink, FIFO, device or directory is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HpctrainError(f"{path}: a symbolic link (only regular files are bundled or read)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HpctrainError(f"{path}: not a regular file")
    return fd


def hash_file(path: tp.Union[str, "os.PathLike[str]"]) -> tp.Tuple[str, int]:
    """(sha256 hex, bytes) of a regular file."""
    fd = open_regular(path)
    try:
        return sha256_fd(fd, block=CHUNK)
    finally:
        os.close(fd)


def _create(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def copy_file(src: tp.Union[str, "os.PathLike[str]"], dst: Path) -> tp.Tuple[str, int]:
    """Copy a regular file to a new ``dst`` (fsynced); (sha256 of what was written, bytes)."""
    sfd = open_regular(src)
    try:
        dfd = _create(dst)
        try:
            digest = sha256_fd(sfd, block=CHUNK, each=lambda piece: _write_all(dfd, piece))
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return digest
    finally:
        os.close(sfd)


def write_new(dst: Path, data: bytes) -> tp.Tuple[str, int]:
    """Write ``data`` to a new file ``dst`` (fsynced); (sha256, bytes)."""
    fd = _create(dst)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest(), len(data)


def link_or_copy(src: Path, dst: Path, *, copy: bool = False) -> str:
    """Hard-link ``src`` as ``dst`` when both lie on one filesystem (``"hardlink"``), else copy (``"copy"``)."""
    fd = open_regular(src)  # refuse links and specials before linking the name
    os.close(fd)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not copy:
        try:
            os.link(src, dst, follow_symlinks=False)
            return "hardlink"
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EACCES):
                raise
    copy_file(src, dst)
    return "copy"


class HashingReader:
    """A read-only file over ``raw`` that hashes (sha256) and counts what it passes on, and never passes on
    more than ``limit`` bytes (a member's declared size: a stream that holds more is cut there)."""

    def __init__(self, raw: tp.BinaryIO, *, limit: tp.Optional[int] = None) -> None:
        self.raw, self.limit, self.size = raw, limit, 0
        self._sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        if self.limit is not None:
            left = self.limit - self.size
            n = left if n is None or n < 0 else min(n, left)
            if n <= 0:
                return b""
        data = self.raw.read(n)
        self._sha.update(data)
        self.size += len(data)
        return data

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


def archive_compression(head: bytes) -> tp.Optional[str]:
    """``"gzip"``, ``"bzip2"`` or ``"xz"`` for a file starting with ``head`` (its first 6 bytes); None: plain."""
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def regular_files(root: Path) -> tp.Tuple[tp.List[Path], tp.List[Path]]:
    """(regular files, anything else) under ``root``, recursively, never following a link; sorted."""
    files: tp.List[Path] = []
    other: tp.List[Path] = []
    stack = [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            for entry in it:
                p = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(p)
                elif entry.is_file(follow_symlinks=False):
                    files.append(p)
                else:
                    other.append(p)
    return sorted(files), sorted(other)


def fsync_tree(root: Path) -> None:
    """fsync every directory under ``root`` (files were fsynced when written), deepest first."""
    dirs = [root]
    for dirpath, dirnames, _ in os.walk(root):
        dirs += [Path(dirpath) / d for d in dirnames]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def _renameat2() -> tp.Optional[tp.Callable[..., int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return tp.cast(tp.Callable[..., int], fn)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError when ``dst`` exists (never replacing it).

    ``renameat2(RENAME_NOREPLACE)`` where the kernel and filesystem have it; else a file is hard-linked into
    place (link never replaces), and a directory is renamed after a check (``rename`` onto an existing empty
    directory would replace it: the check leaves only that narrow race)."""
    fn = _renameat2()
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            fsync_dir(dst.parent)
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    if src.is_dir() and not src.is_symlink():
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)
    else:
        os.link(src, dst)
        os.unlink(src)
    fsync_dir(dst.parent)
