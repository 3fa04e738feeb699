"""``python -m hpctrain export-tensorboard RUN_DIR [-o DIR] [--force] [--json]``: the metrics as TensorBoard scalars.

Every interval and eval record of ``RUN_DIR/train/metrics.jsonl`` (sanitised against the status schemas, as
the report reads them: :func:`hpctrain.report.gather.read_metrics`) becomes scalars with the record's step as
x and its time as the event's wall time, written with the ``tensorboard`` package's own writer
(``tensorboard.summary.Writer``: numpy and protobuf, no torch, no TensorFlow; install it with
``pip install 'hpctrain[tensorboard]'``). ``tensorboard --logdir DIR`` then works on the cluster or on an
rsynced copy, offline.

A restart redoes the steps after its checkpoint: a record whose step is not past the previous one supersedes
the earlier records from that step on (what TensorBoard itself does with "orphaned" data), so each tag
holds one value per step, the one the final model's history went through. The event file is written in a
hidden directory beside DIR and moved in when complete; an earlier export's event files in DIR are an error
(exit 2) unless ``--force`` (``--overwrite``, its older spelling, still works for one release), which removes
them (only ``events.out.tfevents.*`` files).
"""

from __future__ import annotations

import os
import secrets
import shutil
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._cli import add_json_flag, add_output, add_run_dir, command_parser, print_json
from hpctrain._files import shorten
from hpctrain._output import output_dir
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import RunDir
from hpctrain.train import tensorboard as tb_scalars

__all__ = ["main", "build_parser", "export", "ExportResult", "INTERVAL_TAGS", "EVAL_TAGS", "EVENT_PREFIX", "SCHEMA"]

SCHEMA = "hpctrain.export-tensorboard/1"
"""The shape of ``export-tensorboard --json``'s object."""

EVENT_PREFIX = "events.out.tfevents."

# The mapping of a record to scalars, and the writer, are the live writer's (TrainConfig.tensorboard): one owner
INTERVAL_TAGS = tb_scalars.INTERVAL_TAGS
"""``(tag, value of a sanitised interval record or None, description)`` of every scalar an interval gives."""
EVAL_TAGS = tb_scalars.EVAL_TAGS


@dataclass
class ExportResult:
    out: Path
    event_file: Path
    intervals: int = 0
    evals: int = 0
    scalars: int = 0
    tags: tp.Set[str] = field(default_factory=set)
    superseded: int = 0
    """Records left out because a restart redid their steps."""
    untimed: int = 0
    """Records left out because their time is unknown (damaged)."""
    replaced: int = 0
    """Event files of an earlier export removed (``--force``)."""
    first_step: tp.Optional[int] = None
    last_step: tp.Optional[int] = None
    notes: tp.List[str] = field(default_factory=list)


def _latest_per_step(records: tp.List[tp.Dict[str, tp.Any]]) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], int]:
    """The records (interval and eval, in file order) without those a restart superseded: a record whose step
    is before the newest one kept, or not after the previous record of its own kind, starts a redo, and every
    kept record (of either kind) at or after its step is dropped (TensorBoard's own purge of orphaned data)."""
    kept: tp.List[tp.Dict[str, tp.Any]] = []
    last: tp.Dict[tp.Any, int] = {}
    dropped = 0
    for rec in records:
        step, kind = rec["step"], rec.get("kind")
        if kept and (step < kept[-1]["step"] or step <= last.get(kind, -1)):
            while kept and kept[-1]["step"] >= step:  # kept is ordered by step: every append is >= the rest
                last.pop(kept.pop().get("kind"), None)
                dropped += 1
            for r in kept:  # the newest remaining record of each kind
                last[r.get("kind")] = r["step"]
        kept.append(rec)
        last[kind] = step
    return kept, dropped


def _event_files(path: Path) -> tp.List[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.name.startswith(EVENT_PREFIX) and p.is_file())
    except FileNotFoundError:
        return []


def _check_out(out: Path, overwrite: bool) -> Path:
    """The directory to write into (a symbolic link's target), checked by :func:`hpctrain._output.output_dir`:
    a path that exists and is not a directory, or whose parent is not one, is one line (exit 2); an earlier
    export's event files in it too, unless ``overwrite``."""
    real = output_dir(out)
    if _event_files(real) and not overwrite:
        raise UsageError(
            f"-o {shorten(os.fspath(out), 300)}: already holds TensorBoard event files (written live during "
            f"training with TrainConfig.tensorboard, or by an earlier export): view them with tensorboard --logdir "
            f"{shorten(os.fspath(out), 300)}; pass --force to replace them, or -o another directory"
        )
    return real


def export(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    out: tp.Optional[tp.Union[str, "os.PathLike[str]"]] = None,
    *,
    overwrite: bool = False,
) -> ExportResult:
    """Write the metrics of ``run_dir`` as TensorBoard scalars into ``out`` (default ``RUN_DIR/tensorboard``)."""
    from hpctrain.report.gather import check_run_dir, read_metrics

    root = check_run_dir(run_dir)
    notes: tp.List[str] = []
    intervals, evals = read_metrics(RunDir(root), notes)
    if not intervals and not evals:
        raise UsageError(
            f"RUN_DIR {shorten(os.fspath(root), 300)} holds no metrics records ({RunDir.TRAIN}/{RunDir.METRICS}); "
            "nothing to export"
        )
    shown = Path(out) if out is not None else RunDir(root).tensorboard
    out_path = _check_out(shown, overwrite)
    missing = tb_scalars.missing_package()
    if missing is not None:
        raise HpctrainError(missing)

    timed = sorted((r for r in intervals + evals if r.get("time") is not None), key=lambda r: r["_seq"])
    untimed = len(intervals) + len(evals) - len(timed)
    kept, superseded = _latest_per_step(timed)
    kept_i = [r for r in kept if r.get("kind") == "interval"]
    kept_e = [r for r in kept if r.get("kind") == "eval"]

    tmp = out_path.parent / f".{out_path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}"
    result = ExportResult(out=shown, event_file=out_path, superseded=superseded, untimed=untimed, notes=notes)
    try:
        tmp.mkdir()
        writer = tb_scalars.open_writer(tmp)
        described: tp.Set[str] = set()
        for rec in kept_i + kept_e:
            for tag, value, step in tb_scalars.scalars(rec):
                writer.add_scalar(
                    tag,
                    value,
                    step,
                    wall_time=float(rec["time"]),
                    description=None if tag in described else tb_scalars.DESCRIPTIONS[tag],
                )
                described.add(tag)
                result.scalars += 1
                result.tags.add(tag)
        writer.close()
        written = _event_files(tmp)
        if len(written) != 1:  # pragma: no cover - the writer makes exactly one
            raise HpctrainError(f"the TensorBoard writer left {len(written)} event files in {tmp}")
        old = _event_files(out_path)
        out_path.mkdir(exist_ok=True)
        result.event_file = out_path / written[0].name
        os.replace(written[0], result.event_file)
        for p in old:
            if p != result.event_file:
                p.unlink(missing_ok=True)
                result.replaced += 1
    except OSError as exc:
        where = shorten(os.fspath(exc.filename), 300) if exc.filename else os.fspath(out_path)
        raise HpctrainError(f"cannot write the event file to {where}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.intervals, result.evals = len(kept_i), len(kept_e)
    steps = [r["step"] for r in kept_i + kept_e]
    result.first_step, result.last_step = (min(steps), max(steps)) if steps else (None, None)
    return result


def build_parser() -> tp.Any:
    parser = command_parser(
        "export-tensorboard",
        "Write a run's interval and eval records as TensorBoard scalars (loss, eval loss, lr, samples/s, MFU, "
        "FLOP/s, data-wait fraction, the per-step part medians): the step is x, the record's time the wall time. "
        "Needs the tensorboard package (pip install 'hpctrain[tensorboard]'); never torch.",
    )
    add_run_dir(parser)
    # --overwrite: the older spelling of --force, accepted (not shown) for one release
    add_output(
        parser,
        kind="dir",
        help="the TensorBoard log directory",
        default="RUN_DIR/tensorboard",
        force_aliases=("--overwrite",),
    )
    add_json_flag(parser)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    res = export(args.run_dir, args.output, overwrite=args.force)
    from hpctrain._human import plain

    if args.json:
        print_json(
            {
                "output": os.fspath(res.out),
                "event_file": os.fspath(res.event_file),
                "scalars": res.scalars,
                "tags": sorted(res.tags),
                "intervals": res.intervals,
                "evals": res.evals,
                "first_step": res.first_step,
                "last_step": res.last_step,
                "superseded": res.superseded,
                "untimed": res.untimed,
                "replaced": res.replaced,
                "notes": [plain(note, 200) for note in res.notes],
            },
            schema=SCHEMA,
        )
        return 0

    span = f"steps {res.first_step}..{res.last_step}" if res.first_step is not None else "no steps"
    print(
        f"tensorboard {res.out}: {res.scalars} scalars in {len(res.tags)} tags from {res.intervals} interval and "
        f"{res.evals} eval record(s), {span} -> {res.event_file.name}"
    )
    if res.superseded:
        print(f"  {res.superseded} record(s) superseded by a restart that redid their steps were left out")
    if res.untimed:
        print(f"  {res.untimed} record(s) without a usable time were left out")
    if res.replaced:
        print(f"  {res.replaced} event file(s) of an earlier export replaced")
    for note in res.notes[:5]:
        print(f"  note: {plain(note, 200)}")
    print(f"  view: tensorboard --logdir {res.out}")
    return 0
