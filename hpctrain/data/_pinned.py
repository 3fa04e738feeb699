"""Host-to-GPU delivery of batches: a ring of pinned buffers copied on a side stream."""

from __future__ import annotations

import typing as tp

import numpy as np
import torch

from hpctrain._cuda import CudaRuntime, empty_host_cache

__all__ = ["PinnedRing", "empty_host_cache"]


class PinnedRing:
    """Batches to ``device``: each is copied into one of ``depth`` pinned buffers, then to the GPU with a
    non-blocking copy on a side stream, so the copy of batch i+1 overlaps the step on batch i.

    The consumer stream (the one the step runs on: ``stream`` given to :meth:`deliver`, else the one
    current at that call) waits for the copy on the GPU, not the host, and each output tensor is
    recorded on it so the caching allocator does not reuse its memory before the step ran. A pinned
    buffer is refilled only after the copy that last read it has finished (its event).
    """

    def __init__(self, device: torch.device, depth: int = 3, backend: tp.Optional[CudaRuntime] = None) -> None:
        self.device, self.depth = device, depth
        self._cuda = backend or CudaRuntime()
        self._ring: tp.List[tp.Tuple[tp.Dict[str, torch.Tensor], tp.Any]] = []
        self._next = 0
        self._stream: tp.Any = None

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the pinned buffers this ring holds (0 before the first batch and after close)."""
        return sum(t.numel() * t.element_size() for bufs, _ in self._ring for t in bufs.values())

    def deliver(self, views: tp.Mapping[str, np.ndarray], stream: tp.Any = None) -> tp.Dict[str, torch.Tensor]:
        cuda = self._cuda
        if not self._ring:
            shapes = {k: (v.shape, torch.from_numpy(v[:0]).dtype) for k, v in views.items()}
            self._ring = [({k: cuda.pinned(s, d) for k, (s, d) in shapes.items()}, None) for _ in range(self.depth)]
            self._stream = cuda.stream(self.device)
        bufs, event = self._ring[self._next]
        if event is not None:
            event.synchronize()  # the copy that last read this pinned buffer is done
        for key, v in views.items():
            bufs[key].copy_(torch.from_numpy(v))
        with cuda.use(self._stream):
            out = {key: cuda.to_device(t, self.device) for key, t in bufs.items()}
            ev = cuda.event()
            ev.record(self._stream)
        consumer = stream if stream is not None else cuda.current_stream(self.device)
        consumer.wait_event(ev)
        for t in out.values():
            cuda.record_stream(t, consumer)  # the caching allocator must not reuse it before the step ran
        self._ring[self._next] = (bufs, ev)
        self._next = (self._next + 1) % self.depth
        return out

    def close(self) -> None:
        """Drop the pinned buffers, wait for the copies in flight, drop the side stream, and return the
        pinned memory to the system. Idempotent; the ring is rebuilt if used again."""
        stream = self._stream
        had, self._ring, self._next = bool(self._ring), [], 0  # the last references to the pinned buffers
        if stream is not None:
            # every copy that read a buffer, and the events torch's host allocator recorded on this
            # stream when the buffers were freed, are done: the blocks are free, not pending
            stream.synchronize()
        self._stream = None
        if had:
            self._cuda.empty_host_cache()  # freed pinned blocks stay cached (and pinned) otherwise
