"""What a run directory says (stdlib only, login side): its attempts, its identity, and which checkpoints are its own.

:mod:`hpctrain.rundir` owns the paths of a run; this module reads them and decides. One rule lives here, so that
every reader (``bundle``, ``approve``, ``reproduce``) applies the same one:

**Which checkpoint directory is this run's, and does a checkpoint belong to it** (:func:`choose_checkpoint`).
The run's checkpoint directory is the one its newest ledger ``start`` names (``CheckpointPolicy.dir`` may name one
outside the run), else ``RUN_DIR/checkpoints``. A run directory moved with ``mv`` still names its old absolute
path, where another run may live now, so a checkpoint is taken only when its commit manifest belongs to this run
(:func:`ownership`):

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

import os
import re
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import UsageError
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, read_json

__all__ = [
    "attempt_keys",
    "run_identity",
    "recorded_checkpoint_dir",
    "RunSelf",
    "run_self",
    "Ownership",
    "ownership",
    "Chosen",
    "committed_checkpoints",
    "choose_checkpoint",
    "nested",
]

PathLike = tp.Union[str, "os.PathLike[str]"]
MAX_IDENTITY_FILES = 4096
"""Identity manifests read per run (one per attempt): far above any real run, a bound on a damaged one."""
_ATTEMPT_FILE = re.compile(r"^(?P<job>.+)-r(?P<restart>\d+)\.json$")


def _paths(run: tp.Union[PathLike, RunDir]) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(run)


def _text(value: tp.Any) -> tp.Optional[str]:
    return value if isinstance(value, str) and value and "\x00" not in value else None


# ---------------------------------------------------------------------------------------------- attempts, identity
def attempt_keys(run: tp.Union[PathLike, RunDir]) -> tp.List[tp.Tuple[str, int]]:
    """``(job id, restart count)`` of every attempt the ledger knows (start or exit records), oldest first."""
    paths = _paths(run)
    keys: tp.List[tp.Tuple[str, int]] = []
    for rec in Ledger(paths).records():
        if rec.get("event") not in ("start", "exit"):
            continue
        job, restart = rec.get("job_id"), rec.get("restart_count")
        if not isinstance(restart, int) or isinstance(restart, bool):
            continue
        key = (str(job or ""), restart)
        if key not in keys:
            keys.append(key)
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


def recorded_checkpoint_dir(ledger: tp.Iterable[tp.Mapping[str, tp.Any]]) -> tp.Optional[str]:
    """The ``checkpoint_dir`` of the newest ledger ``start`` record that names one (None: none does)."""
    found = None
    for rec in ledger:
        if isinstance(rec, tp.Mapping) and rec.get("event") == "start" and _text(rec.get("checkpoint_dir")):
            found = rec["checkpoint_dir"]
    return found


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
    files += [paths.identity / n for n in names[:MAX_IDENTITY_FILES] if _ATTEMPT_FILE.match(n)]
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


def ownership(manifest: tp.Optional[tp.Mapping[str, tp.Any]], me: RunSelf, where: PathLike = "") -> Ownership:
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
    """The committed checkpoints of ``ckpt_dir`` (``hpctrain.ckpt._scan.Entry``, oldest first); none when it
    is not a readable directory."""
    from hpctrain.ckpt._scan import scan

    try:
        if not Path(ckpt_dir).is_dir():
            return []
        return [e for e in scan(ckpt_dir) if e.status == "committed"]
    except (OSError, ValueError):  # unreadable, a name too long, a loop
        return []


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
    value = recorded_checkpoint_dir(Ledger(paths).records("start"))
    if value is None:
        return None
    path = Path(value)
    if not path.is_absolute():  # written relative to the job's working directory
        submission = read_json(paths.submission, []) or {}
        cwd = _text(submission.get("cwd"))
        path = Path(cwd) / path if cwd else paths.root / path
    return path


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
        owned = ownership(pick.manifest, me, pick.path) if pick is not None else None
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
    with_any = next((x for x in looked if x[2] and ownership(x[2][-1].manifest, me).belongs), None)
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
