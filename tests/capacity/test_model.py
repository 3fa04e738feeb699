"""The capacity model's arithmetic, pinned against cases computed by hand (and the sources' own checks).

The reliability formulas are pinned in tests/test_reliability.py."""

from __future__ import annotations

import pytest

from hpctrain.capacity import model as m


def test_busbw_factor_as_nccl_tests_define_it():
    assert [m.busbw_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    with pytest.raises(ValueError):
        m.busbw_factor(0)


def test_allreduce_time_latency_rounds_plus_bandwidth_term():
    assert [m.allreduce_latency_steps(n) for n in (1, 2, 3, 4, 8, 9)] == [0, 2, 4, 4, 6, 8]
    # 1 MB on 4 ranks, 10 us per round, 1 GB/s: 4 x 10 us + 1.5 x 1 ms = 1.54 ms
    assert m.allreduce_seconds(1e6, 4, busbw=1e9, latency=1e-5) == pytest.approx(1.54e-3)
    assert m.allreduce_seconds(1e6, 1, busbw=1e9, latency=1e-5, base=2e-4) == 2e-4  # one rank: the call only
    assert m.allreduce_seconds(1e6, 2, busbw=None, latency=1e-5) == pytest.approx(2e-5)  # bandwidth unknown
    assert m.overlap_fraction(0.25, 1.0) == 0.75 and m.overlap_fraction(2.0, 1.0) == 0.0


def test_step_parts():
    assert m.compute_seconds(32, 1e-4, 2e-3) == pytest.approx(5.2e-3)
    assert m.data_wait_seconds(5e-3, 3e-3, floor_s=1e-4) == pytest.approx(2e-3)
    assert m.data_wait_seconds(1e-3, 3e-3, floor_s=1e-4) == pytest.approx(1e-4)
    assert m.throughput(32, 8, 0.1) == pytest.approx(2560.0)


def test_input_path_by_hand():
    # 4 ranks x 50 samples x 1 MB = 200 MB a node a step; the rest of the step 0.1 s: a node needs 2 GB/s
    node = m.node_bytes_per_step(50, 4, 1e6)
    assert node == pytest.approx(200e6)
    assert m.node_read_need(node, 0.1) == pytest.approx(2e9) and m.node_read_need(node, 0.0) == float("inf")
    # the node reads 3 GB/s, the file system 20 GB/s in all: 8 nodes get 2.5 GB/s each, 16 nodes 1.25 GB/s
    assert m.node_read_rate(8, node_rate=3e9, aggregate_bw=20e9) == pytest.approx(2.5e9)
    assert m.node_read_rate(16, node_rate=3e9, aggregate_bw=20e9) == pytest.approx(1.25e9)
    assert m.node_read_rate(4, node_rate=3e9, aggregate_bw=20e9) == pytest.approx(3e9)  # the node's own rate
    assert m.node_read_rate(4, node_rate=None, aggregate_bw=None) == float("inf")  # nothing known: no bound
    assert m.node_read_seconds(node, 2.5e9) == pytest.approx(0.08) and m.node_read_seconds(node, float("inf")) == 0
    # 8 nodes: 80 ms of reads hide behind 100 ms; 16 nodes: 160 ms, 60 ms of it waited for
    assert m.data_wait_seconds(m.node_read_seconds(node, 2.5e9), 0.1) == 0.0
    assert m.data_wait_seconds(m.node_read_seconds(node, 1.25e9), 0.1) == pytest.approx(0.06)
    # saturated: 16 nodes at the 0.16 s step they get ask exactly the file system's 20 GB/s
    assert m.read_demand(16, node, 0.16) == pytest.approx(20e9) and m.read_demand(3, node, 0.0) == 0.0
    # storage is the bound from the first N with 20 GB/s / N < 2 GB/s: 10 gives exactly 2 (not yet), 11 does
    assert [n for n in range(1, 13) if m.storage_bound(n, 20e9, 2e9)] == [11, 12]
    assert not m.storage_bound(1000, None, 2e9)


def test_staging_by_hand():
    # 100 GB to every node at a measured 1 GB/s; 16 nodes share 20 GB/s (1.25 each): the node's 1 GB/s, 100 s
    assert m.staging_seconds(100e9, 16, copy_rate=1e9, aggregate_bw=20e9) == pytest.approx(100.0)
    # 32 nodes get 0.625 GB/s each: 160 s; without a measured copy: bytes / (aggregate / N)
    assert m.staging_seconds(100e9, 32, copy_rate=1e9, aggregate_bw=20e9) == pytest.approx(160.0)
    assert m.staging_seconds(100e9, 32, aggregate_bw=20e9) == pytest.approx(160.0)
    assert m.staging_seconds(100e9, 32) is None
    # 100 s of copy against 60 ms a step removed: paid for after 1667 steps; nothing removed: never
    assert m.staging_payoff_steps(100.0, 0.06) == 1667
    assert m.staging_payoff_steps(0.0, 0.06) == 1
    assert m.staging_payoff_steps(100.0, 0.0) is None


def test_scaling_efficiency_time_and_gpu_hours():
    assert m.scaling_efficiency(700.0, 8, 100.0) == pytest.approx(0.875)
    assert m.gpu_hours(3600.0, 64) == 64.0


def test_time_limit_segments():
    assert m.time_limit_segments(10 * 3600, 4 * 3600, 1800) == 3  # 10 h in jobs of 3.5 usable hours
    assert m.time_limit_segments(60, 4 * 3600, 1800) == 1
    assert m.time_limit_segments(60, 100, 100) is None


def test_the_planner_s_live_path_calls_the_tested_formulas():
    """Each formula of the model is called by the planner's code, not only by these tests."""
    import ast
    from pathlib import Path

    import hpctrain.capacity as capacity

    called = set()
    for path in Path(capacity.__file__).parent.glob("*.py"):
        if path.name == "model.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "m":
                called.add(node.attr)
    assert set(m.__all__) - called == set()
