"""``python -m hpctrain ckpt ls|verify|gc|digest DIR``: login-node tools. Never imports torch."""

from __future__ import annotations

import argparse
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import STEP_HELP, add_json_flag, add_subcommands, command_parser, print_json
from hpctrain._human import fmt_bytes
from hpctrain.ckpt._format import CheckpointFormatError, step_name
from hpctrain.ckpt._index import digest_dir, verify_dir
from hpctrain.ckpt._scan import (
    ABANDONED_AFTER_S,
    Entry,
    plan_retention,
    remove_dir,
    scan,
    settle_replaced,
    stale_write_files,
)
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["main", "build_parser", "SCHEMAS"]

SCHEMAS = {
    "ls": "hpctrain.ckpt.ls/1",
    "verify": "hpctrain.ckpt.verify/1",
    "gc": "hpctrain.ckpt.gc/1",
    "digest": "hpctrain.ckpt.digest/1",
}
"""The ``schema`` of each sub-command's ``--json`` object (``ls`` and ``verify``: ``{"checkpoints": [...]}``)."""


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("ckpt", "List, verify, digest and clean hpctrain checkpoints.")
    sub = add_subcommands(p)
    ls = sub.add_parser("ls", help="table of checkpoints: step, status, world size, bytes, time")
    verify = sub.add_parser("verify", help="check sizes and checksums against the manifest (exit 1 if invalid)")
    verify.add_argument("--step", type=int, metavar="N", help="only this step (default: every committed step)")
    verify.add_argument("--no-checksums", action="store_true", help="sizes and headers only (fast)")
    gc = sub.add_parser("gc", help="delete all but the newest K committed checkpoints and abandoned temporaries")
    gc.add_argument("--keep", type=int, required=True, help="committed checkpoints to keep (>= 1)")
    gc.add_argument("--keep-every", type=int, default=0, help="also keep steps that are multiples of N")
    gc.add_argument(
        "--older-than",
        type=float,
        default=ABANDONED_AFTER_S,
        metavar="SECONDS",
        help="a save's temporary dir whose writers cannot be proven gone (another host) is deleted only when "
        f"untouched this long (default {ABANDONED_AFTER_S:.0f})",
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    digest = sub.add_parser("digest", help="content hash per state entry, independent of the world size")
    digest.add_argument("--step", type=int, metavar="N", help=STEP_HELP)
    for sp in (ls, verify, gc, digest):
        sp.add_argument("dir", type=Path, help="the checkpoint directory (CheckpointConfig.dir)")
        add_json_flag(sp)
    return p


def _entries(root: Path, older_than_s: float = ABANDONED_AFTER_S) -> tp.List[Entry]:
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory; pass the checkpoint dir (CheckpointConfig.dir)")
    return scan(root, older_than_s=older_than_s)


def _pick(root: Path, step: tp.Optional[int]) -> Entry:
    committed = [e for e in _entries(root) if e.status == "committed"]
    if step is None:
        if not committed:
            raise HpctrainError(f"no committed checkpoint in {root}")
        return committed[-1]
    for e in committed:
        if e.step == step:
            return e
    raise HpctrainError(
        f"step {step} is not a committed checkpoint in {root}; committed: {[e.step for e in committed][-10:]}"
    )


def _ls(args: argparse.Namespace) -> int:
    rows = []
    for e in _entries(args.dir):
        m = e.manifest or {}
        rows.append(
            {
                "step": e.step,
                "status": e.status,
                "name": e.name,
                "world_size": m.get("world_size"),
                "bytes": e.bytes,
                "time": e.mtime,
                "run_id": m.get("run_id", ""),
                "error": e.error,
            }
        )
    if args.json:
        print_json({"dir": str(args.dir), "checkpoints": rows}, schema=SCHEMAS["ls"])
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"checkpoints in {escape(str(args.dir))}")
    for col in ("step", "status", "world", "size", "time", "name"):
        table.add_column(col, justify="right" if col in ("step", "world", "size") else "left")
    colors = {
        "committed": "green",
        "abandoned": "yellow",
        "in-progress": "cyan",
        "replaced": "yellow",
        "quarantined": "red",
        "incomplete": "red",
    }
    for r in rows:
        table.add_row(
            str(r["step"]),
            f"[{colors.get(r['status'], 'white')}]{r['status']}[/]",
            str(r["world_size"] or "-"),
            fmt_bytes(r["bytes"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])),
            escape(r["name"]),
        )
    Console().print(table)
    return 0


def _verify(args: argparse.Namespace) -> int:
    entries = _entries(args.dir)
    if args.step is not None:
        targets = [e for e in entries if e.step == args.step and e.status in ("committed", "incomplete")]
        if not targets:
            raise HpctrainError(f"no checkpoint for step {args.step} in {args.dir}")
    else:
        targets = [e for e in entries if e.status in ("committed", "incomplete")]
        if not targets:
            raise HpctrainError(f"no checkpoint to verify in {args.dir}")
    results = []
    for e in targets:
        try:
            verify_dir(e.path, checksums=not args.no_checksums)
            results.append({"step": e.step, "name": e.name, "valid": True, "error": ""})
        except CheckpointFormatError as exc:
            results.append({"step": e.step, "name": e.name, "valid": False, "error": str(exc)})
    if args.json:
        ok = all(r["valid"] for r in results)
        print_json({"dir": str(args.dir), "ok": ok, "checkpoints": results}, schema=SCHEMAS["verify"])
    else:
        for r in results:
            print(f"{r['name']}: {'OK' if r['valid'] else 'INVALID: ' + r['error']}")
    return 0 if all(r["valid"] for r in results) else 1


def _gc(args: argparse.Namespace) -> int:
    if args.keep < 1:
        raise UsageError(
            f"ckpt gc --keep must be >= 1 (the newest committed checkpoint is never deleted), got {args.keep}"
        )
    if not args.older_than >= 0:
        raise UsageError(f"ckpt gc --older-than must be >= 0 seconds, got {args.older_than}")
    entries = _entries(args.dir, args.older_than)
    doomed = plan_retention(entries, args.keep, args.keep_every)
    doomed += [e for e in entries if e.status in ("abandoned", "deleting")]
    replaced_gone, restored = settle_replaced(args.dir, entries, dry_run=args.dry_run)
    files = stale_write_files(args.dir, args.older_than)
    if not args.dry_run:
        for e in doomed:
            remove_dir(e.path)
        for f in files:
            f.unlink(missing_ok=True)
    out = {
        "deleted" if not args.dry_run else "would_delete": sorted(
            [e.name for e in doomed + replaced_gone] + [f.name for f in files]
        ),
        "restored" if not args.dry_run else "would_restore": [e.name for e in restored],
        "skipped": [{"name": e.name, "reason": e.error} for e in entries if e.status == "in-progress"],
        "kept": [e.name for e in entries if e.status == "committed" and e not in doomed],
    }
    if args.json:
        print_json({"dir": str(args.dir), "dry_run": bool(args.dry_run), **out}, schema=SCHEMAS["gc"])
    else:
        verb = "would " if args.dry_run else ""
        for name in out.get("deleted", out.get("would_delete", [])):
            print(f"{verb}delete {name}" if verb else f"deleted {name}")
        for name in out.get("restored", out.get("would_restore", [])):
            print(f"{verb}restore {name} (an interrupted re-save's previous copy)")
        for skip in out["skipped"]:
            print(f"skipped {skip['name']}: may be a live save ({skip['reason']}); see --older-than")
        print(f"kept {len(out['kept'])} committed checkpoint(s)")
    return 0


def _digest(args: argparse.Namespace) -> int:
    e = _pick(args.dir, args.step)
    try:
        digests = digest_dir(e.path)
    except CheckpointFormatError as exc:
        raise HpctrainError(f"cannot digest {e.name}: {exc}") from None
    if args.json:
        print_json({"step": e.step, "name": e.name, "digests": digests}, schema=SCHEMAS["digest"])
    else:
        print(f"{step_name(e.step)}")
        for k, v in digests.items():
            print(f"  {k:<12} {v}")
    return 0


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return {"ls": _ls, "verify": _verify, "gc": _gc, "digest": _digest}[args.cmd](args)
