"""What a run directory says (stdlib only, login side): its attempts, its identity, and which checkpoints are its own.

:mod:`hpctrain.rundir` owns the paths of a run; this module reads them and decides. One rule lives here, so that
every reader (``status``, ``report``, ``bundle``, ``capacity``, ``approve``, ``reproduce``) applies the same one.

**What is a run directory** (:func:`is_run_dir`): a directory holding something a run writes, its
``submission.json``, ``train/ledger.jsonl``, ``train/metrics.jsonl``, ``identity/submit.json`` or
``checkpoints/`` (a dangling link counts: the readers report it as damage).

**Which ledger records make an attempt** (:func:`attempts`, :class:`Attempt`), the records in file order:

* a ``start`` opens an attempt (a local run started twice in one run directory has two attempts with the
  same job id and restart count);
* an ``end`` (it names no job) closes the newest attempt that has a start when that one has no end yet;
  otherwise it is an attempt of its own, without a start;
* an ``exit`` (the Runner's: it names its job id and restart count) closes the newest attempt of its key
  that has no exit yet (an exit without a restart count: the newest attempt without an exit), else the
  newest attempt when that is an end without a start (which takes the exit's name); otherwise it is an
  attempt of its own, without a start (an entry that died before the Trainer's start record);
* ``in_job_restart`` records are not attempts: the restarted step writes its own ``start``;
* a ``startup`` (the Trainer's, after the first step) belongs to the newest attempt of its key that has a start.

A start without an end or exit is an attempt that runs still, or died (:attr:`Attempt.status`: ``killed``
when a later attempt exists); an attempt without a start is still counted (:attr:`Attempt.started` False).
Its label is ``<job id or local>-r<restart count>`` (:func:`attempt_label`, :func:`parse_label`: the only
spelling); ``status``, ``report`` and ``bundle`` show the same attempts under the same labels.

**The run's checkpoint directory** (:func:`checkpoint_dir`): the ``checkpoint_dir`` of the newest ledger
``start`` that names one (relative: against the submission's ``cwd``, else the run directory), else
``RUN_DIR/checkpoints``.

**The run's newest identity** (:func:`run_identity`): the newest attempt's identity manifest that holds one,
else the submit record's.

**Does a checkpoint belong to this run** (:func:`choose_checkpoint`).

**Which checkpoint directory is this run's, and does a checkpoint belong to it** (:func:`choose_checkpoint`).
The run's checkpoint directory is the one its newest ledger ``start`` names (``CheckpointPolicy.dir`` may name one
outside the run), else ``RUN_DIR/checkpoints``. A run directory moved with ``mv`` still names its old absolute
path, where another run may live now, so a checkpoint is taken only when its commit manifest belongs to this run
(:func:`checkpoint_ownership`):

* the manifest's ``identity`` (the run identity the Trainer's Checkpointer writes into every commit) must be one
  this run recorded: in an identity manifest (``identity/submit.json``, ``identity/<job>-r<n>.json``) or in a
  ledger ``start`` record (the Trainer writes the attempt's identity into both);
* the manifest's job id (``run_id``, ``job_id``) must be one of this run's jobs (its ledger's, its identity
  manifests'), when both sides know one.

A checkpoint that fails either is refused with one line naming whose it is. When the recorded directory is gone
or holds another run's checkpoints, the run's own ``RUN_DIR/checkpoints`` is tried (a moved run); the user names
any other directory with ``--checkpoint-dir DIR``, which is checked the same way. Where neither side records
anything to compare (a run from before identity capture, a checkpoint written by a Checkpointer without an
identity, in a local run without job ids), the checkpoint is taken and the note says that its ownership was not
checked; a directory with a checkpoint that is proven to be this run's is preferred to one that cannot be told.
An identity says *what* made a checkpoint (code, config, data, environment), not in which directory: two local
runs of identical code, config, data and environment cannot be told apart.
"""

from __future__ import annotations

import math
import os
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import UsageError
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, attempt_label, parse_label, read_json

__all__ = [
    "is_run_dir",
    "Attempt",
    "attempts",
    "attempt_label",
    "parse_label",
    "SLURM_CAUSES",
    "checkpoint_dir",
    "recorded_checkpoint_dirs",
    "attempt_keys",
    "run_identity",
    "recorded_checkpoint_dir",
    "RunSelf",
    "run_self",
    "Ownership",
    "checkpoint_ownership",
    "Chosen",
    "committed_checkpoints",
    "choose_checkpoint",
    "nested",
]

PathLike = tp.Union[str, "os.PathLike[str]"]
MAX_IDENTITY_FILES = 4096
"""Identity manifests read per run (one per attempt): far above any real run, a bound on a damaged one."""


def _paths(run: tp.Union[PathLike, RunDir]) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(run)


def _text(value: tp.Any) -> tp.Optional[str]:
    return value if isinstance(value, str) and value and "\x00" not in value else None


def _num(value: tp.Any) -> tp.Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _int(value: tp.Any) -> tp.Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------------------------------------- a run directory
def is_run_dir(path: tp.Union[PathLike, RunDir]) -> bool:
    """Whether ``path`` is a run directory (the module docstring): a directory holding ``submission.json``,
    ``train/ledger.jsonl``, ``train/metrics.jsonl``, ``identity/submit.json`` or ``checkpoints/``."""
    paths = _paths(path)
    try:
        if not paths.root.is_dir():
            return False
        return any(
            os.path.lexists(p)
            for p in (paths.submission, paths.ledger, paths.metrics, paths.identity_submit, paths.checkpoints)
        )
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------- attempts
SLURM_CAUSES = {
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "PREEMPTED": "preemption",
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "CANCELLED": "cancelled",
}
"""Slurm run states that say why a run ended, and hpctrain's cause (:class:`hpctrain.runtime.preemption.StopCause`)
for the same end; a different recorded cause is a disagreement. The other states say nothing of the cause:
``REQUEUED`` is ``scontrol requeue`` (hpctrain's own, after any cause), ``COMPLETED``/``FAILED`` how the batch
script exited, ``RUNNING``/``PENDING`` a run not over."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run, from its ledger (:func:`attempts`: the pairing rule is the module docstring's)."""

    job_id: str
    """The job id its records name; ``""`` for none (a local run)."""
    restart_count: tp.Optional[int]
    start: tp.Optional[tp.Dict[str, tp.Any]] = None
    end: tp.Optional[tp.Dict[str, tp.Any]] = None
    exit: tp.Optional[tp.Dict[str, tp.Any]] = None
    index: int = 0
    """1-based position among the run's attempts (keys may repeat)."""
    later_attempt: bool = False
    """Another attempt came after this one (so one without an end record did not merely still run)."""
    last_metrics_time: tp.Optional[float] = None
    last_metrics_step: tp.Optional[int] = None
    slurm: tp.Optional[tp.Dict[str, tp.Any]] = None
    """Slurm's run of this attempt (:func:`hpctrain.run_slurm.match_slurm_runs`): ``state``, ``start``, ``end``,
    ``nodes``, ``exit_code``, ``run`` (0-based among the job's runs), ``runs``, ``matched_by``, ``shared`` (a later
    attempt ran in the same Slurm run: an in-job restart, so the state is not this attempt's)."""
    slurm_unavailable: tp.Optional[str] = None
    """Why Slurm's view could not be had (no sacct, accounting disabled), when it was asked for."""
    startup: tp.Optional[tp.Dict[str, tp.Any]] = None
    """The ``startup`` record written after the attempt's first step (read with
    :func:`hpctrain.runtime.startup.recorded`, beside :attr:`start`)."""

    @property
    def key(self) -> tp.Tuple[str, tp.Optional[int]]:
        return self.job_id, self.restart_count

    @property
    def label(self) -> str:
        return attempt_label(self.job_id, self.restart_count)

    @property
    def started(self) -> bool:
        """Whether a ``start`` record opened it (False: an end or exit without a start)."""
        return self.start is not None

    @property
    def ended(self) -> bool:
        return self.end is not None or self.exit is not None

    @property
    def start_time(self) -> tp.Optional[float]:
        return _num((self.start or {}).get("time"))

    @property
    def end_time(self) -> tp.Tuple[tp.Optional[float], str]:
        """(when it ended, from what): the end record, else the exit record, else its last metrics record."""
        for rec, what in ((self.end, "end record"), (self.exit, "exit record")):
            t = _num((rec or {}).get("time"))
            if t is not None:
                return t, what
        if self.last_metrics_time is not None:
            return self.last_metrics_time, "last metrics record (no end record)"
        return None, ""

    @property
    def hosts(self) -> tp.List[str]:
        hosts = (self.start or {}).get("hosts")
        return [str(h) for h in hosts] if isinstance(hosts, list) else []

    @property
    def world_size(self) -> tp.Optional[int]:
        return _int((self.start or {}).get("world_size"))

    @property
    def resumed_from_step(self) -> tp.Optional[int]:
        for rec in (self.start, self.exit):
            value = _int((rec or {}).get("resumed_from_step"))
            if value is not None:
                return value
        return None

    @property
    def committed_step(self) -> tp.Optional[int]:
        for rec in (self.exit, self.end):
            value = _int((rec or {}).get("committed_step"))
            if value is not None:
                return value
        return None

    @property
    def step(self) -> tp.Optional[int]:
        value = _int((self.end or {}).get("step"))
        return value if value is not None else self.last_metrics_step

    @property
    def status(self) -> str:
        """completed | stopped | failed | killed (no end record, a later attempt exists) | unknown."""
        end = (self.end or {}).get("status")
        cause = (self.exit or {}).get("cause")
        if end == "failed" or cause in ("user_error", "node_failure"):
            return "failed"
        if end in ("completed", "stopped"):
            return str(end)
        if cause == "finished":
            return "completed"
        if cause in ("time_limit", "preemption", "cancelled"):
            return "stopped"
        return "killed" if self.later_attempt else "unknown"

    @property
    def requeued(self) -> bool:
        return bool((self.exit or {}).get("requeued"))

    @property
    def error(self) -> str:
        for rec in (self.end, self.exit):
            text = (rec or {}).get("error")
            if isinstance(text, str) and text:
                return text
        if self.status == "killed":
            return "the attempt left no end or exit record (killed: node failure, time limit, scancel -9)"
        return ""

    @property
    def launcher(self) -> tp.Optional[str]:
        """``slurm``, ``submitit-local``, ``torchrun``, ``single`` (the start record's), else None."""
        value = (self.start or {}).get("launcher")
        return str(value) if value else None

    @property
    def where(self) -> str:
        """``Slurm job 123`` or ``local job 456`` / ``local run`` (what ran it, for people)."""
        if self.launcher == "slurm" or (self.exit or {}).get("slurm_state"):
            return f"Slurm job {self.job_id}"
        return f"local job {self.job_id}" if self.job_id else "local run"

    @property
    def cause(self) -> tp.Optional[str]:
        cause = (self.exit or {}).get("cause")
        return str(cause) if cause else None

    @property
    def lived(self) -> tp.List[float]:
        """Times the attempt itself wrote (start, end, last metrics; its exit when one of its own ranks decided
        it: an exit recorded at the next attempt's start is not a time of this one)."""
        times = [self.start_time, _num((self.end or {}).get("time")), self.last_metrics_time]
        if _int((self.exit or {}).get("decided_by_rank")) is not None:
            times.append(_num((self.exit or {}).get("time")))
        return [t for t in times if t is not None]

    @property
    def slurm_disagrees(self) -> tp.Optional[str]:
        """``attempt 12-r0: hpctrain says preemption, Slurm says NODE_FAIL`` when Slurm's state of this attempt's
        run names another cause than hpctrain recorded (:data:`SLURM_CAUSES`), else None."""
        if not self.slurm or self.slurm.get("shared") or not self.cause:
            return None
        state = str(self.slurm.get("state") or "")
        if state not in SLURM_CAUSES or SLURM_CAUSES[state] == self.cause:
            return None
        return f"attempt {self.label}: hpctrain says {self.cause}, Slurm says {state}"


def attempts(
    ledger: tp.Iterable[tp.Mapping[str, tp.Any]],
    metrics: tp.Iterable[tp.Mapping[str, tp.Any]] = (),
) -> tp.List[Attempt]:
    """The run's attempts from its ledger records (file order), by the module docstring's rule; ``metrics``
    records fill in each attempt's last sign of life. Slurm's record of each: :func:`hpctrain.run_slurm.with_slurm`."""
    out: tp.List[tp.Dict[str, tp.Any]] = []
    for rec in ledger:
        if not isinstance(rec, tp.Mapping):
            continue
        event = rec.get("event")
        key = (str(rec.get("job_id") or ""), _int(rec.get("restart_count")))
        if event == "start":
            out.append({"job_id": key[0], "restart_count": key[1], "start": dict(rec)})
        elif event == "end":
            opened = next((a for a in reversed(out) if a.get("start") is not None), None)
            if opened is not None and opened is out[-1] and opened.get("end") is None:
                opened["end"] = dict(rec)
            else:
                out.append({"job_id": key[0], "restart_count": key[1], "end": dict(rec)})
        elif event == "startup":
            opened = next((a for a in reversed(out) if a.get("start") is not None), None)
            if opened is not None and (opened["job_id"], opened["restart_count"]) == key:
                opened["startup"] = dict(rec)
        elif event == "exit":
            owner = next(
                (
                    a
                    for a in reversed(out)
                    if a.get("exit") is None and (key[1] is None or (a["job_id"], a["restart_count"]) == key)
                ),
                None,
            )
            nameless = out[-1] if out and out[-1].get("start") is None and out[-1].get("exit") is None else None
            if owner is None and nameless is not None:  # the newest attempt is an end without a start: its exit
                owner = nameless
                owner["job_id"], owner["restart_count"] = key
            if owner is None:
                out.append({"job_id": key[0], "restart_count": key[1], "exit": dict(rec)})
            else:
                owner["exit"] = dict(rec)
    for rec in metrics:
        if not isinstance(rec, tp.Mapping):
            continue
        t, step = _num(rec.get("time")), _int(rec.get("step"))
        key = (str(rec.get("job_id") or ""), _int(rec.get("restart_count")) or 0)
        if t is None:
            continue
        mine = [
            a
            for a in out
            if (a["job_id"], a["restart_count"]) == key
            and (_num((a.get("start") or {}).get("time")) is None or _num(a["start"]["time"]) <= t)
        ]
        if mine and (mine[-1].get("last_metrics_time") is None or t >= mine[-1]["last_metrics_time"]):
            mine[-1]["last_metrics_time"], mine[-1]["last_metrics_step"] = t, step
    return [Attempt(**a, index=n, later_attempt=n < len(out)) for n, a in enumerate(out, start=1)]


# ---------------------------------------------------------------------------------------------- attempts, identity
def attempt_keys(run: tp.Union[PathLike, RunDir]) -> tp.List[tp.Tuple[str, int]]:
    """``(job id, restart count)`` of every attempt (:func:`attempts`) with a restart count, oldest first, each once."""
    keys: tp.List[tp.Tuple[str, int]] = []
    for a in attempts(Ledger(_paths(run)).records()):
        if a.restart_count is not None and (a.job_id, a.restart_count) not in keys:
            keys.append((a.job_id, a.restart_count))
    return keys


def run_identity(run: tp.Union[PathLike, RunDir]) -> tp.Tuple[tp.Optional[str], tp.Optional[Path]]:
    """``(identity, the record it came from)``: the newest attempt record that holds an ``identity``, else the
    submit record's; ``(None, None)`` when no record holds one (a run from before identity capture)."""
    paths = _paths(run)
    candidates = [paths.identity_attempt(job, restart) for job, restart in reversed(attempt_keys(paths))]
    for path in [*candidates, paths.identity_submit]:
        record = read_json(path, [])
        value = _text(record.get("identity")) if record else None
        if value:
            return value, path
    return None, None


def recorded_checkpoint_dirs(ledger: tp.Iterable[tp.Mapping[str, tp.Any]]) -> tp.List[str]:
    """Every ``checkpoint_dir`` the ledger's ``start`` records name, as written, each once, oldest first."""
    found: tp.List[str] = []
    for rec in ledger:
        if isinstance(rec, tp.Mapping) and rec.get("event") == "start" and _text(rec.get("checkpoint_dir")):
            if rec["checkpoint_dir"] in found:
                found.remove(rec["checkpoint_dir"])
            found.append(rec["checkpoint_dir"])
    return found


def recorded_checkpoint_dir(ledger: tp.Iterable[tp.Mapping[str, tp.Any]]) -> tp.Optional[str]:
    """The ``checkpoint_dir`` of the newest ledger ``start`` record that names one, as written (None: none does)."""
    found = None
    for rec in ledger:
        if isinstance(rec, tp.Mapping) and rec.get("event") == "start" and _text(rec.get("checkpoint_dir")):
            found = rec["checkpoint_dir"]
    return found


def checkpoint_dir(
    run: tp.Union[PathLike, RunDir], ledger: tp.Optional[tp.Iterable[tp.Mapping[str, tp.Any]]] = None
) -> Path:
    """The run's checkpoint directory: the newest ledger ``start``'s ``checkpoint_dir`` (a relative one against
    the submission's ``cwd``, else the run directory), else ``RUN_DIR/checkpoints``. ``ledger``: the records,
    when the caller has read them already. Whether what is there is this run's: :func:`choose_checkpoint`."""
    paths = _paths(run)
    value = recorded_checkpoint_dir(Ledger(paths).records("start") if ledger is None else ledger)
    if value is None:
        return paths.checkpoints
    path = Path(value)
    if not path.is_absolute():  # written relative to the job's working directory
        submission = read_json(paths.submission, []) or {}
        cwd = _text(submission.get("cwd"))
        path = Path(cwd) / path if cwd else paths.root / path
    return path


@dataclass(frozen=True)
class RunSelf:
    """Who a run is, as its own records say: the identities and job ids a checkpoint of it may carry."""

    identities: tp.FrozenSet[str]
    job_ids: tp.FrozenSet[str]
    identity: tp.Optional[str]
    """The run's newest identity (:func:`run_identity`, else the newest ledger start's): what messages show."""


def run_self(run: tp.Union[PathLike, RunDir]) -> RunSelf:
    """Every identity and job id this run recorded: its identity manifests (submit and every attempt file in
    ``identity/``, a damaged one skipped) and its ledger's ``start`` and ``exit`` records."""
    paths = _paths(run)
    identities: tp.Set[str] = set()
    jobs: tp.Set[str] = set()
    files = [paths.identity_submit]
    try:
        names = sorted(p.name for p in paths.identity.iterdir())
    except OSError:
        names = []
    files += [
        paths.identity / n
        for n in names[:MAX_IDENTITY_FILES]
        if n.endswith(".json") and (parse_label(n[: -len(".json")]) or ("", None))[1] is not None
    ]
    for path in files:
        rec = read_json(path, [])
        if not rec:
            continue
        if _text(rec.get("identity")):
            identities.add(rec["identity"])
        attempt = rec.get("attempt") if isinstance(rec.get("attempt"), dict) else {}
        if _text(attempt.get("job_id")):
            jobs.add(attempt["job_id"])
    ledger_identity = None
    for rec in Ledger(paths).records():
        if rec.get("event") == "start" and _text(rec.get("identity")):
            identities.add(rec["identity"])
            ledger_identity = rec["identity"]
        if rec.get("event") in ("start", "exit") and rec.get("job_id") not in (None, ""):
            jobs.add(str(rec["job_id"]))
    newest, _ = run_identity(paths)
    return RunSelf(frozenset(identities), frozenset(jobs), newest or ledger_identity)


# ---------------------------------------------------------------------------------------------- ownership
@dataclass(frozen=True)
class Ownership:
    """Whether a checkpoint belongs to a run: ``belongs`` False is a proven mismatch (``why`` names it);
    ``checked`` False means neither side recorded anything to compare (``why`` says so) and it was taken."""

    belongs: bool
    checked: bool
    why: str = ""


def checkpoint_ownership(
    manifest: tp.Optional[tp.Mapping[str, tp.Any]], me: RunSelf, where: PathLike = ""
) -> Ownership:
    """Whether the commit manifest ``manifest`` (of the checkpoint at ``where``) belongs to the run ``me``."""
    manifest = manifest or {}
    theirs = _text(manifest.get("identity"))
    their_jobs = {j for j in (_text(manifest.get("run_id")), _text(manifest.get("job_id"))) if j}
    shown = f"checkpoint {where}" if str(where) else "the checkpoint"
    if theirs and me.identities and theirs not in me.identities:
        mine = f"this run is {me.identity[:12]}" if me.identity else "this run recorded other identities"
        return Ownership(False, True, f"{shown} belongs to run {theirs[:12]} ({mine})")
    if their_jobs and me.job_ids and not their_jobs & me.job_ids:
        jobs = ", ".join(sorted(me.job_ids)[:5]) + (", ..." if len(me.job_ids) > 5 else "")
        return Ownership(False, True, f"{shown} was saved by job {sorted(their_jobs)[0]} (this run's jobs: {jobs})")
    if (theirs and theirs in me.identities) or their_jobs & me.job_ids:
        return Ownership(True, True)
    if theirs:  # the run recorded no identity, the checkpoint does: the run's identity records are gone
        return Ownership(
            False,
            True,
            f"{shown} carries run identity {theirs[:12]}, but this run records none (its identity manifests are "
            "missing or unreadable, its ledger names none): it cannot be told to be this run's",
        )
    why = (
        "neither this run nor its checkpoint records an identity (a run from before identity capture)"
        if not me.identities
        else "the checkpoint records no run identity (written without one)"
    )
    return Ownership(True, False, f"{shown}: {why}, nor a job id to compare; its ownership was not checked")


# ---------------------------------------------------------------------------------------------- checkpoints
def committed_checkpoints(ckpt_dir: PathLike) -> tp.List[tp.Any]:
    """The committed checkpoints of ``ckpt_dir`` (``hpctrain.ckpt.Entry``, oldest first); none when it
    is not a readable directory."""
    from hpctrain.ckpt import committed

    return committed(ckpt_dir)


@dataclass
class Chosen:
    """The checkpoint :func:`choose_checkpoint` took: the scan entry, its directory, how that directory was found
    (``recorded``: the ledger's; ``run directory``: ``RUN_DIR/checkpoints``; ``--checkpoint-dir``), whether its
    ownership was proven, and notes (one line each) for the user."""

    entry: tp.Any
    dir: Path
    how: str
    checked: bool
    identity: tp.Optional[str]
    """The run identity the checkpoint's manifest carries (None: none)."""
    notes: tp.List[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.entry.path)

    @property
    def step(self) -> int:
        return int(self.entry.step)

    @property
    def manifest(self) -> tp.Dict[str, tp.Any]:
        return dict(self.entry.manifest or {})


def _recorded(paths: RunDir) -> tp.Optional[Path]:
    """:func:`checkpoint_dir` when the ledger names one (None: the run's own ``RUN_DIR/checkpoints``)."""
    ledger = Ledger(paths).records("start")
    return checkpoint_dir(paths, ledger) if recorded_checkpoint_dir(ledger) is not None else None


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return str(a) == str(b)


def choose_checkpoint(
    run: tp.Union[PathLike, RunDir],
    step: tp.Optional[int] = None,
    *,
    checkpoint_dir: tp.Optional[PathLike] = None,
    what: str = "to take",
) -> Chosen:
    """The committed checkpoint ``step`` (default: the newest) of this run, from the directory that is its own
    (see the module docstring); one :class:`UsageError` line otherwise: another run's checkpoint, no committed
    checkpoint, no such step. ``what``: the end of the no-checkpoint message (``to bundle``, ``to approve``)."""
    paths = _paths(run)
    me = run_self(paths)
    hint = "pass --checkpoint-dir DIR to name this run's checkpoints"
    if checkpoint_dir is not None:
        given = Path(checkpoint_dir).expanduser()
        if not given.is_dir():
            raise UsageError(f"--checkpoint-dir {given} is not a directory")
        candidates = [(given.absolute(), "--checkpoint-dir")]
    else:
        recorded = _recorded(paths)
        candidates = [(recorded, "recorded")] if recorded is not None else []
        if recorded is None or not _same(recorded, paths.checkpoints):
            candidates.append((paths.checkpoints, "run directory"))
    looked: tp.List[tp.Tuple[Path, str, tp.List[tp.Any], tp.Any, tp.Optional[Ownership]]] = []
    for where, how in candidates:
        committed = committed_checkpoints(where)
        pick = (
            (committed[-1] if committed else None)
            if step is None
            else next((e for e in reversed(committed) if e.step == step), None)
        )
        owned = checkpoint_ownership(pick.manifest, me, pick.path) if pick is not None else None
        looked.append((where, how, committed, pick, owned))
    usable = [x for x in looked if x[4] is not None and x[4].belongs]
    best = next((x for x in usable if x[4].checked), usable[0] if usable else None)  # type: ignore[union-attr]
    if best is not None:
        where, how, _, pick, owned = best
        notes = [] if owned.checked else [owned.why]
        first = looked[0]
        if best is not first and first[1] == "recorded":
            if first[4] is not None and not first[4].belongs:
                notes.insert(0, f"{first[4].why}: took {where} instead, this run's own (the run directory was moved?)")
            elif first[3] is None and not first[0].exists():
                notes.insert(
                    0, f"the recorded checkpoint directory {first[0]} is gone: took {where} (the run was moved?)"
                )
            elif first[3] is None:
                notes.insert(0, f"the recorded checkpoint directory {first[0]} holds no such checkpoint: took {where}")
        ident = _text((pick.manifest or {}).get("identity"))
        return Chosen(entry=pick, dir=Path(where), how=how, checked=owned.checked, identity=ident, notes=notes)
    foreign = next((x for x in looked if x[4] is not None), None)
    if foreign is not None:
        raise UsageError(f"{foreign[4].why}; {hint}")
    shown = looked[0][0]
    with_any = next((x for x in looked if x[2] and checkpoint_ownership(x[2][-1].manifest, me).belongs), None)
    with_any = with_any or next((x for x in looked if x[2]), None)  # the run's own steps first
    if step is not None and with_any is not None:
        steps = ", ".join(str(e.step) for e in with_any[2][-10:])
        raise UsageError(f"--step {step} is not a committed checkpoint in {with_any[0]} (committed: {steps})")
    also = f" (nor in {looked[1][0]})" if len(looked) > 1 else ""
    raise UsageError(
        f"{paths.root} has no committed checkpoint in {shown}{also}: nothing {what}"
        + ("" if checkpoint_dir is not None else f"; if the run's checkpoints are elsewhere, {hint}")
    )


# ---------------------------------------------------------------------------------------------- outputs
def nested(output: PathLike, source: PathLike) -> tp.Optional[str]:
    """Whether ``output`` lies inside ``source`` (or is it) or ``source`` inside ``output``, symlinks resolved
    (neither need exist; the part that exists is resolved): ``"inside"``, ``"contains"``, or None when apart."""
    out = Path(os.path.realpath(os.path.abspath(os.fspath(output))))
    src = Path(os.path.realpath(os.path.abspath(os.fspath(source))))
    if out == src or src in out.parents:
        return "inside"
    if out in src.parents:
        return "contains"
    return None
