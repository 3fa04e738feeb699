"""An array task names itself ``ARRAYJOB_TASK`` everywhere (requeue, exclusion, records), and the sweep's table
reads every task's state with one squeue call."""

import json

from hpctrain.launch.ending import requeue_job_id
from hpctrain.launch.spares import SpareLoop
from hpctrain.runs import cli as runs_cli
from hpctrain.runtime.env import from_environ, slurm_job_id
from hpctrain.runtime.ports import derive_port
from hpctrain.sweep import table
from hpctrain.sweep.plan import write_plan
from hpctrain.testing import FakeSlurm
from tests.runtime.test_env import slurm_env

# task 5 of array 100 is the array's own record (SLURM_JOB_ID 100): the trap of `scontrol requeue $SLURM_JOB_ID`
ARRAY = {"SLURM_JOB_ID": "100", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "5"}


def test_a_task_of_an_array_is_named_array_underscore_task():
    env = from_environ(slurm_env(**ARRAY))
    assert env.job_id == "100_5" and slurm_job_id(slurm_env(**ARRAY)) == "100_5"
    assert requeue_job_id(env.job_id, slurm_env(**ARRAY)) == "100_5"
    assert env.master_port == derive_port("100")  # the port from the task's own numeric record
    other = from_environ(slurm_env(SLURM_JOB_ID="101", SLURM_ARRAY_JOB_ID="100", SLURM_ARRAY_TASK_ID="0"))
    assert other.job_id == "100_0" and other.master_port != env.master_port
    assert from_environ(slurm_env()).job_id == "1234"  # not an array: unchanged


def test_the_spare_node_loop_requeues_and_excludes_the_task(tmp_path):
    loop = SpareLoop(run_dir=tmp_path, nodes=1, tasks_per_node=1, spares=0, srun=["srun"], slurm=FakeSlurm(),
                     environ=slurm_env(**ARRAY))  # fmt: skip
    assert loop.job_id == "100_5"


def _task(root, name, job_id, *, steps, loss, eval_loss=None, cause="finished", restarts=0):
    d = root / name
    (d / "train").mkdir(parents=True)
    ledger = []
    for r in range(restarts + 1):
        ledger.append({"event": "start", "job_id": job_id, "restart_count": r, "time": 1.0 + r, "total_steps": steps,
                       "resumed_from_step": 0})  # fmt: skip
        last = r == restarts
        ledger.append({"event": "exit", "job_id": job_id, "restart_count": r, "time": 2.0 + r,
                       "cause": cause if last else "preemption", "requeued": not last})  # fmt: skip
    (d / "train" / "ledger.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ledger))
    metrics = [{"kind": "interval", "step": steps, "loss": loss, "time": 3.0}]
    if eval_loss is not None:
        metrics.append({"kind": "eval", "step": steps, "loss": eval_loss, "time": 3.5})
    (d / "train" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in metrics))


def _sweep(tmp_path, n=4):
    tasks = [{"index": i, "name": f"000{i}-s={i}", "run_dir": f"000{i}-s={i}", "params": {"--s": str(i)},
              "job_id": f"7_{i}"} for i in range(n)]  # fmt: skip
    write_plan(tmp_path, {"tasks": tasks, "array_job_id": "7", "max_parallel": 2, "state": "submitted"})
    return tasks


def test_sweep_table_one_squeue_call_states_losses_best(tmp_path, capsys):
    _sweep(tmp_path)
    _task(tmp_path, "0000-s=0", "7_0", steps=20, loss=0.5, eval_loss=0.7)
    _task(tmp_path, "0001-s=1", "7_1", steps=20, loss=0.4, eval_loss=0.6, restarts=1)
    (tmp_path / "0002-s=2").mkdir()  # pending: nothing written yet; 0003's directory was deleted
    fake = FakeSlurm()
    fake.queue = {"7_2": ["PENDING"], "7_3": ["RUNNING"]}
    got = table.sweep_table(tmp_path, slurm=fake)
    squeues = [c for c in fake.calls if c[0] == "squeue"]
    assert len(squeues) == 1 and squeues[0][squeues[0].index("-j") + 1] == "7_0,7_1,7_2,7_3"
    rows = got["tasks"]
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED", "PENDING", "MISSING"]
    assert [r["attempts"] for r in rows] == [1, 2, 0, 0] and rows[1]["requeues"] == 1
    assert (rows[0]["step"], rows[0]["total_steps"], rows[0]["train_loss"], rows[0]["eval_loss"]) == (20, 20, 0.5, 0.7)
    assert got["best_by"] == "eval_loss" and got["best"] == 1 and [r["best"] for r in rows] == [0, 1, 0, 0]
    assert runs_cli.main(["--sweep", str(tmp_path)], slurm=FakeSlurm()) == 0
    text = capsys.readouterr().out
    assert "* best" in text and "0.6" in text and "--s" in text
    assert runs_cli.main(["--sweep", str(tmp_path), "--json"], slurm=FakeSlurm()) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["schema"] == table.SCHEMA and obj["task_count"] == 4


def test_sweep_table_without_squeue_reads_the_ledgers(tmp_path):
    _sweep(tmp_path, n=1)
    _task(tmp_path, "0000-s=0", "7_0", steps=20, loss=0.5, cause="user_error")
    fake = FakeSlurm()
    fake.missing = {"squeue"}
    got = table.sweep_table(tmp_path, slurm=fake)
    assert got["tasks"][0]["state"] == "FAILED" and "squeue did not answer" in got["slurm"]
    assert got["best_by"] == "train_loss" and got["best"] == 0


def test_a_requeued_array_task_goes_first_hold_requeue_release():
    from hpctrain.launch.array import release_array, requeue_task_first

    fake = FakeSlurm()
    note = requeue_task_first(fake, "100_5", ARRAY)
    assert fake.held == [("hold", "100"), ("release", "100_5")] and fake.requeued == ["100_5"]
    assert "pending tasks held until this task starts again" in note
    assert [c[1] for c in fake.calls] == ["hold", "requeue", "release"]  # the hold before the slot frees
    assert not release_array(fake, ARRAY)  # a first attempt: nothing of its own to release
    assert release_array(fake, {**ARRAY, "SLURM_RESTART_COUNT": "1"}) and fake.held[-1] == ("release", "100")
    plain = FakeSlurm()
    assert requeue_task_first(plain, "1234", {"SLURM_JOB_ID": "1234"}) == "" and plain.held == []
    assert not release_array(plain, {"SLURM_JOB_ID": "1234", "SLURM_RESTART_COUNT": "1"})


def test_a_failed_requeue_releases_the_hold():
    import pytest

    from hpctrain._slurm import SlurmCommandError
    from hpctrain.launch.array import requeue_task_first

    fake = FakeSlurm()
    fake.requeue_error = "Requested operation is presently disabled"
    with pytest.raises(SlurmCommandError):
        requeue_task_first(fake, "100_5", ARRAY)
    assert fake.held == [("hold", "100"), ("release", "100")]
