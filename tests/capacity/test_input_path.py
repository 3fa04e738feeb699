"""The input path at scale (docs/capacity.md "The input path"): data wait per node count from a run's own loader
reads and the file system's aggregate bandwidth, the node count where storage becomes the bound, and when
staging pays off. The calibration runs are written by hand, so every figure is computed by hand:

one rank per node, 50 samples a step, the loader read 1 MB per sample (500 MB in 10 steps) with 2 readers in
1/3 s of reader time (3 GB/s a node), and the rest of the step is 100 ms (98 ms compute + 2 ms optimizer): a node
needs 50 MB / 0.1 s = 0.5 GB/s. With 5 GB/s in all, storage is the bound from the first N with 5 / N < 0.5: 11.
At 16 nodes a node gets 0.3125 GB/s: 160 ms of reads, 60 ms waited for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.__main__ import main as hpctrain_main
from hpctrain.capacity import Targets, capacity_report
from tests.capacity.synth import add_stage, make_run

READ = {"steps": 10, "samples": 500, "bytes": 500_000_000, "bytes_read": 500_000_000, "readers": 2}
SHARED = {**READ, "read_s": 1 / 3, "wait_s": 0.0}  # 500 MB / (1/3 s) x 2 readers = 3 GB/s
LOCAL = {**READ, "read_s": 1 / 6, "wait_s": 0.0}  # 6 GB/s from node-local copies


def _run(root, read=SHARED):
    return make_run(root, world=1, nodes=1, global_batch=50, data_ms=0.0, compute_ms=98.0, comm_ms=0.0, input_rec=read)


@pytest.fixture
def shared(tmp_path):
    return str(_run(tmp_path / "shared"))


@pytest.fixture
def staged(tmp_path):
    root = _run(tmp_path / "staged", LOCAL)
    add_stage(root, 1, bytes_copied=10e9, copy_s=10.0)  # 10 GB at 1 GB/s
    return str(root)


def _rows(report):
    return {r["nodes"]: r for r in report["rows"]}


def test_data_wait_per_node_count_and_the_storage_bound(shared):
    report = capacity_report([shared], Targets(nodes=(1, 8, 10, 11, 16), read_bw=5e9, samples=1e8, local_batch=50))
    md = report["model"]
    assert md["bytes_per_sample"]["value"] == pytest.approx(1e6) and md["bytes_per_sample"]["source"] == "measured"
    assert md["node_read_rate"]["value"] == pytest.approx(3e9) and md["node_read_rate"]["source"] == "measured"
    rows = _rows(report)
    for n in (1, 8, 10, 11, 16):
        assert rows[n]["input"]["node_bytes_per_step"] == pytest.approx(50e6)
        assert rows[n]["input"]["node_read_need"] == pytest.approx(0.5e9)
        assert rows[n]["input"]["node_read_rate"] == pytest.approx(min(3e9, 5e9 / n))
        assert rows[n]["input"]["storage_bound"] is (n >= 11)
    assert rows[8]["parts"]["data_wait_s"] == 0.0 and rows[10]["parts"]["data_wait_s"] == pytest.approx(0.0)
    assert rows[11]["parts"]["data_wait_s"] == pytest.approx(50e6 / (5e9 / 11) - 0.1)
    assert rows[16]["parts"]["data_wait_s"] == pytest.approx(0.06)
    assert rows[16]["input"]["read_demand"] == pytest.approx(5e9)  # saturated: all of the file system
    assert report["summary"]["storage_bound_from"] == 11
    assert rows[16]["bound"] == "storage"


def test_the_bound_is_found_between_the_requested_node_counts(shared):
    report = capacity_report([shared], Targets(nodes=(1, 64), read_bw=5e9, samples=1e8, local_batch=50))
    assert report["summary"]["storage_bound_from"] == 11
    report = capacity_report([shared], Targets(nodes=(1, 8), read_bw=5e9, samples=1e8, local_batch=50))
    assert report["summary"]["storage_bound_from"] is None


def test_capacity_names_the_node_count_where_storage_becomes_the_bound(shared, capsys):
    argv = ["capacity", shared, "--nodes", "1,8,16,64", "--read-bw", "5", "--samples", "1e8", "--local-batch", "50"]
    assert hpctrain_main(argv) == 0
    out = capsys.readouterr().out
    assert "storage becomes the bound at 11 nodes (a node needs 0.5 GB/s" not in out  # 11 is not a row
    assert "storage becomes the bound at 11 nodes" in out and "file system 5 GB/s aggregate (given)" in out
    assert "a node reads 3 GB/s (measured" in out
    assert hpctrain_main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["storage_bound_from"] == 11 and report["targets"]["read_bw"] == 5e9


def test_without_an_aggregate_bandwidth_it_says_what_to_give(shared, capsys):
    assert hpctrain_main(["capacity", shared, "--nodes", "1,512", "--samples", "1e8", "--local-batch", "50"]) == 0
    out = capsys.readouterr().out
    assert "give --read-bw GB/s (aggregate) to find where storage becomes the bound" in out
    assert "staging cannot be costed" in out


def test_staging_pays_off_after_k_steps(shared, staged, capsys):
    report = capacity_report([shared, staged], Targets(nodes=(8, 16), read_bw=5e9, samples=1e8, local_batch=50))
    md = report["model"]
    assert md["local_read_bw"]["value"] == pytest.approx(6e9) and md["local_read_bw"]["source"] == "measured"
    assert md["stage_copy_rate"]["value"] == pytest.approx(1e9) and md["dataset_bytes"]["value"] == 10e9
    st = _rows(report)[16]["staging"]
    # each of 16 nodes copies 10 GB at min(1 GB/s, 5/16 GB/s): 32 s; it removes 60 ms a step: 534 steps
    assert st["copy_s"] == pytest.approx(32.0) and st["saved_per_step_s"] == pytest.approx(0.06)
    assert st["local_wait_s"] == 0.0 and st["pays_off_after"] == 534 and st["steps"] == 125_000
    assert st["verdict"].startswith("staging pays off after 534 steps")
    assert _rows(report)[8]["staging"]["verdict"].startswith("staging does not pay off: it removes no data wait")
    argv = ["capacity", shared, staged, "--nodes", "8,16", "--read-bw", "5", "--samples", "1e8", "--local-batch", "50"]
    assert hpctrain_main(argv) == 0
    assert "staging   at 16 nodes: staging pays off after 534 steps" in capsys.readouterr().out


def test_staging_does_not_pay_off_on_a_short_run(shared, staged, capsys):
    # 100 steps of 800 samples at 16 nodes: 6 s of wait removed, against a 32 s copy
    report = capacity_report([shared, staged], Targets(nodes=(16,), read_bw=5e9, samples=80_000, local_batch=50))
    st = report["rows"][0]["staging"]
    assert st["steps"] == 100 and st["pays_off_after"] == 534
    assert st["verdict"] == (
        "staging does not pay off: its copy (32.0 s per node) is longer than the data wait it removes over the "
        "run's 100 steps (6.0 s)"
    )


def test_without_stage_records_the_copy_is_bytes_over_the_storage_share(shared):
    targets = Targets(nodes=(16,), read_bw=5e9, samples=1e8, local_batch=50)
    st = capacity_report([shared], targets)["rows"][0]["staging"]
    assert st["copy_s"] is None and st["verdict"].startswith("staging cannot be costed")  # the input's size unknown
    # the data fingerprint in identity/ gives the input files' size: 10 GB over 5/16 GB/s a node is 32 s
    ident = Path(shared) / "identity"
    ident.mkdir()
    shape = {"x": {"type": "dataset", "shape": [10_000, 250_000], "dtype": "<f4"}}
    record = {"data": {"files": [{"cheap": {"size": 10_000_000_000, "structure": shape}}]}}
    (ident / "7-r0.json").write_text(json.dumps(record))
    report = capacity_report([shared], targets)
    assert report["model"]["dataset_bytes"]["value"] == 10e9 and report["model"]["stage_copy_rate"]["value"] is None
    assert report["model"]["local_read_bw"]["source"] == "assumed"  # the node's measured 3 GB/s
    st = report["rows"][0]["staging"]
    assert st["copy_s"] == pytest.approx(32.0) and st["pays_off_after"] == 534


def test_bad_local_read_bw_is_one_line(shared, capsys):
    assert hpctrain_main(["capacity", shared, "--local-read-bw", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "hpctrain capacity: error: --local-read-bw '-1' must be a number > 0\n"


def test_the_slowest_rank_s_data_wait_is_read_beside_the_median_rank_s(tmp_path):
    """A synchronous step waits for the last rank's batch: ``data_wait_slowest_s`` is the max over ranks of each
    interval's per-step wait, then the median over intervals (the first left out), beside the median rank's."""
    from hpctrain.capacity import read_calibrations

    root = make_run(tmp_path / "r", world=3, nodes=3, global_batch=96, data_ms=50.0, compute_ms=100.0, comm_ms=5.0)
    path = root / "train" / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    intervals = [r for r in recs if r.get("kind") == "interval"]
    for i, (rec, slowest) in enumerate(zip(intervals, (0.9, 0.2, 0.15, 0.3, 0.25, 0.2))):
        rec["per_step"]["data_wait_s"].update(max=slowest, max_rank=i % 3)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (cal,) = read_calibrations(root)
    assert cal.data_wait_s == pytest.approx(0.05)
    assert cal.data_wait_slowest_s == pytest.approx(0.2)  # median of 0.2, 0.15, 0.3, 0.25, 0.2: the first left out


def test_the_node_late_for_its_data_waits_for_nobody_else(tmp_path):
    # a 2-rank calibration whose exposed comm (8 ms above the one-rank call's 0) is the bare all-reduce (2 rounds x
    # 0.5 ms, given) plus a 7 ms excess of waiting for the other rank: while no node waits for data every rank
    # pays it; once storage is the bound, the late node's step is its read, then its own work with the bare
    # all-reduce, and the excess is not added on top of the read
    one = _run(tmp_path / "w1")
    two = make_run(
        tmp_path / "w2", world=2, nodes=2, global_batch=100, data_ms=0.0, compute_ms=98.0, comm_ms=8.0, input_rec=SHARED
    )
    report = capacity_report(
        [one, two], Targets(nodes=(2, 16), read_bw=5e9, samples=1e8, local_batch=50, gpus_per_node=1, latency_s=5e-4)
    )
    assert report["model"]["comm_extra_s"]["value"] == pytest.approx(7e-3)
    rows = _rows(report)
    free, bound = rows[2], rows[16]
    assert not free["input"]["storage_bound"] and free["parts"]["comm_s"] == pytest.approx(8e-3)
    assert bound["input"]["storage_bound"] and bound["parts"]["comm_s"] == pytest.approx(8 * 5e-4)  # 8 rounds at 16
    late_rest = 98e-3 + 4e-3 + 2e-3  # compute, the bare all-reduce, the optimizer
    assert bound["parts"]["data_wait_s"] == pytest.approx(50e6 / (5e9 / 16) - late_rest)
    assert bound["step_s"] == pytest.approx(50e6 / (5e9 / 16))  # the step is the read
