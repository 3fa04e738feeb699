"""Calibration run directories written by hand: records with known parts, so predictions are hand-computable."""

from __future__ import annotations

import json
import typing as tp
from pathlib import Path

METRICS = "hpctrain.train.metrics/1"
LEDGER = "hpctrain.train.ledger/1"


def _stats(value: float) -> tp.Dict[str, float]:
    return {"min": value, "median": value, "max": value, "max_rank": 0}


def make_run(
    root: Path,
    *,
    world: int,
    nodes: int,
    global_batch: int,
    data_ms: float,
    compute_ms: float,
    comm_ms: float,
    optimizer_ms: float = 2.0,
    save_stall_ms: float = 5.0,
    every_steps: int = 10,
    intervals: int = 6,
    log_every: int = 10,
    last_save_s: float = 0.02,
    startup_s: float = 10.0,
    flops_per_sample: float = 1e9,
    time: float = 1.8e9,
    input_rec: tp.Optional[tp.Dict[str, tp.Any]] = None,
) -> Path:
    """A run directory of one attempt at ``world`` ranks on ``nodes`` hosts; every interval saves once (its
    checkpoint phase is ``save_stall_ms`` spread over its steps). Parts are per step, in milliseconds."""
    train = root / "train"
    train.mkdir(parents=True)
    step_ms = data_ms + compute_ms + comm_ms + optimizer_ms
    ck_ms = save_stall_ms / log_every
    lines = []
    for i in range(1, intervals + 1):
        step = i * log_every
        sps = global_batch / (step_ms / 1e3)
        lines.append(
            {
                "schema": METRICS,
                "kind": "interval",
                "time": time + i,
                "step": step,
                "steps": log_every,
                "total_steps": intervals * log_every,
                "world_size": world,
                "job_id": "7",
                "restart_count": 0,
                "loss": 1.0,
                "samples": global_batch * log_every,
                "interval_s": log_every * (step_ms + ck_ms) / 1e3,
                "samples_per_s": sps,
                "flops_per_s": sps * flops_per_sample,
                "measured": True,
                "per_step": {
                    "step_s": _stats((step_ms + ck_ms) / 1e3),
                    "data_wait_s": _stats(data_ms / 1e3),
                    "forward_backward_s": _stats(compute_ms / 1e3),
                    "grad_comm_exposed_s": _stats(comm_ms / 1e3),
                    "optimizer_s": _stats(optimizer_ms / 1e3),
                    "checkpoint_s": _stats(ck_ms / 1e3),
                },
                "last_checkpoint_step": step,
                **({"input": input_rec} if input_rec is not None else {}),
            }
        )
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    hosts = [f"node{i + 1}" for i in range(nodes)]
    config = {"checkpoint": {"every_steps": every_steps, "async_save": True, "every_minutes": 0.0}}
    ledger = [
        {
            "schema": LEDGER,
            "event": "start",
            "time": time,
            "job_id": "7",
            "restart_count": 0,
            "hosts": hosts,
            "world_size": world,
            "resumed_from_step": 0,
            "total_steps": intervals * log_every,
            "startup_s": startup_s,
            "config": config,
        },
        {
            "schema": LEDGER,
            "event": "end",
            "time": time + 100,
            "step": intervals * log_every,
            "status": "completed",
            "last_save_s": last_save_s,
            "step_s": step_ms / 1e3,
        },
    ]
    (train / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    (root / "submission.json").write_text(
        json.dumps({"job_id": "7", "config": {"gpus_per_node": 0, "time": "00:05:00"}})
    )
    return root


def add_stage(root: Path, nodes: int, *, bytes_copied: float, copy_s: float, job: str = "7") -> None:
    """Stage records of one attempt (``submit --stage``): every node copied ``bytes_copied`` in ``copy_s``."""
    for i in range(nodes):
        path = root / "stage" / f"{job}-r0" / f"node{i + 1}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "schema": "hpctrain.data.stage/1",
            "node": f"node{i + 1}",
            "job_id": job,
            "restart_count": 0,
            "verified": True,
            "files": [],
            "bytes_copied": bytes_copied,
            "bytes_reused": 0,
            "copy_seconds": copy_s,
            "verify_seconds": 0.0,
            "seconds": copy_s,
        }
        path.write_text(json.dumps(record))
