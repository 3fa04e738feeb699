"""Stragglers: the rule on interval records (above the reference by the threshold, for several consecutive
intervals, attributed to the slow phase), and a real 2-rank Trainer run where rank 1's data read sleeps."""

from __future__ import annotations

import statistics

from hpctrain.ledger import Ledger
from hpctrain.runtime.stragglers import StragglerDetector, find_straggler
from tests.multiproc import run_world


def _spread(values):  # as hpctrain.train.metrics writes it
    worst = max(range(len(values)), key=values.__getitem__)
    return {"min": min(values), "median": statistics.median(values), "max": values[worst], "max_rank": worst}


def _record(busy, data_wait, compute, step=10):
    n = len(busy)
    return {
        "step": step,
        "world_size": n,
        "per_step": {
            "busy_s": _spread(busy),
            "data_wait_s": _spread(data_wait),
            "forward_backward_s": _spread(compute),
            "optimizer_s": _spread([0.001] * n),
            "grad_comm_exposed_s": _spread([0.01] * n),
        },
    }


def test_the_slow_rank_and_its_phase_are_found_and_noise_is_not():
    slow_data = _record([0.1, 0.1, 0.25, 0.1], [0.01, 0.01, 0.16, 0.01], [0.09, 0.09, 0.09, 0.09])
    assert find_straggler(slow_data) == {
        "rank": 2,
        "phase": "data wait",
        "busy_s": 0.25,
        "reference_s": 0.1,
        "ratio": 2.5,
    }
    slow_compute = _record([0.1, 0.3, 0.1, 0.1], [0.01] * 4, [0.09, 0.29, 0.09, 0.09])
    assert find_straggler(slow_compute)["phase"] == "compute"
    assert find_straggler(_record([0.1, 0.12, 0.1, 0.1], [0.01] * 4, [0.09] * 4)) is None  # 20 %: not enough
    assert find_straggler(_record([1e-4, 4e-4], [0.0] * 2, [1e-4] * 2)) is None  # micro-seconds: noise
    assert find_straggler(_record([0.1], [0.01], [0.09])) is None


def test_a_straggler_is_recorded_once_after_consecutive_intervals(tmp_path):
    det = StragglerDetector(tmp_path, job_id="7", restart_count=0, intervals=3)
    slow = _record([0.1, 0.3], [0.01, 0.21], [0.09, 0.09])
    fine = _record([0.1, 0.1], [0.01, 0.01], [0.09, 0.09])
    assert det.observe(slow) is None and det.observe(slow) is None
    assert det.observe(fine) is None  # the streak starts again
    assert det.observe(slow) is None and det.observe(slow) is None
    got = det.observe(slow)
    assert got is not None and got["rank"] == 1 and got["phase"] == "data wait" and got["intervals"] == 3
    assert det.observe(slow) is None  # once per rank and attempt
    (rec,) = Ledger(tmp_path).records("straggler")
    assert rec["rank"] == 1 and rec["job_id"] == "7"


def _runner(rank, world_size, run_dir):
    from hpctrain.launch import Runner, RunnerSettings

    return Runner(entry="tests.entries:straggler_fit", run_dir=run_dir, settings=RunnerSettings(dist_timeout=120))()


def test_a_rank_with_a_slow_data_read_is_named_a_straggler_in_data_wait(tmp_path, capfd, monkeypatch):
    run_dir = tmp_path / "run"
    res = run_world(_runner, 2, str(run_dir), init_pg=False)
    assert res.results == [16, 16]
    (rec,) = Ledger(run_dir).records("straggler")
    assert rec["rank"] == 1 and rec["phase"] == "data wait", rec
    assert rec["host"] and rec["ratio"] > 1.5, rec

    from hpctrain.status.cli import main as status

    capfd.readouterr()
    monkeypatch.setenv("COLUMNS", "400")
    assert status([str(run_dir)]) == 0
    shown = " ".join(capfd.readouterr().out.split())
    assert f"straggler attempt 0 step {rec['step']}: rank 1 on {rec['host']}" in shown, shown
    assert "(slow phase: data wait)" in shown, shown
