"""State trees <-> (JSON tree, tensors), the fully-parallel split of replicated tensors, RNG states."""

from __future__ import annotations

import array
import bisect
import ctypes
import hashlib
import itertools
import operator
import random
import typing as tp

import numpy as np
import numpy.random  # noqa: F401 - numpy 2 imports it on first use: in a first save's capture_rng (5-35 ms)
import torch

from hpctrain.ckpt._format import ALIGN, DTYPE_SIZES, align, entries_json
from hpctrain.errors import UsageError

__all__ = [
    "flatten",
    "unflatten",
    "Piece",
    "split_replicated",
    "capture_rng",
    "restore_rng",
    "tensor_bytes",
    "DTYPES",
    "Layout",
    "layout",
    "LayoutCache",
    "ShardLayout",
    "whole",
    "plan_offsets",
    "piece_view",
    "piece_bytes",
]

DTYPES: tp.Dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_SIZES if hasattr(torch, name)}


_JSON_LEAVES = frozenset({bool, int, float, str, type(None)})


def flatten(obj: tp.Any, path: str, tensors: tp.Dict[str, torch.Tensor]) -> tp.Any:
    """JSON tree of ``obj`` with every tensor replaced by ``{"__tensor__": key}`` (key added to ``tensors``)."""
    if type(obj) in _JSON_LEAVES:  # first: most nodes are numbers (an RNG state alone is 1250 ints)
        return obj
    if isinstance(obj, dict):  # next: the other nodes of a state dict are dicts (no tensor or number is one)
        # the children inline: leaves and plain tensors (nearly every node of a state dict) without a call
        # of their own or a path string (an optimizer's state is thousands of small dicts keyed by ints)
        plain = True  # every key a string not starting with "__" (a plain loop: all() over a generator was slower)
        for k in obj:
            if not isinstance(k, str) or k.startswith("__"):
                plain = False
                break
        out: tp.Any = {} if plain else []
        for k, v in obj.items():
            tv = type(v)
            if tv in _JSON_LEAVES:
                fv = v
            elif tv in _PLAIN_TENSORS:
                key = f"{path}/{k}"
                if key in tensors or v.requires_grad:  # a repeated key or a parameter: the general case
                    fv = _tensor_ref(v, key, tensors)
                else:  # nearly every tensor of a state dict: no call of its own (4000 of them per save)
                    tensors[key] = v
                    fv = {"__tensor__": key}
            else:
                fv = flatten(v, f"{path}/{k}", tensors)
            if plain:
                out[k] = fv
            else:
                out.append([k if type(k) in _JSON_LEAVES else flatten(k, f"{path}/key", {}), fv])
        return out if plain else {"__dict__": out}
    if isinstance(obj, torch.Tensor):
        return _tensor_ref(obj, path, tensors)
    if isinstance(obj, np.ndarray):
        ref = flatten(torch.from_numpy(np.ascontiguousarray(obj)).clone(), path, tensors)
        ref["as"] = "numpy"
        return ref
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    if isinstance(obj, list):
        return [flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    raise UsageError(
        f"cannot checkpoint {path}: a {type(obj).__name__} is not a tensor or JSON value; "
        "convert it to tensors/numbers/strings in state_dict() (hpctrain never pickles)"
    )


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def _tensor_ref(obj: torch.Tensor, path: str, tensors: tp.Dict[str, torch.Tensor]) -> tp.Dict[str, tp.Any]:
    key = path
    n = 1
    while key in tensors:
        n += 1
        key = f"{path}#{n}"
    tensors[key] = obj.detach() if obj.requires_grad else obj
    return {"__tensor__": key}


def unflatten(tree: tp.Any, tensors: tp.Mapping[str, torch.Tensor]) -> tp.Any:
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            t = tensors[tree["__tensor__"]]
            return t.numpy() if tree.get("as") == "numpy" else t
        if "__tuple__" in tree:
            return tuple(unflatten(v, tensors) for v in tree["__tuple__"])
        if "__dict__" in tree:
            return {
                k if type(k) in _JSON_LEAVES else _hashable(unflatten(k, tensors)): unflatten(v, tensors)
                for k, v in tree["__dict__"]
            }
        out = {}
        for k, v in tree.items():  # the children inline: numbers and plain references (most nodes), no call each
            tv = type(v)
            if tv in _JSON_LEAVES:
                out[k] = v
            elif tv is dict and len(v) == 1 and "__tensor__" in v:
                out[k] = tensors[v["__tensor__"]]
            else:
                out[k] = unflatten(v, tensors)
        return out
    if isinstance(tree, list):
        return [v if type(v) in _JSON_LEAVES else unflatten(v, tensors) for v in tree]
    return tree


def _hashable(k: tp.Any) -> tp.Any:
    return tuple(k) if isinstance(k, list) else k


class Piece(tp.NamedTuple):
    key: str
    tensor: torch.Tensor  # the whole tensor (a DTensor's local chunk, for a box)
    start: int  # element range of the flattened tensor
    stop: int
    dtype: str  # dtype name in the format
    es: int  # element size
    box: tp.Optional[tp.Tuple[tp.Tuple[int, ...], tp.Tuple[int, ...]]] = None
    """A sharded tensor's chunk: (offsets, lengths) in the global tensor of shape ``global_shape``."""
    global_shape: tp.Optional[tp.Tuple[int, ...]] = None


_NAMES: tp.Dict[torch.dtype, tp.Tuple[str, int]] = {}


def _dtype_info(dtype: torch.dtype) -> tp.Tuple[str, int]:
    info = _NAMES.get(dtype)
    if info is None:
        name = str(dtype).replace("torch.", "")
        if name not in DTYPES:
            raise UsageError(f"cannot checkpoint tensors of dtype {dtype}; supported: {', '.join(DTYPES)}")
        info = _NAMES[dtype] = (name, DTYPE_SIZES[name])
    return info


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Layout(tp.NamedTuple):
    """Per-tensor metadata computed once per save: (key, tensor, dtype name, element size, numel)."""

    items: tp.List[tp.Tuple[str, torch.Tensor, str, int, int]]
    total: int
    digest: str


_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")


def layout(tensors: tp.Mapping[str, torch.Tensor], cache: tp.Optional["LayoutCache"] = None) -> Layout:
    """Per-tensor metadata and a digest of the keys, dtypes and shapes. With ``cache``: when the keys, dtypes
    and shapes are those of the previous call (a training loop saves the same state every time), the names,
    sizes and digest are reused and only the tensors are new (a third of the cost on 4000 tensors). The
    comparison and the items are built column by column in C (``map``/``zip``), not a Python loop per tensor."""
    keys, values = list(tensors), list(tensors.values())
    dtypes, shapes = list(map(_DTYPE, values)), list(map(_SHAPE, values))
    if cache is not None and cache.keys == keys and cache.dtypes == dtypes and cache.shapes == shapes:
        return Layout(list(zip(keys, values, cache.names, cache.sizes, cache.numels)), cache.total, cache.digest)
    # a miss (the first save): the same metadata, column by column (a state has a handful of distinct dtypes)
    info = {d: _dtype_info(d) for d in set(dtypes)}
    names = [info[d][0] for d in dtypes]
    sizes = [info[d][1] for d in dtypes]
    numels = list(map(torch.Tensor.numel, values))
    total = sum(map(operator.mul, sizes, numels))
    digest = _digest(keys, names, shapes)
    lay = Layout(list(zip(keys, values, names, sizes, numels)), total, digest)
    if cache is not None:
        cache.keys, cache.dtypes, cache.shapes = keys, dtypes, shapes
        cache.names, cache.sizes, cache.numels = names, sizes, numels
        cache.total, cache.digest = total, digest
    return lay


def _digest(keys: tp.List[str], names: tp.List[str], shapes: tp.List[torch.Size]) -> str:
    """A digest of the keys, dtype names and shapes, for the commit's agreement that every rank saves the same
    layout (never stored). The fields' bytes are unambiguous: the keys' lengths, then the keys, the dtype names
    (from a fixed set), the shapes' ranks and their sizes, the numbers as int64 arrays (packed in C: half the cost
    of encoding the same as JSON, on every rank's first save)."""
    h = hashlib.sha1(array.array("q", map(len, keys)).tobytes())
    h.update("".join(keys).encode("utf-8", "surrogatepass"))
    h.update(b"\1" + "\0".join(names).encode())
    h.update(array.array("q", map(len, shapes)).tobytes())
    h.update(array.array("q", itertools.chain.from_iterable(shapes)).tobytes())
    return h.hexdigest()


class ShardLayout(tp.NamedTuple):
    """This rank's shard: its pieces, their header entries (offsets), the data size, the entries' JSON text."""

    pieces: tp.List[Piece]
    entries: tp.List[tp.Dict[str, tp.Any]]
    size: int
    entries_json: str


class LayoutCache:
    """The previous :func:`layout` call's signature and metadata (one per checkpointer), and the previous
    save's shard plan (:meth:`shard`)."""

    def __init__(self) -> None:
        self.keys: tp.Optional[tp.List[str]] = None  # None: nothing cached yet (an empty state is a layout too)
        self.dtypes: tp.List[torch.dtype] = []
        self.shapes: tp.List[torch.Size] = []
        self.names: tp.List[str] = []
        self.sizes: tp.List[int] = []
        self.numels: tp.List[int] = []
        self.total = 0
        self.digest = ""
        self._shard_key: tp.Any = None
        self._spans: tp.Tuple[tp.List[int], tp.List[int], tp.List[int]] = ([], [], [])
        """This rank's replicated pieces: their indices in the layout, starts and stops."""
        self._shard: tp.Optional[ShardLayout] = None

    def shard(self, lay: Layout, others: tp.Sequence[Piece], rank: int, world: int) -> tp.Optional[ShardLayout]:
        """The previous save's shard plan for this one, or None when it does not apply (then :meth:`remember`).

        This rank's pieces are its share of ``lay`` then ``others`` (sharded chunks, rank-local state). The split,
        the offsets and the entries' JSON depend only on the keys, dtypes and shapes (``lay.digest``), the rank
        and world, and the other pieces' metadata: while those repeat (a training loop saving the same state)
        they are reused and only the tensors are new, so a save's metadata work is proportional to this rank's
        pieces, not to every tensor of the state. The entries are shared between saves: read, never change them.
        """
        key = (
            lay.digest,
            rank,
            world,
            [(p.key, p.dtype, p.start, p.stop, p.box, p.global_shape, p.tensor.shape) for p in others],
        )
        hit = self._shard
        if hit is None or self._shard_key != key:
            self._shard_key, self._shard = key, None
            return None
        # tuple.__new__: a namedtuple's own __new__ is a Python function (a third of this on 4000 pieces)
        new, (idx, starts, stops) = tuple.__new__, self._spans
        mine = zip(map(lay.items.__getitem__, idx), starts, stops)
        pieces = [new(Piece, (k, t, a, b, name, es, None, None)) for (k, t, name, es, _), a, b in mine]
        return ShardLayout(pieces + list(others), hit.entries, hit.size, hit.entries_json)

    def remember(
        self,
        lay: Layout,
        mine: tp.Sequence[Piece],
        others: tp.Sequence[Piece],
        entries: tp.List[tp.Dict[str, tp.Any]],
        size: int,
    ) -> ShardLayout:
        """Keep the plan :meth:`shard` did not have: ``mine`` (this rank's share of ``lay``) + ``others``, laid out
        as ``entries`` in ``size`` bytes (after a miss of :meth:`shard` with the same arguments)."""
        index = {item[0]: i for i, item in enumerate(lay.items)}
        json_text = entries_json(entries)
        self._spans = ([index[p.key] for p in mine], [p.start for p in mine], [p.stop for p in mine])
        self._shard = ShardLayout([], entries, size, json_text)  # no tensors: never keep a saved state alive
        return ShardLayout(list(mine) + list(others), entries, size, json_text)


def split_replicated(tensors: tp.Union[Layout, tp.Mapping[str, torch.Tensor]], rank: int, world: int) -> tp.List[Piece]:
    """This rank's share of replicated tensors: the concatenated byte stream cut into ``world`` equal
    ranges at element boundaries (Megatron-style fully parallel save, without communication).
    Zero-size tensors go to rank 0 so that every tensor has at least one entry.

    A tensor cut in two is cut at a multiple of :data:`SPLIT_ALIGN` bytes from its start (every element size
    divides it): its first piece then ends where the restore's packed buffer starts the next shard's region
    (both 64-byte aligned), so the pieces lie end to end there and the restore makes the tensor a view of
    them instead of assembling a copy (``_fetch._Views``)."""
    lay = tensors if isinstance(tensors, Layout) else layout(tensors)
    lo, hi = lay.total * rank // world, lay.total * (rank + 1) // world
    items = lay.items
    nbs = list(map(operator.mul, map(_ES, items), map(_N, items)))
    ends = list(itertools.accumulate(nbs))
    # only the tensors that overlap [lo, hi) (and, on rank 0, the zero-size ones wherever they are), in state order
    first, stop = (
        (0, len(items)) if rank == 0 and 0 in nbs else (bisect.bisect_right(ends, lo), bisect.bisect_left(ends, hi) + 1)
    )
    out: tp.List[Piece] = []
    cum = ends[first] - nbs[first] if first < len(items) else 0
    last = rank == world - 1
    new = tuple.__new__  # not Piece(...): a namedtuple's own __new__ is a Python call (thousands of pieces)
    for key, t, name, es, n in items[first:stop]:
        nb = n * es
        if n == 0:
            if rank == 0:
                out.append(new(Piece, (key, t, 0, 0, name, es, None, None)))
            continue
        if cum + nb > lo and cum < hi:
            a = max(0, (lo - cum) // SPLIT_ALIGN * SPLIT_ALIGN // es)  # lo - cum < nb here: a cut inside it
            b = n if last or hi - cum >= nb else max(0, (hi - cum) // SPLIT_ALIGN * SPLIT_ALIGN // es)
            if b > a:
                out.append(new(Piece, (key, t, a, b, name, es, None, None)))
        cum += nb
    return out


_ES, _N = operator.itemgetter(3), operator.itemgetter(4)
SPLIT_ALIGN = ALIGN
"""Where :func:`split_replicated` may cut a tensor: a multiple of this many bytes from its start."""


def whole(tensors: tp.Mapping[str, torch.Tensor]) -> tp.List[Piece]:
    return [Piece(k, t, 0, n, name, es) for k, t, name, es, n in layout(tensors).items]


def plan_offsets(pieces: tp.Sequence[Piece]) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], int]:
    """Header entries with aligned offsets for ``pieces``, and the data size."""
    entries, off = [], 0
    append = entries.append
    for key, t, start, stop, dtype, es, box, global_shape in pieces:  # unpacked: once per piece of a first save
        nb = (stop - start) * es
        if box is not None and global_shape is not None:
            e = {"key": key, "dtype": dtype, "shape": list(global_shape), "box": [list(b) for b in box]}
            e.update(offset=off, nbytes=nb)
        else:
            e = {
                "key": key,
                "dtype": dtype,
                "shape": list(t.shape),
                "start": start,
                "stop": stop,
                "offset": off,
                "nbytes": nb,
            }
        append(e)
        off += align(nb)
    return entries, off


def piece_view(p: Piece) -> torch.Tensor:
    """The piece as a 1-D contiguous tensor (a view when possible; CPU or device)."""
    t = p.tensor
    flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
    return flat[p.start : p.stop]


def piece_bytes(p: Piece) -> memoryview:
    """The piece's bytes on the host without a copy when the tensor is a contiguous CPU tensor.

    The memoryview points into the tensor's storage: ``p.tensor`` must stay alive (it does, in ``p``).
    """
    t = p.tensor
    nb = (p.stop - p.start) * p.es
    if nb == 0:
        return memoryview(b"")
    if t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        return memoryview((ctypes.c_char * nb).from_address(t.data_ptr() + p.start * p.es)).cast("B")
    v = piece_view(p).resolve_conj().resolve_neg().cpu()  # conj/neg views: their values, not the raw bits
    return memoryview(v.view(torch.uint8).numpy())


def capture_rng() -> tp.Dict[str, tp.Any]:
    np_state = np.random.get_state()
    state: tp.Dict[str, tp.Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], [int(x) for x in np_state[1]], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    # the current device's generator only: the one this rank draws from. Saving every visible GPU's
    # made a resume under another binding (all GPUs visible vs one per task) skip the CUDA state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: tp.Any) -> tp.List[str]:
    """Restore what can be restored; return the names of generators left untouched (and why).

    Each saved state is first loaded into a scratch generator, so a malformed one is skipped (and
    named) instead of raising half-way or leaving a generator in a broken state."""
    if not isinstance(state, dict):
        return ["all generators (the saved RNG state is malformed)"]
    skipped = []
    if "python" in state:
        try:
            v, internal, gauss = state["python"]
            py_state = (v, tuple(internal), gauss)
            random.Random().setstate(py_state)
            random.setstate(py_state)
        except (TypeError, ValueError, OverflowError, IndexError):
            skipped.append("python (malformed state)")
    if "numpy" in state:
        try:
            name, keys, pos, has_gauss, cached = state["numpy"]
            np_state = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
            np.random.RandomState().set_state(np_state)
            np.random.set_state(np_state)
        except (TypeError, ValueError, OverflowError, IndexError):  # numpy: a position past the key array
            skipped.append("numpy (malformed state)")
    if "torch" in state:
        try:
            t = state["torch"].to("cpu", torch.uint8).clone()
            torch.Generator().set_state(t)
            torch.set_rng_state(t)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            skipped.append("torch (malformed state)")
    if "cuda" in state:
        skipped += _restore_cuda_rng(state["cuda"])
    return skipped


def _restore_cuda_rng(cuda: tp.Any) -> tp.List[str]:
    """A tensor is the saving rank's current-device generator: it goes to this rank's current device,
    whatever the binding (restore after the device is bound, as hpctrain's runtime does at init). A
    list is an older checkpoint's every-visible-GPU states: restored only onto the same number of GPUs
    (which entry was this rank's is not recorded)."""
    if isinstance(cuda, torch.Tensor):
        if not torch.cuda.is_available():
            return ["cuda (no GPU here)"]
        try:
            # the index now, not torch's lazy default: a queued call would pick the device current at
            # CUDA's first use, and a bad state would raise there instead of being skipped here
            torch.cuda.set_rng_state(cuda.to("cpu", torch.uint8).clone(), torch.cuda.current_device())
        except (TypeError, ValueError, RuntimeError):
            return ["cuda (malformed state)"]
        return []
    if not isinstance(cuda, list) or not all(isinstance(s, torch.Tensor) for s in cuda):
        return ["cuda (malformed state)"]
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if here != len(cuda):
        return [f"cuda (saved with {len(cuda)} devices, {here} here)"]
    try:
        torch.cuda.set_rng_state_all([s.to("cpu", torch.uint8).clone() for s in cuda])
    except (TypeError, ValueError, RuntimeError):
        return ["cuda (malformed state)"]
    return []
