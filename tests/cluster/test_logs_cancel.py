"""``logs`` and ``cancel`` on the real dev cluster: the per-task files of a 2 x 2 run, a rank that raises, and
``cancel --save`` of a running demo job (stop at an agreed step, checkpoint committed, cancelled, not requeued).

Three jobs are submitted at once (one module fixture) so that their start-ups overlap; the requeued one is
submitted by its test, so that it is still running when the test warns it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final

pytestmark = [pytest.mark.slurm]


def _hpctrain(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def _submit(run_dir: Path, nodes: int, tasks: int, entry: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", str(nodes), "--tasks-per-node", str(tasks), "--time", "5",
         "--partition", "debug", "--job-name", run_dir.name, "--entry", entry, "--run-dir", str(run_dir), "--", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads((run_dir / "submission.json").read_text())["job_id"])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> tp.Dict[str, tp.Tuple[Path, str]]:
    root = tmp_path_factory.mktemp("logs")
    started = time.monotonic()
    out = {
        "ddp": (root / "ddp", _submit(root / "ddp", 2, 2, "hpctrain.examples.demo:main", "--steps", "20")),
        "raise": (root / "raise", _submit(root / "raise", 2, 1, "tests.cluster.raise_entry:main")),
        "cancel": (
            root / "cancel",
            _submit(
                root / "cancel",
                2,
                1,
                "hpctrain.examples.demo:main",
                "--steps",
                "1000000",
                "--log-every",
                "50",
                "--ckpt-every",
                "1000000",
            ),  # fmt: skip
        ),
    }
    print(f"\nfigures: 3 submissions in {time.monotonic() - started:.1f}s")
    return out


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.5)
    assert path.exists(), f"{path} never appeared"


def test_logs_all_shows_four_ranks_with_prefixes(jobs):
    run, job = jobs["ddp"]
    t0 = time.monotonic()
    assert wait_final(job) == "COMPLETED"
    proc = _hpctrain("logs", str(run), "--all", "--stream", "out")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for rank in range(4):
        mine = [x for x in lines if x.startswith(f"[{rank} node")]
        assert any(f"hpctrain: rank {rank}/4 on" in x for x in mine), proc.stdout[-3000:]
    print(f"figures: ddp waited {time.monotonic() - t0:.1f}s; logs --all {len(lines)} lines")


def test_logs_errors_names_the_rank_that_raised(jobs):
    run, job = jobs["raise"]
    assert wait_final(job) == "FAILED"
    proc = _hpctrain("logs", str(run), "--errors", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["first_failed"]["rank"] == 1, doc
    assert "raise_entry: rank 1 fails on purpose" in doc["errors"][0]["exception"]
    text = _hpctrain("logs", str(run), "--errors").stdout
    assert "rank 1 on node" in text.splitlines()[0] and "failed first" in text.splitlines()[0]


def test_cancel_save_commits_the_stop_step_and_is_not_requeued(jobs):
    run, job = jobs["cancel"]
    ledger = run / "train" / "ledger.jsonl"
    _wait_for(run / "train" / "metrics.jsonl")
    t0 = time.monotonic()
    proc = _hpctrain("cancel", str(run), "--save", "--timeout", "60", "--json")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["signalled"] == "USR2" and doc["exit"] is not None, doc
    assert wait_final(job) == "CANCELLED" or doc["scancel"] is False
    records = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    cancel = [r for r in records if r.get("event") == "cancel"]
    exits = [r for r in records if r.get("event") == "exit"]
    assert cancel and cancel[-1]["user"] and cancel[-1]["save"] is True
    assert exits[-1]["cause"] == "cancelled" and exits[-1]["requeued"] is False
    assert exits[-1]["cancelled_by"]["user"] == cancel[-1]["user"]
    step = exits[-1]["agreed_step"]
    ls = _hpctrain("ckpt", "ls", str(run / "checkpoints"), "--json")
    steps = [c["step"] for c in json.loads(ls.stdout)["checkpoints"]]
    assert step in steps, (step, steps)
    assert not (run / "ranks" / f"{job}-r1").exists()
    status = json.loads(_hpctrain("status", str(run), "--json").stdout)
    assert "cancelled by" in status["last_exit"]["reason"], status["last_exit"]
    print(f"figures: cancel --save took {took:.1f}s (signal -> exit record -> scancel); stopped at step {step}")


def test_logs_split_a_requeued_job_and_follow_crosses_the_requeue(jobs):
    """A requeued job appends its second attempt to the same files: ``logs`` splits them, ``--follow`` started
    during attempt 0 prints both and returns by itself when the job ends."""
    # submitted here, not with the others: its 250 steps must still be running when the warning is sent (submitted
    # at the start of the module, it once ran to its end while the tests before this one ran: nothing to requeue)
    run = jobs["ddp"][0].parent / "requeue"
    job = _submit(
        run, 2, 1, "hpctrain.examples.demo:main", "--steps", "250", "--log-every", "50", "--ckpt-every", "1000000"
    )
    _wait_for(run / "logs" / f"{job}_0_log.out")
    t0 = time.monotonic()
    follow = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "logs", str(run), "--all", "--stream", "out", "--follow"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(run / "train" / "metrics.jsonl")
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # a preemption's warning: requeued
        assert wait_final(job, timeout=240) == "COMPLETED"
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    took = time.monotonic() - t0
    assert follow.returncode == 0, err
    for rank in (0, 1):
        assert out.count(f"] hpctrain: rank {rank}/2 on") == 2, out[-3000:]  # one join line per attempt
    assert "attempt 1" in err
    doc = json.loads(_hpctrain("logs", str(run), "--json", "--rank", "1").stdout)
    assert [a["label"] for a in doc["attempts"]] == [f"{job}-r0", f"{job}-r1"]
    for k in (0, 1):
        got = json.loads(_hpctrain("logs", str(run), "--json", "--rank", "1", "--attempt", str(k)).stdout)
        files = {f["stream"]: f for f in got["ranks"][0]["files"]}
        assert sum("hpctrain: rank 1/2 on" in x for x in files["out"]["lines"]) == 1
        assert any(f"hpctrain: rank 1 ends attempt {k} " in x for x in files["err"]["lines"]), files["err"]["lines"]
    print(f"figures: requeued job, logs --follow from attempt 0 to the job's end {took:.1f}s")
