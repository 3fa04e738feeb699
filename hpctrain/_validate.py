"""The checks every configuration dataclass runs in ``__post_init__`` (stdlib only: login-node code imports it).

Each ``check_*`` takes the config being checked (``owner``), a field name and its value, and raises
:class:`~hpctrain.errors.UsageError` with one line that names the option and says what would be right.
The owner chooses how its options are named, with the class attribute ``_option_name``: a format string
of ``{name}`` (the field) and ``{flag}`` (the field with dashes). Without it an option is
``<ClassName>.<field>``::

    TrainConfig.seed must be an integer from 0 to 18446744073709551615 (...), got 18446744073709551616
    TrainConfig.checkpoint.async_save must be True or False, got 'no'   # "TrainConfig.checkpoint.{name}"
    --nodes 0 must be at least 1                                        # "--{flag}": said as it was typed

The checks are strict on types: a bool is not an integer (``eval_every=True``), a truthy string is not a
bool (``async_save="no"``), bytes and integers are not paths (``dir=b"/x"``, ``dir=5``).
"""

from __future__ import annotations

import math
import os
import typing as tp

from hpctrain._files import shorten
from hpctrain.errors import UsageError

__all__ = [
    "option_name",
    "usage_error",
    "check_int",
    "check_number",
    "check_bool",
    "check_str",
    "check_choice",
    "check_path",
    "check_strings",
    "check_instance",
]

Number = tp.Union[int, float]


def option_name(owner: tp.Any, name: str) -> str:
    """How ``owner`` names its field ``name`` in errors (see the module docstring)."""
    fmt = getattr(owner, "_option_name", None) or f"{type(owner).__name__}.{{name}}"
    return str(fmt).format(name=name, flag=name.replace("_", "-"))


def _is_flag(label: str) -> bool:
    return label.startswith("-")


def usage_error(owner: tp.Any, name: str, value: tp.Any, predicate: str, hint: str = "") -> UsageError:
    """``<option> <predicate> (<hint>), got <value>``; a command-line option says the value where it was
    typed: ``--option <value> <predicate> (<hint>)``. ``predicate`` is e.g. ``"must be an integer >= 1"``."""
    label, shown = option_name(owner, name), shorten(repr(value))
    tail = f" ({hint})" if hint else ""
    if _is_flag(label):
        return UsageError(f"{label} {shown} {predicate}{tail}")
    return UsageError(f"{label} {predicate}{tail}, got {shown}")


def _range(kind: str, min: tp.Optional[Number], max: tp.Optional[Number], *, above: bool = False) -> str:
    if min is not None and max is not None:
        return f"{kind} from {min} to {max}"
    if min is not None:
        return f"{kind} {'>' if above else '>='} {min}"
    if max is not None:
        return f"{kind} <= {max}"
    return kind


def _or_none(text: str, none_ok: bool) -> str:
    return f"{text} or None" if none_ok else text


def check_int(
    owner: tp.Any,
    name: str,
    value: tp.Any,
    *,
    min: tp.Optional[int] = None,
    max: tp.Optional[int] = None,
    none_ok: bool = False,
    hint: str = "",
) -> None:
    """An ``int`` (not a bool) in ``[min, max]`` (None: no bound); None when ``none_ok``."""
    if value is None and none_ok:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    low = is_int and min is not None and value < min
    high = is_int and max is not None and value > max
    if is_int and not low and not high:
        return
    if _is_flag(option_name(owner, name)):  # as a command line speaks: "--nodes 0 must be at least 1"
        if not is_int:
            predicate = "must be an integer"
        elif low:
            predicate = f"must be at least {min}"
        else:
            predicate = f"is too large (at most {max})"
    else:
        predicate = "must be " + _or_none(_range("an integer", min, max), none_ok)
    raise usage_error(owner, name, value, predicate, hint)


def check_number(
    owner: tp.Any,
    name: str,
    value: tp.Any,
    *,
    min: tp.Optional[Number] = None,
    above: tp.Optional[Number] = None,
    max: tp.Optional[Number] = None,
    none_ok: bool = False,
    hint: str = "",
) -> None:
    """A finite ``int`` or ``float`` (not a bool, NaN or inf), ``>= min``, ``> above``, ``<= max``."""
    if value is None and none_ok:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (min is None or value >= min) and (above is None or value > above) and (max is None or value <= max):
        return
    text = _range("a number", above if above is not None else min, max, above=above is not None)
    raise usage_error(owner, name, value, "must be " + _or_none(text, none_ok), hint)


def check_bool(owner: tp.Any, name: str, value: tp.Any, *, hint: str = "") -> None:
    """``True`` or ``False`` exactly: ``"no"`` is truthy, so a string (or 0/1) is refused, not guessed."""
    if not isinstance(value, bool):
        raise usage_error(owner, name, value, "must be True or False", hint)


def check_str(owner: tp.Any, name: str, value: tp.Any, *, none_ok: bool = False, hint: str = "") -> None:
    """A ``str`` (None when ``none_ok``)."""
    if not (isinstance(value, str) or (value is None and none_ok)):
        raise usage_error(owner, name, value, "must be " + _or_none("a string", none_ok), hint)


def check_choice(owner: tp.Any, name: str, value: tp.Any, choices: tp.Sequence[str], *, hint: str = "") -> None:
    """One of ``choices`` (strings)."""
    if not (isinstance(value, str) and value in choices):
        raise usage_error(owner, name, value, f"must be one of {', '.join(choices)}", hint)


def check_path(
    owner: tp.Any,
    name: str,
    value: tp.Any,
    *,
    what: str = "a path",
    none_ok: bool = False,
    hint: str = "",
) -> None:
    """A non-empty ``str`` or ``os.PathLike`` naming a ``str`` path (None when ``none_ok``). Refused: bytes
    (``open`` would take them, ``Path`` not), integers (``open(5)`` is file descriptor 5), empty strings."""
    if value is None and none_ok:
        return
    path: tp.Any = None
    if isinstance(value, (str, os.PathLike)):
        try:
            path = os.fspath(value)
        except TypeError:  # a broken __fspath__
            path = None
    if not isinstance(path, str) or not path:
        raise usage_error(owner, name, value, "must be " + _or_none(f"{what} (a str or os.PathLike)", none_ok), hint)


def check_strings(owner: tp.Any, name: str, value: tp.Any, *, hint: str = "") -> tp.Tuple[str, ...]:
    """A tuple or list of strings (not one string, which would be iterated letter by letter); returned as a tuple."""
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise usage_error(owner, name, value, "must be a tuple of strings", hint)
    return tuple(value)


def check_instance(owner: tp.Any, name: str, value: tp.Any, cls: type, *, none_ok: bool = False) -> None:
    """An instance of ``cls`` (None when ``none_ok``)."""
    if not (isinstance(value, cls) or (value is None and none_ok)):
        raise usage_error(owner, name, value, "must be " + _or_none(f"a {cls.__name__}", none_ok))
