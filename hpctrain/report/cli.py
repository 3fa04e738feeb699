"""``python -m hpctrain report RUN_DIR [-o FILE]``: one self-contained HTML report of a run (no torch).

Reads the run directory (:func:`hpctrain.report.gather.gather`), draws the page
(:func:`hpctrain.report.page.render`) and writes it atomically (default ``RUN_DIR/report.html``,
:attr:`hpctrain.rundir.RunDir.report`). A damaged run directory gives a report whose notes say what was
wrong; a path that is not a run directory is one error line and exit 2.
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_bytes
from hpctrain._cli import command_parser
from hpctrain._files import shorten
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.report.text import plain
from hpctrain.rundir import RunDir

__all__ = ["main", "write_report"]


def write_report(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    out: tp.Optional[tp.Union[str, "os.PathLike[str]"]] = None,
    *,
    slurm: tp.Any = None,
) -> tp.Tuple[Path, tp.Any]:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``); ``(path, RunData)``."""
    from hpctrain.report.gather import gather
    from hpctrain.report.page import render

    data = gather(run_dir, slurm=slurm)
    path = Path(out) if out is not None else RunDir(data.run_dir).report
    if path.is_dir():
        raise UsageError(f"-o {shorten(os.fspath(path), 300)}: a directory; give a file name (report.html)")
    if not path.parent.is_dir():
        raise UsageError(f"-o {shorten(os.fspath(path), 300)}: its directory does not exist")
    # errors="replace": a lone surrogate that slipped through must not cost the report
    atomic_write_bytes(path, render(data).encode("utf-8", errors="replace"))
    return path, data


def main(argv: tp.Optional[tp.Sequence[str]] = None, *, slurm: tp.Any = None) -> int:
    parser = command_parser(
        "report",
        "Write one self-contained HTML report of a run: loss and eval curves (restarts as gaps), samples/s and "
        "MFU, the step-time breakdown, per-rank spread, the attempts timeline, checkpoints, identity and "
        "approvals. No server, no network: open the file in any browser.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (hpctrain.submit --run-dir)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write it (default RUN_DIR/report.html)")
    args = parser.parse_args(argv)
    try:
        path, data = write_report(args.run_dir, args.output, slurm=slurm)
    except OSError as exc:  # read-only, full, no permission: one line, not a traceback
        where = shorten(os.fspath(exc.filename), 300) if exc.filename else "the output"
        raise HpctrainError(f"cannot write the report to {where}: {exc.strerror or exc}") from None
    size = path.stat().st_size
    print(
        f"report {path} ({size / 1024:.0f} KiB): {len(data.attempts)} attempt(s), {len(data.intervals)} interval and "
        f"{len(data.evals)} eval record(s), {sum(1 for c in data.checkpoints if c['status'] == 'committed')} "
        f"committed checkpoint(s), {len(data.notes)} note(s)"
    )
    for note in data.notes[:5]:
        print(f"  note: {plain(note, 200)}")
    if len(data.notes) > 5:
        print(f"  ... {len(data.notes) - 5} more in the report's Notes section")
    return 0
