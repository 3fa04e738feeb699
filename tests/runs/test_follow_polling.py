"""``submit --follow`` asks the scheduler at most once per HPCTRAIN_POLL_S (default 10 s), backs off while the job
pends, and still reads the log and the run directory every second. A simulated clock: no timed test."""

from __future__ import annotations

import json
import typing as tp

import pytest
from rich.console import Console

from hpctrain.defaults import DEFAULT_POLL_S
from hpctrain.submit.follow import PENDING_MAX_S, PollSchedule, follow, poll_interval
from hpctrain.testing import FakeSlurm


class Clock:
    """A clock that moves only when the code under test sleeps; every sleep is kept."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: tp.List[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.t += max(seconds, 1e-3)


def timeline(slurm: FakeSlurm, clock: Clock, pending_until: float, ends_at: float) -> tp.Callable[[], tp.Any]:
    """The job's state as slurmctld would have it at the clock's time: pending, running, then COMPLETED in sacct;
    each squeue call's time is recorded."""
    slurm.final["5"] = "COMPLETED"
    asked: tp.List[float] = []

    def state() -> tp.Any:
        t = clock()
        slurm.queue["5"] = ["PENDING:Priority"] if t < pending_until else ["RUNNING"] if t < ends_at else []
        asked.append(t)
        return slurm.job_state("5")

    state.asked = asked  # type: ignore[attr-defined]
    return state


def run_follow(tmp_path, monkeypatch, *, env: tp.Optional[str] = None, pending_until=120.0, ends_at=300.0):
    if env is None:
        monkeypatch.delenv("HPCTRAIN_POLL_S", raising=False)
    else:
        monkeypatch.setenv("HPCTRAIN_POLL_S", env)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "train").mkdir()
    log = run / "logs" / "5_0_log.out"
    slurm, clock = FakeSlurm(), Clock()
    state = timeline(slurm, clock, pending_until, ends_at)
    lines: tp.List[str] = []

    def sleep(seconds: float) -> None:  # the job writes a log line and a metrics record each simulated second
        clock.sleep(seconds)
        n = int(clock.t)
        if pending_until <= clock.t < ends_at and n not in lines:
            lines.append(n)
            with log.open("a") as f:
                f.write(f"tick {n}\n")
            with (run / "train" / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"kind": "interval", "step": n, "total_steps": 300, "loss": 1.0}) + "\n")

    console = Console(record=True, width=200, force_terminal=False)
    final = follow("5", log, state, console=console, clock=clock, sleep=sleep)
    return final, state.asked, slurm, clock, console.export_text()


def test_follow_polls_at_most_every_10_s_and_backs_off_while_pending(tmp_path, monkeypatch):
    final, asked, slurm, clock, out = run_follow(tmp_path, monkeypatch)
    assert final.state == "COMPLETED"
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert min(gaps) >= DEFAULT_POLL_S - 1e-9, asked  # never more often than the rule allows
    pending = [g for a, g in zip(asked, gaps) if a < 120]
    assert pending == [10, 20, 40, 60]  # doubling while pending (0, 10, 30, 70, 130)
    running = [g for a, g in zip(asked, gaps) if a >= 120]
    assert set(running) == {DEFAULT_POLL_S}
    # every poll is one squeue (and the last one sacct too): 22 in 300 s, where polling each second made 300
    assert slurm.count("squeue") == len(asked) == 22 and slurm.count("sacct") == 1
    assert max(clock.sleeps) <= 1.0  # the log is still read every second
    assert "tick 150" in out and "tick 299" in out  # every log line came through, to the last


def test_the_environment_sets_the_interval(tmp_path, monkeypatch):
    _, asked, _, _, _ = run_follow(tmp_path, monkeypatch, env="30", pending_until=0.0)
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert min(gaps) >= 30 and len(asked) == 11  # 0, 30, ..., 300


def test_a_bad_environment_value_is_one_warning_and_the_default(monkeypatch, capsys):
    assert poll_interval({}) == DEFAULT_POLL_S == 10.0
    assert poll_interval({"HPCTRAIN_POLL_S": "2.5"}) == 2.5
    for bad in ("soon", "-1", "nan", "inf"):
        assert poll_interval({"HPCTRAIN_POLL_S": bad}) == DEFAULT_POLL_S
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all("HPCTRAIN_POLL_S" in line for line in err)


def test_the_pending_back_off_is_capped_and_resets_once_running():
    s = PollSchedule(10)
    waits = []
    for _ in range(8):
        s.polled(0.0, "PENDING")
        waits.append(s.wait_s)
    assert waits == [10, 20, 40, 60, 60, 60, 60, 60] and PENDING_MAX_S == 60
    s.polled(0.0, "RUNNING")
    assert s.wait_s == 10 and not s.due(9.9) and s.due(10.0)
    assert PollSchedule(120).pending_max_s == 120  # a longer interval is never shortened


def test_between_polls_the_status_line_shows_the_run_directory(tmp_path):
    """The live line says what the run directory says (the newest interval's step and loss), read each second."""
    from hpctrain.submit.follow import _RunProgress

    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    progress = _RunProgress(run)
    assert progress.read() == ""
    (run / "train" / "metrics.jsonl").write_text(
        json.dumps({"kind": "interval", "step": 40, "total_steps": 100, "loss": 2.125}) + "\n"
    )
    assert progress.read() == "step 40/100 · loss 2.125"


@pytest.mark.parametrize("poll_s", [0.0, 0.5])
def test_an_explicit_interval_is_kept(tmp_path, monkeypatch, poll_s):
    """``follow(poll_s=...)`` (a local job's own process, the existing tests) is not the scheduler's rule."""
    monkeypatch.setenv("HPCTRAIN_POLL_S", "10")
    slurm, clock = FakeSlurm(), Clock()
    slurm.queue["5"] = ["RUNNING"] * 5
    slurm.final["5"] = "COMPLETED"
    follow("5", tmp_path / "5_0_log.out", lambda: slurm.job_state("5"), poll_s=poll_s, console=Console(),
           clock=clock, sleep=clock.sleep)  # fmt: skip
    assert slurm.count("squeue") == 6
