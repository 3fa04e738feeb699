"""Restore in three steps: map the checkpoint onto the caller's objects, read, verify together.

1. :func:`plan` (metadata only, nothing read): every stored tensor the caller's objects need, and the box of
   it this rank needs: the whole tensor for plain targets, the new local chunk for DTensor targets (model
   parameters and buffers, and optimizer state shaped like a DTensor parameter). Keys, global shapes and
   dtype kinds are checked here, so a layout that cannot be mapped fails naming the tensor before anything
   is read or loaded.
2. :func:`read`: each rank reads the byte runs that overlap its boxes. Whole (replicated) tensors are packed
   into one buffer; with ``read_once`` each rank reads 1/world of it (when the world size did not change,
   about the bytes it wrote) and one ``all_gather`` on the checkpointer's gloo group gives every rank the
   rest; with ``read_all`` every rank reads all of it.
3. Verification: every rank reports the crc32 of the runs it read (adjacent runs combined, zero padding
   included); the rank that owns shard ``i`` (``i % world``) combines them with the header's crc into the
   crc32 of the whole file, reads whatever nobody read (state not restored, other ranks' RNG), and
   compares with the manifest. One gather of the verdicts: every rank accepts or rejects the step together.
"""

from __future__ import annotations

import bisect
import ctypes
import math
import os
import typing as tp
from itertools import chain

import torch

from hpctrain.ckpt._boxes import Box, crc32_combine, crc32_zeros, whole
from hpctrain.ckpt._commit import Comm, fault
from hpctrain.ckpt._dtensor import check_placements, from_local, is_dtensor, local_box
from hpctrain.ckpt._format import ALIGN, DTYPE_SIZES, CheckpointFormatError, align, crc32
from hpctrain.ckpt._reader import _BYTES_READ, Index, StoredTensor
from hpctrain.ckpt._state import DTYPES, unflatten
from hpctrain.errors import HpctrainError

__all__ = ["Want", "Plan", "plan", "read", "fill"]

RESTORE_MODES = ("read_once", "read_all")


class _Ref:
    """A stored tensor in a state skeleton, before its bytes are read."""

    __slots__ = ("key", "as_numpy")

    def __init__(self, key: str, as_numpy: bool = False) -> None:
        self.key, self.as_numpy = key, as_numpy

    def numpy(self) -> "_Ref":  # unflatten calls .numpy() on references saved from numpy arrays
        return _Ref(self.key, True)


class _RefMap(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: str) -> _Ref:
        return _Ref(key)


def fill(node: tp.Any, tensors: tp.Mapping[str, tp.Any]) -> tp.Any:
    """The skeleton with every reference replaced by its tensor."""
    if isinstance(node, _Ref):
        t = tensors[node.key]
        return t.numpy() if node.as_numpy else t
    if isinstance(node, dict):
        return {k: fill(v, tensors) for k, v in node.items()}
    if isinstance(node, list):
        return [fill(v, tensors) for v in node]
    if isinstance(node, tuple):
        return tuple(fill(v, tensors) for v in node)
    return node


def _refs(node: tp.Any) -> tp.Iterator[_Ref]:
    if isinstance(node, _Ref):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _refs(v)


class Want(tp.NamedTuple):
    key: str
    box: Box
    """The region of the stored tensor this rank needs (the whole tensor for plain targets)."""
    like: tp.Any
    """The DTensor this chunk becomes (its mesh and placements), or None for a plain tensor."""


class Plan(tp.NamedTuple):
    skeletons: tp.Dict[str, tp.Any]
    wants: tp.Dict[str, Want]
    stored: tp.Dict[str, StoredTensor]


def _kind_ok(saved: str, target: torch.dtype) -> bool:
    got = DTYPES[saved]
    return got == target or (got.is_floating_point and target.is_floating_point)


def plan(index: Index, step: int, targets: tp.Sequence[tp.Tuple[str, tp.Any]], strict: bool, rank: int) -> Plan:
    """What to read for ``targets`` (name, object); raise HpctrainError naming the first tensor that does not map."""
    trees = index.trees
    for name, _ in targets:
        if name not in trees:
            raise HpctrainError(f"checkpoint step {step} holds no {name} state (it has: {', '.join(sorted(trees))})")
    names = [n for n, _ in targets] + (["extra"] if "extra" in trees else [])
    skeletons = {n: unflatten(trees[n], _RefMap()) for n in names}
    stored: tp.Dict[str, StoredTensor] = dict(index.tensors)
    if rank < len(index.shards):
        stored.update(index.local[rank])  # this rank's own RNG state, not the others'
    likes: tp.Dict[str, tp.Any] = {}
    for name, obj in targets:
        if name == "model":
            skeletons[name] = _check_model(step, obj, skeletons[name], stored, strict, likes)
        elif name == "optimizer":
            _check_optimizer(step, obj, skeletons[name], stored, likes)
    wants: tp.Dict[str, Want] = {}
    for ref in chain.from_iterable(_refs(s) for s in skeletons.values()):
        st = stored[ref.key]
        like = likes.get(ref.key)
        if like is None:
            wants[ref.key] = Want(ref.key, whole(st.shape), None)
        else:
            box = local_box(like)
            if box is None:  # not in this DTensor's mesh: an empty chunk
                box = (tuple(0 for _ in st.shape), tuple(0 for _ in st.shape))
            wants[ref.key] = Want(ref.key, box, like)
    if rank < len(index.shards):
        for key, st in index.local[rank].items():
            wants[key] = Want(key, whole(st.shape), None)
    return Plan(skeletons, wants, stored)


def _check_tensor(where: str, key: str, st: StoredTensor, target: tp.Any) -> None:
    if list(st.shape) != list(target.shape):
        raise HpctrainError(f"{where}: {key} has global shape {list(st.shape)} saved, {list(target.shape)} here")
    if not _kind_ok(st.dtype, target.dtype):
        raise HpctrainError(f"{where}: {key} is {DTYPES[st.dtype]} saved, {target.dtype} here")


def _check_model(
    step: int, model: tp.Any, skel: tp.Any, stored: tp.Mapping[str, StoredTensor], strict: bool, likes: tp.Dict
) -> tp.Any:
    """The saved model state fits ``model.state_dict()``: keys (when strict), global shapes, dtype kinds."""
    target = model.state_dict()
    where = f"checkpoint step {step} does not fit the model passed to restore()"
    if not isinstance(skel, dict):
        raise HpctrainError(f"{where}: the saved model state is a {type(skel).__name__}, not a dict")
    if (
        skel
        and all(str(k).startswith("module.") for k in skel)
        and not any(str(k).startswith("module.") for k in target)
    ):
        skel = {k[len("module.") :]: v for k, v in skel.items()}  # saved from a DDP wrapper's own state_dict()
    if strict:
        missing = [k for k in target if k not in skel]
        unexpected = [k for k in skel if k not in target]
        if missing or unexpected:
            raise HpctrainError(
                f"{where}: missing keys {missing[:3]}, unexpected keys {unexpected[:3]} (pass strict=False to allow)"
            )
    for key, want in target.items():
        got = skel.get(key)
        if not isinstance(want, torch.Tensor) or got is None:
            continue
        if not isinstance(got, _Ref):
            raise HpctrainError(f"{where}: {key} is saved as a {type(got).__name__}, not a tensor")
        _check_tensor(where, key, stored[got.key], want)
        if is_dtensor(want):
            check_placements(key, want)
            likes[got.key] = want
    return skel


def _check_optimizer(
    step: int, opt: tp.Any, skel: tp.Any, stored: tp.Mapping[str, StoredTensor], likes: tp.Dict
) -> None:
    """Saved optimizer state fits ``opt``'s parameters: group sizes, and every per-parameter tensor is
    either shaped like its parameter (then sharded like it) or a scalar (``step``)."""
    where = f"checkpoint step {step} does not fit the optimizer passed to restore()"
    groups = getattr(opt, "param_groups", None)
    if not isinstance(skel, dict) or not isinstance(skel.get("state"), dict) or groups is None:
        return  # not a torch optimizer's state: its own load_state_dict decides
    saved_groups = skel.get("param_groups")
    sizes = [len(g["params"]) for g in groups]
    if not isinstance(saved_groups, list) or [len(g.get("params", ())) for g in saved_groups] != sizes:
        got = [len(g.get("params", ())) for g in saved_groups] if isinstance(saved_groups, list) else saved_groups
        raise HpctrainError(f"{where}: parameter groups of sizes {got} saved, {sizes} here")
    params = [p for g in groups for p in g["params"]]
    by_id = dict(zip(chain.from_iterable(g["params"] for g in saved_groups), params))
    for pid, state in skel["state"].items():
        p = by_id.get(pid)
        if p is None:
            raise HpctrainError(f"{where}: state for parameter {pid}, which the optimizer does not have")
        if not isinstance(state, dict):
            continue
        for v in state.values():
            if not isinstance(v, _Ref):
                continue
            st = stored[v.key]
            if list(st.shape) == list(p.shape):
                if is_dtensor(p):
                    check_placements(v.key, p)
                    likes[v.key] = p
            elif st.numel > 1 or len(st.shape) > 1:
                raise HpctrainError(
                    f"{where}: {v.key} has shape {list(st.shape)} saved, its parameter {list(p.shape)} here"
                )


# ---------------------------------------------------------------------------------------------- reading
class _Segments:
    """Per shard: the crc32 of the byte ranges this rank read, adjacent ranges (across zero padding) combined."""

    def __init__(self, index: Index) -> None:
        self.out: tp.Dict[int, tp.List[tp.Tuple[int, int, int]]] = {}
        self._used: tp.Dict[int, tp.Tuple[tp.List[int], tp.List[int]]] = {}
        spans: tp.Dict[int, tp.List[tp.Tuple[int, int]]] = {}
        for table in (index.tensors, *index.local):
            for t in table.values():
                for p in t.pieces:
                    spans.setdefault(p.shard, []).append((p.pos, p.pos + p.nbytes))
        for shard, s in spans.items():
            s.sort()
            ends, m = [], 0
            for _, e in s:
                m = max(m, e)
                ends.append(m)
            self._used[shard] = ([a for a, _ in s], ends)

    def padding(self, shard: int, a: int, b: int) -> bool:
        """No stored piece lies in ``[a, b)`` (the writer zero-fills it)."""
        starts, ends = self._used.get(shard, ([], []))
        i = bisect.bisect_left(starts, b) - 1  # the last piece starting before b
        return i < 0 or ends[i] <= a

    def add(self, shard: int, pos: int, n: int, crc: int) -> None:
        segs = self.out.setdefault(shard, [])
        if segs:
            a, b, c = segs[-1]
            if b <= pos and pos - b < ALIGN and self.padding(shard, b, pos):
                c = crc32_combine(crc32_combine(c, crc32_zeros(pos - b), pos - b), crc, n)
                segs[-1] = (a, pos + n, c)
                return
        segs.append((pos, pos + n, crc))


def _mem(addr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def _read_runs(index: Index, runs: tp.List[tp.Tuple[int, int, int, int]], segs: tp.Optional[_Segments]) -> None:
    """Execute ``(shard, file position, destination address, nbytes)`` runs, shard by shard in file order."""
    by_shard: tp.Dict[int, tp.List[tp.Tuple[int, int, int]]] = {}
    for shard, pos, addr, n in runs:
        if n:
            by_shard.setdefault(shard, []).append((pos, addr, n))
    for shard, rs in by_shard.items():
        rs.sort()
        merged: tp.List[tp.List[int]] = []
        for pos, addr, n in rs:  # file-contiguous and memory-contiguous runs become one read
            if merged and merged[-1][0] + merged[-1][2] == pos and merged[-1][1] + merged[-1][2] == addr:
                merged[-1][2] += n
            else:
                merged.append([pos, addr, n])
        name = f"{index.path.name}/{index.shards[shard]['file']}"
        with index.open_shard(shard) as f:
            fd = f.fileno()
            for pos, addr, n in merged:
                view, got = _mem(addr, n), 0
                while got < n:
                    k = os.preadv(fd, [view[got:]], pos + got)
                    if k <= 0:
                        raise CheckpointFormatError(f"{name}: truncated while reading")
                    got += k
                _BYTES_READ[0] += n
                if segs is not None:
                    segs.add(shard, pos, n, crc32(view))


def _verify_shard(index: Index, i: int, segs: tp.Iterable[tp.Tuple[int, int, int]], helper: _Segments) -> str:
    """crc32 of shard ``i`` from the ranges every rank read, reading only what nobody read."""
    s = index.shards[i]
    size = s["bytes"]
    parts = sorted(set(segs) | {(0, index.data_starts[i], index.header_crcs[i])}, key=lambda x: (x[0], -x[1]))
    cursor = crc = j = 0
    f = None
    try:
        while cursor < size:
            while j < len(parts) and parts[j][0] < cursor:
                j += 1  # starts inside what is already covered: not usable
            if j < len(parts) and parts[j][0] == cursor:
                a, b, c = parts[j]
                crc, cursor, j = crc32_combine(crc, c, b - a), b, j + 1
                continue
            nxt = parts[j][0] if j < len(parts) else size
            if helper.padding(i, cursor, nxt) and nxt - cursor < ALIGN:
                crc = crc32_combine(crc, crc32_zeros(nxt - cursor), nxt - cursor)
            else:
                f = f or index.open_shard(i)
                f.seek(cursor)
                left = nxt - cursor
                while left:
                    chunk = f.read(min(left, 16 << 20))
                    if not chunk:
                        return f"{index.path.name}/{s['file']}: truncated while reading"
                    crc = crc32(chunk, crc)
                    left -= len(chunk)
                _BYTES_READ[0] += nxt - cursor
            cursor = nxt
    finally:
        if f is not None:
            f.close()
    if crc != s["crc32"]:
        return f"{index.path.name}/{s['file']}: checksum mismatch (corrupted shard)"
    return ""


def read(
    index: Index, p: Plan, comm: Comm, *, mode: str, verify: bool
) -> tp.Tuple[tp.Dict[str, torch.Tensor], tp.List[str]]:
    """Read this rank's wants (collective: every rank calls it for the same step). Return the tensors
    (plain tensors whole, DTensor chunks as local tensors) and the errors of every rank ([] = verified)."""
    rank, world = comm.rank, comm.world
    stored, wants = p.stored, p.wants
    segs = _Segments(index) if verify else None
    # whole tensors, packed in stored order (so that with an unchanged world, rank r's 1/world is what it wrote)
    rep = sorted(
        (w for w in wants.values() if w.like is None and not w.key.startswith("local/")),
        key=lambda w: min(((q.shard, q.pos) for q in stored[w.key].pieces), default=(0, 0)),
    )
    offsets, total = {}, 0
    for w in rep:
        st = stored[w.key]
        offsets[w.key] = total
        total += align(st.numel * DTYPE_SIZES[st.dtype])
    once = mode == "read_once" and world > 1
    chunk = align(-(-total // world)) if once else total
    buf = torch.empty(max(chunk * world if once else total, 1), dtype=torch.uint8)
    lo, hi = (rank * chunk, min((rank + 1) * chunk, total)) if once else (0, total)
    runs: tp.List[tp.Tuple[int, int, int, int]] = []
    base = buf.data_ptr()
    for w in rep:
        st, off = stored[w.key], offsets[w.key]
        for shard, pos, d, n in st.runs(w.box, DTYPE_SIZES[st.dtype]):
            a, b = max(off + d, lo), min(off + d + n, hi)  # this rank's share of the packed buffer
            if a < b:
                runs.append((shard, pos + a - off - d, base + a, b - a))
    own: tp.Dict[str, torch.Tensor] = {}
    for w in wants.values():
        if w.like is None and not w.key.startswith("local/"):
            continue
        st = stored[w.key]
        es = DTYPE_SIZES[st.dtype]
        mem = own[w.key] = torch.empty(math.prod(w.box[1]), dtype=DTYPES[st.dtype])
        runs += [(sh, pos, mem.data_ptr() + d, n) for sh, pos, d, n in st.runs(w.box, es)]
    err = ""
    try:
        fault("restore_read", rank)
        _read_runs(index, runs, segs)
    except CheckpointFormatError as exc:
        err = f"rank {rank}: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure to read: the step is rejected on every rank
        err = f"rank {rank}: {index.path.name}: {type(exc).__name__}: {exc}"
    if once and total:
        import torch.distributed as dist

        try:  # CPU tensors on the checkpointer's own gloo group (never the training group's NCCL)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
            gather(buf, buf[rank * chunk : (rank + 1) * chunk], group=comm.group)
        except Exception as exc:  # noqa: BLE001 - a peer died: the restore fails on every rank
            raise comm._fail(exc) from exc
    if world > 1:
        reports = comm.all_gather((err, segs.out if segs is not None else {}))
    else:
        reports = [(err, segs.out if segs is not None else {})]
    errors = [e for e, _ in reports if e]
    if not errors and segs is not None:
        mine = ""
        for i in range(rank, len(index.shards), world):
            try:
                mine = mine or _verify_shard(index, i, chain.from_iterable(r[1].get(i, ()) for r in reports), segs)
            except CheckpointFormatError as exc:
                mine = str(exc)
        errors = [e for e in (comm.all_gather(mine) if world > 1 else [mine]) if e]
    tensors: tp.Dict[str, torch.Tensor] = {}
    if errors:
        return tensors, errors
    typed: tp.Dict[str, torch.Tensor] = {}
    for w in rep:
        st = stored[w.key]
        tv = typed.get(st.dtype)
        if tv is None:  # one typed view of the packed buffer per dtype (offsets are 64-byte aligned)
            es = DTYPE_SIZES[st.dtype]
            tv = typed[st.dtype] = buf[: buf.numel() // es * es].view(DTYPES[st.dtype])
        es = tv.element_size()
        tensors[w.key] = tv[offsets[w.key] // es : offsets[w.key] // es + st.numel].view(st.shape)
    for key, mem in own.items():
        w = wants[key]
        local = mem.view(w.box[1])
        tensors[key] = from_local(local, w.like) if w.like is not None else local
    return tensors, []
