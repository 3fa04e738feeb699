"""Replicated training state sent from one living rank to the others over a process group, from memory.

In-job recovery (:mod:`hpctrain.runtime.recovery`) gives a warm spare the failed rank's place; under DDP every
rank holds the same model and optimizer, so the replacement gets them from a survivor instead of from storage.
Two pieces:

* :func:`broadcast_state`: any nest of dicts, lists and tuples whose leaves are tensors or picklable values.
  The source sends the nest's shape once (``broadcast_object_list``: names, shapes, dtypes, the small values),
  then the tensors as one flat buffer per dtype: a handful of collectives whatever the model's depth. Bytes are
  copied, never converted, so the receiver's tensors are bit-identical to the source's. Tensors travel on the
  group's ``device``: on GPU (NCCL) the parameters go device to device, with no host copy; only the few CPU
  tensors (the RNG states) are staged through the device and put back on the CPU.
* :class:`ReplicatedState`: what of a DDP run's state to send, and the step boundary it is taken at. The
  model's parameters and the optimizer (and scheduler, scaler) change only at the optimizer step, so an
  interrupted step leaves them as the last completed step left them; the loader's position, the RNG streams
  and the buffers (BatchNorm statistics) move during the forward, so they are snapshotted at every step
  boundary (:meth:`ReplicatedState.boundary`, small and in memory) and the snapshot is what is sent.
* :class:`StoredState`: sharded state (FSDP/HSDP), which no survivor holds whole: the dead rank's shards are only
  in storage. Nothing is sent; every rank of the new generation reloads the newest commit (the node-local tier,
  the dead rank's shards from their partner copies, else the global tier) through the caller's ``reload``.
"""

from __future__ import annotations

import random
import typing as tp
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["broadcast_state", "ReplicatedState", "StoredState", "rng_state", "set_rng_state"]


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was in the nest: its index among the tensors of its dtype, shape and home device."""

    dtype: str
    index: int
    shape: tp.Tuple[int, ...]
    device: str


def _wire_dtype(dtype: torch.dtype) -> torch.dtype:
    # gloo has no bool reduction or broadcast path for every version; a bool is one byte, sent as uint8 bytes
    return torch.uint8 if dtype == torch.bool else dtype


def _strip(obj: tp.Any, tensors: tp.Dict[str, tp.List[torch.Tensor]]) -> tp.Any:
    """``obj`` with each tensor replaced by its :class:`_Slot`; the tensors collected by dtype, in order."""
    if isinstance(obj, torch.Tensor):
        name = str(obj.dtype)
        bucket = tensors.setdefault(name, [])
        bucket.append(obj.detach())
        return _Slot(name, len(bucket) - 1, tuple(obj.shape), str(obj.device))
    if isinstance(obj, dict):
        return type(obj)((k, _strip(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _fill(obj: tp.Any, tensors: tp.Mapping[str, tp.List[torch.Tensor]]) -> tp.Any:
    if isinstance(obj, _Slot):
        return tensors[obj.dtype][obj.index]
    if isinstance(obj, dict):
        return type(obj)((k, _fill(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def _slots(obj: tp.Any, out: tp.List[_Slot]) -> tp.List[_Slot]:
    if isinstance(obj, _Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _slots(v, out)
    return out


def broadcast_state(
    obj: tp.Any, *, src: int, rank: int, device: tp.Union[str, torch.device] = "cpu", group: tp.Any = None
) -> tp.Any:
    """``obj`` of rank ``src`` on every rank of ``group`` (the default group when None); every rank calls it.

    On ``src`` the nest is returned as given (its own tensors); elsewhere ``obj`` is ignored and a copy is built,
    each tensor on the device it had on the source (by type: ``cuda`` tensors on this rank's ``device``)."""
    device = torch.device(device)
    tensors: tp.Dict[str, tp.List[torch.Tensor]] = {}
    box = [_strip(obj, tensors) if rank == src else None]
    dist.broadcast_object_list(box, src=src, group=group, device=device)
    skeleton = box[0]
    if rank == src:
        for name in sorted(tensors):  # the same order on every rank: by dtype name
            flat = torch.cat([t.reshape(-1).to(device).view(_wire_dtype(t.dtype)) for t in tensors[name]])
            dist.broadcast(flat, src=src, group=group)
        return obj
    by_dtype: tp.Dict[str, tp.List[_Slot]] = {}
    for slot in _slots(skeleton, []):
        by_dtype.setdefault(slot.dtype, []).append(slot)
    got: tp.Dict[str, tp.List[torch.Tensor]] = {}
    for name in sorted(by_dtype):
        slots = sorted(by_dtype[name], key=lambda s: s.index)
        dtype = getattr(torch, name.split(".")[-1])
        sizes = [int(torch.Size(s.shape).numel()) for s in slots]
        flat = torch.empty(sum(sizes), dtype=_wire_dtype(dtype), device=device)
        dist.broadcast(flat, src=src, group=group)
        flat = flat.view(dtype)
        parts = torch.split(flat, sizes) if sizes else ()
        home = [device if s.device.startswith("cuda") else torch.device(s.device) for s in slots]
        # clone: each tensor owns its memory (a view would keep the whole flat buffer alive through one of them)
        got[name] = [p.view(s.shape).to(h).clone() for p, s, h in zip(parts, slots, home)]
    return _fill(skeleton, got)


def rng_state(device: tp.Union[str, torch.device] = "cpu") -> tp.Dict[str, tp.Any]:
    """This process's random streams: torch's CPU generator, Python's, numpy's, and the device's on GPU."""
    device = torch.device(device)
    state: tp.Dict[str, tp.Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with h5py
        pass
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: tp.Mapping[str, tp.Any], device: tp.Union[str, torch.device] = "cpu") -> None:
    """Put back what :func:`rng_state` took (on a GPU rank, into that rank's own device generator)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), torch.device(device))


class ReplicatedState:
    """A DDP rank's training state as in-job recovery sends it (see the module docstring).

    ``loader``: anything with ``state_dict()``/``load_state_dict()`` whose state is the *global* position (the
    same on every rank, as :class:`~hpctrain.data.H5Loader`'s), so a survivor's state is right for the
    replacement's shard too. Call :meth:`boundary` after every completed step
    (:class:`~hpctrain.runtime.recovery.InJobRecovery` does, from ``completed``)."""

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: tp.Any = None,
        scaler: tp.Any = None,
        loader: tp.Any = None,
        device: tp.Union[str, torch.device] = "cpu",
    ) -> None:
        self.module, self.optimizer, self.scheduler, self.scaler = module, optimizer, scheduler, scaler
        self.loader, self.device = loader, torch.device(device)
        self._boundary: tp.Optional[tp.Dict[str, tp.Any]] = None

    def boundary(self) -> None:
        """Snapshot what moves inside a step (loader position, RNG, buffers): the state of the step just done."""
        self._boundary = {
            "loader": self.loader.state_dict() if self.loader is not None else None,
            "rng": rng_state(self.device),
            "buffers": {n: b.detach().clone() for n, b in self.module.named_buffers()},
        }

    def payload(self) -> tp.Dict[str, tp.Any]:
        """What the source sends: parameters and optimizer as they are (untouched since the last completed
        step), and that step's boundary snapshot."""
        if self._boundary is None:
            raise RuntimeError("ReplicatedState.payload before the first boundary(): no step state to send")
        return {
            "params": {n: p.detach() for n, p in self.module.named_parameters()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            **self._boundary,
        }

    def load(self, payload: tp.Mapping[str, tp.Any], *, own: bool = False) -> None:
        """Take ``payload`` (``own``: this rank sent it, so only the boundary snapshot is put back); the
        gradients of the interrupted step are dropped."""
        with torch.no_grad():
            if not own:
                params = dict(self.module.named_parameters())
                for name, value in payload["params"].items():
                    params[name].copy_(value)
            buffers = dict(self.module.named_buffers())
            for name, value in payload["buffers"].items():
                buffers[name].copy_(value)
        if not own:
            self.optimizer.load_state_dict(payload["optimizer"])
            if self.scheduler is not None and payload["scheduler"] is not None:
                self.scheduler.load_state_dict(payload["scheduler"])
            if self.scaler is not None and payload["scaler"] is not None:
                self.scaler.load_state_dict(payload["scaler"])
        if self.loader is not None and payload["loader"] is not None:
            self.loader.load_state_dict(payload["loader"])
        set_rng_state(payload["rng"], self.device)
        for p in self.module.parameters():
            p.grad = None
        self.boundary()


class StoredState:
    """State that comes back from storage, not from a survivor's memory: sharded (FSDP/HSDP) state, of which the
    dead rank's shards exist nowhere else.

    ``reload()`` is called on every rank of the new generation, in the same order, once its default group is
    formed (a collective: it builds the sharded modules on the new group and restores the newest commit into
    them); it returns ``(step, tier)``: the step restored (0: no commit yet, a fresh start) and where it came
    from (``hpctrain.ckpt.RESTORE_TIERS``: ``global``, ``local`` or ``partner``; ``none`` without a commit). The
    run goes on after that step, so every step since the commit is redone, as after a restart, but without new
    processes: the interpreter, torch, the loader and the device context stay."""

    def __init__(self, reload: tp.Callable[[], tp.Tuple[int, str]]) -> None:
        self.reload = reload

    def boundary(self) -> None:
        """Nothing to snapshot: what is reloaded is the commit, not this step."""
