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
    # the loader needs 5 ms a batch, the rest of the step takes 3 ms: 2 ms of wait
    assert m.read_seconds(50, ranks=8, loader_samples_per_s=10_000) == pytest.approx(5e-3)
    # 8 ranks x 50 samples x 1 MB over a 100 GB/s filesystem: 4 ms
    assert m.read_seconds(50, ranks=8, bytes_per_sample=1e6, fs_read_bw=100e9) == pytest.approx(4e-3)
    assert m.data_wait_seconds(5e-3, 3e-3, floor_s=1e-4) == pytest.approx(2e-3)
    assert m.data_wait_seconds(1e-3, 3e-3, floor_s=1e-4) == pytest.approx(1e-4)
    assert m.throughput(32, 8, 0.1) == pytest.approx(2560.0)


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
