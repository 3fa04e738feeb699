"""``python -m hpctrain runs [--sweep SWEEP_DIR] [--state S] [--name GLOB] [--since AGE] [--json]``: the user's runs, one table.

The listing is :func:`hpctrain.runs.listing.list_runs` (a library); this module is its command line
(``hpctrain._cli``'s convention: one error line, exit 2 for bad input, ``--json`` one object with
``schema`` :data:`~hpctrain.runs.listing.SCHEMA`). Notes (accounting off, a damaged registry line) go to
stderr, so ``--json``'s stdout is the object alone.
"""

from __future__ import annotations

import shutil
import sys
import typing as tp

from hpctrain._cli import add_json_flag, command_parser, print_json
from hpctrain.errors import UsageError
from hpctrain.runs.listing import CATEGORIES, SCHEMA, list_runs, parse_since, render

__all__ = ["main", "build_parser", "SCHEMA"]


def build_parser() -> tp.Any:
    parser = command_parser(
        "runs",
        "Every run you submitted (python -m hpctrain.submit, reproduce, sweep tasks), from the run\n"
        "registry ($HPCTRAIN_HOME/runs.jsonl, default ~/.hpctrain): name, job, state, nodes, step/total,\n"
        "last loss, last checkpoint, when it started, how its last attempt ended, its run directory.\n"
        "The scheduler is asked once for all runs (one squeue, at most one sacct); without accounting\n"
        "the states of ended jobs come from their run directories. A run directory moved or deleted\n"
        "since shows as MISSING. --sweep SWEEP_DIR: one row per task of that sweep instead (its\n"
        "parameters, state, step, final losses, the best task). See docs/runs.md, docs/sweeps.md.",
    )
    parser.add_argument(
        "--state",
        action="append",
        choices=CATEGORIES,
        metavar="STATE",
        help=f"only runs in this state ({', '.join(CATEGORIES)}); repeat for several",
    )
    parser.add_argument("--name", metavar="GLOB", help="only runs whose job name or run directory name matches GLOB")
    parser.add_argument(
        "--since", metavar="AGE", help="only runs submitted since: 90s, 30m, 12h, 2d, 1w ago, or a date YYYY-MM-DD"
    )
    parser.add_argument(
        "--sweep",
        dest="sweep_dir",
        metavar="SWEEP_DIR",
        help="one row per task of this sweep (submit --sweep's --run-dir)",
    )
    add_json_flag(parser)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None, *, slurm: tp.Any = None) -> int:
    """List the user's runs; ``slurm`` replaces :class:`hpctrain._slurm.SlurmCommands` (tests pass a fake)."""
    args = build_parser().parse_args(argv)
    if args.sweep_dir is not None:
        return _sweep(args, slurm=slurm)
    since = parse_since(args.since) if args.since is not None else None
    listing = list_runs(states=set(args.state) if args.state else None, name=args.name, since=since, slurm=slurm)
    for note in listing["notes"]:
        print(f"hpctrain runs: note: {note}", file=sys.stderr)
    if args.json:
        print_json(listing, schema=SCHEMA)
    else:
        print(render(listing, width=max(shutil.get_terminal_size((80, 24)).columns, 80)))
    return 0


def _sweep(args: tp.Any, *, slurm: tp.Any) -> int:
    """``runs --sweep SWEEP_DIR``: :func:`hpctrain.sweep.table.sweep_table` (one squeue call for every task)."""
    from hpctrain.sweep import table

    if args.state or args.name or args.since:
        raise UsageError("--sweep lists one sweep's tasks; --state, --name and --since filter the list of runs")
    rows = table.sweep_table(args.sweep_dir, slurm=slurm)
    if args.json:
        print_json(rows, schema=table.SCHEMA)
    else:
        table.render(rows, None)
    return 0
