"""In-job recovery on the dev cluster: rank 3's process SIGKILLed mid-run, a warm spare takes its place inside the
step, and the run finishes in the same job and the same attempt, bit-identical to an uninterrupted run.

2 nodes x 2 tasks + 1 spare node (``--spare-nodes 1 --warm-spares``: two warm spares on it, the recovery store
served by the batch script's spare-node loop), tests/cluster/preempt_entry.py with ``TrainConfig.recovery`` on, at
0.1 s a step, a checkpoint every 20 steps; rank 3 kills itself at its 30th step. The figure (failure -> the first
new step, from the ``in_job_recovery`` record, and from the victim's own kill time) is printed and appended to
$HPCTRAIN_FIGURES when set; docs/preemption.md ("In-job recovery", "On Slurm") quotes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import typing as tp

import pytest

from tests.cluster.figures import recovery_figure
from tests.cluster.preempt_entry import write_data
from tests.cluster.test_node_failure import _submit
from tests.cluster.test_preemption import STEPS, _calls, _exits, _ledger, _restarts, _starts, _wait
from tests.cluster.test_slurm_ddp import model_digest, wait_final

pytestmark = [pytest.mark.slurm]

KILL_AT = 30


def _records(run_dir: tp.Any, event: str) -> tp.List[tp.Dict[str, tp.Any]]:
    return [r for r in _ledger(run_dir) if r["event"] == event]


def test_a_killed_rank_is_replaced_by_a_warm_spare_inside_the_step(tmp_path):
    write_data(tmp_path / "data.h5", 256)
    common = ["--data", str(tmp_path / "data.h5"), "--batch", "16", "--steps", str(STEPS), "--ckpt-every", "20"]
    ref, run_dir = tmp_path / "ref", tmp_path / "warm"
    ref_job = _submit(ref, args=common)  # the uninterrupted run of the same world size, recovery off
    args = [*common, "--sleep", "0.1", "--recovery", "--kill-rank3-at", str(KILL_AT)]
    job = _submit(run_dir, "--spare-nodes", "1", "--warm-spares", args=args)
    try:
        _wait("the recovery", lambda: _records(run_dir, "in_job_recovery"), timeout=240)
        load = os.getloadavg()[0]  # the machine's load at the recovery (2 shared cores: the figure depends on it)
        assert wait_final(job, timeout=300) == "COMPLETED"
        assert wait_final(ref_job, timeout=120) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job, ref_job], capture_output=True)
    (record,) = _records(run_dir, "in_job_recovery")
    assert record["failed_ranks"] == [3] and record["fallback"] is None, record
    assert record["agreed_step"] == KILL_AT - 1 and record["steps_redone"] == 1
    assert record["replaced"][0]["rank"] == 3 and record["replaced"][0]["by"] in ("s0", "s1")
    # the same job and the same attempt: no requeue, no new step, no restart from the last commit
    assert _restarts(job) == 0 and _records(run_dir, "in_job_restart") == []
    assert [s["restart_count"] for s in _starts(run_dir)] == [0]
    assert [(e["restart_count"], e["cause"]) for e in _exits(run_dir)] == [(0, "finished")]
    assert model_digest(run_dir, STEPS) == model_digest(ref, STEPS)

    (killed,) = [c["killed"] for c in _calls(run_dir, 0, rank=3) if "killed" in c]
    recovery_figure("warm spare", record, load, kill_to_first_step_s=round(record["first_step_at"] - killed, 2))


SHRINK_BATCH = 24  # divisible by 4 and by 3: the smaller world of 3 ranks takes it, 8 samples a rank
LOSS_RTOL = 1e-4  # tests/train/test_in_job_shrink.py's tolerance and its reasoning (docs/preemption.md)


def _per_step(run_dir: tp.Any, ranks: tp.Sequence[int], suffix: str = "") -> tp.Dict[int, tp.List[tp.Any]]:
    """Attempt 0's records by call, each call's ranks in rank order."""
    out: tp.Dict[int, tp.List[tp.Any]] = {}
    for r in ranks:
        path = run_dir / "samples" / f"r0-rank{r}{suffix}.jsonl"
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "call" in rec:
                out.setdefault(rec["call"], []).append(rec)
    return out


def test_without_a_spare_node_the_survivors_go_on_at_a_smaller_world_inside_the_step(tmp_path):
    """``--in-job-recovery`` with no spare node and ``RecoveryConfig(shrink=True)``: rank 3's process SIGKILLed at
    its 30th step, ranks 0-2 go on at a world of 3 in the same job and attempt, each step with the same samples in
    the same slot order as the uninterrupted 4-rank run and its loss within LOSS_RTOL."""
    write_data(tmp_path / "data.h5", 256)
    common = ["--data", str(tmp_path / "data.h5"), "--batch", str(SHRINK_BATCH), "--steps", str(STEPS),
              "--ckpt-every", "20", "--log-loss"]  # fmt: skip
    ref, run_dir = tmp_path / "ref", tmp_path / "shrink"
    ref_job = _submit(ref, args=common)
    args = [*common, "--sleep", "0.1", "--recovery", "--shrink", "--kill-rank3-at", str(KILL_AT)]
    job = _submit(run_dir, "--in-job-recovery", args=args)
    try:
        _wait("the recovery", lambda: _records(run_dir, "in_job_recovery"), timeout=240)
        load = os.getloadavg()[0]
        assert wait_final(job, timeout=300) == "COMPLETED"
        assert wait_final(ref_job, timeout=120) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job, ref_job], capture_output=True)
    (record,) = _records(run_dir, "in_job_recovery")
    assert record["failed_ranks"] == [3] and record["fallback"] is None, record
    assert record["elastic"] and record["world_size"] == 3 and record["replaced"] == []
    assert record["agreed_step"] == KILL_AT - 1 and record["steps_redone"] == 1
    assert _restarts(job) == 0 and _records(run_dir, "in_job_restart") == []
    assert [s["restart_count"] for s in _starts(run_dir)] == [0]
    assert [(e["restart_count"], e["cause"]) for e in _exits(run_dir)] == [(0, "finished")]

    # the survivors' call KILL_AT was the interrupted step (begun, never completed); call c > KILL_AT is step c - 1
    # (rank 3's files hold its steps before the kill, and the call KILL_AT it was killed in)
    want, got = _per_step(ref, range(4)), _per_step(run_dir, range(4))
    want_loss, got_loss = _per_step(ref, range(4), ".loss"), _per_step(run_dir, range(4), ".loss")
    assert sorted(got) == list(range(1, STEPS + 2))
    worst = 0.0
    for step in range(1, STEPS + 1):
        call = step if step < KILL_AT else step + 1
        assert [i for r in got[call] for i in r["index"]] == [i for r in want[step] for i in r["index"]], step
        assert [len(r["index"]) for r in got[call]] == [SHRINK_BATCH // (4 if step < KILL_AT else 3)] * len(got[call])
        loss = sum(r["loss"] * r["n"] for r in got_loss[call]) / SHRINK_BATCH
        ref_loss = sum(r["loss"] * r["n"] for r in want_loss[step]) / SHRINK_BATCH
        assert loss == pytest.approx(ref_loss, rel=LOSS_RTOL), step
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss))
    assert model_digest(run_dir, STEPS)  # the smaller world committed the last step (not bit-equal: see the docs)

    (killed,) = [c["killed"] for c in _calls(run_dir, 0, rank=3) if "killed" in c]
    taken = round(record["first_step_at"] - killed, 2)
    recovery_figure("smaller world (no spare)", record, load, kill_to_first_step_s=taken, worst_loss_rel_diff=worst)
