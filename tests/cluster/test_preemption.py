"""Preemption, time limits and requeue on the real dev cluster (real sbatch, real signals, gloo on CPU).

All jobs are submitted at once by one module fixture and run concurrently: the unpreemptible ones on the
``steady`` half of the cluster, the preemption victims on the ``preemptible`` half, so a ``high`` job
only ever waits for the victims (docs/devcluster.md). Entry: tests/cluster/preempt_entry.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.preempt_entry import write_data
from tests.cluster.test_slurm_ddp import ENV, ROOT, model_digest, wait_final

pytestmark = [pytest.mark.slurm]

STEPS, BATCH, SAMPLES = 160, 16, 256  # 16 steps an epoch, 10 epochs
ENTRY = "tests.cluster.preempt_entry:main"


def _submit(
    run_dir: Path,
    *,
    time_: str,
    tasks: int,
    constraint: str,
    partition: str = "debug",
    requeues: int = 3,
    args: tp.Sequence[str] = (),
) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", str(tasks), "--time", time_,
         "--partition", partition, "--constraint", constraint, "--max-requeues", str(requeues), "--job-name",
         run_dir.name, "--entry", ENTRY, "--run-dir", str(run_dir), "--", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads((run_dir / "submission.json").read_text())["job_id"])


def _template(run_dir: Path, args: tp.Sequence[str]) -> str:
    # HPCTRAIN_HANG_TIMEOUT: the template's --hang-timeout path runs in every template test
    env = dict(ENV, HPCTRAIN_ENTRY=ENTRY, HPCTRAIN_RUN_DIR=str(run_dir), HPCTRAIN_PYTHON=sys.executable,
               HPCTRAIN_SIGNAL_LEAD="30", HPCTRAIN_HANG_TIMEOUT="600")  # fmt: skip
    run_dir.mkdir(parents=True)
    out = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", "--time=10", "--partition=low",
         "--constraint=preemptible", "--signal=USR2@30", f"--output={run_dir}/batch-%j.out",
         str(ROOT / "sbatch_templates" / "ddp.sbatch"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.strip().split(";")[0]


def _ledger(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    path = run_dir / "train" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _exits(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    return [r for r in _ledger(run_dir) if r["event"] == "exit"]


def _starts(run_dir: Path) -> tp.List[tp.Dict[str, tp.Any]]:
    return [r for r in _ledger(run_dir) if r["event"] == "start"]


def _calls(run_dir: Path, restart: int, rank: int = 0) -> tp.List[tp.Dict[str, tp.Any]]:
    path = run_dir / "samples" / f"r{restart}-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _wait(what: str, cond: tp.Callable[[], tp.Any], timeout: float = 240) -> tp.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise TimeoutError(f"waited {timeout}s for {what}")


def _rank_pid(run_dir: Path, job_id: str, restart: int, rank: int) -> int:
    path = run_dir / "ranks" / f"{job_id}-r{restart}" / f"rank-{rank}.json"
    return int(_wait(f"{path}", lambda: path.exists() and json.loads(path.read_text()))["pid"])


def _restarts(job_id: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return int(next((w.split("=")[1] for w in out.split() if w.startswith("Restarts=")), "-1"))


def _check_samples(run_dir: Path, world: int) -> int:
    """Every sample of every epoch consumed exactly once across the attempts, no computed step thrown away
    (every attempt stopped at a step it committed); returns the number of attempts."""
    starts = _starts(run_dir)
    resumed = [s["resumed_from_step"] for s in starts] + [STEPS]
    per_step: tp.Dict[int, tp.List[int]] = {}
    for a, start in enumerate(starts):
        for rank in range(world):
            calls = _calls(run_dir, start["restart_count"], rank)
            assert len(calls) == resumed[a + 1] - resumed[a], (a, rank, len(calls), resumed)  # 0 steps lost
            for c in calls:
                per_step.setdefault(resumed[a] + c["call"], []).extend(c["index"])
    assert sorted(per_step) == list(range(1, STEPS + 1))
    steps_per_epoch = SAMPLES // BATCH
    for epoch in range(STEPS // steps_per_epoch):
        seen = [i for s in range(1, steps_per_epoch + 1) for i in per_step[epoch * steps_per_epoch + s]]
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch}"
    return len(starts)


def _figures(run_dir: Path, job_id: str) -> tp.List[tp.Dict[str, float]]:
    """Per requeue: signal -> committed checkpoint, Slurm's restart delay, process start, restore, first step."""
    starts, exits, out = _starts(run_dir), _exits(run_dir), []
    for ex in exits:
        if not ex["requeued"]:
            continue
        r = ex["restart_count"]
        # the Trainer's end record of this attempt is written right after the stop save committed
        ends = [e for e in _ledger(run_dir) if e["event"] == "end" and e["time"] <= ex["time"]]
        nxt = next(s for s in starts if s["restart_count"] == r + 1)
        rank0 = json.loads((run_dir / "ranks" / f"{job_id}-r{r + 1}" / "rank-0.json").read_text())
        first = _calls(run_dir, r + 1)[0]["t"]
        proc_start = nxt["time"] - nxt["startup_s"]
        fig = {
            "cause": ex["cause"],
            "steps_lost": ex["agreed_step"] - ex["committed_step"],
            "signal_to_commit_s": ends[-1]["time"] - ex["signal_time"] if ends and ex.get("signal_time") else None,
            "stop_save_s": ends[-1]["last_save_s"] if ends else None,
            "slurm_restart_delay_s": proc_start - ex["time"],
            "process_start_s": rank0["joined_at"] - proc_start,
            "restore_s": nxt["time"] - rank0["joined_at"],
            "first_step_s": first - nxt["time"],
        }
        out.append(fig)
    print(f"figures {run_dir.name}: {json.dumps(out)}")
    if os.environ.get("HPCTRAIN_FIGURES"):
        with open(os.environ["HPCTRAIN_FIGURES"], "a") as f:
            f.write(json.dumps({"run": run_dir.name, "figures": out}) + "\n")
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    data = root / "data.h5"
    write_data(data, SAMPLES)
    common = ["--data", str(data), "--batch", str(BATCH)]
    run = ["--steps", str(STEPS), *common]
    j: tp.Dict[str, tp.Tuple[str, Path]] = {}

    def sub(name: str, **kw: tp.Any) -> None:
        j[name] = (_submit(root / name, **kw), root / name)

    # the victims first, on the preemptible half; the reference and the time-limit run on the steady half
    sub("pre", time_="10", tasks=2, constraint="preemptible", partition="low", args=[*run, "--sleep", "0.25"])
    j["tpl"] = (_template(root / "tpl", [*run, "--sleep", "0.25"]), root / "tpl")
    sub("ref", time_="5", tasks=2, constraint="steady", args=run)
    # --time 2: the warning comes 15-75 s before the end (Slurm's "up to 60 s early" and its 30 s check),
    # so with --time 1 it can land during a start-up slowed by the other jobs, before any step
    sub("timelimit", time_="2", tasks=2, constraint="steady", args=[*run, "--sleep", "0.5"])
    long = ["--steps", "2000", *common, "--sleep", "0.25"]
    # --time 10 for the runs that the tests end themselves (scancel, USR2): they run while the tests before them
    # wait for their jobs, and the time-limit warning of a --time 5 run (at 3:45, or up to 60 s earlier) came
    # before the scancel in a CI run that took 18 minutes, requeueing the run the test expects to cancel
    sub("cancel", time_="10", tasks=1, constraint="steady", args=long)
    sub("error", time_="5", tasks=1, constraint="steady", args=[*long, "--fail-at", "5"])
    sub("bound", time_="10", tasks=1, constraint="steady", requeues=1, args=long)
    kill = ["--steps", "2000", *common, "--sleep", "0.1", "--ckpt-every", "10", "--kill-in-save", "30"]
    sub("kill", time_="5", tasks=1, constraint="steady", args=[*kill, "--kill-after", "5"])
    yield j
    subprocess.run(["scancel", *(job_id for job_id, _ in j.values())], capture_output=True)


def test_preemption_by_high_and_a_signal_to_one_rank_resume_bit_exact(jobs):
    (job, run_dir), (tjob, tdir) = jobs["pre"], jobs["tpl"]
    # 1. a real preemption: a 'high' job that needs a whole node of both victims
    _wait("both victims at step 20", lambda: len(_calls(run_dir, 0)) >= 20 and len(_calls(tdir, 0)) >= 20)
    node = json.loads((run_dir / "ranks" / f"{job}-r0" / "rank-0.json").read_text())["hostname"]
    high = subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # 2. after the restart, USR2 to rank 1 only: every rank still stops at one agreed step
    _wait("restart after the preemption", lambda: len(_calls(run_dir, 1)) >= 10)
    os.kill(_rank_pid(run_dir, job, 1, 1), signal.SIGUSR2)
    assert wait_final(job, timeout=300) == "COMPLETED"
    assert wait_final(tjob, timeout=300) == "COMPLETED", (tdir / f"batch-{tjob}.out").read_text()
    assert wait_final(high, timeout=60) == "COMPLETED"
    ref = model_digest(jobs["ref"][1], STEPS)
    for jid, d in ((job, run_dir), (tjob, tdir)):
        exits = _exits(d)
        assert [e["cause"] for e in exits][-1] == "finished"
        stops = [e for e in exits if e["cause"] != "finished"]
        assert stops and all(e["cause"] == "preemption" and e["requeued"] for e in stops), stops
        assert all(e["agreed_step"] == e["committed_step"] for e in stops)  # saved at the agreed step
        starts = _starts(d)
        assert [s["resumed_from_step"] for s in starts[1:]] == [e["committed_step"] for e in stops]
        assert all(s["after"].startswith("preemption") for s in starts[1:])
        assert _restarts(jid) == len(stops)
        assert _check_samples(d, 4) == len(stops) + 1
        assert model_digest(d, STEPS) == ref  # bit-identical to the uninterrupted run
        _figures(d, jid)
    assert len(_exits(run_dir)) == 3  # preempted by high, stopped by the one-rank signal, finished
    one_rank = _exits(run_dir)[1]
    lines = [
        line
        for rank in range(4)
        for line in (run_dir / "logs" / f"{job}_{rank}_log.out").read_text().splitlines()
        if "stopped at agreed step" in line
    ]
    assert len([x for x in lines if x.endswith(f"step {one_rank['agreed_step']}")]) == 4, lines


def test_time_limit_warns_saves_requeues_and_finishes_bit_exact(jobs):
    job, run_dir = jobs["timelimit"]
    assert wait_final(job, timeout=400) == "COMPLETED"
    exits = _exits(run_dir)
    stops = [e for e in exits if e["cause"] != "finished"]
    assert stops and all(e["cause"] == "time_limit" and e["requeued"] and e["signal"] == signal.SIGUSR2 for e in stops)
    assert all(e["agreed_step"] == e["committed_step"] for e in stops)
    assert _check_samples(run_dir, 4) == len(stops) + 1
    assert model_digest(run_dir, STEPS) == model_digest(jobs["ref"][1], STEPS)
    _figures(run_dir, job)


def test_scancel_ends_without_requeue(jobs):
    job, run_dir = jobs["cancel"]
    _wait("10 steps", lambda: len(_calls(run_dir, 0)) >= 10)
    subprocess.run(["scancel", job], check=True)
    assert wait_final(job, timeout=120) == "CANCELLED"
    (ex,) = _wait("the exit record", lambda: _exits(run_dir), timeout=30)
    assert ex["cause"] == "cancelled" and not ex["requeued"] and ex["committed_step"] == ex["agreed_step"]
    assert _restarts(job) == 0


def test_user_exception_ends_without_requeue(jobs):
    job, run_dir = jobs["error"]
    assert wait_final(job, timeout=240) == "FAILED"
    (ex,) = _exits(run_dir)
    assert ex["cause"] == "user_error" and not ex["requeued"], ex
    assert _restarts(job) == 0


def test_requeue_bound_is_counted_by_hpctrain(jobs):
    job, run_dir = jobs["bound"]
    for restart in (0, 1):
        _wait(f"attempt {restart} at step 5", lambda r=restart: len(_calls(run_dir, r)) >= 5)
        os.kill(_rank_pid(run_dir, job, restart, 0), signal.SIGUSR2)
    assert wait_final(job, timeout=240) == "FAILED"
    first, second = _exits(run_dir)
    assert first["requeued"] and "(1 of 1)" in first["reason"]
    assert not second["requeued"] and "1 requeues used of --max-requeues 1" in second["reason"]
    assert _restarts(job) == 1
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "hpctrain", "status", str(run_dir), "--json"],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
    )
    assert "--max-requeues 1" in status["last_exit"]["reason"]


def test_rank_killed_mid_save_resumes_from_the_previous_step_then_stops_without_progress(jobs):
    job, run_dir = jobs["kill"]
    assert wait_final(job, timeout=300) == "FAILED"
    first, second = _exits(run_dir)
    # attempt 0: rank 1 died inside the save of step 30 -> step 30 never committed, requeued (20 is new)
    assert first["cause"] == "node_failure" and first["requeued"] and first["committed_step"] == 20, first
    starts = _starts(run_dir)
    assert starts[1]["resumed_from_step"] == 20 and starts[1]["after"].startswith("node_failure")
    # attempt 1: rank 1 dies again before any new commit -> not requeued, and status says why
    assert second["cause"] == "node_failure" and not second["requeued"]
    assert "committed no new checkpoint step" in second["reason"]
    assert _restarts(job) == 1
