"""Sharded state (DTensor: FSDP2 ``fully_shard``, tensor parallel): which chunk a rank writes and which it needs.

A DTensor's local chunk is a box of the global tensor (offsets and lengths per dimension, from torch's own
``compute_local_shape_and_global_offset``). On save, a rank writes its chunk when it is the lowest rank
holding it (coordinate 0 on every mesh dimension where the placement is ``Replicate``); a fully replicated
DTensor is plain replicated state (split over all ranks like DDP state). On restore, the target DTensor
says which box this rank needs; the reader fills it from whatever pieces overlap it.
"""

from __future__ import annotations

import sys
import typing as tp

import torch

from hpctrain.ckpt._boxes import Box
from hpctrain.ckpt._state import Piece, _dtype_info, tensor_bytes
from hpctrain.errors import UsageError

__all__ = [
    "is_dtensor",
    "fully_replicated",
    "local_box",
    "writes_chunk",
    "from_local",
    "check_placements",
    "Replicas",
    "replicas",
    "split_sharded",
]


_DTENSOR: tp.List[tp.Any] = []
"""The DTensor class, once found (asked for every tensor of every save and restore)."""


def _dtensor_type() -> tp.Any:
    """The DTensor class, or None while ``torch.distributed.tensor`` is not imported: no tensor can be a DTensor
    then, and importing it only to ask would cost a restore ~1 s on this VM (it imports sympy; measured under cProfile:
    0.98 s of a first restore's 1.33 s in a process that never used DTensors). Never imported here; found once
    imported."""
    if _DTENSOR:
        return _DTENSOR[0]
    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None)  # None also while the module is still being imported
    if cls is not None:
        _DTENSOR.append(cls)
    return cls


def is_dtensor(t: tp.Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def check_placements(key: str, t: tp.Any) -> None:
    """Placements hpctrain can store as boxes: Shard(dim) and Replicate (a Partial sum is not a value yet;
    a _StridedShard chunk, FSDP and TP sharding the same dim, is not a box)."""
    for p in t.placements:
        name = type(p).__name__
        if name not in ("Shard", "Replicate"):
            raise UsageError(
                f"cannot checkpoint {key}: DTensor placement {p} is not supported (only Shard(dim) and Replicate; "
                "shard FSDP and tensor parallel on different dims, reduce Partial values first)"
            )


def fully_replicated(t: tp.Any) -> bool:
    return all(type(p).__name__ == "Replicate" for p in t.placements)


def local_box(t: tp.Any) -> tp.Optional[Box]:
    """This rank's chunk of DTensor ``t``, or None when this rank is not in its mesh."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if t.device_mesh.get_coordinate() is None:
        return None
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(int(o) for o in offset), tuple(int(n) for n in shape)


def writes_chunk(t: tp.Any) -> bool:
    """Whether this rank is the lowest of the ranks holding its chunk (coordinate 0 where replicated)."""
    coord = t.device_mesh.get_coordinate()
    if coord is None:
        return False
    return all(c == 0 for c, p in zip(coord, t.placements) if type(p).__name__ == "Replicate")


class Replicas(tp.NamedTuple):
    """The ranks that hold the same chunk of a DTensor as this rank: its mesh dimension's group."""

    group: tp.Any
    size: int
    index: int
    """This rank's place in the group."""
    device: tp.Optional[torch.device]
    """The mesh's device (its group is NCCL's): the bytes go through buffers there; None on a CPU mesh."""


def replicas(t: tp.Any) -> tp.Optional[Replicas]:
    """The replica group of DTensor ``t``'s chunk when ``t`` is ``Replicate`` on exactly one mesh dimension of size
    2 or more (HSDP: replicated across nodes, sharded within); None otherwise (each rank reads its chunk)."""
    mesh = t.device_mesh
    dims = [d for d, p in enumerate(t.placements) if type(p).__name__ == "Replicate"]
    if len(dims) != 1 or mesh.get_coordinate() is None or mesh.size(dims[0]) < 2:
        return None
    if mesh.device_type not in ("cpu", "cuda"):
        return None
    d = dims[0]
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else None
    return Replicas(mesh.get_group(d), mesh.size(d), mesh.get_local_rank(d), device)


def from_local(local: torch.Tensor, like: tp.Any) -> tp.Any:
    """A DTensor with ``like``'s mesh, placements and global shape around ``local`` (no communication)."""
    cls = _dtensor_type()
    strides, acc = [], 1
    for d in reversed(like.shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return cls.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=tuple(strides[::-1])
    )


def split_sharded(
    tensors: tp.Dict[str, torch.Tensor], rank: int
) -> tp.Tuple[tp.Dict[str, torch.Tensor], tp.List[Piece], int, tp.List[tp.Any]]:
    """A save's tensors as: the plain (replicated) ones, this rank's chunks of sharded DTensors (box pieces), the
    sharded bytes of all ranks together, and the global signature of the sharded ones (the same on every rank)."""
    exact = {torch.Tensor, torch.nn.Parameter}  # never a DTensor: a DDP state is checked in one scan in C
    if all(map(exact.__contains__, map(type, tensors.values()))):
        return tensors, [], 0, []
    plain: tp.Dict[str, torch.Tensor] = {}
    pieces: tp.List[Piece] = []
    total, sig = 0, []
    for key, t in tensors.items():
        if not is_dtensor(t):
            plain[key] = t
            continue
        check_placements(key, t)
        if fully_replicated(t):
            plain[key] = t.to_local()
            continue
        name, es = _dtype_info(t.dtype)
        sig.append((key, name, tuple(t.shape)))
        total += t.numel() * es
        box = local_box(t)
        if box is None or not writes_chunk(t):
            continue
        n = tensor_bytes(t.to_local()) // es
        if n == 0 and not (t.numel() == 0 and rank == 0):  # an empty chunk; rank 0 records an empty tensor
            continue
        pieces.append(Piece(key, t.to_local().detach(), 0, n, name, es, box, tuple(t.shape)))
    return plain, pieces, total, sig
