"""Calibration records -> fitted model -> predicted rows, on hand-written run directories (hand-computed)."""

from __future__ import annotations

import json

import pytest

from hpctrain import reliability as rel
from hpctrain.capacity.calibration import read_calibrations
from hpctrain.capacity.predict import capacity_report
from hpctrain.capacity.targets import Targets
from hpctrain.errors import UsageError
from tests.capacity.synth import make_run


@pytest.fixture
def runs(tmp_path):
    # world 1: local batch 64; world 2: local batch 32 (the global batch of 64 kept)
    w1 = make_run(tmp_path / "w1", world=1, nodes=1, global_batch=64, data_ms=1, compute_ms=10, comm_ms=0.5)
    w2 = make_run(tmp_path / "w2", world=2, nodes=2, global_batch=64, data_ms=1, compute_ms=6, comm_ms=4.5)
    return [w1, w2]


def test_calibration_reads_the_parts_and_costs(runs):
    (c,) = read_calibrations(runs[1])
    assert (c.world_size, c.nodes, c.local_batch, c.global_batch) == (2, 2, 32, 64)
    assert c.step_s == pytest.approx(13.5e-3) and c.comm_s == pytest.approx(4.5e-3)
    assert c.intervals == 5  # the first interval of the attempt is left out
    assert c.save_stall_s == pytest.approx(5e-3)  # 0.5 ms per step x 10 steps, one save per interval
    assert c.save_commit_s == 0.02 and c.startup_s == 10.0 and c.flops_per_sample == pytest.approx(1e9)
    assert c.grad_bytes is None and c.checkpoint_bytes is None  # no checkpoint directory


def test_prediction_at_four_ranks_by_hand(runs):
    report = capacity_report(runs, Targets(nodes=(1, 2, 4), samples=64 * 1000, mtbf_node_hours=1.0, queue_wait_s=60))
    model = report["model"]
    # compute per regime, each measured at one local batch: proportional to it. One rank: 10 ms / 64 samples;
    # several ranks (the all-reduce beside the backward): 6 ms / 32 samples
    assert model["compute_per_sample_s"]["value"] == pytest.approx(10e-3 / 64)
    assert model["compute_per_step_s"]["value"] == 0.0 and model["compute_per_step_s"]["source"] == "assumed"
    assert model["compute_multi_per_sample_s"]["value"] == pytest.approx(0.1875e-3)
    assert any("fitted per regime" in n for n in report["notes"])
    # one multi-rank size, no gradient bytes: the 4 ms above the one-rank call are latency, 2 rounds at 2 ranks
    assert model["comm_base_s"]["value"] == pytest.approx(0.5e-3)
    assert model["comm_latency_s"]["value"] == pytest.approx(2e-3)
    row4 = report["rows"][2]
    assert row4["gpus"] == 4 and row4["local_batch"] == 16
    parts = row4["parts"]
    assert parts["compute_s"] == pytest.approx(3e-3)  # 0.1875 x 16
    assert parts["comm_s"] == pytest.approx(8.5e-3)  # 0.5 + 2 x 4 rounds
    assert parts["data_wait_s"] == pytest.approx(1e-3) and parts["optimizer_s"] == pytest.approx(2e-3)
    assert row4["step_s"] == pytest.approx(14.5e-3)
    # the calibration points are reproduced
    assert report["rows"][0]["step_s"] == pytest.approx(13.5e-3) and report["rows"][1]["step_s"] == pytest.approx(
        13.5e-3
    )
    # E(N) = thr(4) / (4 thr(1)) = (64 / 14.5) / (4 x 64 / 13.5)
    assert row4["efficiency"] == pytest.approx(13.5 / (4 * 14.5))
    # checkpoints and failures: stall 5 ms, commit 20 ms (async: 15 ms pending), M = 1 h / 4 nodes
    ck, fl = row4["checkpoint"], row4["failures"]
    mtbf = 900.0
    assert fl["job_mtbf_s"] == pytest.approx(mtbf)
    assert ck["save_stall_s"] == pytest.approx(5e-3) and ck["save_commit_s"] == pytest.approx(0.02)
    assert ck["daly_s"] == pytest.approx(rel.daly_interval(5e-3, mtbf)) and ck["young_s"] == pytest.approx(3.0)
    restart = 60 + 10 + 0.02  # queue + start-up + restore (taken as long as a save: no restart measured)
    assert fl["restart_s"] == pytest.approx(restart)
    assert row4["ettr"] == pytest.approx(rel.ettr(ck["daly_s"], 5e-3, mtbf, restart + 0.015))
    work = 1000 * 14.5e-3
    assert row4["train_s"] == pytest.approx(work)
    assert row4["wall_s"] == pytest.approx(60 + 10 + work / row4["ettr"])  # one job: queue + start-up + run
    assert row4["bound"] == "start-up"  # 15 s of training behind 70 s of queue and start-up


def test_compute_is_a_line_per_regime_when_a_regime_has_two_batches(tmp_path):
    # several ranks at local batches 32 (2 x 1) and 16 (2 x 2): 6 ms and 4 ms, a line of 2 ms + 0.125 ms/sample;
    # the one-rank point (64 samples, 10 ms) is a regime of its own and does not bend that line
    w1 = make_run(tmp_path / "w1", world=1, nodes=1, global_batch=64, data_ms=1, compute_ms=10, comm_ms=0.5)
    w2 = make_run(tmp_path / "w2", world=2, nodes=2, global_batch=64, data_ms=1, compute_ms=6, comm_ms=4.5)
    w4 = make_run(tmp_path / "w4", world=4, nodes=2, global_batch=64, data_ms=1, compute_ms=4, comm_ms=8.5)
    report = capacity_report([w1, w2, w4], Targets(nodes=(1, 8), gpus_per_node=1, samples=64 * 100))
    model = report["model"]
    assert model["compute_multi_per_step_s"]["value"] == pytest.approx(2e-3)
    assert model["compute_multi_per_sample_s"]["value"] == pytest.approx(0.125e-3)
    assert model["compute_multi_per_sample_s"]["source"] == "fitted"
    one, eight = report["rows"]
    assert one["parts"]["compute_s"] == pytest.approx(10e-3)  # the one-rank regime: 64 x 10/64 ms
    assert eight["parts"]["compute_s"] == pytest.approx(3e-3)  # 2 + 0.125 x 8
    assert not any("fitted per regime" in n for n in report["notes"])


@pytest.mark.parametrize(
    "latency_ms, extra_ms, comm4_ms",
    [
        # all-reduce of 2 rounds x 0.5 ms at 2 ranks, 4 ms exposed: none of it hidden, 3 ms beyond it. At 4 ranks
        # (4 rounds): the whole all-reduce (2 ms) + the same 3 ms, not the 4x share scaled up (8 ms)
        (0.5, 3.0, 0.5 + 2.0 + 3.0),
        # 2 x 4 ms = 8 ms at 2 ranks, 4 ms exposed: half hidden; 4 ranks: 0.5 + 0.5 x 16 ms
        (4.0, 0.0, 0.5 + 8.0),
    ],
)
def test_exposed_comm_beyond_the_whole_all_reduce_is_a_fixed_excess(runs, latency_ms, extra_ms, comm4_ms):
    report = capacity_report(runs, Targets(nodes=(4,), gpus_per_node=1, latency_s=latency_ms / 1e3, samples=6400))
    assert report["model"]["comm_extra_s"]["value"] == pytest.approx(extra_ms / 1e3)
    assert report["rows"][0]["parts"]["comm_s"] == pytest.approx(comm4_ms / 1e3)


def test_targets_change_the_batch_policy_and_time_limit(runs):
    weak = capacity_report(runs, Targets(nodes=(8,), local_batch=32, samples=1e7, time_limit_s=600))["rows"][0]
    assert weak["local_batch"] == 32 and weak["global_batch"] == 256 and weak["segments"] > 1
    strong = capacity_report(runs, Targets(nodes=(128,)))["rows"][0]
    assert strong["feasible"] is False and strong["bound"] == "infeasible"  # 64 samples over 128 ranks


def test_bad_targets_name_the_field():
    with pytest.raises(UsageError, match="Targets.nodes"):
        Targets(nodes=(0,))
    with pytest.raises(UsageError, match="samples or epochs"):
        Targets(samples=1, epochs=1)
    with pytest.raises(UsageError, match="Targets.busbw"):
        Targets(busbw=-1.0)


def test_a_directory_that_is_not_a_run_is_one_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such directory"):
        read_calibrations(tmp_path / "missing")
    with pytest.raises(UsageError, match="metrics.jsonl"):
        read_calibrations(tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "metrics.jsonl").write_text('{"kind": "eval", "step": 1}\nnot json\n')
    with pytest.raises(UsageError, match="no measured interval"):
        read_calibrations(tmp_path)


def test_a_loader_bound_calibration_measures_the_loader_rate(tmp_path):
    # 5 ms of a 17.5 ms step waiting for data: the loader delivers 64 samples per 17.5 ms
    w1 = make_run(tmp_path / "w1", world=1, nodes=1, global_batch=64, data_ms=5, compute_ms=10, comm_ms=0.5)
    report = capacity_report([w1], Targets(nodes=(1,), local_batch=128, samples=1e8))
    assert report["model"]["loader_samples_per_s"]["value"] == pytest.approx(64 / 17.5e-3)
    row = report["rows"][0]
    # twice the batch: the loader needs 35 ms, the rest of the step 10 x 2 + 0.5 + 2 = 22.5 ms: 12.5 ms wait
    assert row["parts"]["data_wait_s"] == pytest.approx(12.5e-3) and row["bound"] == "storage"
    assert row["advice"].startswith("data wait reaches 36% of the step at 1 node: stage to node-local storage")


def test_the_steps_data_wait_comes_from_the_per_step_maximum_when_recorded(tmp_path):
    run = make_run(tmp_path / "w2", world=2, nodes=2, global_batch=64, data_ms=1, compute_ms=6, comm_ms=4.5)
    (old,) = read_calibrations(run)
    assert old.data_wait_slowest_s == pytest.approx(1e-3)  # no per-step maximum: the slowest rank's mean
    metrics = run / "train" / "metrics.jsonl"
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    for i, rec in enumerate(recs):
        if rec.get("kind") == "interval":
            rec["data_wait_step_max_s"] = 3e-3 + i * 1e-4
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (new,) = read_calibrations(run)
    assert new.data_wait_slowest_s == pytest.approx(3.3e-3)  # the median of intervals 2..6 (the first left out)
    assert new.data_wait_s == pytest.approx(1e-3)  # the step's parts keep the median rank's
