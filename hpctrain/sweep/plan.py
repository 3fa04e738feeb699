"""A sweep file (TOML) -> a validated plan: the task table of a Slurm job array.

Layout (every combination of ``[sweep.grid]`` is one task, then each ``[[sweep.tasks]]`` table is one more)::

    [sweep]
    max_parallel = 2                 # tasks running at once (the array's %K); --max-parallel overrides it
    [sweep.grid]
    "--lr" = ["0.01", "0.003"]       # the entry's arguments: a flag and its values (strings, numbers, booleans)
    "--seed" = [1, 2, 3]
    [[sweep.tasks]]                  # an explicit task: its arguments
    "--lr" = "0.1"
    "--seed" = 7
    [job]                            # optional, as in hpctrain.toml: the settings of every task
    time = "00:10:00"
    [train]
    entry = "mypkg.train:main"

A value ``true`` passes the flag alone (``"--amp" = [true, false]``: with and without it), ``false`` leaves it out.
Each task's entry arguments are the common ones (after ``--``, or ``[train] args``) followed by its own. A task's
run directory is named by its index and its parameters (``0003-lr=0.003-seed=1``), filesystem-safe. Torch-free,
stdlib only; every problem is one :class:`~hpctrain.errors.UsageError` line (exit 2) before anything is written.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain._files import shorten
from hpctrain.errors import UsageError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "SweepTask",
    "SweepPlan",
    "load_sweep",
    "parse_sweep",
    "task_name",
    "check_array_size",
    "write_plan",
    "read_plan",
    "is_sweep_dir",
    "read_toml",
    "SWEEP_FILE",
    "SCHEMA",
    "MAX_TASKS",
]

SWEEP_FILE = "sweep.json"
"""``SWEEP_DIR/sweep.json``: the whole plan, written atomically before submission and again with the job ids."""
SCHEMA = "hpctrain.sweep/1"
SWEEP_KEYS = ("max_parallel", "grid", "tasks")
CONFIG_TABLES = ("job", "train", "run")  # as in hpctrain.toml: read by hpctrain.submit.config
MAX_TASKS = 4_000_000
"""More tasks than Slurm allows in any array (its MaxArraySize is at most 4000001): refused before expansion."""
MAX_NAME_BYTES = 120  # a task directory's name; the sweep directory's path leaves room under PATH_MAX
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+,-]")

Value = tp.Union[str, int, float, bool]


@dataclass(frozen=True)
class SweepTask:
    """One task of the array: ``index`` is ``SLURM_ARRAY_TASK_ID``."""

    index: int
    params: tp.Dict[str, Value]
    """The entry's arguments of this task, in file order: ``{"--lr": "0.01", "--seed": 2}``."""
    name: str
    """Its run directory's name under the sweep directory (``0002-lr=0.01-seed=3``)."""

    @property
    def args(self) -> tp.List[str]:
        """The arguments appended to the common ones: ``["--lr", "0.01", "--seed", "2"]``."""
        out: tp.List[str] = []
        for key, value in self.params.items():
            if value is True:
                out.append(key)
            elif value is not False:
                out += [key, _text(value)]
        return out

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        return {"index": self.index, "name": self.name, "params": dict(self.params), "args": self.args}


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep file asks for: the tasks, the parallelism, and the SubmitConfig keys of its other tables."""

    tasks: tp.List[SweepTask]
    max_parallel: tp.Optional[int] = None
    config: tp.Dict[str, tp.Any] = field(default_factory=dict)
    """SubmitConfig keyword arguments from the file's ``[job]``, ``[train]`` and ``[run]`` tables."""
    source: str = ""

    def parallelism(self, override: tp.Optional[int] = None) -> int:
        """The array's ``%K``: ``--max-parallel``, else ``max_parallel``, else every task at once."""
        k = override if override is not None else self.max_parallel
        return len(self.tasks) if k is None else min(k, len(self.tasks))


def _text(value: Value) -> str:
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float: 0.003, 1e-05
    return str(value)


def task_name(index: int, params: tp.Mapping[str, Value], width: int = 4) -> str:
    """``0003-lr=0.01-seed=2``: the index (zero-padded) then ``key=value`` per parameter, leading dashes dropped;
    characters outside ``[A-Za-z0-9._=+,-]`` become ``_``; a name too long is cut and ends in a hash of the rest."""
    parts = [f"{index:0{width}d}"]
    for key, value in params.items():
        parts.append(f"{key.lstrip('-')}={str(value).lower() if isinstance(value, bool) else _text(value)}")
    name = _UNSAFE.sub("_", "-".join(parts))
    if len(name) > MAX_NAME_BYTES:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: MAX_NAME_BYTES - 11]}~{digest}"
    return name


def _where(path: tp.Union[str, Path]) -> str:
    return shorten(str(path))


def _check_value(src: str, where: str, key: str, value: tp.Any) -> Value:
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"{src}: {where} {key!r} = {value}: not a finite number")
        return value
    if isinstance(value, str):
        if _CONTROL.search(value):
            raise UsageError(f"{src}: {where} {key!r}: values must be one line without control characters")
        return value
    raise UsageError(
        f"{src}: {where} {key!r}: a value must be a string, a number or a boolean, not {type(value).__name__}"
    )


def _check_key(src: str, where: str, key: str) -> None:
    if not key.startswith("-") or key.strip("-") == "" or _CONTROL.search(key) or " " in key:
        raise UsageError(
            f'{src}: {where} key {shorten(repr(key))} must be the entry\'s flag, e.g. "--lr" (quoted, with its dashes)'
        )


def parse_sweep(table: tp.Any, source: tp.Union[str, Path] = "sweep.toml") -> SweepPlan:
    """The ``[sweep]`` table (already read from TOML) -> a plan; every problem is one UsageError line."""
    src = _where(source)
    if not isinstance(table, dict):
        raise UsageError(f"{src}: no [sweep] table: add [sweep.grid] and/or [[sweep.tasks]] (docs/sweeps.md)")
    bad = sorted(set(table) - set(SWEEP_KEYS))
    if bad:
        raise UsageError(f"{src}: unknown key(s) {shorten(bad)} in [sweep]; valid keys: {', '.join(SWEEP_KEYS)}")
    max_parallel = table.get("max_parallel")
    if max_parallel is not None and (
        isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or not 1 <= max_parallel <= MAX_TASKS
    ):
        raise UsageError(f"{src}: [sweep] max_parallel = {shorten(repr(max_parallel))} must be a whole number >= 1")
    grid = table.get("grid")
    listed = table.get("tasks")
    if grid is None and listed is None:
        raise UsageError(f"{src}: [sweep] has no tasks: add [sweep.grid] and/or [[sweep.tasks]] (docs/sweeps.md)")
    combos: tp.List[tp.Dict[str, Value]] = []
    if grid is not None:
        if not isinstance(grid, dict):
            raise UsageError(f'{src}: sweep.grid must be a table ([sweep.grid] then "--flag" = [values] lines)')
        if not grid:
            raise UsageError(f'{src}: [sweep.grid] is empty: give at least one "--flag" = [values] line')
        axes: tp.List[tp.Tuple[str, tp.List[Value]]] = []
        for key, values in grid.items():
            _check_key(src, "[sweep.grid]", key)
            if not isinstance(values, list):
                values = [values]  # "--steps" = 100: one value, the same for every task
            if not values:
                raise UsageError(f"{src}: [sweep.grid] {key!r} = []: an empty list makes an empty grid")
            axes.append((key, [_check_value(src, "[sweep.grid]", key, v) for v in values]))
        count = math.prod(len(v) for _, v in axes)
        if count > MAX_TASKS:
            raise UsageError(f"{src}: [sweep.grid] makes {count} tasks; no Slurm job array holds more than {MAX_TASKS}")
        combos += [dict(zip([k for k, _ in axes], values)) for values in itertools.product(*[v for _, v in axes])]
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
            raise UsageError(f'{src}: sweep.tasks must be a list of tables ([[sweep.tasks]] then "--flag" = value)')
        if not listed and grid is None:
            raise UsageError(f"{src}: sweep.tasks is empty: give at least one [[sweep.tasks]] table")
        if len(combos) + len(listed) > MAX_TASKS:
            raise UsageError(
                f"{src}: {len(combos) + len(listed)} tasks; no Slurm job array holds more than {MAX_TASKS}"
            )
        for n, task in enumerate(listed):
            where = f"[[sweep.tasks]] #{n + 1}"
            for key, value in task.items():
                _check_key(src, where, key)
                _check_value(src, where, key, value)
            combos.append(dict(task))
    width = max(4, len(str(len(combos) - 1)))
    tasks = [SweepTask(index=i, params=p, name=task_name(i, p, width)) for i, p in enumerate(combos)]
    return SweepPlan(tasks=tasks, max_parallel=max_parallel, source=str(source))


def load_sweep(
    path: tp.Union[str, Path],
    *,
    config: tp.Optional[tp.Callable[[tp.Dict[str, tp.Any], tp.Union[str, Path]], tp.Dict[str, tp.Any]]] = None,
) -> SweepPlan:
    """Read and validate a sweep file: its ``[sweep]`` table and, as in ``hpctrain.toml``, ``[job]``/``[train]``/
    ``[run]``, which ``config(tables, path)`` turns into SubmitConfig keyword arguments (``hpctrain.submit`` passes
    its own reader: unknown keys, wrong types). Any problem is one UsageError line."""
    data = read_toml(path)
    unknown = sorted(set(data) - {"sweep", *CONFIG_TABLES})
    if unknown:
        raise UsageError(f"{_where(path)}: unknown table(s) {shorten(unknown)}; use [sweep], [job], [train], [run]")
    tables = {k: v for k, v in data.items() if k in CONFIG_TABLES}
    kwargs = config(tables, path) if config is not None else {}
    plan = parse_sweep(data.get("sweep"), path)
    return SweepPlan(tasks=plan.tasks, max_parallel=plan.max_parallel, config=kwargs, source=str(path))


def read_toml(path: tp.Union[str, Path]) -> tp.Dict[str, tp.Any]:
    """The tables of a sweep file (a regular UTF-8 file of at most 1 MiB, valid TOML), else one UsageError line."""
    from hpctrain._files import read_regular_file

    raw = read_regular_file(Path(path), what="--sweep", limit=1 << 20)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{_where(path)}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{_where(path)}: not valid TOML ({exc})") from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4300 digits, absurd nesting
        raise UsageError(f"{_where(path)}: not usable TOML ({type(exc).__name__}: {shorten(exc, 120)})") from None


def check_array_size(count: int, slurm: tp.Any, *, source: str = "--sweep") -> tp.Optional[int]:
    """Refuse more tasks than the cluster's ``MaxArraySize`` allows (``scontrol show config`` through the Slurm
    seam); returns that limit (None: scontrol did not say, the check is left to sbatch)."""
    from hpctrain._slurm import SlurmCommandError

    try:
        limit = slurm.max_array_size()
    except SlurmCommandError:
        return None
    if limit is not None and count > limit:
        raise UsageError(
            f"{source}: {count} tasks, but this cluster's MaxArraySize is {limit} (array indices 0-{limit - 1}); "
            "split the sweep or shrink its grid"
        )
    return limit


def write_plan(sweep_dir: Path, record: tp.Mapping[str, tp.Any]) -> Path:
    """``SWEEP_DIR/sweep.json`` (atomic: tmp, fsync, rename)."""
    path = Path(sweep_dir) / SWEEP_FILE
    atomic_write_json(path, {"schema": SCHEMA, "written_at": time.time(), **record})
    return path


def is_sweep_dir(path: tp.Union[str, Path]) -> bool:
    """Whether ``path`` is a sweep's directory (it holds :data:`SWEEP_FILE`), the one test every command asks."""
    return (Path(path) / SWEEP_FILE).is_file()


def read_plan(sweep_dir: tp.Union[str, Path]) -> tp.Dict[str, tp.Any]:
    """The sweep's record (bounded read); a directory without one is a UsageError naming it."""
    from hpctrain.rundir import read_json

    problems: tp.List[str] = []
    record = read_json(Path(sweep_dir) / SWEEP_FILE, problems, limit=64 << 20)  # a task per line, up to MaxArraySize
    if record is None or not isinstance(record.get("tasks"), list):
        why = problems[0] if problems else f"no {SWEEP_FILE}"
        raise UsageError(f"{shorten(str(sweep_dir))}: {why}; name a directory that submit --sweep created")
    return record
