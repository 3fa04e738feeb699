"""The house, read from its imports: the layers below are the design, and the code must follow them.

Read the list from the bottom up: each line is one floor, and a package may import only from the
floors below its own (never from its own floor's other packages, never from a floor above). The
graph is computed from the code with ``ast`` (every ``import``, including those inside functions),
so a lazy import that climbs is caught as well as a top-level one.

Three more rules:
- no circle between modules (a circle hides which of two modules owns a fact);
- no module outside a package imports that package's private modules (``hpctrain.ckpt._reader``):
  a package is read through its public API;
- the node side (what runs on the compute nodes) never imports a login-side command module.
"""

from __future__ import annotations

import ast
import typing as tp
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. One line per floor: the packages (or top-level modules) on it, and what the floor is.
LAYERS: tp.List[tp.Tuple[str, str]] = [
    ("errors", "the errors raised on purpose, each with its exit code"),
    (
        "hpctrain defaults _atomic _files _human _procs",
        "ground: defaults, durable writes, bounded reads, formats for people",
    ),
    ("charts", "inline SVG charts drawn from numbers (the one chart engine)"),
    (
        "_validate _cli _entry _output reliability",
        "config validation, the CLI convention, the entry; reliability formulas",
    ),
    ("_slurm _lustre _cuda _container", "the seams to Slurm, Lustre, CUDA and container runtimes"),
    ("testing", "the fakes of those seams, shipped with the library"),
    ("rundir", "every path of a run directory"),
    ("registry", "the per-user run registry (one line per submitted run)"),
    ("ledger", "the attempts' start / end / exit records"),
    ("runtime", "ranks, rendezvous, process group, device, stop agreement (node side)"),
    ("data ckpt", "the input path and the checkpoints (node side, with torch-free login readers)"),
    ("identity", "the run identity: code, config, data, runtime, ownership"),
    ("run", "what a run directory says: attempts, its checkpoints, its identity"),
    ("run_slurm", "Slurm's record of a run's attempts (sacct, matched by time)"),
    ("sweep", "a sweep's plan and its table (login side)"),
    ("launch train approvals", "the task runner and the Trainer (node side); the approval log"),
    ("status submit logs cancel", "login side: where a run stands; submitting a run; its logs; cancelling it"),
    ("runs", "the list of a user's runs (registry + run directories + one squeue/sacct)"),
    ("capacity", "the planner"),
    ("report bundle", "the HTML report and TensorBoard export; the recoverable bundle and reproduce"),
    ("examples __main__", "the demo and the front door"),
]

NODE_SIDE = {"runtime", "data", "ckpt", "launch", "train"}
LOGIN_COMMANDS = {"submit", "status", "logs", "cancel", "runs", "capacity", "report", "bundle", "approvals", "__main__"}


def _modules(root: Path = ROOT) -> tp.Dict[str, Path]:
    mods = {}
    for path in (root / "hpctrain").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: tp.Dict[str, Path]) -> tp.Dict[str, tp.Set[str]]:
    edges: tp.Dict[str, tp.Set[str]] = defaultdict(set)
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: tp.List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # `from pkg import sub` imports the module pkg.sub (and runs pkg/__init__, which is not an
                # arrow of this module's making); `from pkg import name` imports pkg itself.
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            for target in targets:
                if not target.startswith("hpctrain"):
                    continue
                while target and target not in mods:  # the longest module prefix: `from x import name`
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    edges[mod].add(target)
    return edges


def _unit(mod: str) -> str:
    """The package or top-level module a module belongs to (``hpctrain.ckpt._reader`` -> ``ckpt``)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "hpctrain"


MODS = _modules()
EDGES = _imports(MODS)
FLOOR = {unit: i for i, (units, _) in enumerate(LAYERS) for unit in units.split()}


def test_every_package_has_a_floor():
    units = {_unit(m) for m in MODS}
    assert not units - set(FLOOR), f"packages with no line in LAYERS (add one): {sorted(units - set(FLOOR))}"
    assert not set(FLOOR) - units, f"LAYERS names packages that do not exist: {sorted(set(FLOOR) - units)}"


def test_no_import_climbs_or_crosses_a_floor():
    bad = sorted(
        f"{m} -> {t}  ({_unit(m)} is on floor {FLOOR[_unit(m)]}, {_unit(t)} on floor {FLOOR[_unit(t)]})"
        for m, targets in EDGES.items()
        for t in targets
        if _unit(m) != _unit(t) and FLOOR[_unit(t)] >= FLOOR[_unit(m)]
    )
    assert not bad, "imports that climb, or cross to a package on the same floor:\n" + "\n".join(bad)


def test_no_circle_between_modules():
    index: tp.Dict[str, int] = {}
    low: tp.Dict[str, int] = {}
    stack: tp.List[str] = []
    on_stack: tp.Set[str] = set()
    circles: tp.List[tp.List[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in EDGES.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for mod in sorted(MODS):
        if mod not in index:
            visit(mod)
    assert not circles, "modules that import each other in a circle: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_private_module_of_another_package_is_imported():
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in EDGES.items()
        for t in targets
        if _unit(m) != _unit(t) and any(part.startswith("_") and part != "__init__" for part in t.split(".")[2:])
    )
    assert not bad, "read another package through its public API, not its private modules:\n" + "\n".join(bad)


def test_the_node_side_never_imports_a_login_command():
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in EDGES.items()
        for t in targets
        if _unit(m) in NODE_SIDE and _unit(t) in LOGIN_COMMANDS
    )
    assert not bad, "node-side code importing a login-side command:\n" + "\n".join(bad)


def test_the_layering_check_sees_a_climbing_import(tmp_path):
    """The checker itself: a module that imports from a floor above is found (the test can fail)."""
    fake = tmp_path / "hpctrain"
    (fake / "ckpt").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "ckpt" / "__init__.py").write_text("def f():\n    from hpctrain.report import page\n")
    (fake / "report").mkdir()
    (fake / "report" / "__init__.py").write_text("")
    (fake / "report" / "page.py").write_text("from ..ckpt import f\n")
    edges = _imports(_modules(tmp_path))
    assert "hpctrain.report.page" in edges["hpctrain.ckpt"]
    assert "hpctrain.ckpt" in edges["hpctrain.report.page"]
    assert FLOOR["report"] > FLOOR["ckpt"]
