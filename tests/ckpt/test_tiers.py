"""The local + partner tier (hpctrain.ckpt.tiers): real gloo processes on simulated nodes, each node a directory.

Steps 1..5 with ``global_every_local_saves=3``: 1, 2 local, 3 global, 4, 5 local. Every restore must load a complete,
verified step bit-identical to the saved state, never a mix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.ckpt._format import shard_name, step_name
from hpctrain.ckpt.config import CheckpointConfig
from hpctrain.ckpt.tiers import SIM_NODES_ENV
from hpctrain.ckpt.tiers._nodes import Nodes, tier_key
from hpctrain.errors import UsageError
from tests.ckpt import tier_workers as tw
from tests.ckpt.workers import expected_hash
from tests.multiproc import run_world

TWO_NODES = {SIM_NODES_ENV: "2"}  # 4 ranks: nodes {0, 1} and {2, 3}; rank r's replica on rank (r + 2) % 4
FOUR_NODES = {SIM_NODES_ENV: "1"}  # 4 ranks, one per node; rank r's replica on rank (r - 1) % 4


def _dirs(tmp_path: Path):
    return str(tmp_path / "global"), str(tmp_path / "local")


def _step_dir(ldir: str, node: int, gdir: str, step: int, identity: str = "id-A") -> Path:
    return Path(ldir) / f"node-{node}" / tier_key(gdir, identity) / step_name(step)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def _check(got, step: int, tier: str) -> None:
    for r in got:
        assert (r["step"], r["tier"]) == (step, tier), r["lines"]
        assert r["hash"] == expected_hash(step)  # bit-identical to the saved state
        assert r["data_state"] == {"step": step}


def test_partner_ring_by_node():
    two = Nodes((0, 0, 1, 1), True)
    assert [two.partner(r) for r in range(4)] == [2, 3, 0, 1]
    three = Nodes((0, 0, 1, 2, 2), True)  # a node with fewer ranks: its last local index takes the rest
    assert [three.partner(r) for r in range(5)] == [3, 4, 0, 2, 2]
    assert three.replicas_of(2) == [3, 4]
    assert Nodes((0, 0), True).partner(0) is None  # one node: no replica


def test_config_validation_names_the_option():
    with pytest.raises(UsageError, match="CheckpointConfig.local_max_bytes"):
        CheckpointConfig(local_dir="/dev/shm/ck")
    with pytest.raises(UsageError, match="CheckpointConfig.global_every_local_saves"):
        CheckpointConfig(global_every_local_saves=0)
    with pytest.raises(UsageError, match="CheckpointConfig.local_every_steps"):
        CheckpointConfig(local_every_steps=-1)


def _run(tmp_path: Path, env, cases, steps=(1, 2, 3, 4, 5), **kw):
    gdir, ldir = _dirs(tmp_path)
    res = run_world(tw.scenarios, 4, gdir, ldir, list(steps), cases, env=env, timeout=120, **kw).results
    return gdir, ldir, res[0]["saved"], [[r["restores"][i] for r in res] for i in range(len(cases))]


def test_local_restore_node_wiped_and_partner_copies(tmp_path):
    gdir, ldir = _dirs(tmp_path)
    node1 = str(Path(ldir) / "node-1")
    gdir, ldir, saved, got = _run(tmp_path, TWO_NODES, [([], {}), ([("rmtree", node1)], {})])
    assert saved == [(1, "local"), (2, "local"), (3, "global"), (4, "local"), (5, "local")]
    # only the global tier is on the shared filesystem
    assert sorted(p.name for p in Path(gdir).glob("step-*")) == [step_name(3)]
    _check(got[0], 5, "local")
    assert got[0][0]["global_step"] == 3
    # node 1 replaced (its directory gone): ranks 2 and 3 got their shards from their partners on node 0
    _check(got[1], 5, "partner")
    assert any("the shards of ranks [2, 3] from their partner copies" in x for x in got[1][0]["lines"])
    # each node holds its own shards and its partner's (here all four), of the last 2 steps only
    node0 = _step_dir(ldir, 0, gdir, 5).parent
    assert sorted(p.name for p in node0.glob("step-*")) == [step_name(4), step_name(5)]
    assert sorted(p.name for p in (node0 / step_name(5)).glob("*.shard")) == [shard_name(r, 4) for r in range(4)]
    # healthy: nothing crossed between nodes; node 1 replaced: it was sent the shards its ranks open (its own,
    # 2 and 3, from their partner copies on node 0), not the whole step
    assert sum(r["sent"] for r in got[0]) == 0
    shards = sorted(p.name for p in _step_dir(ldir, 1, gdir, 5).glob("*.shard"))
    assert {shard_name(2, 4), shard_name(3, 4)} <= set(shards) and shard_name(0, 4) not in shards
    assert (
        0 < sum(r["sent"] for r in got[1]) < sum(p.stat().st_size for p in node0.joinpath(step_name(5)).glob("*.shard"))
    )


def test_damaged_copies_own_serves_both_bad_falls_back(tmp_path):
    gdir, ldir = _dirs(tmp_path)
    own0, rep0 = _step_dir(ldir, 0, gdir, 5) / shard_name(0, 4), _step_dir(ldir, 1, gdir, 5) / shard_name(0, 4)
    rep2 = _step_dir(ldir, 0, gdir, 5) / shard_name(2, 4)
    cases = [
        ([("flip", str(rep0)), ("unlink", str(rep2))], {}),  # rank 0's replica flipped, rank 2's missing
        # both copies of rank 0's shard of step 5 bad: the replica on node 1 failed its crc in the first case and
        # was removed (nothing on node 1 opens shard 0, so it was not fetched again)
        ([("flip", str(own0)), ("discard", str(rep0))], {}),
    ]
    _, _, _, got = _run(tmp_path, TWO_NODES, cases)
    _check(got[0], 5, "local")  # the own copies serve
    assert any("fails its checksum" in line for r in got[0] for line in r["lines"])
    _check(got[1], 4, "local")  # step 4, never a mix of 4 and 5
    assert any("no verified copy of the shards of ranks [0]" in line for line in got[1][0]["lines"])


def test_two_adjacent_nodes_lost_falls_back_to_global_with_a_clear_line(tmp_path):
    ldir = _dirs(tmp_path)[1]
    lost = [("rmtree", str(Path(ldir) / "node-1")), ("rmtree", str(Path(ldir) / "node-0"))]  # rank 1 and its partner
    _, _, _, got = _run(tmp_path, FOUR_NODES, [(lost, {})])
    _check(got[0], 3, "global")
    line = next(x for x in got[0][0]["lines"] if "local tier not usable" in x)
    assert "no surviving copy of the shards of ranks [1]" in line


def test_stale_local_dir_of_another_run_or_dir_is_never_loaded(tmp_path):
    gdir, _ = _dirs(tmp_path)
    other = str(tmp_path / "other-global")  # the same run, another checkpoint directory
    cases = [([], {"identity": "id-B"}), ([("copytree", f"{gdir}|{other}")], {"gdir": other})]
    _, _, _, got = _run(tmp_path, TWO_NODES, cases)
    _check(got[0], 3, "global")
    _check(got[1], 3, "global")


def test_one_process_async_local_saves_restore_bit_identical(tmp_path):
    from hpctrain.ckpt.tiers import TieredCheckpointer
    from tests.ckpt.workers import build, state_hash

    cfg = CheckpointConfig(
        dir=tmp_path / "g",
        local_dir=tmp_path / "l",
        local_every_steps=1,
        global_every_local_saves=2,
        clean_abandoned=False,
    )
    ck = TieredCheckpointer(cfg, identity="x")
    tiers = []
    for s in (1, 2, 3):
        model, opt, sched = build(seed=s)
        ck.save(s, model=model, optimizer=opt, scheduler=sched, blocking=False)
        ck.wait()
        tiers.append(ck.last_tier)
    ck.close()
    assert tiers == ["local", "global", "local"]
    ck = TieredCheckpointer(cfg, identity="x")
    model, opt, sched = build(seed=9, steps=0)
    got = ck.restore(model=model, optimizer=opt, scheduler=sched)
    ck.close()
    assert (got.step, got.tier, got.global_step) == (3, "local", 2)
    assert state_hash(model, opt, sched) == expected_hash(3)


def test_global_copy_of_a_local_step_same_bytes_and_a_failed_copy_makes_the_next_save_global(tmp_path, caplog):
    from hpctrain.ckpt import Checkpointer
    from hpctrain.ckpt.tiers import TieredCheckpointer
    from tests.ckpt.workers import build, state_hash

    cfg = CheckpointConfig(
        dir=tmp_path / "g",
        local_dir=tmp_path / "l",
        local_every_steps=1,
        global_every_local_saves=2,
        clean_abandoned=False,
    )
    ck = TieredCheckpointer(cfg, identity="x")
    tiers = []
    for s in (1, 2, 3, 4, 5):
        model, opt, sched = build(seed=s)
        if s == 4:  # the copy of local step 4 to the global tier fails once
            os.environ["HPCTRAIN_CKPT_FAULT"] = "before_write:0:raiseonce"
        try:
            ck.save(s, model=model, optimizer=opt, scheduler=sched, blocking=False)
            ck.wait()
        finally:
            os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
        tiers.append(ck.last_tier)
    local_step = ck.local.root / step_name(4)
    ck.close()
    # step 2: committed locally, then copied (the same shard bytes) to the global tier; 4: the copy failed, with
    # one line, and the run went on: local step 4 stands, the next save (5) went to the global tier itself
    assert tiers == ["local", "global", "local", "global", "global"]
    assert sorted(p.name for p in (tmp_path / "g").glob("step-*")) == [step_name(2), step_name(5)]
    assert any("copy of a local step to the global tier failed" in r.getMessage() for r in caplog.records)
    assert (local_step / shard_name(0, 1)).exists()
    g = json.loads((tmp_path / "g" / step_name(2) / "MANIFEST.json").read_text())
    assert "tier" not in g and "host_of" not in g and g["step"] == 2 and g["identity"] == "x"
    plain = Checkpointer(CheckpointConfig(dir=tmp_path / "g", clean_abandoned=False))
    model, opt, sched = build(seed=9, steps=0)
    got = plain.restore(model=model, optimizer=opt, scheduler=sched, step=2)
    plain.close()
    assert got.step == 2 and state_hash(model, opt, sched) == expected_hash(2)


def test_four_nodes_restore_sends_a_node_only_the_shards_its_ranks_open(tmp_path):
    ldir = _dirs(tmp_path)[1]
    node1 = str(Path(ldir) / "node-1")
    gdir, ldir, _, got = _run(tmp_path, FOUR_NODES, [([], {}), ([("rmtree", node1)], {})], steps=(1, 2))
    _check(got[0], 2, "local")
    _check(got[1], 2, "partner")
    size = (_step_dir(ldir, 0, gdir, 2) / shard_name(0, 4)).stat().st_size
    # healthy: a rank opens its own shard and, where its share of the bytes crosses into it, the next one, which
    # its node holds as that shard's partner: nothing is sent (every shard a node lacks would be 2 a node);
    # node 1 replaced: it is sent the shards its rank opens, 1 from its partner copy on node 0 and 2 from node 2
    # (or its partner copy there), never 0 or 3
    assert sum(r["sent"] for r in got[0]) == 0
    assert 0 < sum(r["sent"] for r in got[1]) <= 2 * size
    node1 = {p.name for p in _step_dir(ldir, 1, gdir, 2).glob("*.shard")}
    assert shard_name(1, 4) in node1 and shard_name(0, 4) not in node1 and shard_name(3, 4) not in node1


@pytest.mark.parametrize("mode", ["fsdp", "hsdp"])
def test_sharded_state_through_the_tiers_exact(tmp_path, mode):
    """FSDP2 / HSDP state: the local tier, the partner copies of a wiped node, and the global copy made from the
    local files each restore the saved global values exactly into a fresh sharded model."""
    gdir, ldir = _dirs(tmp_path)
    res = run_world(tw.sharded, 4, gdir, ldir, mode, env=TWO_NODES, timeout=180).results
    saved = res[0]["saved"]
    assert res[0]["tiers"] == ["local", "local", "global"]
    for r in res:
        assert list(r["local"]) == [4, "local", saved[4]]
        assert list(r["partner"]) == [4, "partner", saved[4]]
        assert list(r["global"]) == [3, saved[3]]
    assert len(set(saved.values())) == 4  # the state changed between the saves: each check tells them apart


@pytest.mark.parametrize("world", [2, 3])
def test_local_tier_restores_at_another_world_size(tmp_path, world):
    """Saved by 4 ranks on 2 nodes; restored by 2 ranks on those 2 nodes, or by 3 ranks with a third, empty one
    (sent what its rank opens: still the local tier, every shard's own node holding it)."""
    gdir, ldir = _dirs(tmp_path)
    run_world(tw.save, 4, gdir, ldir, [1, 2, 3, 4], env=TWO_NODES, timeout=120)
    got = run_world(tw.restore, world, gdir, ldir, env=FOUR_NODES, timeout=120).results
    _check(got, 4, "local")
    assert all(r["global_step"] == 3 for r in got)
