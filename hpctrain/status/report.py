"""The status report of a run directory as a JSON-able dict: :func:`collect` (stdlib only, never torch).

A library: ``python -m hpctrain status`` (:mod:`hpctrain.status.cli`) prints it, other tools may call it.
It reads what the run directory holds (``submission.json`` from ``hpctrain.submit``, the ledger and the
tail of the metrics, through :mod:`hpctrain.rundir`'s bounded non-blocking readers), the newest committed
checkpoint (:func:`hpctrain.ckpt.latest_committed`) and Slurm's view of the job
(:class:`hpctrain._slurm.SlurmCommands`).

Damaged run directories: each record is sanitised once, when read, against the schema of its kind
(:data:`hpctrain.status.schema.SCHEMAS`: field -> expected type and range). A field of the wrong type,
out of range or not finite becomes None (shown as unknown) and one line in ``problems`` names the file,
the record and the field; fields outside the schema pass through made JSON-standard (non-finite numbers
become null, nesting is bounded). Everything after that trusts the types. :func:`to_json` prints
standard JSON: no ``NaN`` or ``Infinity`` tokens.
"""

from __future__ import annotations

import json
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
from hpctrain.run import Attempt, attempts, checkpoint_dir, is_run_dir, recorded_checkpoint_dir
from hpctrain.rundir import RunDir, read_json, read_jsonl
from hpctrain.runtime.startup import from_rank_records, recorded
from hpctrain.status.faults import collect_faults
from hpctrain.status.nodes import collect_nodes
from hpctrain.status.schema import (
    MAX_DEPTH,
    MAX_PROBLEMS,
    METRICS_TAIL_BYTES,
    SCHEMAS,
    TIME,
    Field,
    _plain,
    sanitize,
)

__all__ = [
    "collect",
    "to_json",
    "sanitize",
    "SCHEMAS",
    "Field",
    "METRICS_TAIL_BYTES",
    "MAX_PROBLEMS",
]


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


def _job_of(
    submission: tp.Optional[tp.Dict[str, tp.Any]], starts: tp.List[tp.Dict[str, tp.Any]]
) -> tp.Tuple[tp.Optional[str], str]:
    """(the run's job id, its cluster: ``slurm`` or ``local``)."""
    sub = submission or {}
    last = starts[-1] if starts else {}
    cluster = sub.get("cluster")
    if cluster is None:  # no submission record (plain sbatch template, torchrun): how the ranks were launched
        cluster = "slurm" if last.get("launcher") == "slurm" else "local"
    return sub.get("job_id") or last.get("job_id"), cluster


def _job_state(
    submission: tp.Optional[tp.Dict[str, tp.Any]],
    starts: tp.List[tp.Dict[str, tp.Any]],
    end: tp.Optional[tp.Dict[str, tp.Any]],
    slurm: tp.Any,
    problems: tp.List[str],
    runs: tp.Optional[tp.List[tp.Any]] = None,
) -> tp.Dict[str, tp.Any]:
    """``runs``: the job's Slurm runs from sacct, asked for already ([] when accounting is unavailable), so
    that sacct is not asked twice."""
    sub = submission or {}
    last = starts[-1] if starts else {}
    job_id, cluster = _job_of(submission, starts)
    job: tp.Dict[str, tp.Any] = {"id": job_id, "cluster": cluster}
    if cluster == "slurm" and job_id:
        from hpctrain._slurm import SlurmCommands

        try:
            st = (slurm or SlurmCommands()).job_state(job_id, runs=runs)
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


def _attempt_rows(found: tp.List[Attempt]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The run's attempts (:func:`hpctrain.run.attempts`), one row each, oldest first: what ``report`` and
    ``bundle`` count too."""
    return [
        {
            "attempt": a.label,
            "job_id": a.job_id,
            "restart_count": a.restart_count,
            "started": a.started,
            "ended": a.ended,
            "status": a.status,
            "cause": a.cause,
            "requeued": a.requeued,
        }
        for a in found
    ]


RANK_RECORDS_READ = 64
"""Rank records read for the start-up of an attempt without a start record: one small file each, on the shared
filesystem, at every ``status``; the profile then says how many ranks it covers."""


def _startup(found: tp.List[Attempt], paths: RunDir) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The newest attempt's start-up profile that was recorded, with that attempt's label: the Trainer's
    (:func:`hpctrain.runtime.startup.recorded`), else for an entry without the Trainer the Runner's phases in its
    ranks' records; None when no attempt recorded one (a run from before the profile)."""
    for a in reversed(found):
        profile = recorded(a.start, a.startup)
        if profile is None and a.start is None and a.restart_count is not None:
            first = read_json(paths.rank_record(a.job_id, a.restart_count, 0), []) or {}
            world = first.get("world_size") if isinstance(first.get("world_size"), int) else 1
            records = [first] + [
                read_json(paths.rank_record(a.job_id, a.restart_count, r), [])
                for r in range(1, min(world, RANK_RECORDS_READ))
            ]
            profile = from_rank_records(r for r in records if isinstance(r, dict))
        if profile is not None:
            return {"attempt": a.label, **profile}
    return None


def _slurm_view(
    found: tp.List[Attempt],
    job_id: tp.Optional[str],
    slurm: tp.Any,
) -> tp.Tuple[tp.Dict[str, tp.Any], tp.List[tp.Any], tp.Optional[str]]:
    """Slurm's record of each attempt (``found``: :func:`hpctrain.run.attempts`) beside hpctrain's cause
    (:mod:`hpctrain.run_slurm`), from one ``sacct -D`` call for the whole run: ``(view, runs, why
    unavailable)``. The view: ``available``, ``unavailable`` (why not), ``attempts`` (one row per Slurm attempt,
    oldest first) and ``disagreements`` (one line each: ``attempt 12-r0: hpctrain says preemption, Slurm says
    NODE_FAIL``)."""
    from hpctrain._slurm import SlurmCommands
    from hpctrain.run_slurm import match_slurm_runs, slurm_job_ids, slurm_runs

    runs, why = slurm_runs(found, slurm or SlurmCommands(), also=[job_id])
    matched = match_slurm_runs(found, runs)
    ids = slurm_job_ids(matched, also=[job_id])
    rows = []
    for a in matched:
        if a.job_id not in ids:
            continue
        got = a.slurm or {}
        rows.append(
            {
                "attempt": a.label,
                "job_id": a.job_id,
                "restart_count": a.restart_count,
                "cause": a.cause,
                "requeued": a.requeued,
                "ended": a.exit is not None or a.end is not None,
                "slurm_state": got.get("state"),
                "slurm_nodes": got.get("nodes"),
                "slurm_start": got.get("start"),
                "slurm_end": got.get("end"),
                "slurm_exit_code": got.get("exit_code"),
                "slurm_run": got.get("run"),
                "slurm_runs": got.get("runs"),
                "matched_by": got.get("matched_by"),
                "shared": bool(got.get("shared")),
                "disagrees": a.slurm_disagrees,
            }
        )
    view = {
        "available": why is None,
        "unavailable": why,
        "attempts": rows,
        "disagreements": [r["disagrees"] for r in rows if r["disagrees"]],
    }
    return view, runs, why


def _slowest(last: tp.Optional[tp.Dict[str, tp.Any]]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The last interval's slowest rank and its own slow phase, by the straggler detector's rule
    (:func:`hpctrain.runtime.stragglers.find_straggler` with no threshold): the rank with the most busy time (its
    step less its exposed communication, i.e. less the waiting for the others) and the phase where it exceeds
    the others most. ``{rank, phase, busy_s, reference_s, ratio}``; ``phase`` None when no rank's own work is
    ``MIN_EXCESS_S`` above the others' (or the record has no busy time: the rank is then the one with the
    longest step). None without per-rank times."""
    if not last or not isinstance(last.get("per_step"), dict):
        return None
    from hpctrain.runtime.stragglers import find_straggler

    found = find_straggler(last, threshold=0.0)
    if found is not None:
        return {k: found[k] for k in ("rank", "phase", "busy_s", "reference_s", "ratio")}
    busy = last["per_step"].get("busy_s")
    rank = busy.get("max_rank") if isinstance(busy, dict) else None
    rank = rank if rank is not None else last.get("slowest_rank")
    if rank is None:
        return None
    return {"rank": rank, "phase": None, "busy_s": None, "reference_s": None, "ratio": None}


IDENTITY_ROWS = 20
"""Attempts whose identity the report lists (the newest ones; the records hold them all)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _short_text(value: tp.Any, keep: int = 200) -> tp.Optional[str]:
    return value[:keep] if isinstance(value, str) else None


def _identity(root: Path, problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """Each attempt's run identity and what changed since the attempt before (hpctrain.identity): a restart
    that ran other code, config or data is shown as such, not silently mixed. None without records."""
    try:
        from hpctrain.identity import RunIdentity, attempt_history

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
    current = rows[-1]["identity"]
    # a healthy identity (a sha256) is shown as the house shows it everywhere (RunIdentity.short); any other text
    # is recorded damage: the view cuts it and says how long it was
    short = RunIdentity(current, root, {}).short if isinstance(current, str) and _SHA256.fullmatch(current) else None
    return {"current": current, "short": short, "attempts": rows, "changes": sum(1 for r in rows if r["changed"])}


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
    if not problems and not is_run_dir(paths):
        raise UsageError(f"RUN_DIR {root} holds no submission.json and no train/ records: is it a run directory?")

    starts = [r for r in ledger if r.get("event") == "start"]
    # the newest start's end, if it has one: the ledger is append-only, so "after it" is "later in the file"
    last_start = max((i for i, r in enumerate(ledger) if r.get("event") == "start"), default=-1)
    last_end = max((i for i, r in enumerate(ledger) if r.get("event") == "end"), default=-1)
    end = ledger[last_end] if last_end > last_start else None
    last = _last_of_kind(metrics, "interval", problems)
    last_eval = _last_of_kind(metrics, "eval", problems)
    # the run's checkpoint directory (hpctrain.run.checkpoint_dir); none shown when no start names one (checkpointing
    # not configured: RUN_DIR/checkpoints is the fallback of a run that saves, not a sign that it does)
    ckpt_dir = str(checkpoint_dir(paths, starts)) if recorded_checkpoint_dir(starts) is not None else None
    try:
        found = attempts(ledger, [m for m in metrics if isinstance(m, dict)])
    except Exception as exc:  # noqa: BLE001 - the ledger was sanitised; should grouping fail, one line, not a crash
        problems.append(f"attempts: the ledger's attempts could not be grouped ({type(exc).__name__}: {exc})"[:400])
        found = []
    total = (last or {}).get("total_steps") or (starts[-1].get("total_steps") if starts else None)
    known_steps = [s for s in ((last or {}).get("step"), (end or {}).get("step")) if s is not None]
    step = max(known_steps) if known_steps else None
    job_id, cluster = _job_of(submission, starts)
    slurm_view, runs = None, None
    if cluster == "slurm" and job_id:
        slurm_view, runs, why = _slurm_view(found, job_id, slurm)
        runs = [] if why else runs
    report: tp.Dict[str, tp.Any] = {
        "run_dir": str(root),
        "job": _job_state(submission, starts, end, slurm, problems, runs),
        "starts": len(starts),
        "restarts": max(len(starts) - 1, 0),
        # every attempt, by the one pairing rule (hpctrain.run.attempts): its label, whether it started and ended
        "attempts": _attempt_rows(found),
        # where the newest recorded start-up went, per phase (max over ranks), the slowest rank named
        "startup": _startup(found, paths),
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
        **collect_faults(ledger),  # "hangs" and "stragglers" (hpctrain.status.faults)
        **collect_nodes(ledger),  # node_failures, in_job_restarts, in_job_recoveries, nodes_lost, excluded_nodes
        # Slurm's record of each attempt (sacct) beside hpctrain's cause; None for a run not on Slurm
        "slurm_view": slurm_view,
        "slowest": _slowest(last),
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
