"""What the Runner takes from the submitter: one frozen dataclass, one name per setting (stdlib only).

A setting has one name everywhere. The field ``hang_timeout`` is ``SubmitConfig.hang_timeout`` (the flag
``--hang-timeout`` of ``python -m hpctrain.submit``, ``[job] hang_timeout`` in TOML), ``RunnerSettings.hang_timeout``
(pickled into the :class:`~hpctrain.launch.runner.Runner`), the flag ``--hang-timeout`` of
``python -m hpctrain.launch`` (what the sbatch templates run) and ``Watchdog(hang_timeout=)``. Nothing copies the
settings one by one:

* :meth:`RunnerSettings.from_config` fills every field from the :class:`~hpctrain.submit.config.SubmitConfig`
  attribute of the same name;
* :func:`add_arguments` generates the launch command line's flags from the fields (``--hang-timeout`` from
  ``hang_timeout``; type, default and help from the field), and :meth:`RunnerSettings.from_args` reads them back;
  with ``--settings-from-env`` a setting not given as a flag comes from ``HPCTRAIN_<NAME>``
  (``HPCTRAIN_HANG_TIMEOUT``): how ``sbatch_templates/ddp.sbatch`` hands its environment to every task.

So a new setting is a field here and a field (or property) of ``SubmitConfig`` with the same name, nothing more;
``tests/launch/test_settings.py`` walks the fields and fails when one is not reachable both ways.

Stdlib only: the login side builds it, and the Runner's pickle loads it on the nodes before torch.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import textwrap
import typing as tp
from dataclasses import dataclass

from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S, DEFAULT_MAX_REQUEUES
from hpctrain.errors import UsageError

__all__ = ["RunnerSettings", "add_arguments", "flag", "env_name", "default_signal_lead"]

_UNSET: tp.Any = argparse.SUPPRESS  # a flag not given leaves no attribute: the environment or the field decides


def default_signal_lead(time_limit: int) -> int:
    """The warning lead a job gets when none is asked for: 120 s, or a quarter of a limit under 8 minutes (at least
    10 s). ``SubmitConfig`` sets ``--signal=USR2@`` to it; the Runner assumes it for the same limit."""
    return 120 if time_limit >= 480 else max(10, time_limit // 4)


@dataclass(kw_only=True, frozen=True)
class RunnerSettings:
    """Every setting of a Runner except what it runs (entry, arguments, run directory). Units are seconds."""

    gpus_per_node: int = 0
    """GPUs per node; 0 = a CPU job over gloo."""
    dist_timeout: float = DEFAULT_DIST_TIMEOUT_S
    """Seconds a rank waits for the others (rendezvous, stop agreement) before failing."""
    max_requeues: int = DEFAULT_MAX_REQUEUES
    """Requeues after a time limit, preemption or rank/node failure, counted against SLURM_RESTART_COUNT."""
    signal_lead: tp.Optional[float] = None
    """Seconds between Slurm's warning signal (--signal=USR2@S) and the end of the job; default: derived from
    the time limit as a submitted job's (120 s, a quarter of limits under 8 min), unknown (0) without one."""
    time_limit: tp.Optional[float] = None
    """The job's time limit in seconds; default: the limit squeue reports when the attempt ends."""
    hang_timeout: tp.Optional[float] = None
    """Seconds without progress on any rank that end a hung attempt; default: derived from the measured step
    time, max(10 x step, 5 min), 4 x longer in start-up, restore, save and evaluation."""
    code_path: tp.Optional[str] = None
    """A directory put first on sys.path on every task before anything of the entry is imported, so that the
    entry runs from that tree ahead of anything installed."""

    def __post_init__(self) -> None:
        # One type per setting whatever the source (SubmitConfig's ints, argparse, an older pickle's floats).
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), _kind(f)
            if value is not None and kind in (int, float, str) and type(value) is not kind:
                object.__setattr__(self, f.name, kind(value))

    @property
    def signal_lead_s(self) -> float:
        """The lead the Runner works with: ``signal_lead``, else the derived one, else 0 (unknown)."""
        if self.signal_lead is not None:
            return float(self.signal_lead)
        return float(default_signal_lead(int(self.time_limit))) if self.time_limit else 0.0

    @classmethod
    def from_config(cls, cfg: tp.Any) -> "RunnerSettings":
        """Every field from the attribute of ``cfg`` (a :class:`~hpctrain.submit.config.SubmitConfig`) with the
        same name: the one place the submitter's settings reach the Runner."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: tp.Optional[tp.Mapping[str, str]] = None) -> "RunnerSettings":
        """The settings of a command line parsed with the flags of :func:`add_arguments`: a flag given, else (with
        ``--settings-from-env``) a non-empty ``HPCTRAIN_<NAME>``, else the field's default."""
        environ = os.environ if environ is None else environ
        from_env = getattr(args, "settings_from_env", False)
        values: tp.Dict[str, tp.Any] = {}
        for f in dataclasses.fields(cls):
            if hasattr(args, f.name):
                values[f.name] = getattr(args, f.name)
            elif from_env and environ.get(env_name(f.name)):
                values[f.name] = _parse_env(f, environ[env_name(f.name)])
        return cls(**values)


def flag(name: str) -> str:
    """The command-line flag of a setting: ``hang_timeout`` -> ``--hang-timeout``."""
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    """A setting's variable under ``--settings-from-env``: ``hang_timeout`` -> ``HPCTRAIN_HANG_TIMEOUT``."""
    return "HPCTRAIN_" + name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`RunnerSettings` field (:func:`flag`), typed and documented by the field (its default
    is the field's), and ``--settings-from-env``."""
    docs = _field_docs(RunnerSettings)
    for f in dataclasses.fields(RunnerSettings):
        kind = _kind(f)
        text = " ".join(docs.get(f.name, "").split())
        if f.default is not None:
            text += f" (default {f.default})"
        help_text = f"{text} [{env_name(f.name)}]".replace("%", "%%")
        if kind is bool:
            parser.add_argument(
                flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=_UNSET, help=help_text
            )
        else:
            metavar = kind.__name__.upper()
            parser.add_argument(flag(f.name), dest=f.name, type=kind, default=_UNSET, metavar=metavar, help=help_text)
    parser.add_argument(
        "--settings-from-env",
        action="store_true",
        help="take each setting not given as a flag from its HPCTRAIN_<NAME> variable, when set and non-empty",
    )


def _parse_env(f: dataclasses.Field, text: str) -> tp.Any:  # type: ignore[type-arg]
    kind, name = _kind(f), env_name(f.name)
    if kind is bool:
        word = text.strip().lower()
        if word in ("1", "true", "yes", "on") or word in ("0", "false", "no", "off"):
            return word in ("1", "true", "yes", "on")
        raise UsageError(f"{name}={text!r} is not a yes/no value: use 1 or 0")
    try:
        return kind(text.strip())
    except ValueError:
        raise UsageError(
            f"{name}={text!r} is not {'an' if kind is int else 'a'} {kind.__name__} ({flag(f.name)})"
        ) from None


def _kind(f: dataclasses.Field) -> tp.Any:  # type: ignore[type-arg]
    """The value type of a field: ``float`` for ``Optional[float]``."""
    hint = _HINTS[f.name]
    args = [a for a in tp.get_args(hint) if a is not type(None)]
    return args[0] if tp.get_origin(hint) is tp.Union and len(args) == 1 else hint


def _field_docs(cls: type) -> tp.Dict[str, str]:
    """The docstring under each field of ``cls`` (read from its source, as torchtitan's config manager does)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source shipped: flags without help
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = after.value.value
    return docs


_HINTS = tp.get_type_hints(RunnerSettings)
