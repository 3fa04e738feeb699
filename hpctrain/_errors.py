"""User-facing errors and the one place that turns them into a one-line message and an exit code."""

from __future__ import annotations

import sys
import typing as tp

__all__ = ["HpctrainError", "UsageError", "cli_entry"]


class HpctrainError(Exception):
    """An error a researcher can act on: the message is one line that names the problem and the fix."""

    exit_code: int = 1


class UsageError(HpctrainError):
    """Bad input (flag, config file, path): exit 2 and nothing was submitted, written or removed."""

    exit_code = 2


def cli_entry(main: tp.Callable[[tp.Optional[tp.Sequence[str]]], int], prog: str) -> tp.NoReturn:
    """Run a CLI ``main(argv) -> exit code``; report an :class:`HpctrainError` as ``prog: error: msg``."""
    try:
        code = main(None)
    except HpctrainError as exc:
        message = " ".join(str(exc).split("\n"))  # one line, always
        print(f"{prog}: error: {message}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
