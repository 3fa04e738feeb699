"""The seam between hpctrain and the CUDA runtime for the decisions a CPU test must be able to steer: device
choice, batch delivery and checkpoint staging go through :class:`CudaRuntime`, so that CPU tests (and users
testing their own code) pass :class:`hpctrain.testing.FakeCuda` instead of patching torch.

Not through it, on purpose: calls that only read or restore what a real device already holds, where a fake
would have nothing to say — the CUDA RNG states in a checkpoint (``ckpt/_state.py``), the current device of
a tensor being restored (``ckpt/_dtensor.py``, ``ckpt/_fetch.py``), the device name and NCCL version in the
run identity (``identity/runtime.py``) and the metrics (``train/metrics.py``), the loader's copy stream
(``data/loader.py``) and the probe's synchronize (``launch/probe.py``). Each of those is guarded by
``torch.cuda.is_available()``; the checkpoint, loader and Trainer ones run in ``benchmarks/gpu_checks.sh``
on a GPU (the probe's and the identity's do not yet).

torch is imported inside the methods: the seam itself costs nothing to import on the login node.
"""

from __future__ import annotations

import logging
import typing as tp

__all__ = ["CudaRuntime", "empty_host_cache"]

log = logging.getLogger("hpctrain.cuda")


def empty_host_cache() -> None:
    """Return torch's cached, unused pinned host blocks to the system (the caching host allocator keeps
    freed blocks pinned for reuse until asked)."""
    import torch

    fn = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) or getattr(
        torch._C, "_host_emptyCache", None
    )
    if fn is not None and torch.cuda.is_initialized():
        fn()


class CudaRuntime:
    """The CUDA calls hpctrain makes. Override (or fake) any of them; the groups below say who calls which."""

    # ------------------------------------------------------------ device choice (runtime.process_group)
    def is_available(self) -> bool:
        import torch

        return torch.cuda.is_available()

    def count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def set_device(self, index: int) -> None:
        import torch

        torch.cuda.set_device(index)

    def uuid(self, index: int) -> str:
        import torch

        return str(torch.cuda.get_device_properties(index).uuid)

    # ------------------------------------------------------------ memory per interval (train.memory)
    def max_memory_allocated(self, device: tp.Any) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(device))

    def max_memory_reserved(self, device: tp.Any) -> int:
        import torch

        return int(torch.cuda.max_memory_reserved(device))

    def reset_peak_memory_stats(self, device: tp.Any) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)

    # ------------------------------------------------------------ checkpoint staging (ckpt._staging)
    def synchronize(self, device: int) -> None:
        import torch

        torch.cuda.synchronize(device)

    def pin(self, ptr: int, nbytes: int) -> bool:
        """Page-lock ``[ptr, ptr + nbytes)`` for every device (cudaHostRegisterPortable); False on failure."""
        import torch

        return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1)) == 0

    def unpin(self, ptr: int) -> None:
        import torch

        rc = int(torch.cuda.cudart().cudaHostUnregister(ptr))
        if rc != 0:
            log.warning("hpctrain: cudaHostUnregister of a staging arena failed (cudaError %d)", rc)

    # ------------------------------------------------------------ batch delivery (data._pinned)
    def stream(self, device: tp.Any) -> tp.Any:
        import torch

        return torch.cuda.Stream(device=device)

    def current_stream(self, device: tp.Any) -> tp.Any:
        import torch

        return torch.cuda.current_stream(device)

    def use(self, stream: tp.Any) -> tp.ContextManager[tp.Any]:
        import torch

        return torch.cuda.stream(stream)

    def event(self) -> tp.Any:
        import torch

        return torch.cuda.Event()

    def pinned(self, shape: tp.Tuple[int, ...], dtype: tp.Any) -> tp.Any:
        import torch

        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def to_device(self, t: tp.Any, device: tp.Any) -> tp.Any:
        return t.to(device, non_blocking=True)

    def record_stream(self, t: tp.Any, stream: tp.Any) -> None:
        t.record_stream(stream)

    def empty_host_cache(self) -> None:
        empty_host_cache()
