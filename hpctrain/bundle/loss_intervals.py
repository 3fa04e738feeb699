"""The loss of each recorded metrics interval against a reproduction's: ``python -m hpctrain reproduce`` compares
when its job has ended, ``python -m hpctrain reproduce compare NEW_RUN`` later (stdlib + rich, no torch).

The records are ``RUN_DIR/train/metrics.jsonl``'s ``"kind": "interval"`` lines (``step``, ``steps`` in the
interval, ``loss``: the mean over the interval's steps and all ranks). Two intervals are compared when they end
at the same step and cover the same number of steps (a resumed run's first interval may be shorter). On CPU the
expectation is **bit-exact**: the same code, data, seed and world size give the same floats, so the default
tolerance is 0; GPU kernels are not all deterministic, hence ``--tolerance``.
"""

from __future__ import annotations

import math
import typing as tp

__all__ = ["intervals", "expected_intervals", "compare", "render_comparison"]


def _num(value: tp.Any) -> tp.Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def intervals(records: tp.Iterable[tp.Mapping[str, tp.Any]]) -> tp.Dict[int, tp.Dict[str, tp.Any]]:
    """``{step: {"step", "steps", "loss"}}`` of the interval records; a step recorded twice (an attempt that
    redid steps after a restart) keeps its last record, the one the run's final state descends from."""
    out: tp.Dict[int, tp.Dict[str, tp.Any]] = {}
    for rec in records:
        if not isinstance(rec, dict) or rec.get("kind") != "interval":
            continue
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        steps = rec.get("steps")
        out[step] = {
            "step": step,
            "steps": steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
            "loss": _num(rec.get("loss")),
        }
    return dict(sorted(out.items()))


def expected_intervals(
    recorded: tp.Mapping[int, tp.Mapping[str, tp.Any]], after: int, until: tp.Optional[int]
) -> tp.List[tp.Dict[str, tp.Any]]:
    """The recorded intervals a reproduction that starts at step ``after`` and ends at ``until`` (None: where
    the recorded run ended) must match."""
    return [dict(r) for s, r in recorded.items() if s > after and (until is None or s <= until)]


def _equal(a: tp.Optional[float], b: tp.Optional[float], tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None  # null: the writer's NaN
    if tolerance == 0:
        return a == b
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=0.0)


def compare(
    expected: tp.Sequence[tp.Mapping[str, tp.Any]],
    replayed: tp.Mapping[int, tp.Mapping[str, tp.Any]],
    *,
    tolerance: float = 0.0,
) -> tp.Dict[str, tp.Any]:
    """Row by row: ``{"rows": [{"step", "steps", "recorded", "reproduced", "equal", "why"}], "compared",
    "differ", "missing", "not_comparable", "ok"}``. ``equal`` is True, False, or None (not comparable: the
    replay has no interval at that step, or one of another length). ``ok``: at least one interval compared,
    none differs and none is missing."""
    rows: tp.List[tp.Dict[str, tp.Any]] = []
    for exp in expected:
        step = int(exp["step"])
        got = replayed.get(step)
        row: tp.Dict[str, tp.Any] = {
            "step": step,
            "steps": exp.get("steps"),
            "recorded": exp.get("loss"),
            "reproduced": None if got is None else got.get("loss"),
            "equal": None,
            "why": "",
        }
        if got is None:
            row["why"] = "missing: the reproduction recorded no interval at this step"
        elif exp.get("steps") is not None and got.get("steps") is not None and exp["steps"] != got["steps"]:
            row["why"] = f"not comparable: an interval of {got['steps']} step(s), the recorded one {exp['steps']}"
        else:
            row["equal"] = _equal(exp.get("loss"), got.get("loss"), tolerance)
            if not row["equal"] and row["recorded"] is not None and row["reproduced"] is not None:
                row["why"] = f"differs by {row['reproduced'] - row['recorded']:+.3e}"
        rows.append(row)
    compared = [r for r in rows if r["equal"] is not None]
    missing = [r for r in rows if r["why"].startswith("missing")]
    differ = [r for r in compared if not r["equal"]]
    return {
        "rows": rows,
        "tolerance": tolerance,
        "compared": len(compared),
        "differ": len(differ),
        "missing": len(missing),
        "not_comparable": len(rows) - len(compared) - len(missing),
        "ok": bool(compared) and not differ and not missing,
    }


def _loss(value: tp.Any) -> str:
    return "null" if value is None else repr(float(value))


def render_comparison(result: tp.Mapping[str, tp.Any], console: tp.Any, *, title: str = "") -> None:
    """The comparison as a rich table (step / steps / recorded / replayed / equal) and a verdict line."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title or None)
    for col, just in (("step", "right"), ("steps", "right"), ("recorded loss", "right"), ("reproduced loss", "right")):
        table.add_column(col, justify=just)
    table.add_column("equal")
    for r in result["rows"]:
        if r["equal"] is True:
            verdict = "[green]yes[/]"
        elif r["equal"] is False:
            verdict = f"[red]NO[/] ({escape(r['why'])})" if r["why"] else "[red]NO[/]"
        else:
            verdict = f"[yellow]n/a[/] ({escape(r['why'])})"
        table.add_row(str(r["step"]), str(r["steps"] or "?"), _loss(r["recorded"]), _loss(r["reproduced"]), verdict)
    console.print(table)
    how = "bit-exact" if not result["tolerance"] else f"within a relative {result['tolerance']:g}"
    if result["ok"]:
        console.print(
            f"[bold green]loss matches[/]: {result['compared']} interval(s) {how}"
            + (f"; {result['not_comparable']} not comparable" if result["not_comparable"] else "")
        )
    else:
        parts = [
            f"{result['differ']} differ" if result["differ"] else "",
            f"{result['missing']} missing" if result["missing"] else "",
            "nothing compared" if not result["compared"] else "",
        ]
        console.print(
            f"[bold red]loss does not match[/] ({how} expected): "
            + ", ".join(p for p in parts if p)
            + f" of {len(result['rows'])} recorded interval(s)"
        )
