"""Memory of one rank, per metrics interval: device peaks, host RSS, and the training state it holds.

* GPU: ``max_memory_allocated`` / ``max_memory_reserved`` since the previous interval (the peak is reset
  after each reading, through :class:`hpctrain._cuda.CudaRuntime`);
* host: the resident set size of this process now (``/proc/self/statm``; on CPU runs the model lives here);
* ``state_bytes``: the bytes of the parameters, buffers and optimizer state (not gradients) this rank
  holds, counting a DTensor (FSDP2 / HSDP / tensor parallel) by its local shard only, so under fsdp it is
  about total / world, under ddp the whole.
"""

from __future__ import annotations

import os
import typing as tp

import torch

__all__ = ["MemoryProbe", "state_bytes", "rss_bytes", "FIELDS"]

FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "rss_bytes", "state_bytes")
"""The per-rank memory figures of an interval record's ``memory`` (each as min/median/max/max_rank)."""


def _local_bytes(t: tp.Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    local = t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t
    return int(local.numel() * local.element_size())


def state_bytes(module: torch.nn.Module, optimizer: tp.Optional[torch.optim.Optimizer] = None) -> int:
    """Bytes of ``module``'s parameters and buffers plus ``optimizer``'s state tensors on this rank (each
    storage once: tied weights count once; DTensors by their local shard)."""
    seen: tp.Set[int] = set()
    total = 0

    def add(t: tp.Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += _local_bytes(t)

    for p in module.parameters():
        add(p)
    for b in module.buffers():
        add(b)
    if optimizer is not None:
        for st in optimizer.state.values():
            for v in st.values():
                add(v)
    return total


def rss_bytes() -> float:
    """This process's resident set size now (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


class MemoryProbe:
    """Reads the interval's figures of :data:`FIELDS` (``read``) and starts the next interval's peak."""

    def __init__(self, device: tp.Any, cuda: tp.Any = None) -> None:
        self.device = torch.device(device)
        self.cuda = None
        if self.device.type == "cuda":
            from hpctrain._cuda import CudaRuntime

            self.cuda = cuda or CudaRuntime()
        self.state_bytes: tp.Optional[float] = None
        """Set by the Trainer after the first optimizer step (optimizer state exists from then on)."""

    def read(self) -> tp.List[float]:
        """[peak allocated, peak reserved, rss, state] (peaks -1 off GPU, state -1 until set); resets peaks."""
        alloc = reserved = -1.0
        if self.cuda is not None:
            alloc = float(self.cuda.max_memory_allocated(self.device))
            reserved = float(self.cuda.max_memory_reserved(self.device))
            self.cuda.reset_peak_memory_stats(self.device)
        state = -1.0 if self.state_bytes is None else float(self.state_bytes)
        return [alloc, reserved, rss_bytes(), state]
