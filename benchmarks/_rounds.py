"""Repeated, interleaved rounds and what is reported of them: the one owner of that logic for every benchmark.

On a shared machine the ceiling moves as much as hpctrain does between runs, so a figure measured once says
little. A benchmark with ``--repeat N`` measures every side of a comparison (hpctrain, its ceiling, its peer)
once per round, interleaved (A B C, A B C, ...), computes each ratio *per round* (both sides under the same
load), and reports the median and the spread (min-max) of the per-round ratios; a goal is met when the median
meets it. The 1-minute load average before and after each round goes with the round; a round whose load
changed by more than ``LOAD_CHANGE_CORES`` is marked (``load_changed``), as its two sides may have run under
different load.

Record of one round (``Round.as_dict``)::

    {"round": int (1-based), "load_1min": [before, after], "load_changed": bool, "seconds": float | None,
     "figures": {DOTTED KEY: number}}

Summary of one figure over the rounds (``summarize``)::

    {"median": float, "min": float, "max": float, "values": [per round, None where it was not measured],
     "rounds": int (rounds that measured it)}

Pure functions except ``load_1min`` and ``run_rounds`` (which read the load average and the clock).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
import typing as tp

__all__ = [
    "LOAD_CHANGE_CORES",
    "Round",
    "load_1min",
    "load_changed",
    "flatten",
    "summarize",
    "spread_table",
    "medians",
    "run_rounds",
    "report",
    "fmt_spread",
]

LOAD_CHANGE_CORES = 1.0  # a round whose 1-min load average moved by more than this is marked


def load_1min() -> float:
    """The 1-minute load average now (0.0 where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not on Linux/macOS
        return 0.0


def load_changed(before: float, after: float, threshold: float = LOAD_CHANGE_CORES) -> bool:
    """Whether the load moved by more than ``threshold`` cores between a round's start and its end."""
    return abs(after - before) > threshold


@dataclasses.dataclass
class Round:
    """One round: the load around it and the figures (ratios, times) it measured."""

    index: int
    load_before: float
    load_after: float
    figures: tp.Dict[str, float]
    seconds: tp.Optional[float] = None

    @property
    def changed(self) -> bool:
        return load_changed(self.load_before, self.load_after)

    def as_dict(self) -> tp.Dict[str, tp.Any]:
        return {
            "round": self.index,
            "load_1min": [self.load_before, self.load_after],
            "load_changed": self.changed,
            "seconds": self.seconds,
            "figures": dict(self.figures),
        }


def _number(v: tp.Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def flatten(result: tp.Any, prefix: str = "") -> tp.Dict[str, float]:
    """Every number in a nested dict under its dotted key (``disk.save_vs_raw``); lists, bools, strings dropped."""
    out: tp.Dict[str, float] = {}
    if isinstance(result, dict):
        for k, v in result.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(flatten(v, key + "."))
            elif _number(v):
                out[key] = v
    return out


def summarize(values: tp.Sequence[tp.Optional[float]]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """Median and min-max of the rounds' values of one figure (None entries: rounds that did not measure it);
    None when no round measured it."""
    nums = [v for v in values if _number(v)]
    if not nums:
        return None
    return {
        "median": statistics.median(nums),
        "min": min(nums),
        "max": max(nums),
        "values": [v if _number(v) else None for v in values],
        "rounds": len(nums),
    }


def spread_table(rounds: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Dict[str, tp.Any]]:
    """``summarize`` of every figure any round measured, from the rounds' records (``Round.as_dict``)."""
    keys: tp.Dict[str, None] = {}
    for r in rounds:
        keys.update(dict.fromkeys(r["figures"]))
    out = {}
    for k in keys:
        s = summarize([r["figures"].get(k) for r in rounds])
        if s is not None:
            out[k] = s
    return out


def medians(results: tp.Sequence[tp.Any]) -> tp.Any:
    """One result shaped like the rounds' results (nested dicts), each number the median over the rounds that
    have it; everything else (strings, lists, bools) from the first round."""
    if not results:
        return None
    first = results[0]
    if isinstance(first, dict):
        out = {}
        for k, v in first.items():
            same = [r[k] for r in results if isinstance(r, dict) and k in r]
            out[k] = medians(same) if isinstance(v, dict) or _number(v) else v
        return out
    if _number(first):
        return statistics.median([r for r in results if _number(r)])
    return first


def run_rounds(
    n: int, measure: tp.Callable[[int], tp.Mapping[str, float]], load: tp.Callable[[], float] = load_1min
) -> tp.List[Round]:
    """Call ``measure(i)`` for i = 1..n (each call measures every side of the comparison once, in the same
    order) and wrap each call's figures with the load average before and after it."""
    out = []
    for i in range(1, n + 1):
        before, t0 = load(), time.monotonic()
        figures = dict(measure(i))
        out.append(Round(i, before, load(), figures, round(time.monotonic() - t0, 2)))
    return out


def report(rounds: tp.Sequence[Round]) -> tp.Dict[str, tp.Any]:
    """What a benchmark adds to its JSON: ``rounds`` (each round's record), ``spread`` (every figure's median
    and min-max) and ``load_changed_rounds`` (the marked rounds' numbers)."""
    recs = [r.as_dict() for r in rounds]
    return {
        "repeat": len(recs),
        "rounds": recs,
        "spread": spread_table(recs),
        "load_changed_rounds": [r["round"] for r in recs if r["load_changed"]],
    }


def fmt_spread(s: tp.Optional[tp.Mapping[str, tp.Any]], fmt: tp.Callable[[float], str] = "{:.3g}".format) -> str:
    """``min–max`` of a summary (one value: itself; none: an em dash)."""
    if not s:
        return "—"
    if s["rounds"] == 1 or s["min"] == s["max"]:
        return fmt(s["min"]) + (" (1 round)" if s["rounds"] == 1 else "")
    return f"{fmt(s['min'])}–{fmt(s['max'])}"
