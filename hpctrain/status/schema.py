"""What each record of a run directory must look like, and how a damaged one is made safe (stdlib only).

:data:`SCHEMAS` maps each record kind (the submission, ledger start/end/exit, metrics interval/eval) to its
fields' expected types and ranges; :func:`sanitize` checks a record once, when it is read: a field of the
wrong type, out of range or not finite becomes None and one problem line names the file, the record and
the field; fields outside the schema pass through made JSON-standard (non-finite numbers become null,
nesting bounded). :mod:`hpctrain.status.report` reads the records through it; the HTML report and other
readers of a run may too.
"""

from __future__ import annotations

import math
import re
import typing as tp

from hpctrain._files import shorten

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
MEMORY_PARTS = ("peak_allocated_bytes", "peak_reserved_bytes", "rss_bytes", "state_bytes")  # train.memory.FIELDS
# per-step phases of a metrics interval (hpctrain.train.metrics), and busy_s: the step less its exposed comm
PER_STEP_PARTS = (
    "step_s",
    "data_wait_s",
    "forward_backward_s",
    "grad_comm_exposed_s",
    "optimizer_s",
    "checkpoint_s",
    "busy_s",
)

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
        "restored_tier": Str(),
        "local_tier_saved_steps": STEP,
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
        # node failures (hpctrain.launch.exclusion): which hosts failed, which the job now avoids
        "failed_nodes": StrList(),
        "suspect_nodes": StrList(),
        "excluded_nodes": StrList(),
        "newly_excluded": StrList(),
        "not_excluded": StrList(),
        "exclusion": Str(),
        "in_job_restart": Bool(),
    },
    # a restart of the training step inside the allocation, on a spare node (hpctrain.launch.spares)
    "ledger.in_job_restart": {
        **_LEDGER_COMMON,
        "next_restart_count": Int(0),
        "failed_at": TIME,
        "failed_nodes": StrList(),
        "excluded_nodes": StrList(),
        "spares_used": Int(0),
        "spares": Int(0),
    },
    # a failed node's own training step ended while the other nodes' steps went on (in-job recovery: one step per
    # node, hpctrain.launch.spares)
    "ledger.node_lost": {
        **_LEDGER_COMMON,
        "node": Str(),
        "node_index": Int(0),
        "exit_code": Int(-255, 255, what="an exit code"),
        "tasks": Int(1),
    },
    # a rank replaced inside the step by a warm spare, the run gone on at a smaller world (its `elastic`, a dict:
    # checked where status reads it, hpctrain.status.nodes), or the fallback (hpctrain.runtime.recovery)
    "ledger.in_job_recovery": {
        **_LEDGER_COMMON,
        "generation": Int(0),
        "agreed_step": STEP,
        "interrupted_step": STEP,
        "resumed_step": STEP,  # the step it continued after: the agreed one from memory, the commit from storage
        "state_from": Str(),  # memory, or the tier the sharded state was reloaded from (local, partner, global)
        "steps_redone": Int(0),
        "source_rank": RANK,
        "world_size": WORLD,
        "spares_left": Int(0),
        "failed_at": TIME,
        "first_step_at": TIME,
        "failure_to_first_step_s": SECONDS,
        "fallback": Str(),
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
        "data_wait_step_max_s": SECONDS,  # each step's max over ranks, meaned: what the synchronous step waited
        "last_checkpoint_step": STEP,
        # per-rank memory (hpctrain.train.memory; null: not measured here, e.g. device peaks on CPU)
        "memory": Record({k: STATS for k in MEMORY_PARTS}),
        "comm_measure": Str(),
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
