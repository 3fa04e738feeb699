"""Approvals: an append-only, hash-chained log of who approved or rejected which checkpoint (stdlib only).

``python -m hpctrain approve RUN_DIR --decision approved --by NAME --reason TEXT [--step N]`` appends one
entry to :attr:`hpctrain.rundir.RunDir.approvals`. Each entry is one line of canonical JSON (sorted keys, no
spaces, ASCII) tied to one committed checkpoint (the sha256 of its ``MANIFEST.json``, which holds every
shard's size and crc32) and to the run's identity (the newest attempt's identity record, else the submit
record's). ``prev`` is the previous entry's ``entry_hash`` (:data:`GENESIS` for the first), and
``entry_hash`` is the sha256 of the entry's canonical JSON without ``entry_hash``. So

* an edited entry no longer matches its own ``entry_hash``; one edited *and* re-hashed no longer matches
  the next entry's ``prev``;
* a removed entry leaves a gap in ``seq`` (or, renumbered, a broken ``prev``);
* a reordered entry appears before the entry it chains to.

:func:`verify_chain` names each of these by ``seq``. What a chain cannot show by itself is the removal of
its *last* entries: compare the count and head hash with a copy kept elsewhere (a bundle records both, and
``bundle verify`` compares them). No server, no signature: this is tamper-evident, not tamper-proof.

Appends use ``O_APPEND`` + ``fsync`` under an exclusive ``lockf`` lock on the log itself (not the atomic
rewrite the ledger uses): the lock serialises two approvers, so the second chains to the first instead of
both chaining to the same predecessor, and the file only ever grows, so no writer can lose or rewrite an
earlier entry (an atomic rewrite replaces the whole history on every append; two concurrent rewrites lose
one entry without a trace). An entry is one ``write()`` of a few hundred bytes; a crash in the middle leaves
at worst an unfinished last line, which :func:`verify_chain` reports, and ``approve`` refuses to extend a log
that does not verify. Where the filesystem refuses locks (Lustre mounted without ``flock``) the append goes
ahead unlocked and a race would show as a broken chain.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import getpass
import hashlib
import json
import os
import re
import socket
import stat
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import EXIT_OK, STEP_HELP, add_json_flag, add_run_dir, command_parser, print_json
from hpctrain._files import NotReadable, read_bounded
from hpctrain.errors import CheckpointFormatError, HpctrainError, UsageError
from hpctrain.run import attempt_keys, committed_checkpoints, is_run_dir, run_identity
from hpctrain.run import checkpoint_dir as run_checkpoint_dir
from hpctrain.run import choose_checkpoint as _choose
from hpctrain.rundir import JSONL_LIMIT, RunDir

__all__ = [
    "SCHEMA",
    "GENESIS",
    "DECISIONS",
    "canonical",
    "entry_hash",
    "approve",
    "verify_chain",
    "verify_chain_bytes",
    "approvals_summary",
    "checkpoint_dir",
    "committed_checkpoints",
    "choose_checkpoint",
    "is_run_dir",
    "checkpoint_identity",
    "attempt_keys",
    "run_identity",
    "main",
]

SCHEMA = "hpctrain.approvals/1"
GENESIS = "0" * 64
"""The ``prev`` of the first entry."""
DECISIONS = ("approved", "rejected")
MAX_BY = 200
MAX_REASON = 4000
LOCK_WAIT_S = 30.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

PathLike = tp.Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------------------------------- hashing
def canonical(entry: tp.Mapping[str, tp.Any]) -> bytes:
    """The bytes an entry is hashed and stored as: sorted keys, no whitespace, ASCII, no NaN."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def entry_hash(entry: tp.Mapping[str, tp.Any]) -> str:
    """sha256 of the entry's canonical JSON, ``entry_hash`` itself left out."""
    return hashlib.sha256(canonical({k: v for k, v in entry.items() if k != "entry_hash"})).hexdigest()


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------------------------- the run
# attempt_keys, run_identity and committed_checkpoints are hpctrain.run's (imported above, names kept here)
def checkpoint_dir(run: tp.Union[PathLike, RunDir]) -> Path:
    """The checkpoint directory the run recorded: the newest ledger start's ``checkpoint_dir``
    (``CheckpointPolicy.dir`` may name one outside the run), else :attr:`RunDir.checkpoints`. Whether what is
    there is this run's is :func:`choose_checkpoint`'s question (a moved run names its old path)."""
    return run_checkpoint_dir(run)  # the one rule: hpctrain.run.checkpoint_dir


def checkpoint_identity(path: PathLike) -> str:
    """sha256 of a committed checkpoint's ``MANIFEST.json``, read through the checkpoint reader (validated,
    regular file, bounded); raises :class:`CheckpointFormatError` for a damaged one."""
    from hpctrain.ckpt import manifest_sha256

    return manifest_sha256(path)


def choose_checkpoint(
    paths: RunDir, step: tp.Optional[int], *, checkpoint_dir: tp.Optional[PathLike] = None, what: str = "to approve"
) -> tp.Any:
    """The committed checkpoint ``step`` (default: the newest) of the run, from the directory that is its own and
    only when its manifest belongs to the run (:func:`hpctrain.run.choose_checkpoint`, which this is):
    a :class:`hpctrain.run.Chosen`; one UsageError line otherwise."""
    return _choose(paths, step, checkpoint_dir=checkpoint_dir, what=what)


# ---------------------------------------------------------------------------------------------- verify
def verify_chain(path: PathLike) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[str]]:
    """``(entries, problems)`` of the log at ``path``; a missing log is ``([], [])``. Every problem names the
    entry by ``seq`` (and line): edited, edited and re-hashed, removed, reordered, duplicated, unfinished."""
    path = Path(path)
    try:
        data, _ = read_bounded(path, limit=JSONL_LIMIT)
    except FileNotFoundError:
        return [], []
    except NotReadable as exc:
        return [], [f"{path.name}: {exc}"]
    return verify_chain_bytes(data, path.name)


def _shape_problem(e: tp.Any) -> str:
    if not isinstance(e, dict):
        return f"a JSON {type(e).__name__}, not an entry"
    seq = e.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return "no valid seq"
    for key in ("prev", "entry_hash"):
        if not isinstance(e.get(key), str) or not _HEX64.match(e[key]):
            return f"no valid {key}"
    return ""


def verify_chain_bytes(
    data: bytes, name: str = RunDir.APPROVALS
) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[str]]:
    """:func:`verify_chain` on the log's bytes (a bundle verifies its own copy)."""
    problems: tp.List[str] = []
    entries: tp.List[tp.Dict[str, tp.Any]] = []
    lines: tp.List[int] = []
    raw_lines = data.split(b"\n")
    for n, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            unfinished = n == len(raw_lines) and not data.endswith(b"\n")
            what = "unfinished last line (the write was cut off)" if unfinished else "not JSON (edited or damaged)"
            problems.append(f"{name} line {n}: {what}")
            continue
        bad = _shape_problem(value)
        if bad:
            problems.append(f"{name} line {n}: {bad} (edited or damaged)")
            continue
        if canonical(value) != raw.strip():
            # the same content in another spelling still hashes the same; say it all the same
            problems.append(f"seq {value['seq']} (line {n}): rewritten (not the canonical JSON it was written as)")
        entries.append(value)
        lines.append(n)
    seen: tp.Dict[int, int] = {}
    by_seq: tp.Dict[int, tp.Dict[str, tp.Any]] = {}
    for e in entries:
        by_seq.setdefault(e["seq"], e)
    later = {e["seq"]: lines[i] for i, e in enumerate(entries)}
    reordered: tp.Set[int] = set()
    prev_seq = 0
    for i, e in enumerate(entries):
        seq, line = e["seq"], lines[i]
        if entry_hash(e) != e["entry_hash"]:
            problems.append(f"seq {seq} (line {line}): edited: its content does not match its entry_hash")
        # where it stands: after the entry it follows, with no seq missing in between
        if seq in seen:
            problems.append(f"seq {seq} appears twice (lines {seen[seq]} and {line}): a copied or forked entry")
        elif seq <= prev_seq:
            if seq not in reordered:
                problems.append(f"seq {seq} (line {line}): reordered: it comes after seq {prev_seq}")
        elif seq > prev_seq + 1:
            gap = range(prev_seq + 1, seq)
            for s in gap:
                if s in later and later[s] > line:
                    problems.append(f"seq {seq} (line {line}): reordered: it comes before seq {s} (line {later[s]})")
                    reordered.add(s)
            removed = [s for s in gap if s not in later]
            if removed:
                which = f"seq {removed[0]}" if len(removed) == 1 else f"seqs {removed[0]}..{removed[-1]}"
                after = f"seq {prev_seq}" if prev_seq else "the start of the log"
                problems.append(f"{which} removed: seq {seq} (line {line}) follows {after}")
        # what it chains to: the entry numbered one less (wherever it stands), or the genesis value
        if seq not in seen:
            if seq == 1 and e["prev"] != GENESIS:
                problems.append(f"seq 1 (line {line}): prev is not the genesis value: edited")
            elif seq > 1 and seq - 1 in by_seq and e["prev"] != by_seq[seq - 1]["entry_hash"]:
                problems.append(
                    f"seq {seq - 1} (line {seen.get(seq - 1, later[seq - 1])}) edited and re-hashed, or an entry "
                    f"after it removed and the rest renumbered: seq {seq}'s prev does not match its entry_hash"
                )
        seen.setdefault(seq, line)
        prev_seq = max(prev_seq, seq)
    return entries, problems


# ---------------------------------------------------------------------------------------------- append
def _check_text(value: str, flag: str, limit: int) -> str:
    value = value.strip()
    if not value:
        raise UsageError(f"{flag} must not be empty")
    if len(value) > limit:
        raise UsageError(f"{flag} is {len(value)} characters; at most {limit}")
    if _CONTROL.search(value):
        raise UsageError(f"{flag} holds a control character (newline, escape, ...): give one line of text")
    return value


def _lock(fd: int, path: Path) -> bool:
    """Exclusive lock on the log (True), or False where the filesystem has no locks."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return False
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() > deadline:
            raise HpctrainError(f"{path}: another approval has held its lock for {LOCK_WAIT_S:.0f}s; try again")
        time.sleep(0.05)


def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    if size > JSONL_LIMIT:
        raise HpctrainError(f"approval log of {size} bytes, over the {JSONL_LIMIT}-byte bound")
    chunks, pos = [], 0
    while pos < size:
        chunk = os.pread(fd, min(1 << 20, size - pos), pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def approve(
    run_dir: tp.Union[PathLike, RunDir],
    *,
    decision: str,
    by: str,
    reason: str,
    step: tp.Optional[int] = None,
    checkpoint_dir: tp.Optional[PathLike] = None,
    now: tp.Optional[float] = None,
    notes: tp.Optional[tp.List[str]] = None,
) -> tp.Dict[str, tp.Any]:
    """Append one decision about a committed checkpoint (default: the newest) and return the entry.

    ``checkpoint_dir``: where the run's checkpoints are, when not where it recorded them (a moved run); the
    checkpoint must belong to the run either way (:func:`hpctrain.run.choose_checkpoint`).
    :class:`UsageError` for bad input (not a run, no such committed step, another run's checkpoint, empty
    text); :class:`HpctrainError` when the existing log does not verify (it is never extended past a broken or
    edited entry). ``notes``, when given, gets what the user should know (a moved run's directory, an ownership
    that could not be checked), one line each."""
    paths = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    if decision not in DECISIONS:
        raise UsageError(f"--decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    by, reason = _check_text(by, "--by", MAX_BY), _check_text(reason, "--reason", MAX_REASON)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise UsageError(f"--step must be a non-negative integer, got {step!r}")
    if not paths.root.is_dir():
        raise UsageError(f"RUN_DIR {paths.root} is not a directory")
    if not is_run_dir(paths):
        raise UsageError(f"RUN_DIR {paths.root} holds nothing a run writes: not a run")
    chosen = choose_checkpoint(paths, step, checkpoint_dir=checkpoint_dir)
    try:
        manifest_sha = checkpoint_identity(chosen.path)
    except CheckpointFormatError as exc:
        raise HpctrainError(f"checkpoint step {chosen.step}: {exc}") from None
    identity, source = run_identity(paths)
    manifest = chosen.manifest
    world = manifest.get("world_size")
    path = paths.approvals
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise HpctrainError(f"{path}: cannot open the approval log ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HpctrainError(f"{path}: not a regular file")
        _lock(fd, path)
        old = _read_fd(fd)
        entries, problems = verify_chain_bytes(old, path.name)
        if problems:
            raise HpctrainError(
                f"{path} does not verify ({problems[0]}{'; ...' if len(problems) > 1 else ''}): it is not extended "
                "past a broken entry; move it aside (keep it: it is evidence) to start a new log"
            )
        t = time.time() if now is None else now
        entry: tp.Dict[str, tp.Any] = {
            "schema": SCHEMA,
            "seq": len(entries) + 1,
            "time": _iso(t),
            "decision": decision,
            "by": by,
            "reason": reason,
            "step": chosen.step,
            "checkpoint": {
                "name": chosen.path.name,
                "manifest_sha256": manifest_sha,
                "world_size": world if isinstance(world, int) and not isinstance(world, bool) else None,
            },
            "run_identity": identity,
            "run_identity_source": os.path.relpath(source, paths.root) if source is not None else None,
            "user": _user(),
            "host": socket.gethostname(),
            "prev": entries[-1]["entry_hash"] if entries else GENESIS,
        }
        entry["entry_hash"] = entry_hash(entry)
        line = canonical(entry) + b"\n"
        if old and not old.endswith(b"\n"):  # cannot happen after a verified read; kept for safety
            line = b"\n" + line
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        if not old:
            from hpctrain._atomic import fsync_dir

            fsync_dir(path.parent)
        if notes is not None:
            notes.extend(chosen.notes)
        return entry
    finally:
        os.close(fd)  # closing releases the lock


def _user() -> tp.Optional[str]:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


# ---------------------------------------------------------------------------------------------- status
def approvals_summary(run_dir: tp.Union[PathLike, RunDir], *, limit: int = 50) -> tp.Dict[str, tp.Any]:
    """The approval history for ``status`` (stdlib, never raises on a damaged log)::

    {"path": str, "count": int, "head": entry_hash of the last entry | None,
     "ok": bool (the chain verifies), "problems": [str, ...],
     "entries": [{"seq", "time", "decision", "by", "reason", "step", "manifest_sha256",
                  "run_identity", "entry_hash"}, ...]   (the last ``limit``, oldest first),
     "omitted": int (older entries left out of "entries"),
     "latest": {"<step>": {"decision", "by", "time", "seq"}, ...}   (the newest decision per step)}
    """
    paths = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    entries, problems = verify_chain(paths.approvals)
    rows = []
    latest: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    for e in entries:
        ck = e.get("checkpoint") if isinstance(e.get("checkpoint"), dict) else {}
        row = {
            "seq": e.get("seq"),
            "time": e.get("time"),
            "decision": e.get("decision"),
            "by": e.get("by"),
            "reason": e.get("reason"),
            "step": e.get("step"),
            "manifest_sha256": ck.get("manifest_sha256"),
            "run_identity": e.get("run_identity"),
            "entry_hash": e.get("entry_hash"),
        }
        rows.append(row)
        latest[str(e.get("step"))] = {k: row[k] for k in ("decision", "by", "time", "seq")}
    return {
        "path": str(paths.approvals),
        "count": len(entries),
        "head": entries[-1]["entry_hash"] if entries else None,
        "ok": not problems,
        "problems": problems,
        "entries": rows[-limit:] if limit else rows,
        "omitted": max(0, len(rows) - limit) if limit else 0,
        "latest": latest,
    }


# ---------------------------------------------------------------------------------------------- CLI
def build_parser() -> tp.Any:
    p = command_parser(
        "approve",
        "Append an approval or rejection of one committed checkpoint to RUN_DIR's hash-chained approval log.",
    )
    add_run_dir(p)
    p.add_argument("--decision", required=True, choices=DECISIONS)
    p.add_argument("--by", required=True, metavar="NAME", help="who decides (recorded with the login user)")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (one line)")
    p.add_argument("--step", type=int, metavar="N", help=STEP_HELP)
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where the run's checkpoints are, when not where it recorded them (a moved run); checked to be its own",
    )
    add_json_flag(p)
    return p


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    opts = build_parser().parse_args(argv)
    notes: tp.List[str] = []
    entry = approve(
        opts.run_dir,
        decision=opts.decision,
        by=opts.by,
        reason=opts.reason,
        step=opts.step,
        checkpoint_dir=opts.checkpoint_dir,
        notes=notes,
    )
    if opts.json:
        print_json(entry, schema=SCHEMA)  # the entry as appended to the log (its own schema)
        for note in notes:
            print(f"hpctrain approve: note: {note}", file=sys.stderr)
        return EXIT_OK
    ident = entry["run_identity"]
    print(
        f"seq {entry['seq']}: {entry['decision']} step {entry['step']} by {entry['by']!r} "
        f"(checkpoint {entry['checkpoint']['manifest_sha256'][:12]}, run identity "
        f"{ident[:12] if ident else 'not recorded'})\nentry {entry['entry_hash']} -> {RunDir(opts.run_dir).approvals}",
        file=sys.stdout,
    )
    for note in notes:
        print(f"  note: {note}", file=sys.stdout)
    return EXIT_OK
