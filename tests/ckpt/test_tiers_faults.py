"""Faults in the local tier: SIGKILL in a local save and in the partner exchange, local storage full."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.ckpt._format import MANIFEST, shard_name, step_name
from hpctrain.ckpt.tiers import SIM_NODES_ENV, TIER_FAULT_POINTS
from hpctrain.ckpt.tiers._nodes import tier_key
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
        {"agreement_timeout_s": 20.0},  # room for healthy steps on a loaded machine; SIGKILL closes the sockets
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


# ------------------------------------------------------------------------------------ damaged local files
# One saved tier set for the module (2 ranks, one per simulated node, each node holding the other's replica;
# steps 1, 2 local, 3 global, 4, 5 local), put back before each case; all cases restore in one launch (2 ranks:
# 4 on the 2 CI cores cost ~30x as much per restore). Every damage of a local file is a fallback to the next
# newest complete candidate (a partner copy, an older local step, the global tier) with one line naming the
# file, on every rank the same, and the state is exactly the one saved at that step.
ID = "id-A"
IDS = [ID, ""]  # as the Trainer passes it: the run identity on rank 0 only (the leaders' manifests differ in it)
GIB = 1 << 30


class P:
    """The paths of the tier set, as the cases name them."""

    def __init__(self, gdir: str, ldir: str) -> None:
        self.gdir, self.ldir = gdir, ldir
        self.key = tier_key(gdir, ID)

    def root(self, node: int) -> str:
        return str(Path(self.ldir) / f"node-{node}" / self.key)

    def step(self, node: int, step: int) -> str:
        return f"{self.root(node)}/{step_name(step)}"

    def m(self, node: int, step: int) -> str:
        return f"{self.step(node, step)}/{MANIFEST}"

    def sh(self, node: int, step: int, rank: int) -> str:
        return f"{self.step(node, step)}/{shard_name(rank, 2)}"


def _sealed(p: P, node: int, at: int, **fields):
    """Fields of node ``node``'s manifest of step ``at`` replaced, its checksum made to match."""
    return ("manifest", p.m(node, at), fields)


# (id, damage ops, (step, tier) restored, the files one line must name)
DAMAGES = [
    ("intact", lambda p: [], (5, "local"), lambda p: []),  # and no line about any file
    # node 0's manifest of step 5: node 1 holds both shards (its own and node 0's replica): step 5, rank 0's
    # shard from its partner copy
    ("manifest-garbage", lambda p: [("garbage", p.m(0, 5))], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-empty", lambda p: [("bytes", p.m(0, 5), b"")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-truncated", lambda p: [("truncate_to", p.m(0, 5), -1)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-list", lambda p: [("bytes", p.m(0, 5), b"[1, 2]")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-number", lambda p: [("bytes", p.m(0, 5), b"5")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-null", lambda p: [("bytes", p.m(0, 5), b"null")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-huge", lambda p: [("grow_to", p.m(0, 5), 65 << 20)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-dir", lambda p: [("dir", p.m(0, 5))], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-symlink", lambda p: [("symlink", p.m(0, 5), p.m(1, 5))], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("manifest-missing", lambda p: [("unlink", p.m(0, 5))], (5, "partner"), lambda p: [p.step(0, 5)]),
    # valid JSON, the content changed without its checksum: data_state says step 4 (a mix if it were loaded)
    (
        "manifest-unsealed-edit",
        lambda p: [("manifest", p.m(0, 5), {"data_state": {"step": 4}, "__sealed__": False})],
        (5, "partner"),
        lambda p: [p.m(0, 5)],
    ),
    # checksum made to match: the field checks reject them
    ("sealed-step-str", lambda p: [_sealed(p, 0, 5, step="5")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-step-negative", lambda p: [_sealed(p, 0, 5, step=-1)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-step-other", lambda p: [_sealed(p, 0, 5, step=4)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-step-float", lambda p: [_sealed(p, 0, 5, step=5.0)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-world-str", lambda p: [_sealed(p, 0, 5, world_size="4")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-shards-dict", lambda p: [_sealed(p, 0, 5, shards={})], (5, "partner"), lambda p: [p.m(0, 5)]),
    (
        "sealed-bytes-str",
        lambda p: [_sealed(p, 0, 5, **{"shards.0.bytes": "9"})],
        (5, "partner"),
        lambda p: [p.m(0, 5)],
    ),
    (
        "sealed-crc-negative",
        lambda p: [_sealed(p, 0, 5, **{"shards.1.crc32": -1})],
        (5, "partner"),
        lambda p: [p.m(0, 5)],
    ),
    ("sealed-host-of-number", lambda p: [_sealed(p, 0, 5, host_of=5)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-node-of-strs", lambda p: [_sealed(p, 0, 5, node_of=["a"] * 4)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-global-dir-list", lambda p: [_sealed(p, 0, 5, global_dir=[])], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-tier-key-other", lambda p: [_sealed(p, 0, 5, tier_key="x")], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-format-newer", lambda p: [_sealed(p, 0, 5, format_version=99)], (5, "partner"), lambda p: [p.m(0, 5)]),
    ("sealed-time-str", lambda p: [_sealed(p, 0, 5, time="x")], (5, "partner"), lambda p: [p.m(0, 5)]),
    # both manifests well formed, they differ (a crc32): which one is right cannot be told, the step is not used
    ("sealed-crc-differs", lambda p: [_sealed(p, 0, 5, **{"shards.0.crc32": 7})], (4, "local"), lambda p: [p.m(0, 5)]),
    # both nodes' manifests name shards that exist nowhere
    (
        "manifest-names-missing-shards",
        lambda p: [
            _sealed(
                p,
                n,
                5,
                world_size=8,
                shards=[{"file": shard_name(i, 8), "rank": i, "bytes": 64, "crc32": 0} for i in range(8)],
                host_of=["sim-node-0"] * 8,
                node_of=[0] * 8,
            )
            for n in (0, 1)
        ],
        (4, "local"),
        lambda p: [],
    ),
    ("manifest-node1-garbage", lambda p: [("garbage", p.m(1, 5))], (5, "partner"), lambda p: [p.m(1, 5)]),
    ("manifests-both", lambda p: [("garbage", p.m(0, 5)), ("bytes", p.m(1, 5), b"{}")], (4, "local"), None),
    (
        "manifests-both-steps",
        lambda p: [("garbage", p.m(n, s)) for n in (0, 1) for s in (4, 5)],
        (3, "global"),
        lambda p: [p.m(n, s) for n in (0, 1) for s in (4, 5)],
    ),
    # the step directory, the tier's directory
    ("step-dir-file", lambda p: [("file", p.step(0, 5))], (5, "partner"), lambda p: [p.step(0, 5)]),
    ("step-dir-symlink", lambda p: [("symlink", p.step(0, 5), p.step(1, 5))], (5, "partner"), lambda p: [p.step(0, 5)]),
    ("tier-root-file", lambda p: [("file", p.root(0))], (5, "partner"), lambda p: [p.root(0)]),
    # a newer step that is damaged or holds nothing, a save's leftover temporary: step 5 from the local tier
    (
        "newer-step-garbage-manifest",
        lambda p: [("mkdir", p.step(0, 6)), ("garbage", p.m(0, 6))],
        (5, "local"),
        lambda p: [p.m(0, 6)],
    ),
    (
        "newer-step-without-shards",
        lambda p: [("mkdir", p.step(0, 6)), ("manifest", p.m(0, 6), {"__from__": p.m(0, 5), "step": 6})],
        (5, "local"),
        lambda p: [],
    ),
    (
        "tmp-owner-garbage",
        lambda p: [
            ("mkdir", p.step(0, 6) + ".tmp-j1-r0-abc"),
            ("garbage", p.step(0, 6) + ".tmp-j1-r0-abc/.owner-r0.json"),
        ],
        (5, "local"),
        lambda p: [],
    ),
    # node 0's own copy of rank 0's shard of step 5: the partner copy on node 1 serves
    ("shard-flip", lambda p: [("flip", p.sh(0, 5, 0))], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-empty", lambda p: [("bytes", p.sh(0, 5, 0), b"")], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-truncated", lambda p: [("truncate_to", p.sh(0, 5, 0), -1)], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-huge", lambda p: [("grow_to", p.sh(0, 5, 0), GIB)], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-dir", lambda p: [("dir", p.sh(0, 5, 0))], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-symlink", lambda p: [("symlink", p.sh(0, 5, 0), p.sh(1, 5, 0))], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    ("shard-missing", lambda p: [("unlink", p.sh(0, 5, 0))], (5, "partner"), lambda p: [p.sh(0, 5, 0)]),
    # a replica damaged: the own copy serves
    ("replica-flip", lambda p: [("flip", p.sh(0, 5, 1))], (5, "local"), lambda p: [p.sh(0, 5, 1)]),
    # both copies of rank 0's shard of step 5: step 4, never a mix of 4 and 5
    (
        "shard-both-copies",
        lambda p: [("flip", p.sh(0, 5, 0)), ("truncate_to", p.sh(1, 5, 0), 100)],
        (4, "local"),
        lambda p: [p.sh(0, 5, 0), p.sh(1, 5, 0)],
    ),
]


@pytest.fixture(scope="module")
def tier_set(tmp_path_factory):
    """Steps 1..5 saved once through the tiers; (gdir, ldir, pristine copies) for the cases."""
    import shutil

    base = tmp_path_factory.mktemp("tiers")
    gdir, ldir = str(base / "global"), str(base / "local")
    run_world(tw.save, 2, gdir, ldir, [1, 2, 3, 4, 5], IDS, env=TWO_NODES, timeout=180)
    pristine = (str(base / "pristine-global"), str(base / "pristine-local"))
    shutil.copytree(gdir, pristine[0], symlinks=True)
    shutil.copytree(ldir, pristine[1], symlinks=True)
    return gdir, ldir, pristine


FUZZ_CASES = 24


def _fuzz_ops(p: P, pristine_local: str, seed: int):
    """Random byte flips and truncations of 1-6 random local tier files (manifests and shards of steps 4, 5)."""
    import random

    rng = random.Random(seed)
    files = sorted(f for f in Path(pristine_local).glob("node-*/*/step-*/*") if f.is_file())
    ops = []
    for f in rng.sample(files, rng.randint(1, 6)):
        rel = Path(p.ldir) / f.relative_to(pristine_local)
        size = f.stat().st_size
        if rng.random() < 0.7:
            ops += [("flip_at", str(rel), (rng.randrange(size), rng.randrange(8))) for _ in range(rng.randint(1, 3))]
        else:
            ops.append(("truncate_to", str(rel), rng.randrange(size)))
    return ops


@pytest.fixture(scope="module")
def damaged(tier_set):
    """Every case of DAMAGES and the fuzz, restored in one launch: {id: per-rank results}."""
    gdir, ldir, pristine = tier_set
    p = P(gdir, ldir)
    ids = [d[0] for d in DAMAGES] + [f"fuzz-{i}" for i in range(FUZZ_CASES)]
    cases = [d[1](p) for d in DAMAGES] + [_fuzz_ops(p, pristine[1], 28_000 + i) for i in range(FUZZ_CASES)]
    got = run_world(tw.damaged, 2, gdir, ldir, pristine, cases, IDS, env=TWO_NODES, timeout=400).results
    return p, {i: [r[k] for r in got] for k, i in enumerate(ids)}


def _exact(got, step: int, tier: str) -> None:
    for r in got:
        assert (r["step"], r["tier"]) == (step, tier), r["lines"]
        assert r["hash"] == expected_hash(step)  # bit-exact, never a mix of steps
        assert r["data_state"] == {"step": step}


@pytest.mark.parametrize("case", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_damaged_local_file_falls_back_with_one_line(damaged, case):
    name, _, (step, tier), named = case
    p, results = damaged
    got = results[name]
    _exact(got, step, tier)  # every rank the same choice, whichever saw the damage
    lines = [x for r in got for x in r["lines"]]
    assert not any("Traceback" in x or "\n" in x for x in lines), lines
    if name == "intact":
        assert not any("not used" in x for x in lines), lines
    for path in named(p) if named else []:
        naming = [x for x in lines if path + ":" in x or path + " " in x]
        assert len(naming) == 1, (path, lines)  # one line, on one rank, naming the file and what was wrong


def test_fuzzed_local_tier_restores_one_committed_state_exactly(damaged):
    _, results = damaged
    for i in range(FUZZ_CASES):
        got = results[f"fuzz-{i}"]
        assert len({(r["step"], r["tier"]) for r in got}) == 1, (i, [r["lines"] for r in got])
        step = got[0]["step"]
        assert step in (3, 4, 5), (i, got[0]["lines"])
        _exact(got, step, got[0]["tier"])
