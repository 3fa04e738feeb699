"""Processes on this host (stdlib only: the bottom of the house, below every login-node tool).

One answer to "who runs this?" (:func:`user_name`: the registry, ``cancel`` and the identity's owner ask it),
and one to "does process N still run here?" for every caller that finds a pid in a record it did not
write (a ledger's rank 0, a checkpoint owner file, a leftover shared-memory name): such a pid may be of
any JSON type, zero or negative (``kill(0, ...)`` and ``kill(-1, ...)`` signal whole process groups), or
beyond the range of ``pid_t`` (``os.kill`` then raises OverflowError, not OSError).
"""

from __future__ import annotations

import getpass
import os
import typing as tp

__all__ = ["pid_alive", "user_name", "PID_MAX"]

PID_MAX = 2**31 - 1
"""The largest value a pid can take (``pid_t`` is a signed 32-bit int; Linux itself stops at 2**22)."""


def user_name() -> str:
    """The user this process runs as: ``getpass.getuser()``, else ``uid N`` (no USER and a uid outside
    /etc/passwd, as in many containers: the uid is still someone)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def pid_alive(pid: tp.Any) -> tp.Optional[bool]:
    """Whether process ``pid`` exists on this host.

    True: it runs (or is a zombie not yet reaped, or belongs to another user: kill(2) says EPERM).
    False: no such process. None: no answer, because ``pid`` is not a process id (not an int, a bool,
    not in 1..:data:`PID_MAX`) or kill(2) failed another way. Callers choose what None means for them
    (deleting something only when the owner is provably gone: treat None as alive).

    Signal 0 is sent: nothing is delivered, only existence and permission are checked.
    """
    if type(pid) is not int or not 0 < pid <= PID_MAX:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError, ValueError):
        return None
    return True
