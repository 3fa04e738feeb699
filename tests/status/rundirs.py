"""A complete run directory for the damage tests, and ``status`` run in process the way a user runs it.

The run: submitted to Slurm as job 77 (the fake's sacct says COMPLETED); two starts (a time-limit exit and
a requeue in between), an end at step 30 and a final exit; metrics intervals at steps 10, 20, 30 and an
evaluation at 30; committed checkpoints at steps 10 and 20 (and a save in progress).
"""

from __future__ import annotations

import functools
import json
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import run_main
from hpctrain.status.cli import main
from hpctrain.testing import FakeSlurm
from tests.fuzzing import bounded

STATUS_BOUND_S = 10
"""One ``status`` call on a damaged directory must end within this (a FIFO must not block it)."""
LAST_STEP, TOTAL, CKPT_STEP, N_RECORDS = 30, 100, 20, 5
SUBMISSION = "submission.json"
LEDGER = "train/ledger.jsonl"
METRICS = "train/metrics.jsonl"
MANIFEST = f"checkpoints/step-{CKPT_STEP:09d}/MANIFEST.json"


def stats(v: float, world: int = 2) -> tp.Dict[str, tp.Any]:
    return {"min": v, "median": v, "max": 1.5 * v, "max_rank": world - 1}


def interval(step: int, now: float) -> tp.Dict[str, tp.Any]:
    return {
        "schema": "hpctrain.train.metrics/1",
        "kind": "interval",
        "time": now - (LAST_STEP - step),
        "step": step,
        "steps": 10,
        "total_steps": TOTAL,
        "epoch": 0,
        "lr": 3e-4,
        "world_size": 2,
        "job_id": "77",
        "restart_count": 1,
        "loss": 2.5 - step / 100,
        "samples": 1280,
        "interval_s": 1.0,
        "samples_per_s": 1280.0,
        "samples_per_s_per_rank": stats(640.0),
        "eta_s": (TOTAL - step) * 0.1,
        "flops_per_s": 3.2e8,
        "mfu": None,
        "measured": True,
        "per_step": {
            k: stats(v)
            for k, v in (
                ("step_s", 0.1),
                ("data_wait_s", 0.01),
                ("forward_backward_s", 0.05),
                ("grad_comm_exposed_s", 0.02),
                ("optimizer_s", 0.01),
                ("checkpoint_s", 0.0),
            )
        },
        "slowest_rank": 1,
        "data_wait_frac": 0.1,
        "last_checkpoint_step": CKPT_STEP,
    }


def manifest(step: int, saved: float, world: int = 2) -> tp.Dict[str, tp.Any]:
    shards = [{"file": f"rank-{r:05d}-of-{world:05d}.shard", "bytes": 0, "crc32": 0} for r in range(world)]
    return {
        "format": "hpctrain-ckpt",
        "format_version": 1,
        "step": step,
        "world_size": world,
        "shards": shards,
        "time": saved,
        "host": "node1",
    }


def ledger_records(run: Path, now: float) -> tp.List[tp.Dict[str, tp.Any]]:
    def start(restart: int, t: float, resumed: int) -> tp.Dict[str, tp.Any]:
        return {
            "schema": "hpctrain.train.ledger/1",
            "event": "start",
            "time": t,
            "job_id": "77",
            "restart_count": restart,
            "hosts": ["node1", "node2"],
            "hostname": "node1",
            "pid": 4242,
            "launcher": "slurm",
            "world_size": 2,
            "resumed_from_step": resumed,
            "total_steps": TOTAL,
            "checkpoint_dir": str(run / "checkpoints"),
            "startup_s": 3.2,
            "lost_s": 1.5 if restart else None,
            "down_s": 40.0 if restart else None,
            "after": "time_limit (requeued)" if restart else None,
            "signal_lead_s": 120.0,
            "warning": None,
            "config": {"steps": TOTAL, "checkpoint": {"every_steps": 10, "dir": None}, "lr": [1e-3, 3e-4]},
        }

    def exit_(restart: int, t: float, cause: str, requeued: bool) -> tp.Dict[str, tp.Any]:
        return {
            "schema": "hpctrain.train.ledger/1",
            "event": "exit",
            "time": t,
            "job_id": "77",
            "restart_count": restart,
            "cause": cause,
            "requeued": requeued,
            "reason": "requeued (job 77, restart 1 of 3)" if requeued else "finished",
            "signal": 12 if requeued else None,
            "signal_time": t - 1 if requeued else None,
            "agreed_step": 20 if requeued else None,
            "resumed_from_step": 0 if not restart else 20,
            "committed_step": 20,
            "progress": "committed step 20",
            "slurm_state": None,
            "error": None,
            "decided_by_rank": 0,
        }

    end = {
        "schema": "hpctrain.train.ledger/1",
        "event": "end",
        "time": now - 2,
        "step": LAST_STEP,
        "status": "completed",
        "committed_step": CKPT_STEP,
        "last_save_s": 0.4,
        "step_s": 0.1,
    }
    return [
        start(0, now - 300, 0),
        exit_(0, now - 200, "time_limit", True),
        start(1, now - 100, CKPT_STEP),
        end,
        exit_(1, now - 1, "finished", False),
    ]


def metrics_records(now: float) -> tp.List[tp.Dict[str, tp.Any]]:
    ev = {"schema": "hpctrain.train.metrics/1", "kind": "eval", "time": now, "step": LAST_STEP, "loss": 2.1}
    return [interval(10, now), interval(20, now), interval(LAST_STEP, now), {**ev, "batches": 4, "seconds": 0.5}]


def build(run: Path) -> Path:
    """Write the complete run directory at ``run``."""
    now = time.time()
    (run / "train").mkdir(parents=True)
    submission = {"job_id": "77", "cluster": "slurm", "state": "submitted", "run_dir": str(run), "config": {}}
    (run / SUBMISSION).write_text(json.dumps(submission))
    (run / LEDGER).write_text("".join(json.dumps(r) + "\n" for r in ledger_records(run, now)))
    (run / METRICS).write_text("".join(json.dumps(r) + "\n" for r in metrics_records(now)))
    for step in (10, CKPT_STEP):
        d = run / "checkpoints" / f"step-{step:09d}"
        d.mkdir(parents=True)
        (d / "MANIFEST.json").write_text(json.dumps(manifest(step, now - 50 + step)))
    (run / "checkpoints" / "step-000000030.tmp-j77-r1-abc-3").mkdir()
    return run


def fake_slurm() -> FakeSlurm:
    slurm = FakeSlurm()
    slurm.final["77"] = "COMPLETED"
    return slurm


def reject_constant(token: str) -> tp.Any:
    raise ValueError(f"not standard JSON: {token}")


class Result(tp.NamedTuple):
    code: int
    out: str
    err: str
    report: tp.Optional[tp.Dict[str, tp.Any]]  # --json: the parsed report (exit 0)


def status(capsys: tp.Any, run: tp.Union[str, Path], *flags: str, slurm: tp.Any = None) -> Result:
    """``python -m hpctrain status RUN [flags]`` in process, bounded in time, checked for what every run must
    satisfy: exit 0, or exit 2 with one ``hpctrain status: error:`` line; no traceback; ``--json`` output
    parses as standard JSON (no NaN/Infinity tokens)."""
    capsys.readouterr()
    entry = functools.partial(main, slurm=slurm if slurm is not None else fake_slurm())
    with bounded(STATUS_BOUND_S):
        code = run_main(entry, "status", [str(run), *flags])
    got = capsys.readouterr()
    assert "Traceback" not in got.err and "Traceback" not in got.out, got.err[-3000:]
    assert code in (0, 2), (code, got.err[-2000:])
    report = None
    if code == 2:
        assert got.err.startswith("hpctrain status: error: ") and got.err.count("\n") == 1, got.err
        assert got.out == "", got.out[:500]
    else:
        assert got.err == "", got.err[-2000:]
        if "--json" in flags:
            report = json.loads(got.out, parse_constant=reject_constant)
            assert isinstance(report, dict)
        else:
            assert got.out.startswith("run "), got.out[:500]
    return Result(code, got.out, got.err, report)
