"""The reproduction's record and the comparison of its loss with the bundled run's: what
``python -m hpctrain reproduce compare NEW`` does (:func:`compare_run`; the intervals and the comparison of
them are :mod:`hpctrain.bundle.loss_intervals`'s).

The record (:data:`RECORD`, schema :data:`RECORD_SCHEMA`) is written into ``NEW/code/`` by
:class:`hpctrain.bundle.reproduce_steps.Reproduction`; it holds the recorded intervals the reproduction covers and
the tolerance, so that a job that ended after reproduce returned (Slurm without ``--follow``) is compared later
from the new run directory alone.
"""

from __future__ import annotations

import typing as tp
from pathlib import Path

from hpctrain._cli import EXIT_FAILED, EXIT_OK, add_json_flag, add_run_dir, print_json
from hpctrain.errors import UsageError
from hpctrain.rundir import JSONL_LIMIT, RunDir, read_json, read_jsonl

__all__ = ["RECORD", "RECORD_SCHEMA", "compare_run"]

RECORD = "reproduce.json"
"""The reproduction's record, in :attr:`hpctrain.rundir.RunDir.reproduced_code`."""
RECORD_SCHEMA = "hpctrain.reproduce/1"


def compare_run(run_dir: tp.Union[str, Path], expected: tp.Sequence[tp.Mapping[str, tp.Any]], tolerance: float):
    """The reproduction's metrics against the ``expected`` recorded intervals (:func:`loss_intervals.compare`)."""
    from hpctrain.bundle import loss_intervals

    records, _ = read_jsonl(RunDir(run_dir).metrics, limit=JSONL_LIMIT)
    return loss_intervals.compare(expected, loss_intervals.intervals(records), tolerance=tolerance)


COMPARE_SCHEMA = "hpctrain.reproduce.compare/1"


def _compare_arguments(p: tp.Any) -> None:
    """``reproduce compare``'s arguments (the parser is :func:`hpctrain.bundle.reproduce_cli.build_parser`)."""
    add_run_dir(p)
    p.add_argument("--tolerance", type=float, metavar="REL", help="override the recorded tolerance")
    add_json_flag(p)


def _compare_main(opts: tp.Any) -> int:
    from rich.console import Console

    from hpctrain.bundle import loss_intervals

    paths = RunDir(opts.run_dir)
    problems: tp.List[str] = []
    record = read_json(paths.reproduced_code / RECORD, problems)
    if record is None or record.get("schema") != RECORD_SCHEMA:
        why = problems[0] if problems else f"no {RECORD}"
        raise UsageError(f"{opts.run_dir}: not a reproduction ({why} in {paths.reproduced_code})")
    tolerance = float(record.get("tolerance") or 0.0) if opts.tolerance is None else opts.tolerance
    result = compare_run(paths.root, record.get("expected") or [], tolerance)
    if opts.json:
        print_json(result, schema=COMPARE_SCHEMA)
    else:
        loss_intervals.render_comparison(result, Console(highlight=False, soft_wrap=True), title=_title(record))
    return EXIT_OK if result["ok"] else EXIT_FAILED


def _title(record: tp.Mapping[str, tp.Any]) -> str:
    mode = record.get("mode") or {}
    return f"loss per interval: recorded (bundle) vs {mode.get('what', 'reproduction')}"
