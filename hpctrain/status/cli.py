"""``python -m hpctrain status RUN_DIR [--json]``: where a run stands, from the login node.

Reads what the run directory holds (``submission.json`` from ``hpctrain.submit``, the training ledger
and metrics (:mod:`hpctrain.rundir`), the checkpoint directory's committed steps) and asks
Slurm for the job's state. Never imports torch: it must answer in well under a second on a login node.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import add_json_flag, command_parser
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import RunDir, read_jsonl

__all__ = ["main", "collect"]

_STEP_DIR = re.compile(r"^step-(\d{9})$")  # a committed checkpoint (docs/checkpoint.md "On disk")
_METRICS_TAIL_BYTES = 1 << 20  # the last intervals are enough, however long the run


def _read_json(path: Path, problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name}: unreadable ({exc}); ignored")
        return None
    if not isinstance(value, dict):
        problems.append(f"{path.name}: not a JSON object; ignored")
        return None
    return value


def last_checkpoint(ckpt_dir: tp.Optional[str], problems: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The newest committed step in ``ckpt_dir`` (renamed to ``step-NNNNNNNNN`` only after every rank's
    shard was durable, with its MANIFEST.json): step, time, world size."""
    if not ckpt_dir:
        return None
    root = Path(ckpt_dir)
    try:
        names = [e.name for e in os.scandir(root) if _STEP_DIR.match(e.name)]
    except FileNotFoundError:
        return {"dir": str(root), "step": None}
    except OSError as exc:
        problems.append(f"checkpoint dir {root}: cannot list it ({exc.strerror})")
        return None
    for name in sorted(names, reverse=True):
        manifest = _read_json(root / name / "MANIFEST.json", problems)
        if manifest is None:
            continue
        saved = manifest.get("time")
        return {
            "dir": str(root),
            "step": int(name[5:]),
            "time": saved,
            "age_s": time.time() - saved if isinstance(saved, (int, float)) else None,
            "world_size": manifest.get("world_size"),
        }
    return {"dir": str(root), "step": None}


def _pid_alive(pid: tp.Any, host: tp.Any) -> tp.Optional[bool]:
    """Whether a local run's rank-0 process still runs (None when it ran on another host)."""
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _job_state(
    submission: tp.Optional[tp.Dict[str, tp.Any]],
    starts: tp.List[tp.Dict[str, tp.Any]],
    end: tp.Optional[tp.Dict[str, tp.Any]],
    slurm: tp.Any,
    problems: tp.List[str],
) -> tp.Dict[str, tp.Any]:
    last = starts[-1] if starts else {}
    job_id = str((submission or {}).get("job_id") or last.get("job_id") or "")
    cluster = (submission or {}).get("cluster")
    if cluster is None:  # no submission record (plain sbatch template, torchrun): how the ranks were launched
        cluster = "slurm" if last.get("launcher") == "slurm" else "local"
    job: tp.Dict[str, tp.Any] = {"id": job_id or None, "cluster": cluster}
    if cluster == "slurm" and job_id:
        from hpctrain._slurm import SlurmCommands

        try:
            st = (slurm or SlurmCommands()).job_state(job_id)
            if st.source:  # squeue or sacct knows the job
                job.update(state=st.state, source=st.source, nodes=st.nodes, elapsed=st.elapsed, reason=st.reason)
                return job
            problems.append(f"job state: Slurm does not know job {job_id} (accounting off or purged)")
        except HpctrainError as exc:
            problems.append(f"job state: {exc}")
    # local runs, or Slurm unreachable: what the run's own records say
    if end is not None:
        job.update(state={"completed": "COMPLETED", "stopped": "STOPPED"}.get(end.get("status"), "FAILED"))
    elif last:
        alive = _pid_alive(last.get("pid"), last.get("hostname"))
        job["state"] = {True: "RUNNING", False: "DIED (no end record)", None: "RUNNING?"}[alive]
    elif submission is not None:
        job["state"] = str(submission.get("state", "submitted")).upper()
    else:
        job["state"] = "UNKNOWN"
    job["source"] = "run dir"
    return job


def collect(run_dir: tp.Union[str, Path], *, slurm: tp.Any = None) -> tp.Dict[str, tp.Any]:
    """The status report of ``run_dir`` as a JSON-able dict (what ``--json`` prints)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"RUN_DIR {run_dir}: no such directory")
    problems: tp.List[str] = []
    paths = RunDir(run_dir)
    submission = _read_json(paths.submission, problems)
    ledger, bad = read_jsonl(paths.ledger)
    problems += bad
    metrics, bad = read_jsonl(paths.metrics, tail_bytes=_METRICS_TAIL_BYTES)
    problems += bad
    if submission is None and not ledger and not metrics:
        raise UsageError(f"RUN_DIR {run_dir} holds no submission.json and no train/ records: is it a run directory?")

    starts = [r for r in ledger if r.get("event") == "start"]
    ends = [r for r in ledger if r.get("event") == "end"]
    # the newest start's end, if it has one (an end always follows its own start)
    end = ends[-1] if ends and starts and ends[-1].get("time", 0) >= starts[-1].get("time", 0) else None
    intervals = [r for r in metrics if r.get("kind") == "interval"]
    evals = [r for r in metrics if r.get("kind") == "eval"]
    last = intervals[-1] if intervals else None
    ckpt_dir = next((s.get("checkpoint_dir") for s in reversed(starts) if s.get("checkpoint_dir")), None)
    total = (last or {}).get("total_steps") or (starts[-1].get("total_steps") if starts else None)
    step = max((last or {}).get("step", 0), (end or {}).get("step", 0)) if (last or end) else None
    report: tp.Dict[str, tp.Any] = {
        "run_dir": str(run_dir),
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
        "checkpoint": last_checkpoint(ckpt_dir, problems),
        "last_interval": last,
        "last_eval": evals[-1] if evals else None,
        # how the newest attempt ended and whether it was requeued, with the reason (hpctrain.launch.ending)
        "last_exit": next((r for r in reversed(ledger) if r.get("event") == "exit"), None),
        "ledger": ledger,
        "problems": problems,
    }
    return report


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    parser = command_parser(
        "status",
        "Where a training run stands: job state, restarts, last checkpoint, progress, throughput, "
        "data wait, the step-time breakdown and slowest rank of the last interval, and the ledger.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (hpctrain.submit --run-dir)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    report = collect(args.run_dir)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        from hpctrain.status.view import render

        render(report)
    return 0
