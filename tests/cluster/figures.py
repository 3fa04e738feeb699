"""The figures the cluster tests measure: printed, and appended to ``$HPCTRAIN_FIGURES`` when it is set (the docs
quote them from there). One writer, and one shape for an in-job recovery's figure."""

from __future__ import annotations

import json
import os
import typing as tp

__all__ = ["write_figure", "recovery_figure"]


def write_figure(fig: tp.Mapping[str, tp.Any]) -> None:
    print(f"figures {json.dumps(fig)}")
    if os.environ.get("HPCTRAIN_FIGURES"):
        with open(os.environ["HPCTRAIN_FIGURES"], "a") as f:
            f.write(json.dumps(fig) + "\n")


def recovery_figure(name: str, record: tp.Mapping[str, tp.Any], load: float, **extra: tp.Any) -> None:
    """An ``in_job_recovery`` record's figure: failure -> first new step, its phases, the steps redone, the load
    average (1 min) when it was read; ``extra`` (e.g. from the test's own clock) after them."""
    write_figure(
        {
            "run": name,
            "failure_to_first_step_s": round(record["failure_to_first_step_s"], 2),
            "phases_s": {k: round(v, 3) for k, v in record["phases_s"].items() if v is not None},
            "agreed_step": record["agreed_step"],
            "steps_redone": record["steps_redone"],
            "load_average_1m": round(load, 2),
            **extra,
        }
    )
