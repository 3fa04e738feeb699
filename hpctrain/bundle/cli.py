"""``python -m hpctrain bundle create RUN_DIR -o OUT [...]`` and ``python -m hpctrain bundle verify BUNDLE [--json]``.

``bundle RUN_DIR -o OUT`` is the short form of ``bundle create`` (:func:`hpctrain._cli.implicit_subcommand`).
Exit 0 ok, 1 a failed check (verify) or operation, 2 bad input (not a run, not a bundle, OUT exists
without ``--force``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import typing as tp
from pathlib import Path

from hpctrain._cli import (
    EXIT_FAILED,
    EXIT_OK,
    FORCE_HINT,
    STEP_HELP,
    add_json_flag,
    add_output,
    add_run_dir,
    add_subcommands,
    command_parser,
    implicit_subcommand,
    print_json,
)
from hpctrain._output import check_output_parent
from hpctrain.bundle.layout import BundleLayout
from hpctrain.errors import UsageError

__all__ = ["main", "build_parser", "render_report", "CREATE_SCHEMA", "VERIFY_SCHEMA"]

CREATE_SCHEMA = "hpctrain.bundle.create/1"
VERIFY_SCHEMA = "hpctrain.bundle.verify/1"
_SUBCOMMANDS = ("create", "verify")

_DESCRIPTION = """\
Write a run's recoverable training bundle (RO-Crate metadata, identity manifests, code snapshot,
environment lock, data fingerprint, one committed checkpoint, metrics, ledger, approvals, a file list
with a sha256 of every file), or verify one:

  python -m hpctrain bundle create RUN_DIR -o OUT [--force] [--step N] [--tar] [--copy] [--license SPDX]
      [--team-url URL] [--checkpoint-dir DIR] [--json]
  python -m hpctrain bundle verify BUNDLE [--json]

`bundle RUN_DIR -o OUT` is short for `bundle create RUN_DIR -o OUT` when RUN_DIR exists and is not
"create" or "verify" (a run directory named "verify": `bundle create verify -o OUT`, or ./verify)."""


def build_parser() -> tp.Any:
    p = command_parser("bundle", _DESCRIPTION)
    sub = add_subcommands(p)
    c = sub.add_parser(
        "create",
        help="write a run's bundle (the default: `bundle RUN_DIR -o OUT`)",
        description="Write a run's recoverable training bundle.",
    )
    _create_arguments(c)
    v = sub.add_parser(
        "verify",
        help="verify a bundle: every file's sha256, the checkpoint, approvals, identity (exit 1 if not)",
        description="Verify a bundle: every file's sha256, the checkpoint, approvals, identity.",
    )
    v.add_argument("bundle", metavar="BUNDLE", help="a bundle directory or its tar")
    add_json_flag(v)
    return p


def _create_arguments(p: tp.Any) -> None:
    add_run_dir(p)
    add_output(p, kind="dir", required=True, help="the bundle (a directory; one tar file with --tar)")
    p.add_argument("--step", type=int, metavar="N", help=STEP_HELP)
    p.add_argument("--tar", action="store_true", help="write one uncompressed tar file instead of a directory")
    p.add_argument("--copy", action="store_true", help="copy the checkpoint even where a hard link would do")
    p.add_argument(
        "--license",
        metavar="SPDX|URL",
        help="the bundle's license (default: none stated; the crate names the owner to ask)",
    )
    p.add_argument("--team-url", metavar="URL", help="the owner's team's web page (the crate's organisation)")
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where the run's checkpoints are, when not where it recorded them (a moved run); checked to be its own",
    )
    add_json_flag(p)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = implicit_subcommand(sys.argv[1:] if argv is None else argv, _SUBCOMMANDS, "create")
    opts = build_parser().parse_args(args)
    if opts.cmd == "verify":
        from hpctrain.bundle.verify import verify_bundle

        report = verify_bundle(opts.bundle)
        if opts.json:
            print_json(report, schema=VERIFY_SCHEMA)
        else:
            render_report(report)
        return EXIT_OK if report["ok"] else EXIT_FAILED
    # -o: a parent that is a file is one line here (the build creates missing parents)
    check_output_parent(opts.output, parents=True)
    from hpctrain.bundle.build import build_bundle

    with _replacing(opts.output, force=opts.force):
        summary = build_bundle(
            opts.run_dir,
            opts.output,
            step=opts.step,
            tar=opts.tar,
            copy=opts.copy,
            license=opts.license,
            team_url=opts.team_url,
            checkpoint_dir=opts.checkpoint_dir,
        )
    if opts.json:
        print_json(summary, schema=CREATE_SCHEMA)
        return EXIT_OK
    ck, ap = summary["checkpoint"], summary["approvals"]
    ident = summary["run_identity"]
    print(
        f"bundle {summary['bundle']} ({summary['format']}): {summary['files']} files, {summary['bytes']} bytes\n"
        f"  checkpoint step {ck['step']} ({ck['link']}, verified), {summary['attempts']} attempt(s), "
        f"{ap['entries']} approval(s), run identity {ident[:16] + '...' if ident else 'not recorded'}"
    )
    for note in summary["notes"]:
        print(f"  note: {note}")
    print(f"  check it: python -m hpctrain bundle verify {summary['bundle']}")
    return EXIT_OK


@contextlib.contextmanager
def _replacing(out: str, *, force: bool) -> tp.Iterator[None]:
    """An existing OUT: refused (exit 2) without ``--force``. With it, only an earlier bundle (a directory
    holding ``bundle.json``, or a regular file: a tar) is replaced: moved aside while the new one is written,
    removed once it is, put back if the build fails. Anything else is still refused: a directory that is
    not a bundle is never deleted."""
    path = Path(out)
    if not os.path.lexists(path):
        yield
        return
    if not force:
        raise UsageError(f"-o {out}: already exists; {FORCE_HINT}")
    if path.is_dir() and not path.is_symlink():
        if not (path / BundleLayout.RECORD).is_file():
            raise UsageError(
                f"-o {out}: an existing directory that is not a bundle (no {BundleLayout.RECORD}); "
                "--force replaces only a bundle: choose another path"
            )
    elif not (path.is_file() or path.is_symlink()):
        raise UsageError(f"-o {out}: exists and is not a bundle directory or file; choose another path")
    aside = path.with_name(f".{path.name}.replaced-{os.getpid()}")
    os.replace(path, aside)
    try:
        yield
    except BaseException:
        if not os.path.lexists(path):
            os.replace(aside, path)
        raise
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def render_report(report: tp.Mapping[str, tp.Any]) -> None:
    """The verify report as rich tables; every recorded string is escaped (no markup from a bundle)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=False)
    verdict = "[bold green]OK[/]" if report["ok"] else "[bold red]FAILED[/]"
    rec = report.get("record") or {}
    ck = rec.get("checkpoint") or {}
    console.print(f"bundle   {escape(str(report['bundle']))} ({report['format']}): {verdict}")
    console.print(
        f"run      {escape(str(rec.get('run_name')))} · written {escape(str(rec.get('created_utc')))} by hpctrain "
        f"{escape(str(rec.get('hpctrain_version')))} · identity {escape(str(rec.get('run_identity')))}"
    )
    console.print(
        f"ckpt     step {escape(str(ck.get('step')))} · manifest sha256 {escape(str(ck.get('manifest_sha256')))}"
    )
    image = report.get("container")
    if image:
        digest = image.get("digest") or "none recorded (a registry reference, resolved on the node)"
        console.print(
            f"image    {escape(str(image.get('image')))} · {escape(str(image.get('runtime')))} "
            f"{escape(str(image.get('version') or ''))} · digest {escape(str(digest))}",
            soft_wrap=True,
        )
    table = Table(show_lines=False)
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for c in report["checks"]:
        result = "[green]ok[/]" if c["ok"] else f"[red]FAILED ({len(c['problems'])})[/]"
        if c["ok"] and c["warnings"]:
            result = "[yellow]ok, see below[/]"
        table.add_row(escape(c["check"]), result, escape(c["detail"]))
    console.print(table)
    # problems in full, one per line (not folded into a table cell): what to grep for, and copy
    for c in report["checks"]:
        for p in c["problems"][:200]:
            console.print(f"[red]✗[/] {escape(c['check'])}: {escape(p)}", soft_wrap=True)
        if len(c["problems"]) > 200:
            console.print(f"[red]✗[/] {escape(c['check'])}: ... and {len(c['problems']) - 200} more (--json)")
        for w in c["warnings"]:
            console.print(f"[yellow]![/] {escape(c['check'])}: {escape(w)}", soft_wrap=True)
    attempts = report.get("attempts") or []
    if attempts:
        t = Table(title="attempts (one CreateAction each in ro-crate-metadata.json)")
        for col in ("job", "restart", "status", "hosts", "resumed from", "step", "committed", "requeued"):
            t.add_column(col)
        for a in attempts:
            t.add_row(
                *(
                    escape(str(x if x is not None else "-"))
                    for x in (
                        a.get("job_id") or "local",
                        a.get("restart_count"),
                        (a.get("status") or "") + (f" ({a['cause']})" if a.get("cause") else ""),
                        ",".join(a.get("hosts") or []) or "-",
                        a.get("resumed_from_step"),
                        a.get("step"),
                        a.get("committed_step"),
                        "yes" if a.get("requeued") else "no",
                    )
                )
            )
        console.print(t)
    approvals = report.get("approvals") or []
    if approvals:
        t = Table(title="approvals (hash-chained, oldest first)")
        for col in ("seq", "time", "decision", "step", "by", "reason", "entry"):
            t.add_column(col)
        for e in approvals:
            t.add_row(
                *(
                    escape(str(x if x is not None else "-"))
                    for x in (
                        e.get("seq"),
                        e.get("time"),
                        e.get("decision"),
                        e.get("step"),
                        e.get("by"),
                        e.get("reason"),
                        str(e.get("entry_hash"))[:16],
                    )
                )
            )
        console.print(t)
