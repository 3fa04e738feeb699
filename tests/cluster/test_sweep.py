"""A sweep as one job array on the real dev cluster: 2 learning rates x 3 seeds, at most 2 tasks at once, one task
preempted for real by a ``high`` job -> only that task requeued, resumed bit-exactly (its final checkpoint digest
equals the same task run uninterrupted as a plain submit), and ``runs --sweep SWEEP_DIR`` lists all 6 with their losses.

Every task takes a whole node (``--cpus-per-task 4``, the dev nodes' CPUs) of the preemptible half, so the
``high`` job that needs one node preempts exactly one task; the reference run goes to the steady half meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.preempt_entry import write_data
from tests.cluster.test_slurm_ddp import ENV, ROOT, model_digest, wait_final

pytestmark = [pytest.mark.slurm]

ENTRY = "tests.cluster.sweep_entry:main"
STEPS = 60
SWEEP = """
[sweep]
max_parallel = 2
[sweep.grid]
"--lr" = ["0.1", "0.03"]
"--seed" = ["1", "2", "3"]
"""
VICTIM = 0  # a task of the first wave: the pending tasks behind it show where a requeued task goes


def _submit(args: tp.Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180
    )


def _ledger(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    path = run_dir / "train" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _calls(run_dir: Path, restart: int) -> int:
    path = run_dir / "samples" / f"r{restart}-rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _runs(array_id: str) -> tp.Dict[str, tp.List[tp.Tuple[float, float, str]]]:
    """``{task job id: [(start, end, state)]}`` of every run of every task (sacct -D: requeued runs too)."""
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-j", array_id, "-o", "JobID,Start,End,State"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    runs: tp.Dict[str, tp.List[tp.Tuple[float, float, str]]] = {}
    for line in out.splitlines():
        job, start, end, state = line.split("|")[:4]
        if start in ("Unknown", "None", ""):
            continue
        t0 = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        t1 = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")) if end not in ("Unknown", "") else time.time()
        runs.setdefault(job, []).append((t0, t1, state.split()[0]))
    return runs


def _most_at_once(runs: tp.Dict[str, tp.List[tp.Tuple[float, float, str]]]) -> int:
    spans = [(a, b) for rs in runs.values() for a, b, _ in rs]
    return max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)


def test_sweep_as_job_array_one_task_preempted_requeued_alone_bit_exact(tmp_path):
    from hpctrain._slurm import SlurmCommands

    data = tmp_path / "data.h5"
    write_data(data, 256)
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text(SWEEP)
    sweep_dir = tmp_path / "sweep"
    common = ["--data", str(data), "--steps", str(STEPS), "--sleep", "0.15", "--ckpt-every", "25"]
    job = ["--nodes", "1", "--cpus-per-task", "4", "--time", "5", "--max-requeues", "2"]
    args = [*job, "--partition", "low", "--constraint", "preemptible", "--job-name", "sweeptest", "--entry", ENTRY,
            "--sweep", str(sweep_file), "--run-dir", str(sweep_dir)]  # fmt: skip
    dry = _submit([*args, "--dry-run", "--", *common])
    assert dry.returncode == 0 and "#SBATCH --array=0-5%2\n" in dry.stdout and not sweep_dir.exists(), dry.stderr
    started = time.time()
    proc = _submit([*args, "--json", "--", *common])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sub = json.loads(proc.stdout)
    array_id, tasks = sub["array_job_id"], sub["tasks"]
    assert [t["job_id"] for t in tasks] == [f"{array_id}_{i}" for i in range(6)]
    assert (sweep_dir / "sbatch.sh").read_text() == dry.stdout  # the dry run printed what sbatch got
    victim = tasks[VICTIM]
    vdir = Path(victim["run_dir"])
    # the same task's parameters as a plain run, uninterrupted, on the steady half meanwhile
    ref_dir = tmp_path / "ref"
    ref = _submit([*job, "--partition", "debug", "--constraint", "steady", "--entry", ENTRY, "--run-dir",
                   str(ref_dir), "--", *common, *victim["args"]])  # fmt: skip
    assert ref.returncode == 0, ref.stdout + ref.stderr
    ref_job = json.loads((ref_dir / "submission.json").read_text())["job_id"]

    slurm = SlurmCommands()
    running_seen: tp.List[int] = []

    def poll() -> None:
        states = slurm.queue_states([t["job_id"] for t in tasks])  # one squeue call for the whole sweep
        running_seen.append(sum(1 for s in states.values() if s.state == "RUNNING"))

    deadline = time.monotonic() + 150
    while _calls(vdir, 0) < 15:
        assert time.monotonic() < deadline, "the victim never reached step 15"
        poll()
        time.sleep(0.3)
    node = json.loads((vdir / "ranks" / f"{victim['job_id']}-r0" / "rank-0.json").read_text())["hostname"]
    preempted_at = time.time()
    high = subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    while True:
        states = slurm.queue_states([t["job_id"] for t in tasks])
        running_seen.append(sum(1 for s in states.values() if s.state == "RUNNING"))
        if not states:
            break
        assert time.monotonic() < deadline + 120, f"the sweep did not finish: {states}"
        time.sleep(0.5)
    assert wait_final(ref_job, timeout=120) == "COMPLETED"
    assert wait_final(high, timeout=60) == "COMPLETED"
    wall = time.time() - started

    # every task completed; only the victim was requeued, once, by itself
    for t in tasks:
        assert wait_final(t["job_id"], timeout=60) == "COMPLETED", t
        ledger = _ledger(Path(t["run_dir"]))
        starts = [r for r in ledger if r["event"] == "start"]
        exits = [r for r in ledger if r["event"] == "exit"]
        assert {r["job_id"] for r in ledger if "job_id" in r} == {t["job_id"]}  # records carry the task's A_T
        if t is victim:
            assert [len(starts), [e["cause"] for e in exits]] == [2, ["preemption", "finished"]], exits
            stop = exits[0]
            assert stop["requeued"] and stop["agreed_step"] == stop["committed_step"]  # 0 steps lost
            assert starts[1]["resumed_from_step"] == stop["committed_step"] and starts[1]["restart_count"] == 1
        else:
            assert [len(starts), [e["cause"] for e in exits]] == [1, ["finished"]], (t["name"], exits)
    assert model_digest(vdir, STEPS) == model_digest(ref_dir, STEPS)  # bit-identical to the same task run uninterrupted

    # never more than 2 tasks at once: Slurm's own record of every run, and what squeue said while it ran.
    # slurmdbd keeps a requeued run's record apart from the first (sacct -D) most of the time, but three full suites
    # (2026-12-06 twice, CI 2026-12-07) ended with one record of the victim while its ledger had both attempts, one
    # of them after waiting 60 s for the second to land (so not a late record, as far as a wait shows). The victim's
    # runs are then its ledger's attempts (process start -> exit: inside Slurm's own span of each run).
    want = [2 if t is victim else 1 for t in tasks]
    settle = time.monotonic() + 30
    while True:
        runs = _runs(array_id)
        if [len(runs.get(t["job_id"], [])) for t in tasks] == want or time.monotonic() > settle:
            break
        time.sleep(1)
    assert sorted(runs) == sorted(t["job_id"] for t in tasks), runs
    assert all(len(runs[t["job_id"]]) == 1 for t in tasks if t is not victim), runs
    assert len(runs[victim["job_id"]]) in (1, 2), runs
    if len(runs[victim["job_id"]]) == 1:
        ledger = _ledger(vdir)
        spans = zip([r for r in ledger if r["event"] == "start"], [r for r in ledger if r["event"] == "exit"])
        runs[victim["job_id"]] = [(a["time"], b["time"], b["cause"]) for a, b in spans]
    assert _most_at_once(runs) <= 2, runs
    assert max(running_seen) <= 2, running_seen

    # runs --sweep: all 6, their final losses, the victim's 2 attempts
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "runs", "--sweep", str(sweep_dir), "--json"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    table = json.loads(out)
    assert [r["state"] for r in table["tasks"]] == ["COMPLETED"] * 6
    assert all(r["train_loss"] is not None and r["step"] == STEPS for r in table["tasks"])
    assert [r["attempts"] for r in table["tasks"]] == [2 if i == VICTIM else 1 for i in range(6)]
    assert sum(r["best"] for r in table["tasks"]) == 1

    # the sweep report: one page, 6 train-loss curves, opened in headless Chromium without a console error
    from tests.sweep.test_report import CHROMIUM, chromium_dom

    subprocess.run([sys.executable, "-m", "hpctrain", "report", str(sweep_dir)], cwd=ROOT, env=ENV, check=True,
                   capture_output=True)  # fmt: skip
    page = (sweep_dir / "sweep-report.html").read_text()
    assert page.count('class="curve"') == 6
    if CHROMIUM:
        dom, console = chromium_dom(sweep_dir / "sweep-report.html", tmp_path)
        assert dom.count('class="curve"') == 6 and not console, console

    # the figures docs/sweeps.md quotes
    (first, second) = runs[victim["job_id"]][:2]
    overtook = [t["index"] for t in tasks if t is not victim and first[1] <= runs[t["job_id"]][0][0] < second[0]]
    figures = {
        "wall_s": round(wall, 1),
        "steps_lost": stop["agreed_step"] - stop["committed_step"],
        "stopped_at_step": stop["agreed_step"],
        "preempt_to_exit_record_s": round(stop["time"] - preempted_at, 1),
        "requeued_task_waited_s": second[0] - first[1],
        "never_started_tasks_that_started_first": overtook,
        "most_running_at_once": _most_at_once(runs),
    }
    print(f"figures sweep: {json.dumps(figures)}")
    # the requeued task went first: the array's pending tasks were held from its requeue to its restart
    assert "pending tasks held until this task starts again" in stop["reason"], stop["reason"]
    assert overtook == [], figures
    if os.environ.get("HPCTRAIN_FIGURES"):
        with open(os.environ["HPCTRAIN_FIGURES"], "a") as f:
            f.write(json.dumps({"run": "sweep", "figures": figures}) + "\n")
