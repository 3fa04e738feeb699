"""The entry point, ``package.module:function``: parsed, found and imported one way on the login node and on the nodes.

Stdlib only, on the ground floor below ``identity/`` (which hashes the entry's package), ``submit/`` (which checks
the entry before submitting), ``launch/`` (which imports it on every task) and ``bundle/`` (which finds it in a
rebuilt tree), so that none of them imports another for it:

- :func:`split_entry` parses ``module:function`` (a UsageError naming ``--entry`` otherwise);
- :func:`find_module_file` finds a module's source file by walking ``sys.path`` and each package's directory the
  way the import system would, **without importing anything** (``importlib.util.find_spec("a.b")`` imports
  ``a``); :func:`entry_location` turns that into the entry's file and its package root;
- :func:`module_file` finds a module's source under one directory (a rebuilt tree), and :func:`import_root`
  the directory a module file is imported from (its top-level package's parent);
- :func:`load_entry` imports the entry (on the node) and returns the function.
"""

from __future__ import annotations

import importlib
import sys
import typing as tp
from importlib.machinery import ModuleSpec
from pathlib import Path

from hpctrain.errors import UsageError

__all__ = ["split_entry", "find_module_file", "entry_location", "module_file", "import_root", "load_entry"]


def split_entry(entry: str) -> tp.Tuple[str, str]:
    """``"pkg.mod:fn"`` -> ``("pkg.mod", "fn")``; anything else is a UsageError naming --entry."""
    if len(entry) > 1000:  # a name no filesystem holds; keep the error line short
        raise UsageError(f"--entry {entry[:40]!r}... is {len(entry)} characters; name a module:function")
    module, sep, func = entry.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".") + func.split(".")):
        raise UsageError(f"--entry {entry!r} is not of the form 'package.module:function'")
    return module, func


# ------------------------------------------------------------------------------ finding it, importing nothing
def _top_level_spec(name: str) -> tp.Any:
    """Spec of a top-level module from the meta path finders (PathFinder, editable-install finders).

    For a top-level name no parent package exists, so asking the finders imports nothing.
    """
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except Exception:  # a broken third-party finder must not crash the check
            continue
        if spec is not None:
            return spec
    return None


def _path_finder(location: str) -> tp.Any:
    """The finder for one directory (or zip) of a search path, as the import system builds it."""
    cached = sys.path_importer_cache.get(location)
    if cached is not None:
        return cached
    for hook in sys.path_hooks:
        try:
            return hook(location)
        except ImportError:
            continue
    return None


def _find_in(name: str, locations: tp.Iterable[str]) -> tp.Any:
    """``PathFinder.find_spec(name, locations)`` without its one import: for a nested namespace package
    it builds a ``_NamespacePath`` that looks the parent package up in ``sys.modules``."""
    portions: tp.List[str] = []
    for location in locations:
        finder = _path_finder(location)
        spec = finder.find_spec(name) if finder is not None and hasattr(finder, "find_spec") else None
        if spec is None:
            continue
        if spec.loader is not None:  # a module or a regular package: the first one on the path wins
            return spec
        portions.extend(spec.submodule_search_locations or [])
    if not portions:
        return None
    spec = ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def find_module_file(module: str) -> tp.Tuple[tp.Optional[str], tp.List[str]]:
    """``(file, package __init__ files on the way)`` of ``module``, found without importing anything.

    ``file`` is None for a namespace package or a module without Python source (built-in, extension).
    Raises UsageError when a level cannot be found.
    """
    parts = module.split(".")
    spec = _top_level_spec(parts[0])
    inits: tp.List[str] = []
    for depth in range(2, len(parts) + 2):
        name = ".".join(parts[: depth - 1])
        if spec is None:
            raise UsageError(f"no module named {name!r}")
        if depth > len(parts):
            break
        if spec.submodule_search_locations is None:
            raise UsageError(f"no module named {'.'.join(parts[:depth])!r}: {name!r} is not a package")
        if spec.origin and spec.has_location and spec.origin.endswith(".py"):
            inits.append(spec.origin)
        try:
            locations = list(spec.submodule_search_locations)
        except Exception:  # a lazy namespace path that cannot be computed
            locations = []
        spec = _find_in(".".join(parts[:depth]), locations)
    origin = spec.origin if spec.has_location else None
    return (origin if origin and origin.endswith(".py") else None), inits


def entry_location(entry: str) -> tp.Tuple[tp.Optional[Path], tp.Optional[Path], str]:
    """``(entry file, package root, why not)`` of ``module:function``, found without importing anything.

    The package root is the top-level package's directory (``mypkg/`` for ``mypkg.sub.train``), or the
    module's own file for a top-level module: what is hashed when the entry lives outside git."""
    try:
        module = split_entry(entry)[0]
        file, _ = find_module_file(module)
    except UsageError as exc:
        return None, None, str(exc)
    if file is None:
        return None, None, f"{entry}: its module has no Python source file"
    path = Path(file).resolve()
    depth = module.count(".")
    root = path if depth == 0 else path.parents[depth - 1]
    if path.name == "__init__.py":  # `--entry pkg:main` names a package
        root = path.parents[depth]
    return path, root, ""


def import_root(file: tp.Union[str, Path], module: str) -> Path:
    """The directory ``module`` (whose source is ``file``) is imported from: its top-level package's parent, the
    entry of ``sys.path`` that holds it. Raises IndexError when ``file`` lies too shallow for ``module``."""
    path = Path(file)
    return path.parents[module.count(".") + (1 if path.name == "__init__.py" else 0)]


def module_file(root: Path, module: str) -> tp.Optional[Path]:
    """The source of ``module`` under the directory ``root`` (``root/a/b.py`` or ``root/a/b/__init__.py``), or None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# ---------------------------------------------------------------------------------------------- importing it
def load_entry(entry: str) -> tp.Callable[..., tp.Any]:
    """Import ``module:function`` (on the node) and return the function."""
    module_name, func = split_entry(entry)
    try:
        obj: tp.Any = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"--entry {entry!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in func.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"--entry {entry!r}: {module_name!r} has no attribute {func!r}") from None
    if not callable(obj):
        raise UsageError(f"--entry {entry!r} is not callable")
    return tp.cast(tp.Callable[..., tp.Any], obj)
