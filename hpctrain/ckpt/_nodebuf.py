"""The node exchange of a ``read_once`` restore (``restore_exchange="node"``): one shared-memory buffer that every rank
of a host reads its part of a checkpoint into and then maps copy-on-write, set up with no collective of its own
(docs/checkpoint.md, "Where read_once exchanges the bytes"). :mod:`hpctrain.ckpt._fetch` drives it."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
import typing as tp

import torch

from hpctrain.ckpt._commit import Comm, fault

__all__ = ["NODE_DIR", "NODE_PREFIX", "NodeBuffer", "NO_NODE_MEMORY"]

log = logging.getLogger("hpctrain.ckpt")

NODE_DIR = "/dev/shm"
"""Where the ``node`` exchange puts its buffer (memory: tmpfs). Where it is missing or full, every rank falls
back to the ``host`` route together."""
NODE_PREFIX = "hpctrain-restore-"
NO_NODE_MEMORY = "no memory for the node buffer"
"""How a read error that is no damage starts (the node's tmpfs ran out of memory): the ranks read again over gloo."""


_NODE_STALE_S = 7200.0
"""A buffer file lives from its creation to the end of its exchange (the reports' gather, under
``agreement_timeout_s``); one this old was left by a rank that died in between, and the next exchange on the node
removes it."""


class NodeBuffer:
    """A shared-memory buffer that every rank of this host maps (``MAP_SHARED``): each rank reads its part of the
    checkpoint's bytes into it; once every rank has, each maps the whole file again copy-on-write
    (:meth:`private`): the bytes every rank read, as this rank's own memory, with no copy (a page is copied only
    when this rank writes it: the page cache holds one copy of the node's bytes for every rank).

    Opening it takes no collective: every rank opens (or creates) the file under the name all of them derive from
    the checkpointer's tag and exchange count, and writes a random token into its slot after the data. The reports'
    gather after the reads is the barrier; then each rank checks every rank's token in its mapping
    (:meth:`shared_by`): a rank that does not share this ``/dev/shm`` (another machine or container behind the same
    host name) made a file of its own, so its token is missing from every other rank's mapping and theirs from its:
    every rank finds the mismatch from the same reports, and all of them read again over gloo together, before any
    byte of the buffer is used. So do they when a rank could not open it or ran out of memory while reading into it."""

    def __init__(self, fd: int, mm: tp.Any, nbytes: int, path: str, token: bytes) -> None:
        self.fd, self.nbytes, self.path, self.token = fd, nbytes, path, token
        self.shared: tp.Optional[torch.Tensor] = torch.frombuffer(mm, dtype=torch.uint8)
        self._mm = mm

    @classmethod
    def open(cls, comm: Comm, nbytes: int, rank: int, part: int) -> tp.Optional["NodeBuffer"]:
        """This rank's handle on the node's buffer of ``nbytes`` (its ``part`` of them still free on the tmpfs), or
        None when it cannot have it (the reports then make every rank read again over gloo). Not collective."""
        import mmap

        comm.exchanges += 1
        path = os.path.join(NODE_DIR, f"{NODE_PREFIX}{comm.tag}-{comm.exchanges}")
        size = nbytes + _TOKEN * comm.world  # the tokens' slots after the data
        fd, mm = -1, None
        try:
            fault("node_buffer", rank)
            if rank == 0:
                _sweep_node_buffers(max(_NODE_STALE_S, 2 * comm.timeout_s))
            st = os.statvfs(NODE_DIR)
            if st.f_bavail * st.f_frsize < part:
                raise OSError(errno.ENOSPC, f"{NODE_DIR} has {st.f_bavail * st.f_frsize} bytes free, {part} needed")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise OSError(f"{path}: not a regular file of this user")
            if info.st_size != size:
                os.ftruncate(fd, size)  # the same size on every rank: whichever rank comes first sets it
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            token = secrets.token_bytes(_TOKEN - 1) + b"\x01"  # never all zeros, as an unwritten slot is
            mm[nbytes + _TOKEN * rank : nbytes + _TOKEN * (rank + 1)] = token
        except BaseException as exc:  # whatever it is, the file made here is not left behind
            if mm is not None:
                mm.close()
            if fd >= 0:
                os.close(fd)
                _unlink(path)
            if not isinstance(exc, (OSError, ValueError)):
                raise
            log.info("hpctrain.ckpt: no node buffer on rank %d (%s): the restore exchanges over gloo", rank, exc)
            return None
        return cls(fd, mm, nbytes, path, token)

    def shared_by(self, tokens: tp.Sequence[bytes]) -> bool:
        """Whether every rank's token (from the reports, after every rank wrote its own) is in this mapping."""
        mm = self._mm
        return all(
            t and mm[self.nbytes + _TOKEN * r : self.nbytes + _TOKEN * (r + 1)] == t for r, t in enumerate(tokens)
        )

    def private(self) -> torch.Tensor:
        """The whole buffer, mapped copy-on-write (call once every rank has read its part); the shared mapping
        and the descriptor are released."""
        import mmap

        mm = mmap.mmap(self.fd, self.nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        self.close()
        return torch.frombuffer(mm, dtype=torch.uint8)

    def close(self) -> None:
        """Release this rank's handles and remove the file's name (every rank: each may have made its own, and
        every rank has it open once the reports are gathered); the memory goes with the last mapping."""
        self.shared, self._mm = None, None  # the mapping goes with the last reference to it
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            _unlink(self.path)


_TOKEN = 64
"""Bytes of a rank's token slot after the node buffer's data (one cache line each)."""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sweep_node_buffers(older_than_s: float) -> None:
    """Remove node-exchange buffers left by ranks that died before unlinking them (only this user's)."""
    import time

    try:
        names = [n for n in os.listdir(NODE_DIR) if n.startswith(NODE_PREFIX)]
    except OSError:
        return
    now = time.time()
    for n in names:
        p = os.path.join(NODE_DIR, n)
        try:
            st = os.lstat(p)
            if st.st_uid == os.getuid() and now - st.st_mtime > older_than_s:
                os.unlink(p)
        except OSError:
            pass
