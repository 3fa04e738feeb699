"""Host staging for saves: a reused arena, or the tensors' own memory for a blocking CPU save."""

from __future__ import annotations

import ctypes
import typing as tp

import torch

from hpctrain.ckpt._state import Piece, piece_bytes, piece_view

__all__ = ["Stager"]


class Stager:
    """Lays this rank's pieces out in one host arena exactly like the shard's data section.

    Async saves (and GPU state) copy every piece into the arena, so the caller can go on at once. A
    blocking save of CPU state passes ``direct_min``: pieces of at least that many bytes are not copied
    but handed to the writer as views of their tensors (the caller waits, so they cannot change), and
    only the small ones are copied, so that thousands of small tensors still make a few large writes.
    The arena is reused while it is large enough (no page faults after the first save; pages under
    direct pieces are never touched) and is pinned when the state lives on a GPU.
    """

    def __init__(self) -> None:
        self._arena: tp.Optional[torch.Tensor] = None

    def stage(
        self,
        pieces: tp.Sequence[Piece],
        entries: tp.Sequence[tp.Dict[str, tp.Any]],
        size: int,
        direct_min: tp.Optional[int] = None,
    ) -> tp.List[tp.Tuple[int, memoryview]]:
        """The data section as (offset, bytes) chunks that tile ``[0, size)`` in order."""
        on_gpu = any(p.tensor.device.type == "cuda" for p in pieces)
        if self._arena is None or self._arena.numel() < size or (on_gpu and not self._arena.is_pinned()):
            self._arena = None
            self._arena = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=on_gpu)
        arena = self._arena
        whole = memoryview(arena.numpy())
        base = arena.data_ptr()
        chunks: tp.List[tp.Tuple[int, memoryview]] = []
        pos = seg = 0  # end of the last piece; start of the arena segment not yet emitted
        for p, e in zip(pieces, entries):
            nb, off = e["nbytes"], e["offset"]
            if off > pos:  # alignment padding: zeros, never stale memory
                ctypes.memset(base + pos, 0, off - pos)
            if nb:
                t = p.tensor
                plain = t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg()
                if plain and direct_min is not None and nb >= direct_min:
                    if off > seg:
                        chunks.append((seg, whole[seg:off]))
                    chunks.append((off, piece_bytes(p)))
                    seg = off + nb
                elif plain:
                    ctypes.memmove(base + off, t.data_ptr() + p.start * p.es, nb)
                else:
                    arena[off : off + nb].view(t.dtype).copy_(piece_view(p), non_blocking=on_gpu)
            pos = off + nb
        if size > pos:
            ctypes.memset(base + pos, 0, size - pos)
        if size > seg:
            chunks.append((seg, whole[seg:size]))
        if on_gpu:
            torch.cuda.synchronize()
        return chunks

    def release(self) -> None:
        self._arena = None
