"""The settings a reproduction is submitted with: the submit flags given to ``reproduce`` (they override the
recorded ones), the recorded settings written as ``hpctrain.submit``'s TOML (:data:`SUBMIT_TOML`), the new run
directory, and the rebuilt code tree made visible to ``hpctrain.submit`` and to the job while it is submitted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import typing as tp
from pathlib import Path

from hpctrain.errors import UsageError

__all__ = ["SUBMIT_TOML"]

SUBMIT_TOML = "submit.toml"
"""The recorded settings as given to ``hpctrain.submit --config`` (flags given to reproduce override them)."""
_NOT_PASSED = {
    "entry",
    "resume",
    "config",
    "run_dir",
    "require_clean",
    "json",
}  # submit flags reproduce owns or refuses


def _submit_flags(ns: argparse.Namespace) -> tp.Tuple[tp.List[str], tp.Dict[str, tp.Any]]:
    """The submit flags given (argv for hpctrain.submit, and ``{field: value}``)."""
    from hpctrain.submit.cli import build_parser

    argv: tp.List[str] = []
    values: tp.Dict[str, tp.Any] = {}
    for action in build_parser()._actions:
        if action.dest in _NOT_PASSED or action.dest == "help" or not hasattr(ns, action.dest):
            continue
        value = getattr(ns, action.dest)
        values[action.dest] = value
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return argv, values


def _toml_value(value: tp.Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise UsageError(f"the recorded setting {value!r} cannot be written as TOML")


def _toml(config: tp.Mapping[str, tp.Any], entry: str, args: tp.Sequence[str], notes: str, code_path: str) -> str:
    from hpctrain.submit.config import RUN_KEYS, SubmitConfig

    fields = {f for f in SubmitConfig.__dataclass_fields__}
    job = {
        k: v
        for k, v in config.items()
        if k in fields and k not in ("entry", "entry_args", "run_dir", "code_path", *RUN_KEYS) and v is not None
    }
    job["code_path"] = code_path
    lines = ["# written by python -m hpctrain reproduce: the recorded settings (flags given to it override them)"]
    lines += ["[job]"] + [f"{k} = {_toml_value(v)}" for k, v in sorted(job.items())]
    lines += ["", "[train]", f"entry = {_toml_value(entry)}", f"args = {_toml_value(list(args))}"]
    # the deny-list of files never stored travels with the run; who and why are the reproducer's (notes below)
    patterns = config.get("secret_patterns")
    lines += ["", "[run]", f"notes = {_toml_value(notes)}"]
    lines += [f"secret_patterns = {_toml_value(list(patterns))}"] if patterns else []
    lines += [""]
    return "\n".join(lines)


def refuse_nested(run_dir: Path, bundle: Path) -> None:
    """One UsageError line when the new run directory would lie inside the bundle (a run writes its records and
    checkpoints there: the bundle would no longer verify) or hold it, symlinks resolved."""
    from hpctrain.run import nested

    how = nested(run_dir, bundle)
    if how == "inside":
        raise UsageError(
            f"--run-dir {run_dir} is inside the bundle {bundle}: the reproduction would write into it (and it would "
            "no longer verify); choose a run directory outside the bundle"
        )
    if how == "contains":
        raise UsageError(
            f"--run-dir {run_dir} contains the bundle {bundle}: choose a new run directory beside the bundle"
        )


def _new_run_dir(opts: argparse.Namespace, job_name: str, bundle: tp.Optional[Path] = None) -> Path:
    from hpctrain.submit import backend
    from hpctrain.submit.config import SubmitConfig

    if opts.run_dir:
        path = Path(opts.run_dir).expanduser().absolute()
    else:
        path = backend.default_run_dir(SubmitConfig(job_name=f"{job_name}-reproduce")).absolute()
    if bundle is not None:
        refuse_nested(path, bundle)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--run-dir {path} exists and is not empty; a reproduction goes into a new directory")
    return path


@contextlib.contextmanager
def _entry_visible(
    code_path: str, cwd: tp.Optional[str], env: tp.Optional[tp.Mapping[str, str]] = None
) -> tp.Iterator[None]:
    """While hpctrain.submit checks the entry (statically on sys.path, then by importing it in a child) and
    starts the job (which inherits this environment: a local job's processes, and sbatch's default export): the
    rebuilt tree first on this process's path and the child's ``PYTHONPATH``, the working directory the run was
    submitted from (translated into the tree), and ``env`` (``OMP_NUM_THREADS``)."""
    old_path, old_cwd = list(sys.path), os.getcwd()
    extra = dict(env or {})
    previous = {k: os.environ.get(k) for k in ["PYTHONPATH", *extra]}
    sys.path.insert(0, code_path)
    os.environ["PYTHONPATH"] = code_path + (os.pathsep + previous["PYTHONPATH"] if previous["PYTHONPATH"] else "")
    os.environ.update(extra)
    if cwd:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
