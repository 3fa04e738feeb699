"""The status report of a run directory as a JSON-able dict: :func:`collect` (stdlib only, never torch).

A library: ``python -m hpctrain status`` (:mod:`hpctrain.status.cli`) prints it, other tools may call it.
It reads what the run directory holds (``submission.json`` from ``hpctrain.submit``, the ledger and the
tail of the metrics, through :mod:`hpctrain.rundir`'s bounded non-blocking readers), the newest committed
checkpoint (:func:`hpctrain.ckpt.latest_committed`) and Slurm's view of the job
(:class:`hpctrain._slurm.SlurmCommands`).

Damaged run directories: each record is sanitised once, when read, against the schema of its kind
(:data:`SCHEMAS`: field -> expected type and range). A field of the wrong type, out of range or not
finite becomes None (shown as unknown) and one line in ``problems`` names the file, the record and the
field; fields outside the schema pass through made JSON-standard (non-finite numbers become null,
nesting is bounded). Everything after that trusts the types. :func:`to_json` prints standard JSON:
no ``NaN`` or ``Infinity`` tokens.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import time
import typing as tp
from pathlib import Path

from hpctrain._files import shorten
from hpctrain._procs import pid_alive
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import RunDir, read_json, read_jsonl

__all__ = [
    "collect",
    "to_json",
    "sanitize",
    "SCHEMAS",
    "Field",
    "METRICS_TAIL_BYTES",
    "MAX_PROBLEMS",
]

METRICS_TAIL_BYTES = 1 << 20
"""Bytes read from the end of ``metrics.jsonl``: the last intervals are enough, however long the run."""
MAX_PROBLEMS = 200
"""Problem lines kept; a badly damaged directory adds one line saying how many more there were."""
MAX_DEPTH = 32
"""Nesting kept in fields outside the schemas (a start record's ``config`` is 3 deep)."""

_TIME_MAX = 253402300799.0  # 9999-12-31: localtime() and strftime() answer for every time up to it
_INT_MAX = 2**63 - 1  # step counts: far above any run, and step / total stays a float
_PID_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------- schemas
class Field:
    """What one field of a record must hold. ``null``: whether null is a normal value (the writers write
    null for "none yet" and for non-finite measurements) or a problem; ``required``: whether a record
    without it is a problem."""

    what = "a value"

    def __init__(self, *, null: bool = True, required: bool = False) -> None:
        self.null, self.required = null, required

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        """``(ok, the value to keep)`` for a value that is not None."""
        return True, value

    def clean(self, value: tp.Any, name: str, where: str, problems: tp.List[str]) -> tp.Any:
        if value is None:
            if not self.null:
                problems.append(f"{where}: field '{name}' is null, not {self.what}; shown as unknown")
            return None
        try:
            ok, kept = self.check(value)
        except _TooDeep:
            problems.append(f"{where}: field '{name}' is nested deeper than {MAX_DEPTH} levels; shown as unknown")
            return None
        if not ok:
            problems.append(f"{where}: field '{name}' is {describe(value)}, not {self.what}; shown as unknown")
            return None
        return kept


class Num(Field):
    """A finite JSON number (not a bool) in ``lo..hi``."""

    def __init__(self, lo: tp.Optional[float] = None, hi: tp.Optional[float] = None, what: str = "", **kw: tp.Any):
        super().__init__(**kw)
        self.lo, self.hi = lo, hi
        if what:
            self.what = what
        elif lo is not None and hi is not None:
            self.what = f"a number in {lo:g}..{hi:g}"
        elif lo is not None:
            self.what = f"a finite number >= {lo:g}"
        else:
            self.what = "a finite number"

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, None
        try:
            f = float(value)
        except OverflowError:  # an integer of hundreds of digits
            return False, None
        ok = math.isfinite(f) and (self.lo is None or f >= self.lo) and (self.hi is None or f <= self.hi)
        return ok, value


class Int(Field):
    """A JSON integer (not a bool, not 10.0) in ``lo..hi``."""

    def __init__(self, lo: int = 0, hi: int = _INT_MAX, what: str = "", **kw: tp.Any) -> None:
        super().__init__(**kw)
        self.lo, self.hi = lo, hi
        self.what = what or f"an integer >= {lo}"

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        return type(value) is int and self.lo <= value <= self.hi, value


class Str(Field):
    """A string; with ``pattern``, one that matches it whole."""

    def __init__(self, pattern: str = "", what: str = "", **kw: tp.Any) -> None:
        super().__init__(**kw)
        self.pattern = re.compile(pattern) if pattern else None
        self.what = what or "a string"

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        ok = isinstance(value, str) and (self.pattern is None or self.pattern.fullmatch(value) is not None)
        return ok, value


class JobId(Field):
    """A Slurm or local job id: a short string of ``[A-Za-z0-9_.:+-]`` (an integer is taken as its digits;
    the empty string, a run without one, as None). It goes to ``squeue -j``: no spaces, NUL or options."""

    what = "a job id"
    _FORM = re.compile(r"[A-Za-z0-9_.:+][A-Za-z0-9_.:+-]{0,63}")

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        if type(value) is int and 0 <= value <= _INT_MAX:
            return True, str(value)
        if value == "":
            return True, None
        return isinstance(value, str) and self._FORM.fullmatch(value) is not None, value


class Bool(Field):
    what = "true or false"

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        return isinstance(value, bool), value


class StrList(Field):
    what = "a list of strings"

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        return isinstance(value, list) and all(isinstance(v, str) for v in value), value


class Record(Field):
    """A JSON object whose fields have a schema of their own (problems name them ``outer.inner``)."""

    what = "an object"

    def __init__(self, schema: tp.Mapping[str, Field], **kw: tp.Any) -> None:
        super().__init__(**kw)
        self.schema = schema

    def clean(self, value: tp.Any, name: str, where: str, problems: tp.List[str]) -> tp.Any:
        if isinstance(value, dict):
            return sanitize(value, self.schema, where, problems, prefix=f"{name}.")
        return super().clean(value, name, where, problems)

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        return False, None  # a dict never gets here


TIME = Num(0, _TIME_MAX, what="a Unix time")
STEP = Int(0)
RANK = Int(0, _PID_MAX)
WORLD = Int(1, _PID_MAX)
SECONDS = Num(0, 1e9, what="a duration in 0..1e9 s")  # 31 years: more is damage, not a measurement
# {min, median, max, max_rank} over ranks (docs/train.md, metrics.jsonl): every key is needed to show a row
STATS = Record(
    {
        "min": Num(0, required=True),
        "median": Num(0, required=True),
        "max": Num(0, required=True),
        "max_rank": Int(0, _PID_MAX, required=True),
    }
)
PER_STEP_PARTS = ("step_s", "data_wait_s", "forward_backward_s", "grad_comm_exposed_s", "optimizer_s", "checkpoint_s")

_LEDGER_COMMON: tp.Dict[str, Field] = {
    "schema": Str(),
    "event": Str(null=False, required=True),
    "time": Num(0, _TIME_MAX, what="a Unix time", null=False, required=True),
    "job_id": JobId(),
    "restart_count": Int(0),
}

SCHEMAS: tp.Dict[str, tp.Dict[str, Field]] = {
    # RUN_DIR/submission.json (hpctrain.submit): only what the report uses
    "submission": {"job_id": JobId(), "cluster": Str(), "state": Str()},
    # RUN_DIR/train/ledger.jsonl: one schema per event; another event gets the common fields only
    "ledger": _LEDGER_COMMON,
    "ledger.start": {
        **_LEDGER_COMMON,
        "hosts": StrList(),
        "hostname": Str(),
        "pid": Int(1, _PID_MAX, what="a process id"),
        "launcher": Str(),
        "world_size": WORLD,
        "resumed_from_step": STEP,
        "total_steps": STEP,
        "checkpoint_dir": Str(pattern=r"[^\x00]+", what="a path"),
        "startup_s": SECONDS,
        "lost_s": SECONDS,
        "down_s": Num(-1e9, 1e9, what="a duration in -1e9..1e9 s"),  # two hosts' clocks: may be a little negative
        "after": Str(),
        "signal_lead_s": SECONDS,
        "warning": Str(),
    },
    "ledger.end": {
        **_LEDGER_COMMON,
        "step": Int(0, null=False, required=True),
        "status": Str(),
        "committed_step": STEP,
        "last_save_s": SECONDS,
        "step_s": SECONDS,
        "error": Str(),
    },
    "ledger.exit": {
        **_LEDGER_COMMON,
        "cause": Str(),
        "requeued": Bool(),
        "reason": Str(),
        "signal_time": TIME,
        "agreed_step": STEP,
        "resumed_from_step": STEP,
        "committed_step": STEP,
        "slurm_state": Str(),
        "error": Str(),
        "decided_by_rank": RANK,
    },
    # RUN_DIR/train/metrics.jsonl
    "metrics.interval": {
        "schema": Str(),
        "kind": Str(),
        "time": TIME,
        "step": Int(0, null=False, required=True),
        "steps": STEP,
        "total_steps": STEP,
        "epoch": STEP,
        "lr": Num(),
        "world_size": WORLD,
        "job_id": JobId(),
        "restart_count": Int(0),
        "loss": Num(),  # null: the mean loss was NaN or infinite when written
        "samples": Num(0),
        "interval_s": SECONDS,
        "samples_per_s": Num(0),
        "samples_per_s_per_rank": STATS,
        "eta_s": Num(0),  # a huge total_steps gives a huge ETA: shown as a bound, not damage
        "flops_per_s": Num(0),
        "mfu": Num(0),
        "measured": Bool(),
        "per_step": Record({k: STATS for k in PER_STEP_PARTS}),
        "slowest_rank": RANK,
        "data_wait_frac": Num(0, 1),
        "last_checkpoint_step": STEP,
    },
    "metrics.eval": {
        "schema": Str(),
        "kind": Str(),
        "time": TIME,
        "step": Int(0, null=False, required=True),
        "loss": Num(),
        "batches": STEP,
        "seconds": SECONDS,
        "interrupted": Bool(),
    },
}


class _TooDeep(Exception):
    pass


def _plain(value: tp.Any, depth: int = 0, limit: int = MAX_DEPTH) -> tp.Any:
    """A parsed JSON value made standard: non-finite floats become None; deeper than ``limit``: _TooDeep."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if depth >= limit:
        raise _TooDeep
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1, limit) for v in value]
    return str(value)[:200]  # not from JSON: what a caller put in a report


class _Plain(Field):
    """A field outside the schema: kept, made JSON-standard."""

    def check(self, value: tp.Any) -> tp.Tuple[bool, tp.Any]:
        return True, _plain(value)


_PASS = _Plain()


def sanitize(
    record: tp.Mapping[str, tp.Any],
    schema: tp.Mapping[str, Field],
    where: str,
    problems: tp.List[str],
    *,
    prefix: str = "",
    keep_unknown: bool = True,
) -> tp.Dict[str, tp.Any]:
    """``record`` with every field checked against ``schema``: a bad one becomes None and one line in
    ``problems`` (``"<where>: field 'time' is 'x', not a Unix time; shown as unknown"``). Fields outside
    the schema are kept JSON-standard (dropped with ``keep_unknown=False``)."""
    out: tp.Dict[str, tp.Any] = {}
    for key, value in record.items():
        key = str(key)
        field = schema.get(key)
        if field is None and not keep_unknown:
            continue
        out[key] = (field or _PASS).clean(value, prefix + key, where, problems)
    for key, field in schema.items():
        if field.required and key not in record:
            problems.append(f"{where}: field '{prefix}{key}' is missing; shown as unknown")
            out[key] = None
    return out


def describe(value: tp.Any) -> str:
    """A short, safe description of a JSON value for a problem line (never a repr of a deep structure)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, int):  # no str() of a huge one: over 4300 digits it raises
        return str(value) if value.bit_length() <= 64 else f"an integer of about {len(hex(value)) * 1.2:.0f} digits"
    if isinstance(value, str):
        return repr(shorten(value, 40))
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__


# --------------------------------------------------------------------------------------------- reading
def _run_dir(run_dir: tp.Union[str, "os.PathLike[str]"]) -> Path:
    """``run_dir`` if it is a directory; else one UsageError (a symlink loop or a 5000-byte name too)."""
    shown = shorten(os.fspath(run_dir), 300)
    try:
        st = os.stat(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"RUN_DIR {shown}: no such directory") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"RUN_DIR {shown}: cannot open it ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"RUN_DIR {shown}: not a directory")
    return Path(run_dir)


def _dangling(path: Path, shown: str) -> str:
    """A problem line when ``path`` is a symbolic link to nothing (the readers take it for a missing file)."""
    try:
        if not os.path.islink(path) or os.path.exists(path):
            return ""
        target = os.readlink(path)
    except (OSError, ValueError):
        return ""
    return f"{shown}: a symbolic link to {shorten(target, 120)!r}, which does not exist; ignored"


def _train_dir_problem(paths: RunDir) -> str:
    try:
        st = os.stat(paths.train)
    except FileNotFoundError:
        return _dangling(paths.train, f"{RunDir.TRAIN}/")  # else: no training records yet
    except OSError as exc:
        return f"{RunDir.TRAIN}/: cannot open it ({exc.strerror or exc}); no ledger or metrics read"
    return "" if stat.S_ISDIR(st.st_mode) else f"{RunDir.TRAIN}/: not a directory; no ledger or metrics read"


def _ledger(paths: RunDir, problems: tp.List[str]) -> tp.List[tp.Dict[str, tp.Any]]:
    records, bad = read_jsonl(paths.ledger)
    problems += bad
    out = []
    for n, rec in enumerate(records, start=1):
        event = rec.get("event")
        schema = SCHEMAS.get(f"ledger.{event}", SCHEMAS["ledger"]) if isinstance(event, str) else SCHEMAS["ledger"]
        out.append(sanitize(rec, schema, f"{RunDir.LEDGER} record {n}", problems))
    return out


def _last_of_kind(
    metrics: tp.List[tp.Dict[str, tp.Any]], kind: str, problems: tp.List[str]
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The newest metrics record of ``kind``, sanitised (only the records shown are checked)."""
    for rec in reversed(metrics):
        if rec.get("kind") == kind:
            return sanitize(rec, SCHEMAS[f"metrics.{kind}"], f"{RunDir.METRICS} last {kind} record", problems)
    return None


def _checkpoint(ckpt_dir: tp.Optional[str], problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The newest committed checkpoint in ``ckpt_dir`` (the checkpoint package decides what is committed)."""
    if not ckpt_dir:
        return None
    from hpctrain.ckpt import latest_committed

    out: tp.Dict[str, tp.Any] = {"dir": ckpt_dir, "step": None, "time": None, "age_s": None, "world_size": None}
    shown = f"checkpoint dir {shorten(ckpt_dir, 300)}"
    try:  # what the directory itself is; what counts as committed inside it is the checkpoint package's call
        st = os.stat(ckpt_dir)
    except FileNotFoundError:
        problem = _dangling(Path(ckpt_dir), shown)
        problems += [problem] if problem else []  # else: no save yet
        return out
    except (OSError, ValueError) as exc:
        problems.append(f"{shown}: cannot open it ({getattr(exc, 'strerror', None) or exc}); no checkpoint shown")
        return out
    if not stat.S_ISDIR(st.st_mode):
        problems.append(f"{shown}: not a directory; no checkpoint shown")
        return out
    try:
        newest = latest_committed(ckpt_dir)
    except (OSError, ValueError, ArithmeticError, RecursionError, HpctrainError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        problems.append(f"{shown}: cannot read it ({shorten(why, 200)}); no checkpoint shown")
        return out
    if newest is None:
        return out
    saved = TIME.clean(newest.time, "time", f"{newest.path.name}/MANIFEST.json", problems)
    out.update(
        step=newest.step,
        time=saved,
        age_s=time.time() - saved if saved is not None else None,
        world_size=newest.world_size,
    )
    return out


def _job_state(
    submission: tp.Optional[tp.Dict[str, tp.Any]],
    starts: tp.List[tp.Dict[str, tp.Any]],
    end: tp.Optional[tp.Dict[str, tp.Any]],
    slurm: tp.Any,
    problems: tp.List[str],
) -> tp.Dict[str, tp.Any]:
    sub = submission or {}
    last = starts[-1] if starts else {}
    job_id = sub.get("job_id") or last.get("job_id")
    cluster = sub.get("cluster")
    if cluster is None:  # no submission record (plain sbatch template, torchrun): how the ranks were launched
        cluster = "slurm" if last.get("launcher") == "slurm" else "local"
    job: tp.Dict[str, tp.Any] = {"id": job_id, "cluster": cluster}
    if cluster == "slurm" and job_id:
        from hpctrain._slurm import SlurmCommands

        try:
            st = (slurm or SlurmCommands()).job_state(job_id)
        except HpctrainError as exc:
            problems.append(f"job state: {exc}")
        except (OSError, ValueError) as exc:  # the command could not be run at all
            problems.append(f"job state: cannot ask Slurm ({exc})")
        else:
            if st.source:  # squeue or sacct knows the job
                job.update(state=st.state, source=st.source, nodes=st.nodes, elapsed=st.elapsed, reason=st.reason)
                return job
            problems.append(f"job state: Slurm does not know job {job_id} (accounting off or purged)")
    # local runs, or Slurm unreachable: what the run's own records say
    if end is not None:
        status = end.get("status")
        known = {"completed": "COMPLETED", "stopped": "STOPPED", None: "ENDED (status unknown)"}
        job["state"] = known.get(status, "FAILED")
    elif last:
        alive = pid_alive(last.get("pid")) if last.get("hostname") == socket.gethostname() else None
        job["state"] = {True: "RUNNING", False: "DIED (no end record)", None: "RUNNING?"}[alive]
    elif submission is not None:
        job["state"] = (sub.get("state") or "submitted").upper()
    else:
        job["state"] = "UNKNOWN"
    job["source"] = "run dir"
    return job


IDENTITY_ROWS = 20
"""Attempts whose identity the report lists (the newest ones; the records hold them all)."""


def _short_text(value: tp.Any, keep: int = 200) -> tp.Optional[str]:
    return value[:keep] if isinstance(value, str) else None


def _identity(root: Path, problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """Each attempt's run identity and what changed since the attempt before (hpctrain.identity): a restart
    that ran other code, config or data is shown as such, not silently mixed. None without records."""
    try:
        from hpctrain.identity import attempt_history

        history = attempt_history(root)
    except Exception as exc:  # noqa: BLE001 - a damaged identity record is one warning, the rest still shows
        problems.append(f"identity records: unreadable ({type(exc).__name__}: {str(exc)[:200]}); not shown")
        return None
    rows = []
    for h in history[-IDENTITY_ROWS:] if isinstance(history, list) else []:
        if not isinstance(h, dict):
            continue
        changed = h.get("changed") if isinstance(h.get("changed"), list) else []
        rows.append(
            {
                "attempt": _short_text(h.get("attempt"), 80),
                "identity": _short_text(h.get("identity"), 64),
                "changed": [c[:40] for c in changed if isinstance(c, str)],
                "data_change_accepted": h.get("data_change_accepted") is True,
            }
        )
    if not rows:
        return None
    return {"current": rows[-1]["identity"], "attempts": rows, "changes": sum(1 for r in rows if r["changed"])}


def _approvals(root: Path, problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The approval history (hpctrain.approvals): count, whether the chain verifies, the newest decisions.
    None when the run has no approval log."""
    from hpctrain.approvals import approvals_summary

    try:
        summary = approvals_summary(root, limit=10)
    except Exception as exc:  # noqa: BLE001 - documented never to raise; a warning if it does
        problems.append(f"approvals: unreadable ({type(exc).__name__}: {str(exc)[:200]}); not shown")
        return None
    if not summary.get("count") and not summary.get("problems"):
        return None
    problems.extend(f"approvals: {p}" for p in summary.get("problems") or [] if isinstance(p, str))
    return summary


def collect(run_dir: tp.Union[str, "os.PathLike[str]"], *, slurm: tp.Any = None) -> tp.Dict[str, tp.Any]:
    """The status report of ``run_dir`` as a JSON-able dict (what ``--json`` prints): ``run_dir``, ``job``,
    ``starts``, ``restarts``, ``progress``, ``checkpoint``, ``last_interval``, ``last_eval``, ``last_exit``,
    ``ledger``, ``problems``. Every value is of its schema's type or None. ``slurm``: a
    :class:`~hpctrain._slurm.SlurmCommands` (tests pass a fake). UsageError for a path that is not a run
    directory; a damaged one gives a report with its problems listed."""
    root = _run_dir(run_dir)
    paths = RunDir(root)
    problems: tp.List[str] = []
    submission = read_json(paths.submission, problems)
    if submission is None:
        problems += [p for p in [_dangling(paths.submission, RunDir.SUBMISSION)] if p]
    if submission is not None:
        submission = sanitize(submission, SCHEMAS["submission"], RunDir.SUBMISSION, problems, keep_unknown=False)
    train_problem = _train_dir_problem(paths)
    if train_problem:
        problems.append(train_problem)
        ledger, metrics = [], []
    else:
        ledger = _ledger(paths, problems)
        metrics, bad = read_jsonl(paths.metrics, tail_bytes=METRICS_TAIL_BYTES)
        problems += bad
        problems += [p for p in (_dangling(paths.ledger, RunDir.LEDGER), _dangling(paths.metrics, RunDir.METRICS)) if p]
    if submission is None and not ledger and not metrics and not problems:
        raise UsageError(f"RUN_DIR {root} holds no submission.json and no train/ records: is it a run directory?")

    starts = [r for r in ledger if r.get("event") == "start"]
    # the newest start's end, if it has one: the ledger is append-only, so "after it" is "later in the file"
    last_start = max((i for i, r in enumerate(ledger) if r.get("event") == "start"), default=-1)
    last_end = max((i for i, r in enumerate(ledger) if r.get("event") == "end"), default=-1)
    end = ledger[last_end] if last_end > last_start else None
    last = _last_of_kind(metrics, "interval", problems)
    last_eval = _last_of_kind(metrics, "eval", problems)
    ckpt_dir = next((s["checkpoint_dir"] for s in reversed(starts) if s.get("checkpoint_dir")), None)
    total = (last or {}).get("total_steps") or (starts[-1].get("total_steps") if starts else None)
    known_steps = [s for s in ((last or {}).get("step"), (end or {}).get("step")) if s is not None]
    step = max(known_steps) if known_steps else None
    report: tp.Dict[str, tp.Any] = {
        "run_dir": str(root),
        "job": _job_state(submission, starts, end, slurm, problems),
        "starts": len(starts),
        "restarts": max(len(starts) - 1, 0),
        "progress": {
            "step": step,
            "total_steps": total,
            "fraction": step / total if step is not None and total else None,
            "eta_s": None if end is not None else (last or {}).get("eta_s"),
            "ended": (end or {}).get("status"),
        },
        "checkpoint": _checkpoint(ckpt_dir, problems),
        "last_interval": last,
        "last_eval": last_eval,
        # how the newest attempt ended and whether it was requeued, with the reason (hpctrain.launch.ending)
        "last_exit": next((r for r in reversed(ledger) if r.get("event") == "exit"), None),
        "ledger": ledger,
        "identity": _identity(root, problems),
        "approvals": _approvals(root, problems),
        "problems": problems,
    }
    if len(problems) > MAX_PROBLEMS:
        report["problems"] = problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problems"]
    return report


def to_json(report: tp.Mapping[str, tp.Any]) -> str:
    """``report`` as standard JSON (what ``status --json`` prints): null for any non-finite number."""
    return json.dumps(_plain(report, limit=4 * MAX_DEPTH), indent=2, sort_keys=True, allow_nan=False)
