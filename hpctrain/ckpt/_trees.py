"""Checks of the state trees in a shard header (stdlib): every tensor reference resolves, and ``unflatten`` can
rebuild the objects (dict keys hashable, ``__dict__`` pairs well formed). The trees' depth is bounded before."""

from __future__ import annotations

import typing as tp

from hpctrain.ckpt._format import NUMPY_DTYPES, CheckpointFormatError

__all__ = ["check_tree", "tensor_keys"]

# What a node of a tree may be: a value, a dict key (a list becomes a tuple there), or an element of a key
_VALUE, _KEY, _IN_KEY = 0, 1, 2
_SCALARS = (str, int, float, bool, type(None))
_LEAVES = frozenset(_SCALARS)


def check_tree(where: str, tree: tp.Any, tensors: tp.Mapping[str, tp.Any]) -> None:
    """``unflatten`` will succeed on ``tree``: every tensor reference resolves, every ``__dict__`` pair is
    ``[key, value]`` with a hashable key, every ``__tuple__`` holds a list. Mirrors ``_state.unflatten``."""
    stack = [(tree, _VALUE)]
    while stack:
        node, role = stack.pop()
        if isinstance(node, _SCALARS):
            continue
        if isinstance(node, list):
            if role == _IN_KEY:
                raise CheckpointFormatError(f"{where}: a dict key holds a list inside a list (not hashable)")
            stack.extend((v, _IN_KEY if role == _KEY else _VALUE) for v in node)
        elif "__tensor__" in node:
            key = node["__tensor__"]
            if role != _VALUE or set(node) - {"__tensor__", "as"}:
                raise CheckpointFormatError(f"{where}: malformed tensor reference {str(node)[:80]}")
            if not isinstance(key, str) or key not in tensors:
                raise CheckpointFormatError(f"{where}: refers to tensor {str(key)[:80]!r}, which is not stored")
            if node.get("as", "numpy") != "numpy" or ("as" in node and tensors[key].dtype not in NUMPY_DTYPES):
                raise CheckpointFormatError(f"{where}: tensor {key!r} cannot be returned as {node['as']!r}")
        elif "__tuple__" in node:
            if not isinstance(node["__tuple__"], list):
                raise CheckpointFormatError(f"{where}: a __tuple__ that is not a list")
            stack.extend((v, _IN_KEY if role != _VALUE else _VALUE) for v in node["__tuple__"])
        elif "__dict__" in node:
            pairs = node["__dict__"]
            if role != _VALUE or not isinstance(pairs, list):
                raise CheckpointFormatError(f"{where}: malformed __dict__ {str(node)[:80]}")
            for pair in pairs:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise CheckpointFormatError(f"{where}: a __dict__ item is not a [key, value] pair")
                stack += [(pair[0], _KEY), (pair[1], _VALUE)]
        elif role != _VALUE:
            raise CheckpointFormatError(f"{where}: a dict key holds a dict (not hashable)")
        else:  # the children inline where they are leaves: numbers and plain references (most nodes), no push each
            for v in node.values():
                tv = type(v)
                if tv in _LEAVES:
                    continue
                if tv is dict and len(v) == 1 and type(v.get("__tensor__")) is str:
                    if v["__tensor__"] not in tensors:
                        raise CheckpointFormatError(
                            f"{where}: refers to tensor {v['__tensor__'][:80]!r}, which is not stored"
                        )
                    continue
                stack.append((v, _VALUE))


def tensor_keys(tree: tp.Any) -> tp.List[str]:
    """Tensor keys in the order ``unflatten`` meets them (the tree is checked: depth is bounded)."""
    out: tp.List[str] = []

    def walk(node: tp.Any) -> None:
        if isinstance(node, dict):
            if "__tensor__" in node:
                out.append(node["__tensor__"])
                return
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    return out
