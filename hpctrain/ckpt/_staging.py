"""Host staging for saves: a reused arena, or the tensors' own memory for a blocking CPU save."""

from __future__ import annotations

import ctypes
import logging
import mmap
import typing as tp

import numpy as np
import torch

from hpctrain._cuda import CudaRuntime
from hpctrain.ckpt._state import Piece, piece_bytes, piece_view

__all__ = ["Stager", "cuda_devices"]

log = logging.getLogger(__name__)

_ZERO_LEN = 4096
_ZEROS = memoryview(bytes(_ZERO_LEN))
"""Alignment padding of a directly written shard (a gap between two entries is under 64 bytes)."""


_READ = 0x100  # PyBUF_READ


def _memory_view() -> tp.Callable[[int, int, int], memoryview]:
    """``view(address, nbytes, _READ)``: a read-only memoryview of ``nbytes`` at ``address``, memory the caller
    keeps alive. CPython's ``PyMemoryView_FromMemory`` makes it in one call, half the cost of a ctypes array
    wrapped and cast (0.6 against 1.1 us: a blocking save makes one per tensor, thousands on the rank that holds
    the small ones)."""
    try:
        make = ctypes.pythonapi.PyMemoryView_FromMemory
    except AttributeError:  # pragma: no cover - not CPython

        def view(address: int, nbytes: int, flags: int) -> memoryview:
            return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")

        return view
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
    return tp.cast(tp.Callable[[int, int, int], memoryview], make)


_VIEW = _memory_view()


def cuda_devices(pieces: tp.Sequence[Piece]) -> tp.List[int]:
    """Indices of the GPUs that hold any of ``pieces``, sorted."""
    return sorted({p.tensor.device.index or 0 for p in pieces if p.tensor.device.type == "cuda"})


class _Arena:
    """Anonymous mmap pages of exactly the requested size, page-locked with cudaHostRegister when needed.

    Not ``torch.empty(pin_memory=True)``: torch's caching host allocator rounds every pinned block up to
    a power of two (a 2.1 GiB arena would pin 4 GiB) and keeps freed blocks pinned in its cache, so a
    grown or released arena would stay locked. Registering our own pages pins exactly their size, and
    unregistering returns them; the mapping itself goes when the last view of it is dropped.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._map: tp.Optional[mmap.mmap] = mmap.mmap(-1, nbytes)
        self.tensor = torch.from_numpy(np.frombuffer(self._map, dtype=np.uint8))
        self.ptr = self.tensor.data_ptr()
        self.pinned = False

    def release(self, ops: CudaRuntime) -> None:
        if self.pinned:
            ops.unpin(self.ptr)
            self.pinned = False
        self.tensor = None  # type: ignore[assignment]
        m, self._map = self._map, None
        if m is not None:
            try:
                m.close()
            except BufferError:  # a chunk handed to the writer still points into it: unmapped when dropped
                pass


class Stager:
    """Lays this rank's pieces out in one host arena exactly like the shard's data section.

    Async saves (and GPU state) copy every piece into the arena, so the caller can go on at once. A
    blocking save of CPU state passes ``direct_min``: pieces of at least that many bytes are not copied
    but handed to the writer as views of their tensors (the caller waits, so they cannot change), and
    only the small ones are copied, so that thousands of small tensors still make a few large writes.
    The arena is reused while it is large enough (no page faults after the first save; pages under
    direct pieces are never touched); growing it releases the old one.

    GPU state: the arena is page-locked (exactly its size) so the device-to-host copies are DMA. Every
    GPU that holds a piece is synchronised before the copies, so work queued on any of its streams
    (an optimizer step on a side stream, state on a second GPU of this rank) has finished writing the
    state, and again after them, so the copies (each on its tensor's device's current stream) are in
    the arena before it is handed to the writer and before the caller may change the state.
    """

    def __init__(self, cuda: tp.Optional[CudaRuntime] = None) -> None:
        self._cuda = cuda or CudaRuntime()
        self._arena: tp.Optional[_Arena] = None
        self._padded: tp.Tuple[tp.Any, tp.Any] = (None, None)
        """(arena, entries) of the last stage: that arena's padding between those entries is zero."""

    @property
    def pinned_bytes(self) -> int:
        """Host bytes this stager holds page-locked (0 when none)."""
        a = self._arena
        return a.nbytes if a is not None and a.pinned else 0

    def _ensure(self, size: int, pin: bool) -> _Arena:
        a = self._arena
        if a is None or a.nbytes < size:
            self.release()  # the old arena first: a grown state must not hold two arenas pinned
            a = self._arena = _Arena(max(size, 1))
        if pin and not a.pinned:
            a.pinned = self._cuda.pin(a.ptr, a.nbytes)
            if not a.pinned:  # still correct (the copies are synchronous), only slower
                log.warning("hpctrain.ckpt: could not pin the %d-byte staging arena; staging from GPU unpinned", size)
        return a

    def stage(
        self,
        pieces: tp.Sequence[Piece],
        entries: tp.Sequence[tp.Dict[str, tp.Any]],
        size: int,
        direct_min: tp.Optional[int] = None,
    ) -> tp.List[tp.Tuple[int, memoryview]]:
        """The data section as (offset, bytes) chunks that tile ``[0, size)`` in order."""
        if direct_min is not None:
            return self._stage_direct(pieces, entries, size, direct_min)
        devices = cuda_devices(pieces)
        on_gpu = bool(devices)
        a = self._ensure(size, on_gpu)
        arena, base = a.tensor, a.ptr
        whole = memoryview(arena.numpy())
        for d in devices:  # every stream of every GPU holding state is done writing it
            self._cuda.synchronize(d)
        chunks: tp.List[tp.Tuple[int, memoryview]] = []
        # alignment padding: zeros, never stale memory. Only pieces write into the arena, each exactly its
        # bytes, so the padding zeroed by the previous stage of the same entries (the checkpointer reuses
        # them while the layout repeats) into the same arena is still zero: thousands of memsets skipped
        pad = not (self._padded[0] is a and self._padded[1] is entries)
        memmove, memset = ctypes.memmove, ctypes.memset
        pos = seg = 0  # end of the last piece; start of the arena segment not yet emitted
        for p, e in zip(pieces, entries):
            nb, off = e["nbytes"], e["offset"]
            if pad and off > pos:
                memset(base + pos, 0, off - pos)
            if nb:
                t = p.tensor
                plain = t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg()
                if plain and direct_min is not None and nb >= direct_min:
                    if off > seg:
                        chunks.append((seg, whole[seg:off]))
                    chunks.append((off, piece_bytes(p)))
                    seg = off + nb
                elif plain:
                    memmove(base + off, t.data_ptr() + p.start * p.es, nb)
                else:
                    arena[off : off + nb].view(t.dtype).copy_(piece_view(p), non_blocking=on_gpu and a.pinned)
            pos = off + nb
        if pad and size > pos:
            memset(base + pos, 0, size - pos)
        self._padded = (a, entries)
        if size > seg:
            chunks.append((seg, whole[seg:size]))
        for d in devices:  # the copies (queued on each device's current stream) are in the arena
            self._cuda.synchronize(d)
        return chunks

    def _stage_direct(
        self,
        pieces: tp.Sequence[Piece],
        entries: tp.Sequence[tp.Dict[str, tp.Any]],
        size: int,
        direct_min: int,
    ) -> tp.List[tp.Tuple[int, memoryview]]:
        """A blocking save of CPU state: every contiguous CPU piece of at least ``direct_min`` bytes as a view of
        its tensor's memory, the padding between them as views of one zero buffer; the other pieces (smaller,
        strided, conj/neg views) are copied into the arena, and each run of them with the padding between them
        is one chunk. The writer hands the chunks to the kernel in a few ``writev`` calls, so the tensors cost
        neither a copy in user space nor the page faults of a fresh arena (a first save's). The views point into
        the pieces' tensors: the caller keeps ``pieces`` alive until the chunks are written."""
        a: tp.Optional[_Arena] = None
        base, whole = 0, memoryview(b"")
        chunks: tp.List[tp.Tuple[int, memoryview]] = []
        append, view, zeros, memmove, memset = chunks.append, _VIEW, _ZEROS, ctypes.memmove, ctypes.memset
        pos, run = 0, -1  # end of the last piece; start of the open run of arena bytes [run, pos), -1: none
        for p, e in zip(pieces, entries):
            nb, off = e["nbytes"], e["offset"]
            if not nb:
                continue
            t = p.tensor
            if not t.is_cpu:  # state on a GPU is copied into the (pinned) arena like an async save's (checked
                # here, not in a pass of its own over thousands of pieces; what was done so far is redone there)
                return self.stage(pieces, entries, size, None)
            plain = t.is_contiguous() and not t.is_conj() and not t.is_neg()
            if plain and nb >= direct_min:
                if run >= 0:
                    append((run, whole[run:pos]))
                    run = -1
                if off > pos:
                    append((pos, zeros[: off - pos] if off - pos <= _ZERO_LEN else memoryview(bytes(off - pos))))
                append((off, view(t.data_ptr() + p.start * p.es, nb, _READ)))
            else:
                if a is None:
                    a = self._ensure(size, False)
                    self._padded = (None, None)  # its padding is no longer known to be zero
                    base, whole = a.ptr, memoryview(a.tensor.numpy())
                if run < 0:
                    run = pos
                if off > pos:
                    memset(base + pos, 0, off - pos)
                if plain:
                    memmove(base + off, t.data_ptr() + p.start * p.es, nb)
                else:
                    a.tensor[off : off + nb].view(t.dtype).copy_(piece_view(p))
            pos = off + nb
        if run >= 0:
            if size > pos:
                memset(base + pos, 0, size - pos)
            append((run, whole[run:size]))
        elif size > pos:
            append((pos, zeros[: size - pos] if size - pos <= _ZERO_LEN else memoryview(bytes(size - pos))))
        return chunks

    def release(self) -> None:
        """Unpin and drop the arena (the next save allocates a new one)."""
        a, self._arena = self._arena, None
        self._padded = (None, None)
        if a is not None:
            a.release(self._cuda)
