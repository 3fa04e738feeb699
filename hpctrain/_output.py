"""Writing the file or directory a user named on the command line (stdlib only: every login tool imports it).

One owner for ``-o FILE`` / ``--plot FILE`` / ``OUT.h5`` / ``-o DIR``, so that every command treats the
name the way a shell redirection would, and never destroys what the name points at:

* a new path, or an existing regular file: written atomically (a temporary file beside it, fsync, rename,
  fsync of the directory; :mod:`hpctrain._atomic`'s recipe), following the command's overwrite rule;
  a failed write leaves the old file and no temporary behind;
* a symbolic link to a regular file (or a dangling one): the *target* is written, atomically at the
  target's path; the link stays a link;
* a character device, a FIFO, ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N`` (or a link to any of them):
  written *through*, as ``>`` would: the device is opened for writing (no create, no rename) or the
  descriptor written to. ``-o /dev/full`` is one ``No space left on device`` line, and ``/dev/full`` is
  still the device afterwards;
* a directory, a block device, a parent that is a file or does not exist: one :class:`UsageError` line
  (``cannot write /a/file/x.html: /a/file is not a directory; ...``), nothing written.

:func:`output_file` checks and classifies a name (:class:`OutputFile`, whose ``write_bytes`` /
``write_with`` write it); :func:`write_output` is both in one call. :func:`output_dir` is the same check
for an output *directory*, :func:`check_output_parent` for a path whose parents a command creates itself.
A write that fails is one :class:`HpctrainError` line (exit 1) naming the path and the system's reason.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import typing as tp
from pathlib import Path

from hpctrain._atomic import fsync_dir, tmp_path
from hpctrain._files import check_path_limits, shorten
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["OutputFile", "output_file", "write_output", "output_dir", "check_output_parent"]

PathLike = tp.Union[str, "os.PathLike[str]"]

_STD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_PATH = re.compile(r"/(?:dev/fd|proc/(self|thread-self|\d+)(?:/task/\d+)?/fd)/(\d+)")
_MAX_HOPS = 40  # the kernel's own limit on symbolic links in one lookup


def _shown(path: PathLike) -> str:
    return shorten(os.fspath(path), 300)


def _fd_alias(path: str) -> tp.Optional[int]:
    """The descriptor ``path`` names (``/dev/stdout``, ``/dev/fd/3``, ``/proc/self/fd/1``, or a symbolic link
    to one of them), else None. These are "magic" links: opening them re-opens whatever the descriptor is
    (a pipe, a terminal, a file opened for appending), so the descriptor itself is written instead."""
    cur = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        if cur in _STD_NAMES:
            return _STD_NAMES[cur]
        m = _FD_PATH.fullmatch(cur)
        if m and m.group(1) in (None, "self", "thread-self", str(os.getpid())):
            return int(m.group(2))
        try:
            target = os.readlink(cur)
        except OSError:  # not a link, or missing
            return None
        cur = os.path.normpath(os.path.join(os.path.dirname(cur), target))
    return None


def _parent_problem(path: Path, *, parents: bool) -> tp.Optional[str]:
    """Why ``path`` cannot be created in its directory (None: it can): an ancestor that is not a directory,
    or (unless ``parents``: the command creates them) a parent that does not exist."""
    parent = path.parent
    missing: tp.Optional[Path] = None
    for ancestor in (parent, *parent.parents):
        try:
            st = os.stat(ancestor)
        except (FileNotFoundError, NotADirectoryError):
            missing = ancestor
            continue
        except OSError as exc:
            return f"{_shown(ancestor)}: {exc.strerror or exc}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{_shown(ancestor)} is not a directory; choose another path"
        break
    if missing is not None and not parents:
        return f"{_shown(parent)} does not exist; create it first or choose another path"
    return None


def _stdout_like(st: os.stat_result) -> bool:
    """Whether ``st`` is the file standard output writes to (the command's own summary then goes to stderr)."""
    try:
        out = os.fstat(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino)


class OutputFile:
    """A checked output name: ``kind`` is ``"file"`` (written atomically at :attr:`path`, the link's target
    for a symbolic link) or ``"stream"`` (a device, FIFO or descriptor, written through). Made by
    :func:`output_file`."""

    def __init__(
        self,
        shown: str,
        kind: str,
        path: Path,
        *,
        fd: tp.Optional[int] = None,
        mode: tp.Optional[int] = None,
        to_stdout: bool = False,
        label: str = "",
    ) -> None:
        self.shown, self.kind, self.path, self.fd, self.mode = shown, kind, path, fd, mode
        self.to_stdout = to_stdout
        """The output is standard output itself (``/dev/stdout``, or the file or terminal stdout goes to)."""
        self.label = label
        self.size = 0
        """Bytes written (after a write)."""

    @property
    def stream(self) -> bool:
        return self.kind == "stream"

    def _failed(self, exc: OSError) -> HpctrainError:
        return HpctrainError(f"{self.label}cannot write {self.shown}: {exc.strerror or exc}")

    # ---- writing ----------------------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> int:
        """Write ``data`` (atomically for a file, through for a stream); returns the bytes written."""
        if self.stream:
            self._through(data)
        else:
            self._atomic(lambda fd: _write_all(fd, data))
        self.size = len(data)
        return self.size

    def write_text(self, text: str) -> int:
        # errors="replace": a lone surrogate that slipped through must not cost the output
        return self.write_bytes(text.encode("utf-8", errors="replace"))

    def write_with(self, produce: tp.Callable[[Path], None]) -> int:
        """Have ``produce(tmp)`` write a regular file at ``tmp`` (an HDF5 writer, which needs a name), then put
        it in place: renamed over a file's path, or copied through a stream. Returns the bytes written."""
        if self.stream:
            fd, name = tempfile.mkstemp(prefix="hpctrain-output-")
            os.close(fd)
            tmp = Path(name)
            try:
                produce(tmp)
                with open(tmp, "rb") as f:
                    while True:
                        chunk = f.read(1 << 20)
                        if not chunk:
                            break
                        self._through(chunk)
                        self.size += len(chunk)
            except OSError as exc:
                raise self._failed(exc) from None
            finally:
                tmp.unlink(missing_ok=True)
            return self.size
        tmp = tmp_path(self.path)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
            produce(tmp)
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
                self.size = os.fstat(fd).st_size
                if self.mode is not None:
                    os.fchmod(fd, self.mode)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._failed(exc) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.size

    def _atomic(self, write: tp.Callable[[int], None]) -> None:
        tmp = tmp_path(self.path)
        fd = -1
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            if self.mode is not None:
                os.fchmod(fd, self.mode)  # an existing file keeps its permissions, as with `>`
            write(fd)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._failed(exc) from None
            raise

    def _through(self, data: bytes) -> None:
        """Write ``data`` through the device, FIFO or descriptor: never created, truncated or renamed."""
        try:
            if self.fd is not None:
                for stream in (sys.stdout, sys.stderr):  # what Python buffered goes first
                    try:
                        stream.flush()
                    except (AttributeError, OSError, ValueError):
                        pass
                _write_all(self.fd, data)
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)  # no O_CREAT: it must be there
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._failed(exc) from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def output_file(path: PathLike, *, overwrite: bool = True, label: str = "", hint: str = "") -> OutputFile:
    """Check the output file ``path`` names and say how it will be written (:class:`OutputFile`); every refusal
    is one :class:`UsageError` line, before anything is written. ``overwrite=False``: an existing file (or a
    link to one) is refused, with ``hint`` (e.g. the flag that allows it) after the reason. ``label``
    prefixes the messages (``"data synth: "``)."""
    raw = os.fspath(path)
    shown = _shown(raw)
    if not raw:
        raise UsageError(f"{label}an empty output path; name a file")
    fd = _fd_alias(raw)
    if fd is not None:
        to_stdout = fd == 1
        if not to_stdout:
            try:
                to_stdout = _stdout_like(os.fstat(fd))
            except OSError:
                pass
        return OutputFile(shown, "stream", Path(raw), fd=fd, to_stdout=to_stdout, label=label)
    try:
        st: tp.Optional[os.stat_result] = os.stat(raw)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        why = _parent_problem(Path(raw), parents=False) or "a parent is not a directory"
        raise UsageError(f"{label}cannot write {shown}: {why}") from None
    except OSError as exc:  # a symlink loop, no permission to look, a name too long
        raise UsageError(f"{label}cannot write {shown}: {exc.strerror or exc}") from None
    if st is not None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{label}cannot write {shown}: it is a directory; give a file name")
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return OutputFile(shown, "stream", Path(raw), to_stdout=_stdout_like(st), label=label)
        if not stat.S_ISREG(mode):
            what = "a block device (a disk)" if stat.S_ISBLK(mode) else "not a regular file, device or FIFO"
            raise UsageError(f"{label}cannot write {shown}: it is {what}; choose another path")
        if not overwrite:
            raise UsageError(f"{label}{shown} already exists{'; ' + hint if hint else ''}")
        real = Path(os.path.realpath(raw)) if os.path.islink(raw) else Path(raw)
        return OutputFile(shown, "file", real, mode=stat.S_IMODE(mode), to_stdout=_stdout_like(st), label=label)
    # a new file, or a dangling link: the file is created where the link points (as `>` would)
    target = Path(os.path.realpath(raw)) if os.path.islink(raw) else Path(raw)
    why = _parent_problem(target, parents=False)
    if why:
        raise UsageError(f"{label}cannot write {shown}: {why}")
    check_path_limits(target, what=f"{label}cannot write {shown}")
    return OutputFile(shown, "file", target, label=label)


def write_output(
    path: PathLike, data: tp.Union[bytes, str], *, overwrite: bool = True, label: str = "", hint: str = ""
) -> OutputFile:
    """:func:`output_file`, then write ``data`` (text as UTF-8); returns the :class:`OutputFile` written."""
    out = output_file(path, overwrite=overwrite, label=label, hint=hint)
    if isinstance(data, str):
        out.write_text(data)
    else:
        out.write_bytes(data)
    return out


def check_output_parent(path: PathLike, *, parents: bool = False, label: str = "") -> None:
    """Refuse an output path whose parent is a file (or, unless ``parents``, does not exist): one line."""
    raw = os.fspath(path)
    if not raw:
        raise UsageError(f"{label}an empty output path; name one")
    why = _parent_problem(Path(os.path.abspath(raw)), parents=parents)
    if why:
        raise UsageError(f"{label}cannot write {_shown(raw)}: {why}")


def output_dir(
    path: PathLike, *, exist_ok: bool = True, parents: bool = False, label: str = "", hint: str = ""
) -> Path:
    """Check the output directory ``path``: an existing directory (or a link to one) is the directory to write
    into (returned resolved: the link's target) when ``exist_ok``, else refused with ``hint``; anything else
    that exists is refused; a new one needs a parent directory (``parents``: only that no ancestor is a file).
    Returns the path to create or write into; the caller creates it."""
    raw = os.fspath(path)
    shown = _shown(raw)
    if not raw:
        raise UsageError(f"{label}an empty output directory; name one")
    try:
        st: tp.Optional[os.stat_result] = os.stat(raw)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        why = _parent_problem(Path(os.path.abspath(raw)), parents=True) or "a parent is not a directory"
        raise UsageError(f"{label}cannot write {shown}: {why}") from None
    except OSError as exc:
        raise UsageError(f"{label}cannot write {shown}: {exc.strerror or exc}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{label}cannot write {shown}: it exists and is not a directory; choose another path")
        if not exist_ok:
            raise UsageError(f"{label}{shown} already exists{'; ' + hint if hint else ''}")
        return Path(os.path.realpath(raw)) if os.path.islink(raw) else Path(raw)
    if os.path.islink(raw):
        raise UsageError(f"{label}cannot write {shown}: a symbolic link to a missing directory; create it first")
    why = _parent_problem(Path(os.path.abspath(raw)), parents=parents)
    if why:
        raise UsageError(f"{label}cannot write {shown}: {why}")
    check_path_limits(Path(raw), what=f"{label}cannot write {shown}")
    return Path(raw)
