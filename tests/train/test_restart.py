"""A stopped run restarted in the same run directory: resumes, and the ledger and status show both starts."""

from __future__ import annotations

from hpctrain.rundir import RunDir, read_jsonl
from hpctrain.status.cli import collect
from hpctrain.train import CheckpointPolicy
from tests.multiproc import run_world
from tests.train.test_trainer import _fit


def test_restart_in_the_same_run_dir_resumes_and_the_ledger_records_what_it_cost(tmp_path):
    cfg = {"steps": 20, "log_every": 4, "checkpoint": CheckpointPolicy(every_steps=4)}
    first = run_world(_fit, 2, str(tmp_path), cfg, 6, 0).results  # stopped at the interval of step 8
    assert [r["step"] for r in first] == [8, 8] and first[0]["stopped"]
    second = run_world(_fit, 1, str(tmp_path), cfg).results  # another world size, same run dir
    assert second[0]["step"] == 20 and not second[0]["stopped"]
    ledger, problems = read_jsonl(RunDir(tmp_path).ledger)
    assert problems == [] and [(r["event"], r.get("status")) for r in ledger] == [
        ("start", None),
        ("startup", None),
        ("end", "stopped"),
        ("start", None),
        ("startup", None),
        ("end", "completed"),
    ]
    restart = ledger[3]
    assert restart["resumed_from_step"] == 8 and restart["world_size"] == 1
    assert restart["lost_s"] >= 0 and restart["down_s"] > 0 and restart["startup_s"] > 0
    report = collect(tmp_path)
    assert report["restarts"] == 1 and report["job"]["state"] == "COMPLETED"
    assert report["checkpoint"]["step"] == 20 and report["progress"]["step"] == 20
