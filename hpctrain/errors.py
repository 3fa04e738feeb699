"""The errors hpctrain raises on purpose. Catch :class:`HpctrainError` to catch them all.

Every message is one line that names the problem and what to do. The CLIs turn these into
``hpctrain <command>: error: <message>`` and the exit code of the class (see ``hpctrain._cli``).
"""

from __future__ import annotations

__all__ = ["HpctrainError", "UsageError", "CheckpointFormatError", "InJobRecoveryFallback"]


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


class InJobRecoveryFallback(HpctrainError):
    """In-job recovery could not keep the run going (no warm spare left, a second failure during the recovery,
    the recovery's bound passed): this rank ends as after any peer failure, and the existing path (a new step on
    a spare node, else the requeue) restarts the run from its last commit.

    Raised *from* the peer failure that started the recovery, so :func:`hpctrain.runtime.preemption.is_peer_failure`
    and the Runner's end classify it as that failure; the message is the one line saying why it fell back.
    """

    exit_code = 1
