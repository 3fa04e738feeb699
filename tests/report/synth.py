"""A synthetic run directory for the report and TensorBoard tests: two attempts (the first died after its
checkpoint at step 80 and was requeued 300 s later; the second redid steps 90 and 100), a non-finite loss,
damaged lines and fields, and hostile strings in the ledger. Written directly as the writers would."""

from __future__ import annotations

import json
import typing as tp
from pathlib import Path

T0 = 1_790_000_000.0
"""The first attempt's first step (2026-09-21)."""
HOSTILE_REASON = '<script>alert("pwned")</script> node lost'
HOSTILE_HOST = "<img src=x onerror=alert(1)>"
HOSTILE_EVENT = "<b>odd</b>"
PARTS = ("step_s", "data_wait_s", "forward_backward_s", "grad_comm_exposed_s", "optimizer_s", "checkpoint_s")


def _stats(median: float, max_rank: int) -> tp.Dict[str, tp.Any]:
    return {"min": 0.8 * median, "median": median, "max": 1.3 * median, "max_rank": max_rank}


def interval(step: int, t: float, *, restart: int, loss: tp.Optional[float], slowest: int = 1) -> tp.Dict[str, tp.Any]:
    parts = {"data_wait_s": 0.05, "forward_backward_s": 0.25, "grad_comm_exposed_s": 0.1, "optimizer_s": 0.05}
    parts["checkpoint_s"] = 0.02 if step % 40 == 0 else 0.0
    parts["step_s"] = sum(parts.values()) + 0.01
    return {
        "schema": "hpctrain.train.metrics/1",
        "kind": "interval",
        "time": t,
        "step": step,
        "steps": 10,
        "total_steps": 200,
        "epoch": 0,
        "lr": 0.1 / (1 + step / 100),
        "world_size": 4,
        "job_id": "77",
        "restart_count": restart,
        "loss": loss,
        "samples": 2560,
        "interval_s": 5.0,
        "samples_per_s": 512.0 + step,
        "samples_per_s_per_rank": {"min": 120.0, "median": 128.0, "max": 131.0, "max_rank": 2},
        "eta_s": (200 - step) * 0.5,
        "flops_per_s": 4e12,
        "mfu": 0.30 + step / 1000,
        "measured": True,
        "per_step": {k: _stats(v, slowest) for k, v in parts.items()},
        "slowest_rank": slowest,
        "data_wait_frac": 0.1,
        "last_checkpoint_step": step // 40 * 40 or None,
    }


def make_run(root: Path) -> tp.Dict[str, tp.Any]:
    """Write the run; returns what the tests check against (the records in file order, per kind)."""
    train = root / "train"
    train.mkdir(parents=True)
    metrics: tp.List[str] = []
    intervals: tp.List[tp.Dict[str, tp.Any]] = []
    evals: tp.List[tp.Dict[str, tp.Any]] = []

    def add(rec: tp.Dict[str, tp.Any]) -> None:
        (intervals if rec["kind"] == "interval" else evals).append(rec)
        metrics.append(json.dumps(rec))

    # attempt 1 (77-r0): steps 10..100, a NaN loss at 50 (the writer writes null), killed after step 100
    for i, step in enumerate(range(10, 101, 10), start=1):
        add(interval(step, T0 + 5.0 * i, restart=0, loss=None if step == 50 else 3.0 - step / 100, slowest=1))
        if step in (50, 100):
            add(
                {
                    "schema": "hpctrain.train.metrics/1",
                    "kind": "eval",
                    "time": T0 + 5.0 * i + 1,
                    "step": step,
                    "loss": 3.1 - step / 100,
                    "batches": 8,
                    "seconds": 0.9,
                    "interrupted": False,
                }
            )
    metrics.append("{not json")
    # attempt 2 (77-r1): resumed from step 80, 300 s after the last record, 25 s start-up: redoes 90 and 100
    t1 = T0 + 50.0 + 300.0
    for i, step in enumerate(range(90, 201, 10), start=1):
        add(interval(step, t1 + 5.0 * i, restart=1, loss=2.2 - step / 200, slowest=3 if step > 150 else 0))
    add(
        {
            "schema": "hpctrain.train.metrics/1",
            "kind": "eval",
            "time": t1 + 61.0,
            "step": 200,
            "loss": 1.3,
            "batches": 4,
            "seconds": 0.5,
            "interrupted": True,
        }
    )
    bad_time = interval(205, t1 + 62.0, restart=1, loss=1.2)
    bad_time["time"] = "x"  # damaged field: the record stays, without a time
    metrics.append(json.dumps(bad_time))
    metrics.append('{"kind": "interval", "step": 206, "time": %r, "loss": NaN}' % (t1 + 63.0))
    (train / "metrics.jsonl").write_text("\n".join(metrics) + '\n{"kind": "interval", "step": 2')  # torn last line

    common = {"schema": "hpctrain.train.ledger/1", "job_id": "77"}
    ledger = [
        {
            **common,
            "event": "start",
            "time": T0,
            "restart_count": 0,
            "hosts": ["node1", HOSTILE_HOST],
            "hostname": "node1",
            "pid": 4242,
            "launcher": "torchrun",
            "world_size": 4,
            "resumed_from_step": 0,
            "total_steps": 200,
            "checkpoint_dir": str(root / "checkpoints"),
            "startup_s": 20.0,
            "lost_s": None,
            "down_s": None,
            "after": None,
        },
        {
            **common,
            "event": "exit",
            "time": T0 + 52.0,
            "restart_count": 0,
            "cause": "node_failure",
            "requeued": True,
            "reason": HOSTILE_REASON,
            "committed_step": 80,
        },
        {**common, "event": HOSTILE_EVENT, "time": T0 + 53.0},
        {
            **common,
            "event": "start",
            "time": t1,
            "restart_count": 1,
            "hosts": ["node2"],
            "hostname": "node2",
            "pid": 4343,
            "launcher": "torchrun",
            "world_size": 4,
            "resumed_from_step": 80,
            "total_steps": 200,
            "checkpoint_dir": str(root / "checkpoints"),
            "startup_s": 25.0,
            "lost_s": 10.0,
            "down_s": 300.0,
            "after": "node_failure (requeued)",
        },
        {
            **common,
            "event": "end",
            "time": t1 + 62.0,
            "step": 200,
            "status": "completed",
            "committed_step": 200,
            "last_save_s": 0.4,
            "step_s": 0.47,
        },
        {
            **common,
            "event": "exit",
            "time": t1 + 62.5,
            "restart_count": 1,
            "cause": "finished",
            "requeued": False,
            "reason": "finished",
            "committed_step": 200,
        },
    ]
    (train / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    return {"intervals": intervals, "evals": evals, "t1": t1}
