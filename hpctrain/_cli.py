"""One convention for every command line: ``python -m hpctrain <command>`` and ``python -m hpctrain.submit``.

- errors: one line on stderr, ``hpctrain <command>: error: <message>``;
- exit codes: 0 ok, 1 a check or operation failed (:class:`~hpctrain.errors.HpctrainError`),
  2 bad input (:class:`~hpctrain.errors.UsageError`, including argparse's own complaints), 130 interrupted;
- ``--json`` on every command that reports something: the report on stdout, nothing else there.

Stdlib only: every login-node tool imports this.
"""

from __future__ import annotations

import argparse
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
    "run_main",
    "console_entry",
    "one_line",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

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
    """``parser.add_subparsers`` whose sub-parsers follow the same error convention."""
    return parser.add_subparsers(dest="cmd", required=True, parser_class=ArgumentParser, metavar="COMMAND")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable report on stdout")


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
