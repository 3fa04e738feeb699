"""``CheckpointPolicy(every_minutes="auto")``: the Saver chooses Daly's interval for the measured save cost and
re-chooses it as saves are measured (a fake clock and a fake checkpointer; no torch, no process group)."""

from __future__ import annotations

import pytest

from hpctrain.errors import UsageError
from hpctrain.reliability import daly_interval, job_mtbf_seconds
from hpctrain.train.config import CheckpointPolicy
from hpctrain.train.ledger_records import AttemptProgress
from hpctrain.train.saving import AUTO_FIRST_SAVE_S, AUTO_WINDOW, Saver


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeCheckpointer:
    """A save takes ``costs[i]`` seconds of the fake clock."""

    def __init__(self, clock: Clock, costs) -> None:
        self.clock, self.costs, self.saved = clock, list(costs), []

    def should_save(self, step, *, requested=False):
        return "global" if requested else None  # saves by time only: every_minutes="auto"

    def save(self, step, *, data_state, blocking, tier="global", **state) -> None:
        self.clock.now += self.costs.pop(0)
        self.saved.append((step, blocking))


def _saver(clock, costs, *, nodes=4, mtbf_node_hours=10.0, **policy):
    pol = CheckpointPolicy(every_minutes="auto", mtbf_node_hours=mtbf_node_hours, **policy)
    ck = FakeCheckpointer(clock, costs)
    return Saver(ck, pol, state={}, loader=None, progress=AttemptProgress(), nodes=nodes, clock=clock), ck


def test_auto_chooses_daly_for_the_measured_save_cost_and_rechooses_it():
    clock = Clock()
    saver, ck = _saver(clock, [9.0, 1.0, 30.0])
    mtbf = job_mtbf_seconds(4, 10.0)  # 10 h per node, 4 nodes: 9000 s
    assert mtbf == 9000.0
    # nothing measured yet: the small first guess, so that the first save comes early
    first = daly_interval(AUTO_FIRST_SAVE_S, mtbf)
    assert saver.interval_s() == pytest.approx(first) and first == pytest.approx(
        133.50, abs=0.01
    )  # sqrt(18000) x 1.00249 - 1
    clock.now += first - 1
    assert not saver.minutes_passed()
    clock.now += 1
    assert saver.minutes_passed()
    saver.requested = True  # the interval's collective carried rank 0's request
    assert saver.periodic(10, total=100)  # a 9 s save
    assert ck.saved == [(10, False)] and saver.stalls == [9.0]
    assert saver.interval_s() == pytest.approx(daly_interval(9.0, mtbf))  # re-chosen: about 6.7 min
    assert not saver.minutes_passed()
    clock.now += daly_interval(9.0, mtbf)
    assert saver.minutes_passed()
    saver.save(20, blocking=True)  # a 1 s save: the mean of the two
    assert saver.interval_s() == pytest.approx(daly_interval(5.0, mtbf))
    saver.save(30, blocking=True)
    assert saver.interval_s() == pytest.approx(daly_interval(40.0 / 3, mtbf))


def test_auto_uses_the_last_saves_only_and_more_nodes_save_more_often():
    clock = Clock()
    saver, _ = _saver(clock, [100.0] + [2.0] * AUTO_WINDOW)
    for step in range(AUTO_WINDOW + 1):
        saver.save(step, blocking=False)
    assert saver.interval_s() == pytest.approx(daly_interval(2.0, 9000.0))  # the 100 s save left the window
    small, _ = _saver(Clock(), [], nodes=1)
    large, _ = _saver(Clock(), [], nodes=512)
    assert large.interval_s() < small.interval_s()


def test_a_number_of_minutes_is_unchanged_and_auto_is_validated():
    clock = Clock()
    pol = CheckpointPolicy(every_minutes=2)
    saver = Saver(FakeCheckpointer(clock, []), pol, state={}, loader=None, progress=AttemptProgress(), clock=clock)
    assert saver.interval_s() == 120.0
    clock.now += 119.9
    assert not saver.minutes_passed()
    clock.now += 0.1
    assert saver.minutes_passed()
    off = Saver(
        FakeCheckpointer(clock, []),
        CheckpointPolicy(every_steps=5),
        state={},
        loader=None,
        progress=AttemptProgress(),
        clock=clock,
    )
    assert off.interval_s() is None and not off.minutes_passed()
    assert CheckpointPolicy(every_minutes="auto").enabled
    with pytest.raises(UsageError, match="TrainConfig.checkpoint.every_minutes"):
        CheckpointPolicy(every_minutes="sometimes")
    with pytest.raises(UsageError, match="TrainConfig.checkpoint.mtbf_node_hours"):
        CheckpointPolicy(every_minutes="auto", mtbf_node_hours=0)


def test_the_trainer_saves_by_the_auto_interval(tmp_path):
    # a node MTBF of 3.6 ms: Daly's interval is the MTBF itself (the save costs more than 2 M), so every log
    # interval asks for a save, which the next step takes; the last step is saved at the end as always
    from hpctrain.rundir import RunDir, read_jsonl
    from tests.multiproc import run_world
    from tests.train.test_trainer import _fit

    policy = CheckpointPolicy(every_minutes="auto", mtbf_node_hours=1e-6)
    (result,) = run_world(_fit, 1, str(tmp_path), {"steps": 20, "log_every": 5, "checkpoint": policy}).results
    assert result["step"] == 20
    records, _ = read_jsonl(RunDir(tmp_path).metrics)
    saved = [r["last_checkpoint_step"] for r in records if r["kind"] == "interval"]
    assert saved == [None, 6, 11, 16]
    (end,) = [r for r in read_jsonl(RunDir(tmp_path).ledger)[0] if r["event"] == "end"]
    assert end["committed_step"] == 20
    (start,) = [r for r in read_jsonl(RunDir(tmp_path).ledger)[0] if r["event"] == "start"]
    assert start["config"]["checkpoint"]["every_minutes"] == "auto"
