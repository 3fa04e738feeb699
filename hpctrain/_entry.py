"""The entry point's name, ``package.module:function``: parsed one way on the login node and on the nodes.

Stdlib only, below both ``submit/`` (which checks the entry before submitting) and ``launch/`` (which
imports it on every task), so that neither imports the other for it.
"""

from __future__ import annotations

import typing as tp

from hpctrain.errors import UsageError

__all__ = ["split_entry"]


def split_entry(entry: str) -> tp.Tuple[str, str]:
    """``"pkg.mod:fn"`` -> ``("pkg.mod", "fn")``; anything else is a UsageError naming --entry."""
    if len(entry) > 1000:  # a name no filesystem holds; keep the error line short
        raise UsageError(f"--entry {entry[:40]!r}... is {len(entry)} characters; name a module:function")
    module, sep, func = entry.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".") + func.split(".")):
        raise UsageError(f"--entry {entry!r} is not of the form 'package.module:function'")
    return module, func
