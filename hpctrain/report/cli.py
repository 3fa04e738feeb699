"""``python -m hpctrain report RUN_DIR [-o FILE] [--force] [--json]``: one self-contained HTML report of a run
(no torch).

Reads the run directory (:func:`hpctrain.report.gather.gather`), draws the page
(:func:`hpctrain.report.page.render`) and writes it through :mod:`hpctrain._output` (default
``RUN_DIR/report.html``, :attr:`hpctrain.rundir.RunDir.report`): a file atomically, a symbolic link's target,
a device, FIFO or ``/dev/stdout`` written through (the summary then goes to stderr). An existing file (the
default one too) is refused, exit 2, unless ``--force`` (``hpctrain._cli``'s convention; before it, the
report replaced it silently). A
damaged run directory gives a report whose notes say what was wrong; a path that is not a run directory is
one error line and exit 2.
"""

from __future__ import annotations

import os
import sys
import typing as tp
from pathlib import Path

from hpctrain._cli import FORCE_HINT, add_json_flag, add_output, add_run_dir, command_parser, print_json
from hpctrain._human import plain
from hpctrain._output import OutputFile, output_file
from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir

__all__ = ["main", "build_parser", "write_report", "SCHEMA"]

SCHEMA = "hpctrain.report/1"
"""The shape of ``report --json``'s object (the summary; the page is the file)."""


def write_report(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    out: tp.Optional[tp.Union[str, "os.PathLike[str]"]] = None,
    *,
    slurm: tp.Any = None,
) -> tp.Tuple[Path, tp.Any]:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``); ``(path, RunData)``: the
    path written (a symbolic link's target; a device or FIFO as named)."""
    target, data = _write(run_dir, out, slurm=slurm)
    return target.path, data


def _write(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    out: tp.Optional[tp.Union[str, "os.PathLike[str]"]],
    *,
    slurm: tp.Any = None,
    overwrite: bool = True,
) -> tp.Tuple[OutputFile, tp.Any]:
    """:func:`write_report`, returning the :class:`~hpctrain._output.OutputFile` (kind, bytes, stdout or not).

    ``out`` goes through :func:`hpctrain._output.output_file`: a file is replaced atomically, a symbolic link's
    target is written (the link stays), a device, FIFO or ``/dev/stdout`` is written through; a directory or
    a parent that is not one is one error line (exit 2), checked before the run directory is read."""
    from hpctrain.report.gather import gather
    from hpctrain.report.page import render

    target = output_file(out, overwrite=overwrite, hint=FORCE_HINT) if out is not None else None
    data = gather(run_dir, slurm=slurm)
    if target is None:
        target = output_file(RunDir(data.run_dir).report, overwrite=overwrite, hint=FORCE_HINT)
    target.write_text(render(data))
    return target, data


def _sweep_main(args: tp.Any, *, slurm: tp.Any) -> int:
    """``report SWEEP_DIR``: :func:`hpctrain.report.sweep.write_sweep_report`, the same -o/--force/--json rule."""
    from hpctrain.report.sweep import write_sweep_report

    target = write_sweep_report(args.run_dir, args.output, slurm=slurm, overwrite=args.force)
    where = target.shown if args.output is not None or target.stream else os.fspath(target.path)
    if args.json:
        print_json({"output": where, "bytes": target.size, "sweep": True}, schema=SCHEMA)
    else:
        print(
            f"sweep report {where} ({target.size / 1024:.0f} KiB)", file=sys.stderr if target.to_stdout else sys.stdout
        )
    return 0


def build_parser() -> tp.Any:
    parser = command_parser(
        "report",
        "Write one self-contained HTML report of a run: loss and eval curves (restarts as gaps), samples/s and "
        "MFU, the step-time breakdown, per-rank spread, the attempts timeline, checkpoints, identity and "
        "approvals. No server, no network: open the file in any browser. Given a sweep's directory (submit\n"
        "--sweep), one page comparing its tasks (SWEEP_DIR/sweep-report.html).",
    )
    add_run_dir(parser)
    add_output(parser, kind="file", help="the HTML report", default="RUN_DIR/report.html")
    add_json_flag(parser)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None, *, slurm: tp.Any = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json and args.output is not None and output_file(args.output).to_stdout:
        raise UsageError("-o names standard output, where --json prints the summary; write the report to a file")
    from hpctrain.sweep.plan import is_sweep_dir

    if is_sweep_dir(args.run_dir):  # a sweep's directory: the one page comparing its tasks
        return _sweep_main(args, slurm=slurm)
    target, data = _write(args.run_dir, args.output, slurm=slurm, overwrite=args.force)
    committed = sum(1 for c in data.checkpoints if c["status"] == "committed")
    # the page went to standard output (-o /dev/stdout, or the file stdout goes to): the summary goes to stderr
    say = sys.stderr if target.to_stdout else sys.stdout
    where = target.shown if args.output is not None or target.stream else os.fspath(target.path)
    if args.json:
        summary = {
            "output": where,
            "bytes": target.size,
            "attempts": len(data.attempts),
            "intervals": len(data.intervals),
            "evals": len(data.evals),
            "committed_checkpoints": committed,
            "notes": [plain(note, 200) for note in data.notes],
        }
        print_json(summary, schema=SCHEMA)
        return 0
    print(
        f"report {where} ({target.size / 1024:.0f} KiB): {len(data.attempts)} attempt(s), {len(data.intervals)} "
        f"interval and {len(data.evals)} eval record(s), "
        f"{committed} committed checkpoint(s), "
        f"{len(data.notes)} note(s)",
        file=say,
    )
    for note in data.notes[:5]:
        print(f"  note: {plain(note, 200)}", file=say)
    if len(data.notes) > 5:
        print(f"  ... {len(data.notes) - 5} more in the report's Notes section", file=say)
    return 0
