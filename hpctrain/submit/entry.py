"""Checking ``--entry module:function`` on the login node.

Two checks, both before anything is written or submitted:

- :func:`check_entry_static` (``--dry-run`` and every submission) runs **no user code**: it finds the
  module's file with :func:`hpctrain._entry.find_module_file` (which walks ``sys.path`` and each package's
  directory the way the import system would, without executing any package ``__init__``), parses the
  source and looks for a top-level binding of the name that could be callable.
- :func:`check_entry_imports` (a real submission only) imports the entry in a child interpreter: the
  user's modules may import torch or fail at import time, and the login-node process must do neither.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import typing as tp

from hpctrain._entry import find_module_file, split_entry
from hpctrain._files import read_regular_file, shorten
from hpctrain.errors import UsageError

__all__ = ["check_entry_static", "check_entry_imports"]

# Values that are never callable: `main = 3`, `main = "x"`, `main = [..]` ...
_NOT_CALLABLE = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr, ast.ListComp, ast.DictComp)
_SOURCE_LIMIT = 16 << 20  # bytes of Python source parsed at most


def _parse(path: str, entry: str) -> ast.Module:
    source = read_regular_file(path, what=f"--entry {entry!r}: module file", limit=_SOURCE_LIMIT)
    try:
        # bytes: the parser honours a PEP 263 coding line and rejects undecodable source itself.
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f"{path}, line {exc.lineno}" if exc.lineno else path
        raise UsageError(f"--entry {entry!r}: {where}: {exc.msg}; fix the source") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise UsageError(f"--entry {entry!r}: {path} cannot be parsed ({type(exc).__name__}); fix the source") from None


def _bindings(tree: ast.Module) -> tp.Dict[str, ast.AST]:
    """Top-level name -> the statement (or assigned value) that binds it last."""
    bound: tp.Dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound[node.target.id] = node.value if node.value is not None else node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound[(alias.asname or alias.name).split(".")[0]] = node
        else:
            # `if`/`try` blocks at top level (optional imports, fallbacks) bind names too.
            for child in ast.walk(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    bound.setdefault(child.name, child)
                elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    bound.setdefault(child.id, child)
                elif isinstance(child, ast.alias):
                    bound.setdefault((child.asname or child.name).split(".")[0], child)
    return bound


def check_entry_static(entry: str) -> None:
    """Check on the login node, running no user code, that ``module:function`` names a callable.

    Raises UsageError for a malformed entry, a module that cannot be found, source (of the module or a
    parent package's ``__init__``) that does not parse, a name the module does not define at top level,
    or a name bound to a literal that cannot be called.
    """
    module, func = split_entry(entry)
    try:
        origin, inits = find_module_file(module)
    except UsageError as exc:
        raise UsageError(
            f"--entry {entry!r}: {exc}; check the name and that it is on PYTHONPATH (run from the project directory)"
        ) from None
    for init in inits:
        _parse(init, entry)  # a syntax error in a parent package fails the import on every node
    if origin is None:
        return  # compiled or namespace module: checked when it is imported (child interpreter, nodes)
    bound = _bindings(_parse(origin, entry))
    top = func.split(".")[0]
    if top not in bound:
        raise UsageError(f"--entry {entry!r}: {origin} defines no top-level {shorten(top)!r}")
    value = bound[top]
    if "." not in func and isinstance(value, _NOT_CALLABLE):
        kind = type(value.value).__name__ if isinstance(value, ast.Constant) else type(value).__name__.lower()
        raise UsageError(
            f"--entry {entry!r}: {top!r} is bound to a value of type {kind} in {origin}, not a function; "
            "name a function taking ctx"
        )


_IMPORT_CHECK = """\
import functools, importlib, sys
obj = functools.reduce(getattr, sys.argv[2].split('.'), importlib.import_module(sys.argv[1]))
if not callable(obj):
    sys.exit(f"TypeError: {sys.argv[1]}:{sys.argv[2]} is a {type(obj).__name__}, not callable")
"""


def check_entry_imports(entry: str, python: str = sys.executable, timeout: float = 120.0) -> None:
    """Import the entry in a fresh interpreter and check that it is callable.

    Catches a module that exists but fails to import (a missing dependency, a package ``__init__`` that
    raises) before the job waits in the queue. stdin is closed: user code waiting for input must not hang us.
    """
    module, func = split_entry(entry)
    try:
        proc = subprocess.run(
            [python, "-c", _IMPORT_CHECK, module, func],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            cwd=os.getcwd(),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"--entry {entry!r}: importing it did not finish in {timeout:.0f} s; does the module run work at import?"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise UsageError(f"--entry {entry!r} does not import: {shorten(last, 300)}")
