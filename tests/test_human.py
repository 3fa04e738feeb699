"""Numbers for people (hpctrain._human): the one duration, count and size format of every screen and page."""

from __future__ import annotations

import math

import pytest

from hpctrain._human import fmt_bytes, fmt_duration, fmt_num


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0, "0 s"),
        (-5, "0 s"),  # clock skew
        (2e-5, "20 µs"),
        (0.85, "850 ms"),
        (12.34, "12.3 s"),
        (45, "45.0 s"),
        (200, "3 min 20 s"),
        (3599, "59 min 59 s"),
        (2 * 3600 + 5 * 60, "2 h 05 min"),
        (27 * 3600, "1 d 3 h"),
        (1e300, ">10000 d"),  # a bound, not 300 digits
    ],
)
def test_durations_are_compact_two_units_at_most(seconds, shown):
    assert fmt_duration(seconds) == shown


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf, True, "12", 10**400])
def test_what_is_not_a_finite_number_is_a_question_mark(value):
    assert fmt_duration(value) == "?" and fmt_num(value) == "?" and fmt_bytes(value) == "?"


def test_counts_and_rates_with_si_suffixes():
    assert fmt_num(0) == "0" and fmt_num(12.345) == "12.3" and fmt_num(5123.0) == "5.12k"
    assert fmt_num(45.6e6) == "45.6M" and fmt_num(3.2e9) == "3.2G" and fmt_num(2e15) == "2P"
    assert fmt_num(2.123456, 5) == "2.1235" and fmt_num(1.5e-4) == "1.50e-04" and fmt_num(-2500) == "-2.5k"


def test_sizes_in_binary_units():
    assert fmt_bytes(512) == "512 B" and fmt_bytes(140_500) == "137.2 KiB"
    assert fmt_bytes(12 * 2**30) == "12.0 GiB" and fmt_bytes(3 * 2**40) == "3.0 TiB"


def test_every_screen_formats_through_this_module():
    """No module of the house keeps a formatter of its own for durations, rates or sizes."""
    import ast
    from pathlib import Path

    import hpctrain

    own = []
    for path in Path(hpctrain.__file__).parent.rglob("*.py"):
        if path.name == "_human.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name in {
                "fmt_bytes", "fmt_duration", "fmt_rate", "fmt_seconds", "fmt_num", "human_bytes", "human_duration"
            }:  # fmt: skip
                own.append(f"{path.name}:{node.name}")
    assert not own, own


def test_fmt_local_time_formats_a_time_and_never_fails_on_a_damaged_one():
    import time

    from hpctrain._human import fmt_local_time

    t = 1_700_000_000.0
    assert fmt_local_time(t, "%Y-%m-%d %H:%M") == time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
    for bad in (None, True, "12", float("inf"), 1e300):
        assert fmt_local_time(bad) == "?" and fmt_local_time(bad, unknown="") == ""
