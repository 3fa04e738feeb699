"""The start-up profile of a real 2-rank run (gloo, the demo through the Runner): the ledger, status and report."""

from __future__ import annotations

import pytest

from hpctrain.rundir import RunDir, read_json, read_jsonl
from hpctrain.runtime.startup import PHASES
from hpctrain.status.cli import collect
from tests.multiproc import run_world

RUNNER_PHASES = ["interpreter", "imports", "rendezvous", "process_group"]
BEFORE_THE_STEP = [name for name, _ in PHASES if name not in ("wait", "first_step")]
SLACK_S = 0.05  # rounding of the recorded phases (0.1 ms each) and the clocks read a few lines apart


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    return Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    common = ["--ckpt-dir", str(root / "ck"), "--ckpt-every", "2", "--batch-size", "32", "--log-every", "1"]
    run_world(_demo, 2, str(root / "run"), ["--steps", "2", *common], init_pg=False)
    run_world(_demo, 2, str(root / "run"), ["--steps", "4", *common], init_pg=False)  # resumes from step 2
    return root / "run"


def test_every_start_record_has_every_ranks_phases_within_its_startup(run):
    ledger, problems = read_jsonl(RunDir(run).ledger)
    assert problems == []
    assert [r["event"] for r in ledger] == ["start", "startup", "end", "exit"] * 2  # two local runs
    for start, later in ((ledger[0], ledger[1]), (ledger[4], ledger[5])):
        prof = start["startup"]
        # (the ledger's lines are written with sorted keys: the order is PHASES', restored by recorded())
        assert (
            sorted(prof["phases"]) == sorted(BEFORE_THE_STEP) and prof["ranks"] == 2 and prof["slowest_rank"] in (0, 1)
        )
        assert prof["slowest_host"] == start["hostname"]  # one host here
        assert [g["rank"] for g in prof["per_rank"]] == [0, 1]
        for g in prof["per_rank"]:
            assert all(v >= 0 for v in g["phases"].values()) and sorted(g["phases"]) == sorted(BEFORE_THE_STEP)
        rank0 = prof["per_rank"][0]
        assert sum(rank0["phases"].values()) <= start["startup_s"] + SLACK_S  # startup_s is rank 0's own
        assert prof["phases"] == {n: max(g["phases"][n] for g in prof["per_rank"]) for n in BEFORE_THE_STEP}
        # after the first step: the whole profile, the wait for the slowest rank and the first step added
        whole = later["startup"]
        assert sorted(whole["phases"]) == sorted(name for name, _ in PHASES) and whole["slowest_rank"] in (0, 1)
        assert later["time"] >= start["time"] and whole["phases"]["first_step"] > 0
        for g in whole["per_rank"]:
            assert g["total_s"] == pytest.approx(sum(g["phases"].values()), abs=1e-3)
            assert g["total_s"] <= later["time"] - g["started_at"] + SLACK_S
    assert ledger[4]["startup"]["phases"]["restore"] > 0  # the second run restored step 2
    # an entry without the Trainer still has the Runner's phases: in each rank's record
    job, restart = ledger[4]["job_id"], ledger[4]["restart_count"]
    for rank in (0, 1):
        record = read_json(RunDir(run).rank_record(job, restart, rank), [])
        assert sorted(record["startup"]) == sorted(RUNNER_PHASES) and all(v >= 0 for v in record["startup"].values())


def test_status_shows_the_newest_attempts_startup_in_one_line_and_in_json(run):
    from rich.console import Console

    from hpctrain.status.view import render

    report = collect(run)
    boot = report["startup"]
    assert boot["until"] == "first_step" and boot["ranks"] == 2 and list(boot["phases"]) == [name for name, _ in PHASES]
    assert boot["attempt"] == report["attempts"][-1]["attempt"]
    console = Console(width=400, record=True, color_system=None, highlight=False, emoji=False)
    render(report, console)
    line = next(x for x in console.export_text().splitlines() if x.startswith("start-up"))
    assert line.startswith(f"start-up   attempt {boot['attempt']}: ")
    for label in ("interpreter", "imports", "rendezvous", "process group", "build", "restore", "first step"):
        assert f" {label} " in line
    assert f"(max over 2 ranks; slowest rank {boot['slowest_rank']} on {boot['slowest_host']})" in line


def test_the_report_shows_the_phases_of_each_attempt(run, tmp_path):
    from hpctrain.report import write_report

    page = write_report(run, tmp_path / "report.html")[0].read_text()
    assert page.count("first step ") >= 2 and "max over 2 ranks; slowest rank" in page


def _probe(rank, world_size, run_dir):
    from hpctrain.launch.runner import Runner

    return Runner(entry="tests.entries:allreduce_probe", run_dir=run_dir)()


def test_an_entry_without_the_trainer_shows_the_runners_phases(tmp_path):
    run_world(_probe, 2, str(tmp_path), init_pg=False)
    boot = collect(tmp_path)["startup"]
    assert boot["until"] == "entry" and boot["ranks"] == 2 and boot["slowest_rank"] in (0, 1)
    assert sorted(boot["phases"]) == sorted(RUNNER_PHASES) and boot["total_s"] > 0
