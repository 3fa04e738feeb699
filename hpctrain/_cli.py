"""One convention for every command line: ``python -m hpctrain <command>`` and ``python -m hpctrain.submit``.

The user's page is ``docs/cli.md``; ``tests/test_cli_convention.py`` walks every command's parser to keep it so.

- errors: one line on stderr, ``hpctrain <command>: error: <message>``;
- exit codes: 0 ok, 1 a check or operation failed (:class:`~hpctrain.errors.HpctrainError`),
  2 bad input (:class:`~hpctrain.errors.UsageError`, including argparse's own complaints), 130 interrupted;
- outputs: ``-o/--output FILE|DIR`` (:func:`add_output`); an existing output is refused (exit 2) unless
  ``--force``, whose switch is :mod:`hpctrain._output`'s ``overwrite=`` (:data:`FORCE_HINT` its ``hint=``);
- the run directory: the positional ``RUN_DIR`` (:func:`add_run_dir`), one help text everywhere;
- sub-commands: :func:`add_subcommands`; a short form without the sub-command's name
  (``bundle RUN_DIR -o OUT``) through :func:`implicit_subcommand`, only where it is unambiguous;
- ``--json`` (:func:`add_json_flag`) on every command that reports something: one JSON object on stdout,
  nothing else there, with a ``schema`` field naming its shape, standard JSON (no NaN or Infinity: a
  non-finite number is ``null``), printed by :func:`print_json`.

Stdlib only: every login-node tool imports this.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import typing as tp

from hpctrain.errors import HpctrainError, UsageError

__all__ = [
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "ArgumentParser",
    "command_parser",
    "add_subcommands",
    "add_json_flag",
    "add_output",
    "add_run_dir",
    "implicit_subcommand",
    "json_object",
    "dumps_json",
    "print_json",
    "HELP",
    "FORCE_HINT",
    "STEP_HELP",
    "run_main",
    "console_entry",
    "one_line",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# The help words of the things every command shares: `--help` shows the same words for the same things.
RUN_DIR_HELP = "the run directory (made by python -m hpctrain.submit; its --run-dir)"
JSON_HELP = (
    'print one JSON object on stdout instead (with a "schema" field; standard JSON: non-finite numbers are null)'
)
FORCE_HELP = "replace an existing output (without --force an existing output is refused, exit 2)"
STEP_HELP = "the committed checkpoint's step (default: the newest)"
HELP: tp.Dict[str, str] = {"RUN_DIR": RUN_DIR_HELP, "--json": JSON_HELP, "--force": FORCE_HELP}
"""Canonical help text per shared option (``tests/test_cli_convention.py`` holds every command to it)."""
FORCE_HINT = "pass --force to replace it, or choose another path"
"""The ``hint=`` for :mod:`hpctrain._output` when an existing output is refused."""
_OUTPUT_METAVAR = {"file": "FILE", "dir": "DIR"}

Main = tp.Callable[[tp.Optional[tp.Sequence[str]]], int]


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a bad command line raises :class:`UsageError` (one line, exit 2) instead of
    printing the usage block and calling ``sys.exit`` from deep inside the parser."""

    def error(self, message: str) -> tp.NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def command_parser(command: str, description: str, **kwargs: tp.Any) -> ArgumentParser:
    """The top-level parser of ``python -m hpctrain <command>``; sub-commands use the same class."""
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    return ArgumentParser(prog=f"python -m hpctrain {command}", description=description, **kwargs)


def add_subcommands(parser: argparse.ArgumentParser) -> tp.Any:
    """``parser.add_subparsers`` whose sub-parsers follow the same error convention (``dest="cmd"``).
    ``sub.add_parser(name, help=..., description=...)``: the sub-command's prog is ``<parent prog> <name>``."""
    return parser.add_subparsers(dest="cmd", required=True, parser_class=ArgumentParser, metavar="COMMAND")


def implicit_subcommand(argv: tp.Sequence[str], names: tp.Iterable[str], default: str) -> tp.List[str]:
    """``argv`` with ``default`` put in front for a short form without the sub-command's name: when the first
    word is an option other than ``-h/--help``, a path (it holds a ``/``), or an existing file or directory
    that is not a sub-command's name.

    Unambiguous: a sub-command's name is always the sub-command (a run directory named ``verify`` is
    ``./verify``, or ``<command> <default> verify``); a bare word that is neither a name nor an existing path
    is left for argparse to refuse (``invalid choice``), so a mistyped sub-command is never read as a path."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help") or args[0] in set(names):
        return args
    first = args[0]
    if first.startswith("-") or os.sep in first or "/" in first or os.path.lexists(first):
        return [default, *args]
    return args


def add_json_flag(parser: tp.Any) -> None:
    """``--json``: the report as one object (:func:`print_json`) instead of the tables."""
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def add_run_dir(parser: tp.Any, *, dest: str = "run_dir", nargs: tp.Optional[str] = None) -> None:
    """The positional ``RUN_DIR`` (``nargs="*"`` for several), with the one help text."""
    kwargs: tp.Dict[str, tp.Any] = {"nargs": nargs} if nargs else {}
    parser.add_argument(dest, metavar="RUN_DIR", help=RUN_DIR_HELP, **kwargs)


def add_output(
    parser: tp.Any,
    *,
    kind: str = "file",
    help: str,
    required: bool = False,
    default: tp.Optional[str] = None,
    dest: str = "output",
    aliases: tp.Sequence[str] = (),
    force_aliases: tp.Sequence[str] = (),
) -> None:
    """``-o/--output FILE|DIR`` and ``--force``, in the same words everywhere: ``help`` names what is written
    (``"the HTML report"``), ``default`` where it goes without ``-o``. ``aliases`` (``--run-dir``) and
    ``force_aliases`` (``--overwrite``) are older spellings, accepted but not shown in ``--help``."""
    if kind not in _OUTPUT_METAVAR:
        raise ValueError(f"add_output kind must be 'file' or 'dir', got {kind!r}")
    metavar = _OUTPUT_METAVAR[kind]
    where = f" (default {default})" if default else ""
    parser.add_argument(
        "-o",
        "--output",
        dest=dest,
        metavar=metavar,
        required=required,
        help=f"write {help} to {metavar}{where}; an existing output there is replaced only with --force",
    )
    for alias in aliases:
        parser.add_argument(alias, dest=dest, metavar=metavar, help=argparse.SUPPRESS)
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    for alias in force_aliases:
        parser.add_argument(alias, dest="force", action="store_true", help=argparse.SUPPRESS)


_MAX_JSON_DEPTH = 200


def _standard(value: tp.Any, depth: int) -> tp.Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= _MAX_JSON_DEPTH:
        return None
    if isinstance(value, tp.Mapping):
        return {str(k): _standard(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_standard(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_standard(v, depth + 1) for v in value), key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    try:  # numpy scalars and the like
        item = value.item()
    except (AttributeError, TypeError, ValueError):
        return str(value)
    return _standard(item, depth + 1) if isinstance(item, (bool, int, float, str)) else str(item)


def json_object(obj: tp.Mapping[str, tp.Any], *, schema: str) -> tp.Dict[str, tp.Any]:
    """``obj`` made standard JSON, with ``schema`` set (it replaces any ``schema`` the object had: it names the
    shape of what is printed). Non-finite numbers become None; tuples lists; paths strings; other values their
    ``str``; nesting deeper than 200 levels None."""
    if not isinstance(obj, tp.Mapping):
        raise TypeError(f"--json prints one object, not {type(obj).__name__}")
    body = _standard(obj, 0)
    body.pop("schema", None)
    return {"schema": schema, **body}


def dumps_json(obj: tp.Mapping[str, tp.Any], *, schema: str) -> str:
    """:func:`json_object` as text (``indent=2``, sorted keys, ``allow_nan=False``)."""
    return json.dumps(json_object(obj, schema=schema), indent=2, sort_keys=True, allow_nan=False)


def print_json(obj: tp.Mapping[str, tp.Any], *, schema: str, file: tp.Optional[tp.TextIO] = None) -> None:
    """Print the report of a ``--json`` command: one object with a ``schema`` field (:func:`dumps_json`)."""
    print(dumps_json(obj, schema=schema), file=file or sys.stdout, flush=True)


def one_line(text: str) -> str:
    """``text`` folded onto one line (error messages may quote multi-line tool output)."""
    return " ".join(str(text).split())


def run_main(main: Main, command: str, argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    """Call ``main(argv)``; report an :class:`HpctrainError` as one line and return the exit code."""
    try:
        return int(main(argv) or 0)
    except HpctrainError as exc:
        print(f"hpctrain {command}: error: {one_line(str(exc)) or type(exc).__name__}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"hpctrain {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        return EXIT_OK


def console_entry(main: Main, command: str) -> tp.NoReturn:
    sys.exit(run_main(main, command))
