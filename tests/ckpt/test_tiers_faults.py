"""Faults in the local tier: SIGKILL in a local save and in the partner exchange, local storage full."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.ckpt.tiers import SIM_NODES_ENV, TIER_FAULT_POINTS
from tests.ckpt import tier_workers as tw
from tests.ckpt.workers import expected_hash
from tests.multiproc import run_world

TWO_NODES = {SIM_NODES_ENV: "1"}  # 2 ranks, one per simulated node: each holds the other's replica

# (point, rank that dies, the step a restore must load): before every shard and replica is durable, step 5 is
# not committed anywhere (step 4 loads); killed while node 1 publishes, node 0 holds all of step 5 (it loads,
# rank 1's shard from the partner copy on node 0: node 1 never published its own)
KILLS = [
    ("local_before_write", 1, 4, "local"),
    ("partner_write", 1, 4, "local"),
    ("local_before_publish", 1, 5, "partner"),
]


@pytest.mark.parametrize("point,rank,step,tier", KILLS, ids=[f"{p}-rank{r}" for p, r, _, _ in KILLS])
def test_sigkill_in_local_save_or_partner_exchange_loads_a_complete_step(tmp_path, point, rank, step, tier):
    assert point in TIER_FAULT_POINTS
    gdir, ldir = str(tmp_path / "global"), str(tmp_path / "local")
    res = run_world(
        tw.save,
        2,
        gdir,
        ldir,
        [1, 2, 3, 4, 5],
        "id-A",
        5,
        f"{point}:{rank}",
        True,
        {"agreement_timeout_s": 3.0},  # the survivors give up on the dead rank soon
        env=TWO_NODES,
        allow_failures=True,
    )
    assert res.exitcodes[rank] == -9  # really killed
    got = run_world(tw.restore, 2, gdir, ldir, env=TWO_NODES, timeout=120).results
    for r in got:
        assert (r["step"], r["tier"]) == (step, tier), r["lines"]
        assert r["hash"] == expected_hash(step)  # bit-exact, never a mix of steps


def test_local_storage_full_clear_error_and_the_run_goes_on_with_the_global_tier(tmp_path):
    gdir, ldir = str(tmp_path / "global"), str(tmp_path / "local")
    cases = [([], {})]
    res = run_world(
        tw.scenarios, 2, gdir, ldir, [1, 2, 3, 4], cases, {"local_max_bytes": 4096}, env=TWO_NODES, timeout=120
    ).results
    assert res[0]["saved"] == [(1, "local"), (2, "local"), (3, "global"), (4, "local")]
    line = next(x for x in res[0]["save_lines"] if "local tier save failed" in x)
    assert "over CheckpointConfig.local_max_bytes=4096" in line and "goes on with the global tier" in line
    got = [r["restores"][0] for r in res]
    for r in got:
        assert (r["step"], r["tier"]) == (3, "global")
        assert r["hash"] == expected_hash(3)
    assert not list(Path(ldir).glob("node-*/*/step-*"))  # nothing committed locally
