"""Every name a doc cites exists: ``file.py:name`` and ``hpctrain.module.name`` in README.md and docs/*.md,
and the Sphinx roles (``:func:``, ``:class:``, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``) in hpctrain's
docstrings. A renamed function leaves a doc pointing at nothing; this fails naming both."""

from __future__ import annotations

import ast
import importlib
import re
import typing as tp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted((ROOT / "hpctrain").rglob("*.py"))

FILE_NAME = re.compile(r"`((?:hpctrain|tests|benchmarks|tools)/[\w/]+\.py):([A-Za-z_][\w.]*)`")
DOTTED = re.compile(r"`(hpctrain(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc):`~?([A-Za-z_][\w.]*)(?:\(\))?`")


def _defined(tree: ast.AST, dotted: str) -> bool:
    """Whether the module ``tree`` binds ``dotted`` (``name`` or ``Class.member``) at top level / in the class."""
    scope: tp.Sequence[ast.stmt] = tree.body  # type: ignore[attr-defined]
    for part in dotted.split("."):
        found = None
        for node in scope:
            names: tp.List[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            if part in names:
                found = node
                break
        if found is None and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in scope):
            # an instance attribute: ``self.<part> = ...`` in one of the class's methods
            found = next(
                (
                    t
                    for n in scope
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for t in ast.walk(n)
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.ctx, ast.Store)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and t.attr == part
                ),
                None,
            )
        if found is None:
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _resolves(dotted: str, context: tp.Optional[str] = None) -> bool:
    """``hpctrain.a.b.C.m``: import the longest module prefix, then getattr the rest (or find it in the
    class body: properties and dataclass fields without defaults are not attributes of the class)."""
    candidates = [dotted]
    if context is not None and not dotted.startswith("hpctrain"):
        # relative to the module, its package, or any class of the module (``:meth:`run``` in a class body)
        module = importlib.import_module(context)
        classes = [n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == context]
        candidates = [f"{context}.{dotted}", f"{context.rsplit('.', 1)[0]}.{dotted}", dotted]
        candidates += [f"{context}.{c}.{dotted}" for c in classes]
    for name in candidates:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj: tp.Any = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            rest = parts[i:]
            try:
                for p in rest:
                    obj = getattr(obj, p)
                return True
            except AttributeError:
                path = getattr(importlib.import_module(".".join(parts[:i])), "__file__", None)
                if path and rest and _defined(ast.parse(Path(path).read_text()), ".".join(rest)):
                    return True
            break
    return False


def test_docs_cite_files_and_names_that_exist():
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for path, name in FILE_NAME.findall(text):
            file = ROOT / path
            if not file.is_file():
                missing.append(f"{doc.name}: {path} does not exist")
            elif not _defined(ast.parse(file.read_text()), name):
                missing.append(f"{doc.name}: {path} has no {name}")
        for dotted in DOTTED.findall(text):
            if not _resolves(dotted):
                missing.append(f"{doc.name}: {dotted} does not exist")
    assert not missing, "\n".join(missing)


def test_docstrings_cite_names_that_exist():
    missing = []
    for source in SOURCES:
        module = ".".join(source.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for dotted in set(ROLE.findall(source.read_text())):
            if not _resolves(dotted, context=module):
                missing.append(f"{source.relative_to(ROOT)}: {dotted}")
    assert not missing, "\n".join(missing)


CLASS_MEMBER = re.compile(r"``~?([A-Z]\w*)\.([A-Za-z_]\w*)(?:\(\))?``")


def test_docstrings_name_members_of_hpctrain_classes_that_exist():
    """``Checkpointer.restore``-style references in plain literals: the class must have that member."""
    trees = {source: ast.parse(source.read_text()) for source in SOURCES}
    classes: tp.Dict[str, tp.List[ast.AST]] = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(tree)
    missing = []
    for source in SOURCES:
        for cls, member in set(CLASS_MEMBER.findall(source.read_text())):
            if cls in classes and not any(_defined(tree, f"{cls}.{member}") for tree in classes[cls]):
                missing.append(f"{source.relative_to(ROOT)}: {cls}.{member}")
    assert not missing, "\n".join(missing)
