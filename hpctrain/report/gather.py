"""What a report shows, read once from a run directory: :func:`gather` (stdlib only, never torch).

The status report (:func:`hpctrain.status.report.collect`: job, progress, the sanitised ledger, identity,
approvals, the newest checkpoint, problems) plus what ``status`` does not keep: every metrics record (the
last :data:`METRICS_WINDOW` bytes of ``metrics.jsonl``), each sanitised against the status schemas
(:data:`hpctrain.status.schema.SCHEMAS`), the ledger grouped into attempts, every checkpoint of the
checkpoint directories the ledger names, and the capacity plot when :mod:`hpctrain.capacity` offers one.

Nothing here raises on a damaged run directory: each problem is one line in :attr:`RunData.notes`. A path
that is not a run directory is :class:`~hpctrain.errors.UsageError` (``collect``'s own check).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.errors import HpctrainError
from hpctrain.run import Attempt as RunAttempt
from hpctrain.run import attempts as run_attempts
from hpctrain.run import checkpoint_dir, recorded_checkpoint_dirs
from hpctrain.rundir import RunDir, read_jsonl
from hpctrain.status.report import collect
from hpctrain.status.schema import MAX_PROBLEMS, SCHEMAS, sanitize

__all__ = [
    "gather",
    "read_metrics",
    "check_run_dir",
    "RunData",
    "ReportAttempt",
    "Attempt",
    "METRICS_WINDOW",
    "CHECKPOINT_ROWS",
]

METRICS_WINDOW = 64 << 20
"""Bytes read from the end of ``metrics.jsonl`` (about 40 000 interval records); an older head is a note."""
CHECKPOINT_ROWS = 100
"""Checkpoint entries listed (the newest ones)."""


@dataclass
class ReportAttempt:
    """One attempt as the report draws it: the run's attempt (:class:`hpctrain.run.Attempt`, from the
    sanitised ledger by :func:`hpctrain.run.attempts`, whose label it shows) and the metrics drawn for it."""

    attempt: RunAttempt
    intervals: tp.List[tp.Dict[str, tp.Any]] = field(default_factory=list)
    evals: tp.List[tp.Dict[str, tp.Any]] = field(default_factory=list)
    lost_after_s: tp.Optional[float] = None
    """Progress redone after this attempt (the next start's ``lost_s``)."""

    @property
    def index(self) -> int:
        """1-based, in ledger order."""
        return self.attempt.index

    @property
    def start(self) -> tp.Optional[tp.Dict[str, tp.Any]]:
        return self.attempt.start

    @property
    def end(self) -> tp.Optional[tp.Dict[str, tp.Any]]:
        return self.attempt.end

    @property
    def exit(self) -> tp.Optional[tp.Dict[str, tp.Any]]:
        return self.attempt.exit

    @property
    def job_id(self) -> str:
        return self.attempt.job_id

    @property
    def restart_count(self) -> tp.Optional[int]:
        return self.attempt.restart_count

    @property
    def label(self) -> str:
        return self.attempt.label

    @property
    def first_step_time(self) -> tp.Optional[float]:
        """When training began (the start record, written just before the first step)."""
        t = (self.start or {}).get("time")
        if t is not None:
            return t
        times = [r["time"] - (r.get("interval_s") or 0.0) for r in self.intervals if r.get("time") is not None]
        return min(times) if times else None

    @property
    def process_start(self) -> tp.Optional[float]:
        """When the attempt's processes started: the first step minus the recorded start-up."""
        t = self.first_step_time
        startup = (self.start or {}).get("startup_s")
        return t - startup if t is not None and startup is not None else t

    @property
    def last_time(self) -> tp.Optional[float]:
        """The newest time the attempt left a record at (end, exit or metrics)."""
        times = [r.get("time") for r in (self.end, self.exit) if r]
        times += [r.get("time") for r in self.intervals + self.evals]
        known = [t for t in times if t is not None]
        return max(known) if known else self.first_step_time

    @property
    def last_step(self) -> tp.Optional[int]:
        steps = [r.get("step") for r in self.intervals + self.evals] + [(self.end or {}).get("step")]
        known = [s for s in steps if s is not None]
        return max(known) if known else None

    @property
    def outcome(self) -> str:
        """``completed``, ``stopped``, ``failed``, ``died`` (a start without an end or exit) or ``unknown``."""
        status = (self.end or {}).get("status")
        if status in ("completed", "stopped", "failed"):
            return str(status)
        cause = (self.exit or {}).get("cause")
        if cause == "finished":
            return "completed"
        if cause in ("time_limit", "preemption", "cancelled"):
            return "stopped"
        if cause in ("node_failure", "user_error") or (self.exit or {}).get("error"):
            return "failed"
        if self.exit is None and self.end is None:
            return "died"
        return "unknown"

    @property
    def why_ended(self) -> str:
        """How it ended, in words (recorded text: the page escapes it)."""
        ex, end = self.exit or {}, self.end or {}
        parts = []
        if ex.get("cause"):
            parts.append(str(ex["cause"]))
        if ex.get("requeued") is True:
            parts.append("requeued")
        if ex.get("reason") and ex.get("reason") != ex.get("cause"):
            parts.append(str(ex["reason"]))
        if end.get("error") or ex.get("error"):
            parts.append(f"error: {end.get('error') or ex.get('error')}")
        if not parts and end.get("status"):
            parts.append(str(end["status"]))
        if not parts:
            parts.append("no end or exit record: the processes died (killed, node failure, time limit)")
        return "; ".join(parts)


Attempt = ReportAttempt
"""The name the report's page modules know."""


@dataclass
class RunData:
    """Everything the page draws; every value of its schema's type or None."""

    run_dir: Path
    status: tp.Dict[str, tp.Any]
    """:func:`hpctrain.status.report.collect`'s report (job, progress, ledger, identity, approvals, ...)."""
    intervals: tp.List[tp.Dict[str, tp.Any]]
    evals: tp.List[tp.Dict[str, tp.Any]]
    attempts: tp.List[ReportAttempt]
    checkpoints: tp.List[tp.Dict[str, tp.Any]]
    capacity: tp.Optional[tp.Dict[str, tp.Any]]
    """``{"summary": str, "image": bytes, "mime": str, "note": str}`` (each key only when there is one), or None
    (no capacity package)."""
    notes: tp.List[str]
    generated: float


def check_run_dir(run_dir: tp.Union[str, "os.PathLike[str]"]) -> Path:
    """``run_dir`` as a Path when it is a directory; else UsageError (the status report's own check)."""
    from hpctrain.status.report import _run_dir

    return _run_dir(run_dir)


def read_metrics(
    paths: RunDir, notes: tp.List[str]
) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[tp.Dict[str, tp.Any]]]:
    """``(intervals, evals)``: every record of the metrics window (the last :data:`METRICS_WINDOW` bytes),
    in file order, sanitised against the status schemas (a bad field is None and one line in ``notes``);
    records without a step are dropped; ``_seq`` is a record's position in the file (both kinds share it)."""
    try:
        size = os.stat(paths.metrics).st_size
    except OSError:
        size = 0
    records, bad = read_jsonl(paths.metrics, tail_bytes=METRICS_WINDOW)
    notes += bad
    if size > METRICS_WINDOW:
        notes.append(
            f"{RunDir.METRICS}: {size} bytes; only its last {METRICS_WINDOW >> 20} MiB are drawn "
            f"(from step {next((r.get('step') for r in records if isinstance(r.get('step'), int)), '?')})"
        )
    intervals, evals = [], []
    no_time = 0
    for n, rec in enumerate(records, start=1):
        kind = rec.get("kind")
        if kind not in ("interval", "eval"):
            continue
        clean = sanitize(rec, SCHEMAS[f"metrics.{kind}"], f"{RunDir.METRICS} record {n}", notes)
        if clean.get("step") is None:
            continue
        clean["kind"], clean["_seq"] = kind, n  # the kind (checked above) and the position in the file
        if clean.get("time") is None:
            no_time += 1
        (intervals if kind == "interval" else evals).append(clean)
    if no_time:
        notes.append(f"{RunDir.METRICS}: {no_time} record(s) without a usable time are left out of the time charts")
    return intervals, evals


def _attempts(ledger: tp.List[tp.Dict[str, tp.Any]]) -> tp.List[ReportAttempt]:
    """The ledger (sanitised, in file order) as the run's attempts (:func:`hpctrain.run.attempts`, its pairing
    rule); each attempt followed by a start gets that start's ``lost_s``."""
    out = [ReportAttempt(a) for a in run_attempts(ledger)]
    for prev, a in zip(out, out[1:]):
        if a.start is not None:
            prev.lost_after_s = a.start.get("lost_s")
    return out


def _attempts_from_metrics(intervals: tp.List[tp.Dict[str, tp.Any]]) -> tp.List[ReportAttempt]:
    """Without a ledger: a new attempt where the writer's job or restart changes, or the step goes back."""
    out: tp.List[ReportAttempt] = []
    prev: tp.Optional[tp.Dict[str, tp.Any]] = None
    for rec in intervals:
        key = (rec.get("job_id"), rec.get("restart_count"))
        if prev is None or key != (prev.get("job_id"), prev.get("restart_count")) or rec["step"] <= prev["step"]:
            restart = key[1] if type(key[1]) is int else None
            out.append(ReportAttempt(RunAttempt(str(key[0] or ""), restart, index=len(out) + 1)))
        out[-1].intervals.append(rec)
        prev = rec
    return out


def _assign(attempts: tp.List[ReportAttempt], records: tp.List[tp.Dict[str, tp.Any]], kind: str) -> None:
    """Each timed record to the newest attempt that began before it (records before the first: the first)."""
    starts = [(a.process_start, a) for a in attempts if a.process_start is not None]
    if not starts:
        return
    starts.sort(key=lambda p: p[0])
    for rec in records:
        t = rec.get("time")
        if t is None:
            continue
        owner = starts[0][1]
        for begin, a in starts:
            if begin <= t:
                owner = a
        getattr(owner, kind).append(rec)


def _dir_problem(path: str, shown: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        return f"{shown}: cannot open it ({getattr(exc, 'strerror', None) or exc}); not listed"
    return "" if stat.S_ISDIR(st.st_mode) else f"{shown}: not a directory; not listed"


def _checkpoints(dirs: tp.List[str], notes: tp.List[str]) -> tp.List[tp.Dict[str, tp.Any]]:
    """Every entry of the checkpoint directories (the checkpoint package's scan: committed means a valid
    manifest), newest :data:`CHECKPOINT_ROWS`."""
    from hpctrain.ckpt import scan

    rows: tp.List[tp.Dict[str, tp.Any]] = []
    for d in dirs:
        shown = f"checkpoint dir {shorten(d, 300)}"
        problem = _dir_problem(d, shown)
        if problem:
            notes.append(problem)
            continue
        try:
            entries = scan(d)
        except Exception as exc:  # noqa: BLE001 - a damaged directory is one note, the report goes on
            notes.append(f"{shown}: cannot read it ({shorten(str(exc) or type(exc).__name__, 200)}); not listed")
            continue
        for e in entries:
            m = e.manifest if isinstance(e.manifest, dict) else {}
            try:
                size: tp.Optional[int] = int(e.bytes)
            except Exception:  # noqa: BLE001 - a manifest without shard sizes: size unknown
                size = None
            saved = m.get("time")
            world = m.get("world_size")
            rows.append(
                {
                    "dir": d,
                    "step": e.step,
                    "status": e.status,
                    "name": e.name,
                    "time": float(saved) if isinstance(saved, (int, float)) and not isinstance(saved, bool) else None,
                    "world_size": world if type(world) is int else None,
                    "bytes": size,
                    "error": e.error,
                }
            )
    rows.sort(key=lambda r: (r["time"] or 0.0, r["step"]))
    if len(rows) > CHECKPOINT_ROWS:
        notes.append(f"checkpoints: {len(rows)} entries; the newest {CHECKPOINT_ROWS} are listed")
        rows = rows[-CHECKPOINT_ROWS:]
    return rows


def _capacity(root: Path, notes: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The capacity estimate of this run and its plot, from :mod:`hpctrain.capacity`:
    ``capacity_report(run_dir) -> dict`` and ``render_plot(report, "svg") -> bytes`` (an older draft's
    ``compute``/``plot_svg`` too). Guarded: without the package (None), without those functions, when the
    plot refuses (an HpctrainError) or fails, or when the model does not apply to this run, the section says
    why and the rest of the report is unchanged. The plot (SVG, drawn by :mod:`hpctrain.charts`) is embedded
    as an image (a ``data:`` URI): whatever it holds cannot run a script or fetch anything."""
    try:
        import hpctrain.capacity as capacity
    except ImportError:
        return None
    except Exception as exc:  # noqa: BLE001 - a broken capacity package must not cost the report
        notes.append(f"capacity: hpctrain.capacity does not import ({type(exc).__name__}: {shorten(str(exc), 200)})")
        return {"note": "the capacity package does not import; no capacity estimate"}
    compute = getattr(capacity, "capacity_report", None) or getattr(capacity, "compute", None)
    plot = getattr(capacity, "render_plot", None) or getattr(capacity, "plot_svg", None)
    if not callable(compute):
        return {"note": "No capacity estimate: this hpctrain's capacity package offers no capacity_report()."}
    try:
        result = compute(root)
    except HpctrainError as exc:  # the estimate does not apply to this run (too few records, ...): said there
        return {"note": f"No capacity estimate for this run: {shorten(str(exc), 300)}"}
    except Exception as exc:  # noqa: BLE001 - the capacity model's failure is one note, not a broken report
        why = f"{type(exc).__name__}: {shorten(str(exc), 200)}"
        notes.append(f"capacity: not computed ({why})")
        return {"note": f"the capacity estimate could not be computed for this run ({why})"}
    out: tp.Dict[str, tp.Any] = {"summary": _capacity_summary(result)}
    if not callable(plot):
        out["note"] = "No capacity plot: this hpctrain's capacity package offers no render_plot()."
        return out
    try:
        image = plot(result)
    except HpctrainError as exc:  # the plot refused on purpose: it is optional, the summary stays
        out["note"] = f"No capacity plot: {shorten(str(exc), 300)}"
        return out
    except Exception as exc:  # noqa: BLE001
        why = f"{type(exc).__name__}: {shorten(str(exc), 200)}"
        notes.append(f"capacity: plot not drawn ({why})")
        out["note"] = f"the capacity plot could not be drawn ({why})"
        return out
    if isinstance(image, str):
        image = image.encode("utf-8", errors="replace")
    if not isinstance(image, (bytes, bytearray)) or not image:
        out["note"] = "hpctrain.capacity returned no plot"
        return out
    out["image"] = bytes(image)
    out["mime"] = "image/png" if bytes(image[:8]) == b"\x89PNG\r\n\x1a\n" else "image/svg+xml"
    return out


def _capacity_summary(result: tp.Any) -> str:
    """One line from a capacity report: where it is fastest and cheapest, where efficiency falls below half."""
    summary = result.get("summary") if isinstance(result, dict) else None
    if isinstance(summary, str):
        return summary
    if not isinstance(summary, dict):
        return ""
    words = {
        "fastest": "fastest on {} node(s)",
        "cheapest": "cheapest in GPU-hours on {} node(s)",
        "efficiency_below_half_from": "scaling efficiency below 50 % from {} nodes",
    }
    parts = [w.format(summary[k]) for k, w in words.items() if type(summary.get(k)) is int]
    text = "; ".join(parts)
    return f"{text[:1].upper()}{text[1:]}." if text else ""


def _dedupe(notes: tp.List[str]) -> tp.List[str]:
    seen: tp.Set[str] = set()
    out = []
    for n in notes:
        if n not in seen:
            seen.add(n)
            out.append(n)
    if len(out) > MAX_PROBLEMS:
        out = out[:MAX_PROBLEMS] + [f"... and {len(out) - MAX_PROBLEMS} more notes"]
    return out


def gather(run_dir: tp.Union[str, "os.PathLike[str]"], *, slurm: tp.Any = None) -> RunData:
    """Read ``run_dir`` for the report. UsageError for a path that is not a run directory (or one holding
    no records at all); anything damaged inside one is a note. ``slurm``: as for ``collect`` (tests pass a fake)."""
    status = collect(run_dir, slurm=slurm)
    root = Path(status["run_dir"])
    paths = RunDir(root)
    notes: tp.List[str] = list(status.get("problems") or [])
    train_ok = not any(p.startswith(f"{RunDir.TRAIN}/:") for p in notes)
    intervals, evals = read_metrics(paths, notes) if train_ok else ([], [])
    ledger = status.get("ledger") or []
    attempts = _attempts(ledger)
    if attempts and any(a.start for a in attempts):
        _assign(attempts, intervals, "intervals")
    else:
        attempts = _attempts_from_metrics(intervals) + [a for a in attempts if not a.intervals]
        for i, a in enumerate(attempts, start=1):
            a.attempt = dataclasses.replace(a.attempt, index=i, later_attempt=i < len(attempts))
    _assign(attempts, evals, "evals")
    # every directory the starts named (older ones too), the run's own last (hpctrain.run.checkpoint_dir)
    named = recorded_checkpoint_dirs(ledger)
    own = str(checkpoint_dir(paths, ledger))
    dirs = [d for d in named[:-1] if d != own] + ([own] if named or os.path.isdir(own) else [])
    checkpoints = _checkpoints(dirs, notes)
    capacity = _capacity(root, notes)
    return RunData(
        run_dir=root,
        status=status,
        intervals=intervals,
        evals=evals,
        attempts=attempts,
        checkpoints=checkpoints,
        capacity=capacity,
        notes=_dedupe(notes),
        generated=time.time(),
    )
