"""A real small run for the bundle tests: the demo on 2 ranks (gloo, CPU) through hpctrain's Runner, with
checkpoints, then identity manifests, a code snapshot, a submission record and approvals written by hand in
the shapes their writers use (hpctrain.identity, hpctrain.submit, hpctrain.approvals)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import typing as tp
from pathlib import Path

import pytest

from hpctrain.approvals import approve
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from tests.multiproc import run_world

try:  # the identity engineer's function, when it is there: the bundle's verify recomputes with it
    from hpctrain.identity import identity_hash
except ImportError:  # pragma: no cover
    identity_hash = None  # type: ignore[assignment]


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    return Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()


DEMO_ARGS = ["--steps", "6", "--ckpt-every", "3", "--log-every", "2", "--quiet", "--batch-size", "16", "--hidden", "16"]


def identity_record(
    kind: str, job: str = "", restart: int = 0, *, seed: int = 0, team: tp.Optional[str] = "ml <infra>"
):
    """An identity manifest in hpctrain.identity's shape (code/config/data/runtime/ownership + identity)."""
    record: tp.Dict[str, tp.Any] = {
        "schema": "hpctrain.identity/1",
        "kind": kind,
        "captured_at": 1.0,
        "code": {
            "entry": "hpctrain.examples.demo:main",
            "argv": ["-m", "hpctrain.submit", "--nodes", "2"],
            "entry_args": DEMO_ARGS,
            "repositories": {
                "entry": {
                    "kind": "git",
                    "commit": "a" * 40,
                    "branch": "main",
                    "remote_url": "git@github.com:example-lab/mlp-demo.git",
                    "dirty": True,
                },
                "hpctrain": {"kind": "files", "sha256": "b" * 64},
            },
        },
        "config": {"entry": "hpctrain.examples.demo:main", "entry_args": DEMO_ARGS, "world_size": 2, "seed": seed},
        "data": {
            "files": [
                {
                    "cheap": {"path": "/lustre/me/train.h5", "name": "train.h5", "size": 123456, "mtime_ns": 1},
                    "content": {"kind": "sample", "sha256": "c" * 64},
                    "cached": False,
                }
            ]
        },
        "runtime": {
            "python": {"version": "3.11.7", "implementation": "CPython"},
            "hpctrain": "0.1.0",
            "torch": {"version": "2.13.0+cpu"},
            "distributions": {"torch": "2.13.0+cpu", "numpy": "2.1.0", "h5py": "3.12.1", "hpctrain": "0.1.0"},
            "slurm": {"SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": str(restart), "SLURM_NNODES": "2"} if job else {},
        },
        "ownership": {"owner": "Ada Lovelace", "team": team, "notes": "demo run <for> the bundle tests"},
    }
    if kind == "attempt":
        record["attempt"] = {"job_id": job, "restart_count": restart}
    record["identity"] = (
        identity_hash(record)
        if identity_hash is not None
        else hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    )
    return record


def write_identity(run: RunDir, keys: tp.Sequence[tp.Tuple[str, int]], **kwargs: tp.Any) -> None:
    run.identity.mkdir(parents=True, exist_ok=True)
    run.identity_submit.write_text(json.dumps(identity_record("submit", **kwargs)))
    for job, restart in keys:
        run.identity_attempt(job, restart).write_text(json.dumps(identity_record("attempt", job, restart, **kwargs)))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"print('the user code')\n"
        info = tarfile.TarInfo("entry/train.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    run.code_snapshot.write_bytes(buf.getvalue())


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> RunDir:
    """The demo's run directory, read-only for the tests (copy it to change it)."""
    run = RunDir(tmp_path_factory.mktemp("bundle") / "demo-run")
    run_world(_demo, 2, str(run.root), list(DEMO_ARGS), init_pg=False)
    write_identity(run, [("", 0)])
    run.submission.write_text(
        json.dumps({"argv": ["--nodes", "2", "--entry", "hpctrain.examples.demo:main"], "cluster": "local"})
    )
    approve(run, decision="approved", by="Grace Hopper", reason="loss falls [red]as expected[/red]")
    approve(run, decision="rejected", by="Alan Turing", reason="superseded by step 6", step=3)
    return run


@pytest.fixture
def run_copy(demo_run, tmp_path) -> RunDir:
    """A private copy of the demo run (its own checkpoint files: safe to hard-link and damage)."""
    dst = RunDir(tmp_path / "run")
    shutil.copytree(demo_run.root, dst.root)
    lines = [json.loads(line) for line in dst.ledger.read_text().splitlines()]
    for rec in lines:  # the ledger names the checkpoint directory by its absolute path: point it at the copy
        if rec.get("checkpoint_dir"):
            rec["checkpoint_dir"] = str(dst.checkpoints)
    dst.ledger.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    return dst


def requeued_run(demo_run: RunDir, root: Path) -> RunDir:
    """The demo's checkpoints under a ledger of a preempted and requeued Slurm job: two attempts."""
    run = RunDir(root)
    shutil.copytree(demo_run.checkpoints, run.checkpoints)
    ledger = Ledger(run)
    common = {"world_size": 2, "total_steps": 6, "checkpoint_dir": str(run.checkpoints), "launcher": "slurm"}
    ledger.append(
        {
            "event": "start",
            "time": 1000.0,
            "job_id": "4242",
            "restart_count": 0,
            "hosts": ["node1", "node2"],
            "resumed_from_step": 0,
            **common,
        }
    )
    ledger.append({"event": "end", "time": 1100.0, "step": 4, "status": "stopped", "committed_step": 3})
    ledger.append(
        {
            "event": "exit",
            "time": 1101.0,
            "job_id": "4242",
            "restart_count": 0,
            "cause": "preemption",
            "requeued": True,
            "reason": "requeued (1 of 3)",
            "agreed_step": 4,
            "committed_step": 3,
            "decided_by_rank": 0,
        }
    )
    ledger.append(
        {
            "event": "start",
            "time": 1300.0,
            "job_id": "4242",
            "restart_count": 1,
            "hosts": ["node3", "node4"],
            "resumed_from_step": 3,
            **common,
        }
    )
    ledger.append({"event": "end", "time": 1400.0, "step": 6, "status": "completed", "committed_step": 6})
    ledger.append(
        {
            "event": "exit",
            "time": 1401.0,
            "job_id": "4242",
            "restart_count": 1,
            "cause": "finished",
            "requeued": False,
            "reason": "finished",
            "committed_step": 6,
            "decided_by_rank": 0,
        }
    )
    metrics = [
        {
            "kind": "interval",
            "time": (1000.0 + 20 * s) if s <= 4 else (1300.0 + 20 * (s - 4)),
            "step": s,
            "loss": 1.0 / s,
            "job_id": "4242",
            "restart_count": 0 if s <= 4 else 1,
        }
        for s in range(1, 7)
    ]
    run.metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    write_identity(run, [("4242", 0), ("4242", 1)])
    run.submission.write_text(json.dumps({"argv": ["--nodes", "2"], "cluster": "slurm", "job_id": "4242"}))
    run.sbatch_script.write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun python -u -m submitit.core._submit\n")
    return run
