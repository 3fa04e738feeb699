"""Restore in three steps: map the checkpoint onto the caller's objects, read, verify together.

1. :func:`plan` (metadata only, nothing read): every stored tensor the caller's objects need, and the box of
   it this rank needs: the whole tensor for plain targets, the new local chunk for DTensor targets (model
   parameters and buffers; optimizer state whose entry in the live optimizer is a DTensor, or, where it has
   none yet, state shaped like its DTensor parameter). Keys, global shapes and dtype kinds are checked here,
   so a layout that cannot be mapped fails naming the tensor before anything is read or loaded.
2. and 3. :func:`hpctrain.ckpt._fetch.read`: each rank reads its share of the byte regions holding what it
   needs (whole tensors packed by file region into one buffer, exchanged with one ``all_gather`` in
   ``read_once`` mode; DTensor chunks as the runs overlapping the new chunk), and the ranks verify every
   shard's crc32 together and accept or reject the step together.
"""

from __future__ import annotations

import typing as tp
from itertools import chain

import torch

from hpctrain.ckpt._boxes import Box, whole
from hpctrain.ckpt._dtensor import check_placements, is_dtensor, local_box
from hpctrain.ckpt._index import Index, StoredTensor
from hpctrain.ckpt._state import DTYPES, unflatten
from hpctrain.errors import HpctrainError

__all__ = ["Want", "Plan", "plan", "fill", "RESTORE_MODES", "resolve_mode"]

from hpctrain.ckpt.config import RESTORE_MODES  # noqa: E402 - re-exported for the restore code


def resolve_mode(mode: str, hosts: int, node: bool = False) -> str:
    """``auto``: ``read_once`` when the ranks span several hosts (each byte leaves the filesystem once instead of
    once per host), or share one host and exchange through its shared memory (``node``: each rank reads a part
    and maps the rest, faster than every rank reading every byte, measured in docs/checkpoint.md); ``read_all``
    when they share one host and would exchange over a socket (there the page cache already hands every rank the
    bytes one rank read, and reading it beats moving the bytes over loopback TCP). The other modes are taken as
    they are."""
    if mode != "auto":
        return mode
    return "read_once" if hosts > 1 or node else "read_all"


class _Ref:
    """A stored tensor in a state skeleton, before its bytes are read."""

    __slots__ = ("key", "as_numpy")

    def __init__(self, key: str, as_numpy: bool = False) -> None:
        self.key, self.as_numpy = key, as_numpy

    def numpy(self) -> "_Ref":  # unflatten calls .numpy() on references saved from numpy arrays
        return _Ref(self.key, True)


class _RefMap(dict):  # type: ignore[type-arg]
    """What ``unflatten`` looks tensors up in while building a skeleton: a reference per lookup, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: tp.List[_Ref] = []

    def __getitem__(self, key: str) -> _Ref:
        ref = _Ref(key)
        self.refs.append(ref)
        return ref


def fill(node: tp.Any, tensors: tp.Mapping[str, tp.Any]) -> tp.Any:
    """The skeleton with every reference replaced by its tensor."""
    if isinstance(node, _Ref):
        t = tensors[node.key]
        return t.numpy() if node.as_numpy else t
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():  # the children inline: references and numbers (most nodes), no call each
            tv = type(v)
            if tv is _Ref and not v.as_numpy:
                out[k] = tensors[v.key]
            elif tv is dict or tv is list or tv is tuple or tv is _Ref:
                out[k] = fill(v, tensors)
            else:
                out[k] = v
        return out
    if isinstance(node, list):
        return [fill(v, tensors) for v in node]
    if isinstance(node, tuple):
        return tuple(fill(v, tensors) for v in node)
    return node


class Want(tp.NamedTuple):
    key: str
    box: Box
    """The region of the stored tensor this rank needs (the whole tensor for plain targets)."""
    like: tp.Any
    """The DTensor this chunk becomes (its mesh and placements), or None for a plain tensor."""


class Plan(tp.NamedTuple):
    skeletons: tp.Dict[str, tp.Any]
    whole: tp.List[str]
    """Keys of the stored tensors wanted whole (plain targets: replicated state, scalars): read by file region."""
    chunks: tp.Dict[str, Want]
    """The others: a DTensor target's new local chunk, and this rank's own rank-local state (RNG)."""
    stored: tp.Dict[str, StoredTensor]
    memo: tp.Dict[str, tp.Any]
    """What the reads derive from the plan, derived once (``_fetch``: the packed regions of ``whole``)."""


def _kind_ok(saved: str, target: torch.dtype) -> bool:
    got = DTYPES[saved]
    return got == target or (got.is_floating_point and target.is_floating_point)


def plan(index: Index, step: int, targets: tp.Sequence[tp.Tuple[str, tp.Any]], strict: bool, rank: int) -> Plan:
    """What to read for ``targets`` (name, object); raise HpctrainError naming the first tensor that does not map."""
    trees = index.trees
    for name, _ in targets:
        if name not in trees:
            raise HpctrainError(
                f"checkpoint step {step} does not fit the {name} passed to restore(): it holds no {name} state "
                f"(it has: {', '.join(sorted(trees))}); restore without {name}= or from a step that saved it"
            )
    names = [n for n, _ in targets] + (["extra"] if "extra" in trees else [])
    refmap = _RefMap()  # every reference of every skeleton, in the order unflatten met them
    skeletons = {n: unflatten(trees[n], refmap) for n in names}
    stored: tp.Dict[str, StoredTensor] = dict(index.tensors)
    if rank < len(index.shards):
        stored.update(index.local[rank])  # this rank's own RNG state, not the others'
    likes: tp.Dict[str, tp.Any] = {}
    checked: tp.Set[int] = set()  # ids of the parameters the model check found saved in the shape they have here
    for name, obj in targets:  # the model first (_STATE_NAMES order): the optimizer check uses what it found
        if name == "model":
            skeletons[name] = _check_model(step, obj, skeletons[name], stored, strict, likes, checked)
        elif name == "optimizer":
            _check_optimizer(step, obj, skeletons[name], stored, likes, checked)
    whole_keys: tp.Dict[str, None] = {}  # replicated tensors and those wanted whole, in the order met
    chunks: tp.Dict[str, Want] = {}
    for ref in refmap.refs:
        like = likes.get(ref.key)
        if like is None:
            whole_keys[ref.key] = None
            continue
        st = stored[ref.key]
        box = local_box(like)
        if box is None:  # not in this DTensor's mesh: an empty chunk
            box = (tuple(0 for _ in st.shape), tuple(0 for _ in st.shape))
        chunks[ref.key] = Want(ref.key, box, like)
    if rank < len(index.shards):
        for key, st in index.local[rank].items():
            chunks[key] = Want(key, whole(st.shape), None)
    return Plan(skeletons, list(whole_keys), chunks, stored, {})


def _check_tensor(where: str, key: str, st: StoredTensor, target: tp.Any) -> None:
    if list(st.shape) != list(target.shape):
        raise HpctrainError(f"{where}: {key} has global shape {list(st.shape)} saved, {list(target.shape)} here")
    if not _kind_ok(st.dtype, target.dtype):
        raise HpctrainError(f"{where}: {key} is {DTYPES[st.dtype]} saved, {target.dtype} here")


def _check_model(
    step: int,
    model: tp.Any,
    skel: tp.Any,
    stored: tp.Mapping[str, StoredTensor],
    strict: bool,
    likes: tp.Dict,
    checked: tp.Set[int],
) -> tp.Any:
    """The saved model state fits ``model.state_dict()``: keys (when strict), global shapes, dtype kinds.
    Adds to ``checked`` the id of every parameter whose saved tensor was found to have its shape."""
    target = model.state_dict()
    named = getattr(model, "named_parameters", None)
    params = dict(named()) if callable(named) else {}
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
        if key in params:
            checked.add(id(params[key]))
        if is_dtensor(want):
            check_placements(key, want)
            likes[got.key] = want
    return skel


def _check_optimizer(
    step: int, opt: tp.Any, skel: tp.Any, stored: tp.Mapping[str, StoredTensor], likes: tp.Dict, checked: tp.Set[int]
) -> None:
    """Saved optimizer state fits ``opt``: group sizes, every saved parameter id maps to a parameter, and every
    per-parameter state tensor fits what ``opt`` holds for it, or would accept (:func:`_check_state`)."""
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
    by_id = dict(zip(chain.from_iterable(g["params"] for g in saved_groups), params))  # as load_state_dict maps
    live = _live_state(opt, params)
    for pid, state in skel["state"].items():
        p = by_id.get(pid)
        if p is None:
            raise HpctrainError(f"{where}: state for parameter {pid}, which the optimizer does not have")
        if not isinstance(state, dict):
            continue
        now = live.get(id(p), {})
        for name, v in state.items():
            if isinstance(v, _Ref):  # tensors nested in lists (LBFGS's history) are load_state_dict's to judge
                _check_state(where, v.key, stored[v.key], p, now.get(name), id(p) in checked, likes)


def _live_state(opt: tp.Any, params: tp.Sequence[tp.Any]) -> tp.Dict[int, tp.Dict[tp.Any, tp.Any]]:
    """The per-parameter state ``opt`` holds now, by ``id`` of the parameter: from its own ``state_dict()`` (what
    was saved came from there, hooks included), else from ``opt.state`` (e.g. an optimizer whose
    ``state_dict()`` needs a collective first); empty for an optimizer that has not stepped yet."""
    try:
        sd = opt.state_dict()
        ids = chain.from_iterable(g["params"] for g in sd["param_groups"])
        by_index = dict(zip(ids, params))
        return {id(by_index[i]): s for i, s in sd["state"].items() if i in by_index and isinstance(s, dict)}
    except Exception:  # noqa: BLE001 - only sharpens the check; the raw state says the same for torch optimizers
        raw = getattr(opt, "state", None)
        if not isinstance(raw, tp.Mapping):
            return {}
        return {id(p): s for p, s in raw.items() if isinstance(p, torch.Tensor) and isinstance(s, dict)}


def _check_state(where: str, key: str, st: StoredTensor, p: tp.Any, now: tp.Any, checked: bool, likes: tp.Dict) -> None:
    """One saved per-parameter state tensor against parameter ``p`` and the optimizer's live entry ``now``.

    The optimizer's own state is the reference, not a guess about its internals: Adafactor's factored
    ``row_var``/``col_var``, LBFGS's flat history and a user optimizer's buffers are not shaped like their
    parameter, and load as they are, as torch's ``load_state_dict`` loads them. So:

    - an entry the optimizer holds (it has stepped, or, like Adagrad, fills its state up front): same shape,
      and a DTensor entry's layout is the one the saved tensor is resharded to;
    - none held: a tensor shaped like the parameter fits it (sharded like it when it is a DTensor); another
      shape fits when the model check found this parameter saved in the shape it has here (the state is not
      elementwise then); without that evidence (the model not restored with it), a tensor of the parameter's
      rank that neither equals nor reduces its shape (sizes 1 for the reduced dims) is taken for the state of
      a differently shaped parameter: a different model.
    """
    shape = list(st.shape)
    if isinstance(now, torch.Tensor):
        if shape != list(now.shape):
            raise HpctrainError(
                f"{where}: {key} has shape {shape} saved, {list(now.shape)} in this optimizer's state "
                f"(parameter {list(p.shape)})"
            )
        if is_dtensor(now):
            check_placements(key, now)
            likes[key] = now
        return
    if shape == list(p.shape):
        if is_dtensor(p):
            check_placements(key, p)
            likes[key] = p
        return
    if checked:
        return
    if len(shape) == len(p.shape) and any(s not in (n, 1) for s, n in zip(shape, p.shape)):
        raise HpctrainError(f"{where}: {key} has shape {shape} saved, its parameter {list(p.shape)} here")
