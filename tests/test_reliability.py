"""The reliability formulas (hpctrain.reliability), pinned against the sources' own figures; and the one home
of the MTBF default."""

from __future__ import annotations

import math

import pytest

from hpctrain import reliability as r
from hpctrain.defaults import DEFAULT_FAILURES_PER_1000_NODE_DAYS, DEFAULT_MTBF_NODE_HOURS


def test_young_and_daly_against_daly_s_own_figures():
    # Young: sqrt(2 x 300 s x 24 h) = 7200 s
    assert r.young_interval(300, 86400) == pytest.approx(7200.0)
    # Daly (2006) Figs. 3-5: delta = 5 min; M = 24 h -> 117 min, 6 h -> 57 min, 15 min -> 9.1 min
    assert r.daly_interval(300, 24 * 3600) / 60 == pytest.approx(116.69, abs=0.01)
    assert round(r.daly_interval(300, 24 * 3600) / 60) == 117
    assert round(r.daly_interval(300, 6 * 3600) / 60) == 57
    assert r.daly_interval(300, 15 * 60) / 60 == pytest.approx(9.14, abs=0.01)
    assert r.daly_interval(600, 200) == 200  # delta >= 2M: checkpoint every M


def test_failure_model_and_ettr():
    # Kokolis et al.: RSC-1's r_f = 6.50 per 1000 node-days; 16,384 GPUs (2048 nodes) fail every ~1.8 h
    node_h = r.mtbf_node_hours_from_rate(DEFAULT_FAILURES_PER_1000_NODE_DAYS)
    assert node_h == pytest.approx(3692.31, abs=0.01) and DEFAULT_MTBF_NODE_HOURS == node_h
    assert r.job_mtbf_seconds(2048, node_h) / 3600 == pytest.approx(1.80, abs=0.01)
    assert math.isclose(r.job_mtbf_seconds(512, DEFAULT_MTBF_NODE_HOURS) / 3600, 7.21, abs_tol=0.01)
    # ETTR: 60-min checkpoints, 1-min stall, 10-h MTBF, 10-min restart:
    # (1 - (600 + 1800) / 36000) / (1 + 60 / 3600) = 0.93333 / 1.01667 = 0.918033
    assert r.ettr(3600, 60, 36000, 600) == pytest.approx(0.918033, abs=1e-6)
    # the paper's 16k-GPU case: 60-min checkpoints, negligible stall and restart -> about 0.7
    assert r.ettr(3600, 1e-9, r.job_mtbf_seconds(2048, node_h), 0) == pytest.approx(0.72, abs=0.01)
    assert r.ettr(3600, 60, 1000, 600) == 0.0  # failing faster than it can restart: clamped
    assert r.failure_loss_seconds(3600, 600) == 2400


def test_the_failure_loss_is_the_ettr_s_own_term():
    """Over a run of ``work / ETTR``, the expected failures times the loss of each is what ETTR takes away
    beyond the checkpoints' stall: the planner's ``lost_s`` (docs/capacity.md)."""
    tau, delta, mtbf, restart, work = 3600.0, 60.0, 36000.0, 600.0, 1e6
    run = work / r.ettr(tau, delta, mtbf, restart)
    lost = run / mtbf * r.failure_loss_seconds(tau, restart)
    assert lost == pytest.approx(run - work - work * delta / tau, rel=1e-12)


def test_the_mtbf_default_has_one_home():
    import hpctrain.capacity.model as model
    from hpctrain.train.config import CheckpointPolicy

    assert CheckpointPolicy().mtbf_node_hours == DEFAULT_MTBF_NODE_HOURS
    assert not hasattr(model, "DEFAULT_MTBF_NODE_HOURS") and not hasattr(r, "DEFAULT_MTBF_NODE_HOURS")


def test_the_trainer_reaches_no_login_side_planner():
    """The Trainer's modules import neither the planner nor status (hpctrain.reliability is their formula)."""
    import ast
    from pathlib import Path

    import hpctrain.train as train

    for path in Path(train.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("hpctrain.capacity", "hpctrain.status")), (path, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith(("hpctrain.capacity", "hpctrain.status")), (path, alias.name)
