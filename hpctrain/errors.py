"""The errors hpctrain raises on purpose. Catch :class:`HpctrainError` to catch them all.

Every message is one line that names the problem and what to do. The CLIs turn these into
``hpctrain <command>: error: <message>`` and the exit code of the class (see ``hpctrain._cli``).
"""

from __future__ import annotations

__all__ = ["HpctrainError", "UsageError", "CheckpointFormatError"]


class HpctrainError(Exception):
    """An error a researcher can act on: the message is one line that names the problem and the fix."""

    exit_code: int = 1
    """Exit status of a CLI that ends with this error (1: a check or an operation failed)."""


class UsageError(HpctrainError):
    """Bad input (flag, config file, path, argument): nothing was submitted, written or removed."""

    exit_code = 2


class CheckpointFormatError(HpctrainError):
    """A checkpoint file or directory does not match the format (missing, truncated, corrupt, crafted).

    The message names the file. Restore quarantines a step that raises it and falls back to an older one.
    """
