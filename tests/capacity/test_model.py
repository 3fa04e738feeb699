"""The capacity model's arithmetic, pinned against cases computed by hand (and the sources' own checks)."""

from __future__ import annotations

import math

import pytest

from hpctrain.capacity import model as m


def test_busbw_factor_and_busbw_as_nccl_tests_define_them():
    assert [m.busbw_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    # 1 GB in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 x 2*7/8 = 17.5 GB/s
    assert m.busbw_from_time(1e9, 8, 0.1) == pytest.approx(17.5e9)
    with pytest.raises(ValueError):
        m.busbw_factor(0)


def test_allreduce_time_latency_rounds_plus_bandwidth_term():
    assert [m.allreduce_latency_steps(n) for n in (1, 2, 3, 4, 8, 9)] == [0, 2, 4, 4, 6, 8]
    # 1 MB on 4 ranks, 10 us per round, 1 GB/s: 4 x 10 us + 1.5 x 1 ms = 1.54 ms
    assert m.allreduce_seconds(1e6, 4, busbw=1e9, latency=1e-5) == pytest.approx(1.54e-3)
    assert m.allreduce_seconds(1e6, 1, busbw=1e9, latency=1e-5, base=2e-4) == 2e-4  # one rank: the call only
    assert m.allreduce_seconds(1e6, 2, busbw=None, latency=1e-5) == pytest.approx(2e-5)  # bandwidth unknown
    assert m.overlap_fraction(0.25, 1.0) == 0.75 and m.overlap_fraction(2.0, 1.0) == 0.0
    assert m.exposed_comm_seconds(1.0, 0.75) == 0.25


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
    assert m.train_seconds(3.6e6, 1000.0) == 3600.0
    assert m.gpu_hours(3600.0, 64) == 64.0


def test_young_and_daly_against_daly_s_own_figures():
    # Young: sqrt(2 x 300 s x 24 h) = 7200 s
    assert m.young_interval(300, 86400) == pytest.approx(7200.0)
    # Daly (2006) Figs. 3-5: delta = 5 min; M = 24 h -> 117 min, 6 h -> 57 min, 15 min -> 9.1 min
    assert m.daly_interval(300, 24 * 3600) / 60 == pytest.approx(116.69, abs=0.01)
    assert round(m.daly_interval(300, 24 * 3600) / 60) == 117
    assert round(m.daly_interval(300, 6 * 3600) / 60) == 57
    assert m.daly_interval(300, 15 * 60) / 60 == pytest.approx(9.14, abs=0.01)
    assert m.daly_interval(600, 200) == 200  # delta >= 2M: checkpoint every M


def test_failure_model_and_ettr():
    # Kokolis et al.: RSC-1's r_f = 6.50 per 1000 node-days; 16,384 GPUs (2048 nodes) fail every ~1.8 h
    node_h = m.mtbf_node_hours_from_rate(6.5)
    assert node_h == pytest.approx(3692.31, abs=0.01) and m.DEFAULT_MTBF_NODE_HOURS == node_h
    assert m.job_mtbf_seconds(2048, node_h) / 3600 == pytest.approx(1.80, abs=0.01)
    # ETTR: 60-min checkpoints, 1-min stall, 10-h MTBF, 10-min restart:
    # (1 - (600 + 1800) / 36000) / (1 + 60 / 3600) = 0.93333 / 1.01667 = 0.918033
    assert m.ettr(3600, 60, 36000, 600) == pytest.approx(0.918033, abs=1e-6)
    # the paper's 16k-GPU case: 60-min checkpoints, negligible stall and restart -> about 0.7
    assert m.ettr(3600, 1e-9, m.job_mtbf_seconds(2048, node_h), 0) == pytest.approx(0.72, abs=0.01)
    assert m.ettr(3600, 60, 1000, 600) == 0.0  # failing faster than it can restart: clamped
    assert m.failure_loss_seconds(3600, 600) == 2400


def test_time_limit_segments():
    assert m.time_limit_segments(10 * 3600, 4 * 3600, 1800) == 3  # 10 h in jobs of 3.5 usable hours
    assert m.time_limit_segments(60, 4 * 3600, 1800) == 1
    assert m.time_limit_segments(60, 100, 100) is None
    assert math.isclose(m.job_mtbf_seconds(512, m.DEFAULT_MTBF_NODE_HOURS) / 3600, 7.21, abs_tol=0.01)
