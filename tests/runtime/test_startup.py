"""The start-up phase clock (hpctrain.runtime.startup): marks, the ranks' summary, and reading it back."""

from __future__ import annotations

import pytest

from hpctrain.runtime import startup


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch):
    startup.reset()
    monkeypatch.setattr(startup, "process_start_time", lambda: 100.0)
    yield
    startup.reset()


def test_each_phase_lasts_from_the_previous_mark_and_a_repeated_one_adds_up():
    startup.mark("interpreter", 100.5)
    startup.mark("imports", 103.0)
    startup.mark("rendezvous", 104.0)
    startup.mark("rendezvous", 104.5)
    startup.mark("build", 104.25)  # a clock that went back: never a negative phase
    assert startup.phases() == {"interpreter": 0.5, "imports": 2.5, "rendezvous": 1.5, "build": 0.0}


def test_phases_come_in_the_order_they_are_passed_whatever_the_marking_order():
    startup.mark("restore", 101.0)
    startup.mark("interpreter", 102.0)
    assert list(startup.phases()) == ["interpreter", "restore"]


def test_a_mark_after_the_first_step_starts_a_new_profile_from_its_end():
    startup.mark("entry", 101.0)
    startup.mark("first_step", 102.0)
    startup.mark("entry", 110.0)  # a second fit() in the same process
    assert startup.phases() == {"entry": 8.0}


def test_an_unknown_phase_is_one_line():
    with pytest.raises(ValueError, match="unknown start-up phase 'warmup'; one of interpreter, imports"):
        startup.mark("warmup")


def test_gather_without_a_process_group_is_this_rank_alone():
    startup.mark("interpreter", 100.3)
    startup.mark("imports", 101.0)
    got = startup.gather("node1")
    assert got["ranks"] == 1 and got["slowest_rank"] == 0 and got["slowest_host"] == "node1"
    assert got["phases"] == {"interpreter": 0.3, "imports": 0.7} and got["total_s"] == pytest.approx(1.0)
    assert got["per_rank"][0]["phases"] == got["phases"] and got["per_rank"][0]["started_at"] == 100.0


def _rank(host, started_at, **phases):
    return {"host": host, "started_at": started_at, "phases": phases}


def test_the_slowest_rank_is_the_last_one_ready_not_the_one_that_started_first():
    got = startup._summary(
        [
            _rank("node1", 100.0, interpreter=1.0, imports=4.0, wait=3.0, first_step=0.5),  # ready at 105
            _rank("node2", 103.0, interpreter=1.0, imports=4.0, wait=0.0, first_step=0.5),  # ready at 108
        ]
    )
    assert got["slowest_rank"] == 1 and got["slowest_host"] == "node2"
    assert got["phases"] == {"interpreter": 1.0, "imports": 4.0, "wait": 3.0, "first_step": 0.5}  # max over ranks
    assert got["total_s"] == pytest.approx(8.5)  # rank 0's: its process started first


def test_a_large_world_keeps_the_slowest_ranks_own_phases_only():
    ranks = [_rank(f"n{r}", 100.0, imports=float(r)) for r in range(200)]
    got = startup._summary(ranks)
    assert got["ranks"] == 200 and len(got["per_rank"]) == startup.PER_RANK_KEPT
    assert [g["rank"] for g in got["per_rank"]] == list(range(200 - startup.PER_RANK_KEPT, 200))
    assert got["phases"] == {"imports": 199.0} and got["slowest_rank"] == 199


def test_recorded_prefers_the_whole_profile_and_survives_damage():
    start = {"startup": {"phases": {"imports": 2.0, "restore": 1.0}, "total_s": 3.5, "slowest_rank": 1, "ranks": 2}}
    later = {"startup": {"phases": {"imports": 2.0, "first_step": 0.4}, "total_s": 4.0, "slowest_host": "node2"}}
    assert startup.recorded(start, later)["phases"] == {"imports": 2.0, "first_step": 0.4}
    only = startup.recorded(start)
    assert only["until"] == "start" and only["slowest_rank"] == 1 and only["total_s"] == 3.5
    damaged = {"startup": {"phases": {"imports": "x", "build": -1, "restore": float("nan"), "bogus": 1.0}}}
    assert startup.recorded(damaged) is None and startup.recorded({"startup": [1]}) is None
    odd = {"startup": {"phases": {"imports": 1.0}, "slowest_rank": True, "slowest_host": 7, "total_s": "?"}}
    assert startup.recorded(odd) == {
        "phases": {"imports": 1.0},
        "total_s": None,
        "slowest_rank": None,
        "slowest_host": None,
        "ranks": None,
        "until": "start",
    }
    assert startup.recorded(None, None) is None


def test_line_names_every_phase_the_ranks_and_the_slowest():
    profile = {
        "phases": {"interpreter": 0.3, "imports": 6.1, "restore": 4.9, "first_step": 0.25},
        "total_s": 14.2,
        "slowest_rank": 3,
        "slowest_host": "node2",
        "ranks": 4,
        "until": "first_step",
    }
    assert startup.line(profile) == (
        "14.2 s: interpreter 300 ms, imports 6.1 s, restore 4.9 s, first step 250 ms"
        " (max over 4 ranks; slowest rank 3 on node2)"
    )
    assert startup.line({**profile, "until": "start", "ranks": 1, "slowest_host": None}).endswith(
        "(slowest rank 3; until the start record: no first step recorded)"
    )


def test_a_startup_record_belongs_to_the_newest_started_attempt_of_its_key():
    from hpctrain.run import attempts

    boot = {"phases": {"imports": 2.0, "first_step": 0.5}, "total_s": 2.5}
    found = attempts(
        [
            {"event": "start", "job_id": "7", "restart_count": 0, "startup": {"phases": {"imports": 2.0}}},
            {"event": "startup", "job_id": "7", "restart_count": 0, "startup": boot},
            {"event": "exit", "job_id": "7", "restart_count": 0, "cause": "preemption", "requeued": True},
            {"event": "startup", "job_id": "7", "restart_count": 1, "startup": boot},  # its start is missing
        ]
    )
    assert len(found) == 1 and found[0].startup["startup"] == boot
    assert startup.recorded(found[0].start, found[0].startup)["until"] == "first_step"


def test_an_entry_without_the_trainer_has_the_runners_phases_from_its_rank_records():
    records = [
        {"rank": 1, "hostname": "node2", "started_at": 105.5, "startup": {"interpreter": 0.5, "imports": 3.0}},
        {"rank": 0, "hostname": "node1", "started_at": 100.5, "startup": {"interpreter": 0.5, "imports": 2.0}},
        {"rank": 2, "hostname": "node3", "started_at": 100.0},  # from an hpctrain before the profile
        {"rank": "x", "startup": {"imports": 1.0}, "started_at": 1.0},
    ]
    got = startup.from_rank_records(records)
    assert got == {
        "phases": {"interpreter": 0.5, "imports": 3.0},
        "total_s": 3.5,
        "slowest_rank": 1,
        "slowest_host": "node2",
        "ranks": 2,
        "until": "entry",
    }
    assert startup.line(got).endswith(
        "(max over 2 ranks; slowest rank 1 on node2; the Runner's phases: the entry records no start)"
    )
    assert startup.from_rank_records([{"rank": 0}]) is None
