"""The no-progress watchdog: its timeouts and decision (a fake clock), the hang attribution and the suspect
hosts from heartbeats, and a real 3-rank gloo run where one rank hangs: every rank ends within a bound of the
timeout, stacks are written, the hung rank is named, the end is classified ``hang``."""

from __future__ import annotations

import json
import time

import pytest

from hpctrain._atomic import atomic_write_json
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from hpctrain.runtime import watchdog as wd
from hpctrain.runtime.preemption import HangDetected, StopCause, classify_end, requeue_decision
from tests.multiproc import run_world


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watchdog(tmp_path, clock, **kw):
    return wd.Watchdog(
        run_dir=tmp_path, job_id="7", restart_count=0, rank=1, world_size=2, host="node2", clock=clock, **kw
    )


def test_the_timeout_is_ten_steps_or_five_minutes_and_longer_in_slow_phases():
    assert wd.hang_timeout("train", 0.5) == 300.0
    assert wd.hang_timeout("train", 60.0) == 600.0
    assert wd.hang_timeout("train", None) == 1200.0  # no step measured yet: the first step is slow
    for phase in ("startup", "restore", "save", "eval"):
        assert wd.hang_timeout(phase, 0.5) == 1200.0
    assert wd.hang_timeout("train", 0.5, hang_timeout=20) == 20.0
    assert wd.hang_timeout("save", 0.5, hang_timeout=20) == 120.0  # an explicit short timeout keeps a floor
    assert wd.hang_timeout("entry", 0.5) is None  # an entry that never reports progress is not watched


def test_a_rank_is_hung_after_the_timeout_without_progress_and_not_before(tmp_path):
    clock = Clock()
    w = _watchdog(tmp_path, clock, hang_timeout=10)
    w.set_phase("entry")
    clock.t += 10_000
    assert w.check() is None  # not watched until the entry reports progress
    for step in range(1, 6):
        w.beat(step)
        w.mark("data_wait")
        clock.t += 1.0
    assert w.step_s == pytest.approx(1.0)
    clock.t += 8.0  # 9 s since the last progress
    assert w.check() is None
    clock.t += 1.5
    reason = w.check()
    assert reason is not None and "rank 1 on node2" in reason and "step 6" in reason and "forward_backward" in reason
    w.mark("forward_backward")  # progress again
    assert w.check() is None


def test_a_save_gets_the_longer_timeout_and_is_no_step_time(tmp_path):
    clock = Clock()
    w = _watchdog(tmp_path, clock)
    for step in range(1, 4):
        w.beat(step)
        clock.t += 2.0
    assert w.timeout() == 300.0

    def save():
        clock.t += 900.0
        assert w.check() is None  # 900 s in a save is within its 1200 s
        return True

    assert wd.during("save", lambda x: x, 5) == 5  # no watchdog installed: just calls it
    wd.install(w)
    try:
        assert wd.during("save", save) is True
    finally:
        wd.install(None)
    w.beat(4)
    assert w.step_s == pytest.approx(2.0)  # the step that held the save did not count


def _beat(paths, rank, host, step, marks, hung=True):
    paths.attempt_dir("7", 0).mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        paths.heartbeat("7", 0, rank),
        {"rank": rank, "host": host, "step": step, "marks": marks, "phase": "train", "part": "x", "hung": hung},
    )


def test_the_rank_furthest_behind_is_named_with_its_host_and_becomes_a_suspect(tmp_path, capfd):
    paths = RunDir(tmp_path)
    _beat(paths, 0, "node1", 5, 3)
    _beat(paths, 1, "node1", 5, 3)
    _beat(paths, 2, "node2", 5, 1)  # stuck in its data read while the others wait in the all-reduce
    _beat(paths, 3, "node2", 5, 3)
    report = wd.attribute_hang(tmp_path, "7", 0, 4)
    assert report["attributed"] and report["hung_ranks"] == [2] and report["hosts"] == ["node2"]
    assert "rank 2 on node2" in capfd.readouterr().err
    assert json.loads(paths.hang_report("7", 0).read_text())["hung_ranks"] == [2]
    assert wd.suspect_hosts(tmp_path, "7", 0) == [{"host": "node2", "reason": "hang", "ranks": [2]}]


def test_ranks_stopped_at_the_same_point_blame_no_host(tmp_path):
    paths = RunDir(tmp_path)
    _beat(paths, 0, "node1", 5, 3)
    _beat(paths, 1, "node2", 5, 3)
    report = wd.attribute_hang(tmp_path, "7", 0, 2)
    assert not report["attributed"] and report["hosts"] == []
    assert wd.suspect_hosts(tmp_path, "7", 0) == []


def test_straggler_hosts_are_suspects_only_with_exclude_stragglers(tmp_path, monkeypatch):
    paths = RunDir(tmp_path)
    Ledger(tmp_path).append({"event": "straggler", "job_id": "7", "restart_count": 0, "rank": 3, "host": "node4"})
    Ledger(tmp_path).append({"event": "straggler", "job_id": "7", "restart_count": 1, "rank": 2, "host": "node3"})
    atomic_write_json(paths.submission, {"config": {"exclude_stragglers": False}})
    assert wd.suspect_hosts(tmp_path, "7", 0) == []
    straggler = [{"host": "node4", "reason": "straggler", "ranks": [3]}]
    monkeypatch.setenv("HPCTRAIN_EXCLUDE_STRAGGLERS", "1")  # an sbatch-template job: no submission.json flag
    assert wd.suspect_hosts(tmp_path, "7", 0) == straggler
    monkeypatch.delenv("HPCTRAIN_EXCLUDE_STRAGGLERS")
    atomic_write_json(paths.submission, {"config": {"exclude_stragglers": True}})
    assert wd.suspect_hosts(tmp_path, "7", 0) == straggler


def test_a_hang_is_its_own_cause_and_is_requeued_only_after_progress():
    common = dict(signum=None, elapsed_s=10.0, time_limit_s=None, lead_s=0.0)
    assert classify_end(error=HangDetected("rank 1"), **common) == StopCause.HANG
    # a rank whose peers were ended by their watchdogs sees a dropped peer: the hang is the cause
    peer = RuntimeError("Connection closed by peer")
    assert classify_end(error=peer, peer_errors=["hang"], **common) == StopCause.HANG
    assert classify_end(error=peer, peer_errors=["node_failure"], **common) == StopCause.NODE_FAILURE
    assert requeue_decision("hang", restarts=0, max_requeues=3, committed_new_step=True)[0]
    assert not requeue_decision("hang", restarts=0, max_requeues=3, committed_new_step=False)[0]


def _runner(rank, world_size, run_dir, entry, hang_timeout):
    from hpctrain.launch import Runner, RunnerSettings

    settings = RunnerSettings(dist_timeout=120, hang_timeout=hang_timeout)
    return Runner(entry=entry, run_dir=run_dir, settings=settings)()


def test_a_hung_rank_ends_every_rank_with_stacks_and_is_named(tmp_path, capfd, monkeypatch):
    run_dir = tmp_path / "run"
    res = run_world(_runner, 3, str(run_dir), "tests.entries:hangs_on_rank_1", 3, init_pg=False, allow_failures=True)
    ended = time.time()
    assert res.exitcodes == [1, 1, 1], res.exitcodes
    err = capfd.readouterr().err
    (exit_record,) = Ledger(run_dir).records("exit")
    assert exit_record["cause"] == "hang", exit_record
    assert "not a Slurm job" in exit_record["reason"]
    hang = exit_record["hang"]
    assert hang["attributed"] and hang["hung_ranks"] == [1], hang
    took = ended - hang["ranks"][1]["progress_time"]  # from rank 1's last progress to every rank gone
    assert took < 3 + 25, f"the ranks took {took:.0f}s to end after a 3 s hang timeout"
    assert "hung: rank 1 on " in err, err[-3000:]
    paths = RunDir(run_dir)
    (attempt,) = [p.name for p in paths.ranks.iterdir()]
    job, restart = attempt.rsplit("-r", 1)
    for rank in range(3):
        stacks = paths.stack_dump(job, int(restart), rank).read_text()
        assert "Current thread" in stacks or "Thread 0x" in stacks, stacks[:500]
    assert "hangs_on_rank_1" in paths.stack_dump(job, int(restart), 1).read_text()  # its sleep, in the entry

    from hpctrain.status.cli import main as status

    monkeypatch.setenv("COLUMNS", "400")  # one line per record: the stack path is not wrapped
    assert status([str(run_dir)]) == 0
    shown = " ".join(capfd.readouterr().out.split())
    assert "hang attempt 0: rank 1 on " in shown and str(paths.stack_dump(job, int(restart), 1)) in shown, shown


def test_hang_options_are_validated_and_reach_the_runner(tmp_path):
    from hpctrain.errors import UsageError
    from hpctrain.submit.backend import _runner
    from hpctrain.submit.config import SubmitConfig

    with pytest.raises(UsageError, match="--hang-timeout"):
        SubmitConfig(entry="m:f", hang_timeout=0)
    with pytest.raises(UsageError, match="--exclude-stragglers"):
        SubmitConfig(entry="m:f", exclude_stragglers="yes")
    cfg = SubmitConfig(entry="m:f", hang_timeout=90, exclude_stragglers=True)
    assert _runner(cfg, tmp_path).settings.hang_timeout == 90.0


GIL_HOLDER = """
import re, sys, time
from hpctrain.runtime import watchdog as wd
wd.END_BOUND_S = 1.0
w = wd.Watchdog(run_dir=sys.argv[1], job_id="1", restart_count=0, rank=0, world_size=1, host="h", hang_timeout=1,
                poll_s=0.1).start()
for step in range(1, 4):
    w.beat(step)
    time.sleep(0.05)
time.sleep(0.3)  # the watchdog thread arms its backstop
re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ages in C, holding the GIL: the watchdog thread never runs
"""


def test_a_rank_holding_the_gil_is_ended_by_the_backstop_with_its_stacks(tmp_path):
    import subprocess
    import sys

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", GIL_HOLDER, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-2000:]
    # faulthandler's backstop ended it (the watchdog thread, which would print "hpctrain: hang", never ran)
    assert proc.stderr.startswith("Timeout") and "hpctrain: hang" not in proc.stderr, proc.stderr[-2000:]
    assert "in match" in proc.stderr and "<string>" in proc.stderr, proc.stderr[-2000:]  # the stuck frame
    assert took < 60, took
