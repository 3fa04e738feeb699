"""``python -m hpctrain status RUN_DIR [--json]``: where a run stands, from the login node.

The report itself is :func:`hpctrain.status.report.collect` (a library); this module is its command line
(``hpctrain._cli``'s convention: one error line, exit 2 for a path that is not a run directory) and
:mod:`hpctrain.status.view` its rich rendering. Never imports torch: it must answer in well under a second
on a login node.
"""

from __future__ import annotations

import typing as tp

from hpctrain._cli import add_json_flag, add_run_dir, command_parser, print_json
from hpctrain.status.report import collect

__all__ = ["main", "build_parser", "collect", "SCHEMA"]

SCHEMA = "hpctrain.status/1"
"""The shape of ``status --json``'s object (:func:`hpctrain.status.report.collect`)."""


def build_parser() -> tp.Any:
    parser = command_parser(
        "status",
        "Where a training run stands: job state, restarts, last checkpoint, progress, throughput, "
        "data wait, the step-time breakdown and slowest rank of the last interval, and the ledger. "
        "A damaged record is one warning; the rest is still shown.",
    )
    add_run_dir(parser)
    add_json_flag(parser)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None, *, slurm: tp.Any = None) -> int:
    """Print the status report of RUN_DIR; ``slurm`` replaces :class:`hpctrain._slurm.SlurmCommands`
    (tests pass a fake)."""
    args = build_parser().parse_args(argv)
    report = collect(args.run_dir, slurm=slurm)
    if args.json:
        print_json(report, schema=SCHEMA)
    else:
        from hpctrain.status.view import render

        render(report)
    return 0
