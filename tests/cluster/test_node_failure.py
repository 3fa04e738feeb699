"""A node fails under a running job on the dev cluster: classified, excluded, resumed bit-exactly; and with a spare
node, restarted inside the allocation (no requeue).

2 nodes x 2 tasks, tests/cluster/preempt_entry.py (a Trainer run that logs every sample it consumes, 0.1 s a
step, a checkpoint every 20 steps). The failed node is the host of rank 3 (not rank 0's: a survivor decides the
end when it can, as on a real cluster). Figures (failure -> first step of the next attempt, steps lost) are
printed and appended to $HPCTRAIN_FIGURES when set; docs/preemption.md quotes them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.nodes import failed_node, rank_host
from tests.cluster.preempt_entry import write_data
from tests.cluster.test_preemption import STEPS, _calls, _exits, _ledger, _restarts, _starts, _wait
from tests.cluster.test_slurm_ddp import ENV, ROOT, model_digest, wait_final

pytestmark = [pytest.mark.slurm]

ENTRY = "tests.cluster.preempt_entry:main"


def _submit(run_dir: Path, *extra: str, args: tp.Sequence[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", "2", "--time", "5",
         "--max-requeues", "3", "--job-name", run_dir.name, "--entry", ENTRY, "--run-dir", str(run_dir), *extra,
         "--", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads((run_dir / "submission.json").read_text())["job_id"])


def _figure(
    run_dir: Path, name: str, failed_at: float, attempt: int, newest_global: tp.Optional[int] = None
) -> tp.Dict[str, tp.Any]:
    """Failure -> first step of the next attempt, and the steps computed before the failure that were redone
    (and, restored from the local tier, those a restore from the ``newest_global`` commit would have redone)."""
    (start,) = [s for s in _starts(run_dir) if s["restart_count"] == attempt]
    before = [s for s in _starts(run_dir) if s["restart_count"] < attempt][-1]
    computed = before["resumed_from_step"] + len(_calls(run_dir, before["restart_count"]))
    fig = {
        "run": name,
        "failure_to_first_step_s": round(_calls(run_dir, attempt)[0]["t"] - failed_at, 2),
        "failure_to_start_record_s": round(start["time"] - failed_at, 2),
        # the part Slurm and hpctrain decide (requeue, BeginTime, scheduling vs. a new srun), before the start-up
        # (interpreter, torch, rendezvous, restore) that both paths pay alike
        "failure_to_process_start_s": round(start["time"] - start["startup_s"] - failed_at, 2),
        "startup_s": round(start["startup_s"], 2),
        "steps_computed_before_failure": computed,
        "resumed_from_step": start["resumed_from_step"],
        "steps_lost": computed - start["resumed_from_step"],
    }
    if newest_global is not None:
        fig["steps_lost_global_only"] = computed - newest_global
    print(f"figures {json.dumps(fig)}")
    if os.environ.get("HPCTRAIN_FIGURES"):
        with open(os.environ["HPCTRAIN_FIGURES"], "a") as f:
            f.write(json.dumps(fig) + "\n")
    return fig


def _restarts_in_job(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    return [r for r in _ledger(run_dir) if r["event"] == "in_job_restart"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodefail")
    path = root / "data.h5"
    write_data(path, 256)
    common = ["--data", str(path), "--batch", "16", "--steps", str(STEPS), "--ckpt-every", "20"]
    ref = root / "ref"
    job = _submit(ref, args=common)  # the uninterrupted run of the same world size
    yield root, common, (job, ref)
    subprocess.run(["scancel", job], capture_output=True)


def _reference(data: tp.Any) -> tp.Dict[str, str]:
    job, ref = data[2]
    assert wait_final(job, timeout=180) == "COMPLETED"
    return model_digest(ref, STEPS)


def test_a_failed_node_is_excluded_and_the_requeued_run_resumes_bit_exact(data):
    root, common, _ = data
    run_dir = root / "queue"
    job = _submit(run_dir, args=[*common, "--sleep", "0.1"])
    try:
        _wait("25 steps", lambda: len(_calls(run_dir, 0)) >= 25, timeout=120)
        host = rank_host(run_dir, job, 0, 3)
        with failed_node(host) as failed_at:
            (ex,) = _wait("the exit record", lambda: _exits(run_dir), timeout=60)
        # the node is back in service before the requeued job may start (BeginTime): only the exclusion keeps it off
        assert ex["cause"] == "node_failure" and ex["requeued"] and ex["failed_nodes"] == [host], ex
        assert host in ex["excluded_nodes"] and "requeued by Slurm itself" in ex["reason"]
        assert wait_final(job, timeout=180) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert f"ExcNodeList={host}" in out and _restarts(job) == 1
    second = [s for s in _starts(run_dir) if s["restart_count"] == 1][0]
    assert host not in second["hosts"] and rank_host(run_dir, job, 1, 0) != host
    # the survivors stopped at one agreed step and committed it: the next attempt resumed there
    assert second["resumed_from_step"] == ex["committed_step"] == ex["agreed_step"]
    assert second["after"].startswith("node_failure")
    assert _figure(run_dir, "queue", failed_at, 1)["steps_lost"] == 0
    assert model_digest(run_dir, STEPS) == _reference(data)


def test_a_spare_node_replaces_the_failed_one_inside_the_allocation(data):
    root, common, _ = data
    run_dir = root / "spare"
    job = _submit(run_dir, "--spare-nodes", "1", args=[*common, "--sleep", "0.1"])
    try:
        _wait("25 steps", lambda: len(_calls(run_dir, 0)) >= 25, timeout=120)
        host = rank_host(run_dir, job, 0, 3)
        with failed_node(host) as failed_at:
            (restart,) = _wait("the in-job restart", lambda: _restarts_in_job(run_dir), timeout=60)
        assert wait_final(job, timeout=180) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert restart["failed_nodes"] == [host] and restart["next_restart_count"] == 1
    assert _restarts(job) == 0  # the same job, never requeued
    (ex, done) = _exits(run_dir)
    assert ex["cause"] == "node_failure" and not ex["requeued"] and ex["in_job_restart"]
    assert done["cause"] == "finished" and done["restart_count"] == 1
    second = [s for s in _starts(run_dir) if s["restart_count"] == 1][0]
    assert host not in second["hosts"] and len(second["hosts"]) == 2
    # resumed from the newest commit before the failure: nothing lost beyond it
    assert second["resumed_from_step"] == ex["committed_step"] and ex["committed_step"] >= 20
    _figure(run_dir, "spare", failed_at, 1)
    assert model_digest(run_dir, STEPS) == _reference(data)


def _local_steps(local: Path) -> tp.List[int]:
    """The committed local steps on any node's directory (``local/<host>/<tier key>/step-N`` with its manifest)."""
    names = (m.parent.name for m in local.glob("*/hpctrain-local-*/step-*/MANIFEST.json"))
    return sorted({int(n[5:]) for n in names if n[5:].isdigit()})


def test_a_lost_node_restores_from_the_partner_tier_with_fewer_steps_lost(data):
    """A node lost at once (Slurm kills the step's tasks: no stop save) with the local tier every 5 steps and the
    global tier every 20: the spare path restarts on the surviving node and the spare, which has no copy; the
    failed node's shards come from their partner copies on the survivor. Same final state as the reference."""
    root, common, _ = data
    run_dir, local = root / "partner", root / "local"
    tier = ["--ckpt-every", "0", "--local-every", "5", "--global-every", "4", "--local-dir", f"{local}/{{host}}"]
    assert common[-2] == "--ckpt-every"
    args = [*common[:-2], *tier, "--sleep", "0.1"]
    job = _submit(run_dir, "--spare-nodes", "1", args=args)
    try:
        # a local step newer than the global one at 20 is committed, and a few steps ran past it
        _wait("local step 25", lambda: [s for s in _local_steps(local) if s > 20], timeout=120)
        _wait("27 steps", lambda: len(_calls(run_dir, 0)) >= 27, timeout=60)
        host = rank_host(run_dir, job, 0, 3)
        with failed_node(host) as failed_at:
            shutil.rmtree(local / host, ignore_errors=True)  # the node is lost with its disk
            (restart,) = _wait("the in-job restart", lambda: _restarts_in_job(run_dir), timeout=60)
        assert wait_final(job, timeout=180) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert restart["failed_nodes"] == [host]
    second = [s for s in _starts(run_dir) if s["restart_count"] == 1][0]
    assert host not in second["hosts"]
    # resumed from a local step past the newest global commit, with the lost node's shards from its partner
    assert second["restored_tier"] == "partner", second
    newest_global = second["resumed_from_step"] - second["local_tier_saved_steps"]
    assert newest_global == 20 and second["resumed_from_step"] >= 25
    fig = _figure(run_dir, "partner", failed_at, 1, newest_global)
    assert fig["steps_lost"] < fig["steps_lost_global_only"]
    shown = subprocess.run(
        [sys.executable, "-m", "hpctrain", "status", str(run_dir)],
        cwd=ROOT, env={**ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    print(shown.stdout)
    assert f"{second['resumed_from_step']} (partner +{second['local_tier_saved_steps']})" in shown.stdout
    assert model_digest(run_dir, STEPS) == _reference(data)
