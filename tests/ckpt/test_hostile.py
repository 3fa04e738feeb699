"""Hostile and unlucky inputs: re-saves killed between renames, gc next to a live save, crafted headers
and manifests, special files, planted symlinks. Each test is a regression test for a failure seen."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpctrain._atomic import atomic_write_text
from hpctrain.ckpt import Checkpointer
from hpctrain.ckpt._index import verify_dir
from hpctrain.ckpt._scan import scan
from hpctrain.errors import CheckpointFormatError, HpctrainError
from tests.ckpt import damage
from tests.ckpt import workers as w
from tests.multiproc import run_world

ROOT = Path(__file__).resolve().parents[2]
STEP1, STEP2 = "step-000000001", "step-000000002"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=timeout,
    )


def statuses(d: Path):
    return {e.name: e.status for e in scan(d)}


# ---------------------------------------------------------------- re-saving a step (issue 8 #2)
@pytest.mark.parametrize("point,kept_seed", [("after_move_aside", 1), ("after_rename", 2)])
def test_resave_killed_between_or_after_its_renames_keeps_one_committed_copy(tmp_path, point, kept_seed):
    assert w.save_one(0, 1, str(tmp_path), 5, seed=1) == "ok"
    res = run_world(w.save_one, 1, str(tmp_path), 5, 2, f"{point}:0", allow_failures=True, timeout=60)
    assert res.exitcodes == [-9]
    if point == "after_move_aside":  # the moment with no step-5: only the aside copy exists
        assert [s for s in statuses(tmp_path).values() if s != "abandoned"] == ["replaced"]
    ck = Checkpointer(w.cfg(str(tmp_path)))  # its start-up puts the previous copy back, or drops it
    model, opt, sched = w.build(999, 0)
    got = ck.restore(model=model, optimizer=opt, scheduler=sched)
    ck.close()
    assert got.step == 5 and w.state_hash(model, opt, sched) == w.expected_hash(kept_seed)
    assert [s for s in statuses(tmp_path).values()] == ["committed"]


# ---------------------------------------------------------------- gc next to a live save (issue 8 #3)
def test_gc_during_a_live_save_skips_its_tmp_dir_and_the_save_commits(tmp_path):
    w.save_steps(0, 1, str(tmp_path), [1])
    code = (
        "from tests.ckpt import workers as w; import sys;"
        f"print(w.save_steps(0, 1, {str(tmp_path)!r}, [2], True, 2, 'after_fsync:0:sleep6'))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    saver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not any(s == "in-progress" for s in statuses(tmp_path).values()):
            assert time.time() < deadline and saver.poll() is None, "the save never started"
            time.sleep(0.1)
        time.sleep(0.5)  # the shard is written and fsynced; the saver sleeps before the agreement
        r = cli("gc", str(tmp_path), "--keep", "1", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["deleted"] == [] and [s["name"] for s in out["skipped"]] == [
            n for n, s in statuses(tmp_path).items() if s == "in-progress"
        ]
        assert (
            str(os.getpid()) not in out["skipped"][0]["reason"] and socket.gethostname() in out["skipped"][0]["reason"]
        )
        stdout, _ = saver.communicate(timeout=60)
    finally:
        saver.kill()
    assert "ok 2" in stdout
    assert statuses(tmp_path) == {STEP1: "committed", STEP2: "committed"}


def test_gc_removes_tmp_dirs_of_dead_writers_and_stale_ones_and_says_what_it_skipped(tmp_path):
    w.save_steps(0, 1, str(tmp_path), [1])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owners = {
        "step-000000002.tmp-j1-r0-aa-1": {"host": socket.gethostname(), "pid": int(dead.stdout)},  # gone
        "step-000000003.tmp-j1-r0-bb-1": {"host": "another-node", "pid": 1},  # cannot tell: fresh, kept
        "step-000000004.tmp-j1-r0-cc-1": {"host": socket.gethostname(), "pid": os.getpid()},  # alive
    }
    for name, rec in owners.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / ".owner-r0.json").write_text(json.dumps(rec))
    stale = tmp_path / ".LATEST.tmp-123-0123abcd"  # a killed atomic write
    stale.write_text("step-000000009\n")
    fresh = tmp_path / ".LATEST.tmp-456-89abcdef"
    fresh.write_text("step-000000009\n")
    os.utime(stale, (time.time() - 7200,) * 2)
    out = json.loads(cli("gc", str(tmp_path), "--keep", "1", "--json").stdout)
    assert out["deleted"] == [".LATEST.tmp-123-0123abcd", "step-000000002.tmp-j1-r0-aa-1"]
    assert sorted(s["name"] for s in out["skipped"]) == [
        "step-000000003.tmp-j1-r0-bb-1",
        "step-000000004.tmp-j1-r0-cc-1",
    ]
    assert fresh.exists() and not stale.exists()
    out = json.loads(cli("gc", str(tmp_path), "--keep", "1", "--older-than", "0", "--json").stdout)
    assert out["deleted"] == [
        ".LATEST.tmp-456-89abcdef",
        "step-000000003.tmp-j1-r0-bb-1",
        "step-000000004.tmp-j1-r0-cc-1",
    ]
    assert sorted(os.listdir(tmp_path)) == ["LATEST", STEP1]


def test_a_checkpointer_removes_tmp_dirs_of_its_own_jobs_earlier_restarts(tmp_path, monkeypatch):
    w.save_steps(0, 1, str(tmp_path), [1])
    (tmp_path / "step-000000002.tmp-j77-r0-aa-1").mkdir()  # restart 0 of job 77, on another node
    (tmp_path / "step-000000002.tmp-j77-r0-aa-1" / ".owner-r0.json").write_text('{"host": "n9", "pid": 1}')
    (tmp_path / "step-000000002.tmp-j78-r0-bb-1").mkdir()  # another job's save: may be live
    slurm = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    slurm.update(SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="1")
    for k, v in slurm.items():  # restart 1 of job 77 (the job id and restart count come from hpctrain.runtime)
        monkeypatch.setenv(k, v)
    ck = Checkpointer(w.cfg(str(tmp_path)))
    ck.join_gc()
    ck.close()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("step")) == [STEP1, "step-000000002.tmp-j78-r0-bb-1"]


# ---------------------------------------------------------------- crafted shard contents (issue 8 #5)
def _two_steps(d: Path) -> None:
    w.save_steps(0, 1, str(d), [1, 2])


CRAFTED = {
    "missing tensor": lambda h: h["trees"]["model"].update({"fc1.weight": {"__tensor__": "nope"}}),
    "trees not a dict": lambda h: h.update(trees=[1, 2]),
    "no trees": lambda h: h.pop("trees"),
    "deep tree": lambda h: h["trees"].update(extra=damage.nested(300)),
    # flat entries: the header's rest is depth-checked as a tree; a nested entry: the whole text is
    "deep local state": lambda h: h["local"].update(extra=damage.nested(300)),
    "deep field beside the entries": lambda h: h.update(note=damage.nested(300)),
    "deep entry field": lambda h: h["entries"][0].update(shape=damage.nested(300)),
    "dict pair not a pair": lambda h: h["trees"].update(extra={"__dict__": [[1, 2, 3]]}),
    "unhashable key": lambda h: h["trees"].update(extra={"__dict__": [[{"a": 1}, 2]]}),
    "tuple not a list": lambda h: h["trees"].update(extra={"__tuple__": 7}),
    "bf16 as numpy": lambda h: h["trees"]["model"].update({"bf": {"__tensor__": "model/bf", "as": "numpy"}}),
    "entry wrong types": lambda h: h["entries"][0].update(start="0"),
    "entry bool shape": lambda h: h["entries"][0].update(shape=[True]),
    "absurd shape": lambda h: h["entries"][0].update(shape=[1 << 40, 1 << 40]),
    "pieces do not tile": lambda h: h["entries"][1].update(stop=h["entries"][1]["stop"] - 1, nbytes=0),
    "duplicate piece": lambda h: h["entries"].append(dict(h["entries"][0])),
    "entries not a list": lambda h: h.update(entries={"a": 1}),
    "header not a dict": lambda h: [h],
    "header of another step": lambda h: h.update(step=1),
    "local not a dict": lambda h: h.update(local=[1]),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_restore_quarantines_crafted_step_falls_back_and_verify_agrees(tmp_path, kind):
    _two_steps(tmp_path)
    damage.rewrite_shard(tmp_path / STEP2, 0, CRAFTED[kind])
    with pytest.raises(CheckpointFormatError):
        verify_dir(tmp_path / STEP2)
    r = cli("verify", str(tmp_path))
    assert r.returncode == 1 and f"{STEP2}: INVALID" in r.stdout and f"{STEP1}: OK" in r.stdout, r.stdout
    got = w.restore_hash(0, 1, str(tmp_path))
    assert got["step"] == 1 and got["quarantined"] == [2] and got["hash"] == w.expected_hash(1)


def test_malformed_rng_state_is_skipped_not_raised(tmp_path, caplog):
    _two_steps(tmp_path)
    damage.rewrite_shard(tmp_path / STEP2, 0, lambda h: h["local"]["rng"].update(python=[1, 2], numpy="x"))
    verify_dir(tmp_path / STEP2)  # structurally sound: restore loads it too
    got = w.restore_hash(0, 1, str(tmp_path))
    assert got["step"] == 2 and got["hash"] == w.expected_hash(2) and got["rng_restored"] is False
    assert "python (malformed state)" in caplog.text and "numpy (malformed state)" in caplog.text


def test_a_checkpoint_that_does_not_fit_the_model_leaves_it_untouched(tmp_path):
    _two_steps(tmp_path)
    m, _, _ = w.build(5)
    ck = Checkpointer(w.cfg(str(tmp_path)))
    # shapes: fc2 saved as [4, 33]; give the model a different fc2 after fc1 (which would load first)
    m.fc2 = torch.nn.Linear(33, 5)
    before = w.state_hash(m)
    with pytest.raises(HpctrainError, match="does not fit the model.*fc2.weight has global shape"):
        ck.restore(model=m)
    assert w.state_hash(m) == before

    # a saved tensor of the wrong kind of dtype (crafted): refused before anything is loaded
    def as_int32(h):
        for e in h["entries"]:
            if e["key"] == "model/fc2.bias":
                e["dtype"] = "int32"  # same element size: the piece still fits its bytes

    damage.rewrite_shard(tmp_path / STEP2, 0, as_int32)
    m2, o2, s2 = w.build(5)
    before = w.state_hash(m2, o2, s2)
    with pytest.raises(HpctrainError, match="fc2.bias is torch.int32 saved"):
        ck.restore(model=m2, optimizer=o2, scheduler=s2, step=2)
    assert w.state_hash(m2, o2, s2) == before
    ck.close()


# ---------------------------------------------------------------- malformed manifests (issue 8 #6)
MANIFESTS = {
    "bool world size": lambda m: m.update(world_size=True),
    "negative bytes": lambda m: m["shards"][0].update(bytes=-1),
    "huge world size": lambda m: m.update(world_size=10**12),
    "shards not records": lambda m: m.update(shards=[1]),
    "file outside the dir": lambda m: m["shards"][0].update(file="../step-000000001/rank-00000-of-00001.shard"),
    "time a string": lambda m: m.update(time="yesterday"),
    "time a 400-digit int": lambda m: m.update(time=10**400),
    "step a float": lambda m: m.update(step=2.0),
    "deep nesting": lambda m: m.update(data_state=damage.nested(300)),
    "deeper than the parser": lambda m: "[" * 100_000 + "]" * 100_000,
    "not an object": lambda m: [m],
}


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_one_malformed_manifest_hides_no_other_step(tmp_path, kind):
    _two_steps(tmp_path)
    m = damage.manifest(tmp_path / STEP2)
    new = MANIFESTS[kind](m)
    text = new if isinstance(new, str) else json.dumps(m if new is None else new)
    (tmp_path / STEP2 / "MANIFEST.json").write_text(text)
    _assert_step2_bad_step1_good(tmp_path)


def test_a_2gb_sparse_manifest_is_refused_without_reading_it(tmp_path):
    _two_steps(tmp_path)
    with open(tmp_path / STEP2 / "MANIFEST.json", "r+b") as f:
        f.truncate(2 << 30)
    t0 = time.perf_counter()
    _assert_step2_bad_step1_good(tmp_path)
    assert time.perf_counter() - t0 < 30


def _assert_step2_bad_step1_good(d: Path) -> None:
    rows = {r["name"]: r for r in json.loads(cli("ls", str(d), "--json").stdout)["checkpoints"]}
    assert rows[STEP1]["status"] == "committed" and rows[STEP2]["status"] == "incomplete"
    r = cli("verify", str(d))
    assert r.returncode == 1 and f"{STEP1}: OK" in r.stdout and f"{STEP2}: INVALID" in r.stdout
    assert r.stderr == ""
    assert json.loads(cli("digest", str(d), "--json").stdout)["step"] == 1
    assert cli("gc", str(d), "--keep", "5", "--dry-run").returncode == 0
    assert w.restore_hash(0, 1, str(d))["step"] == 1


# ---------------------------------------------------------------- special files (issue 8 #7)
@pytest.mark.parametrize("what", ["shard", "manifest"])
@pytest.mark.parametrize("special", ["fifo", "symlink", "dir"])
def test_fifo_symlink_or_dir_in_place_of_a_file_is_an_error_not_a_hang(tmp_path, what, special):
    _two_steps(tmp_path)
    target = tmp_path / STEP2 / ("rank-00000-of-00001.shard" if what == "shard" else "MANIFEST.json")
    keep = target.read_bytes()
    target.unlink()
    if special == "fifo":
        os.mkfifo(target)
    elif special == "symlink":
        (tmp_path / "elsewhere").write_bytes(keep)  # same bytes, but outside the step dir
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.mkdir()
    for cmd in (["ls"], ["verify"], ["digest"], ["gc", "--keep", "5", "--dry-run"]):
        r = cli(*cmd, str(tmp_path), timeout=30)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (cmd, r.stderr)
    assert f"{STEP2}: INVALID" in cli("verify", str(tmp_path), timeout=30).stdout
    got = w.restore_hash(0, 1, str(tmp_path))
    assert got["step"] == 1


def test_symlinked_step_dir_is_not_a_checkpoint(tmp_path):
    _two_steps(tmp_path)
    os.rename(tmp_path / STEP2, tmp_path / "elsewhere")
    (tmp_path / STEP2).symlink_to(tmp_path / "elsewhere")
    assert STEP2 not in statuses(tmp_path)
    assert w.restore_hash(0, 1, str(tmp_path))["step"] == 1


# ---------------------------------------------------------------- planted symlinks (issue 8 #8)
def test_a_symlink_planted_at_the_tmp_name_never_redirects_a_durable_write(tmp_path, monkeypatch):
    import secrets

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setattr(secrets, "token_hex", lambda n=8: "0" * (2 * n))  # make the name guessable
    (tmp_path / f".LATEST.tmp-{os.getpid()}-{'0' * 16}").symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic_write_text(tmp_path / "LATEST", "step-000000001\n")
    assert victim.read_text() == "precious\n" and not (tmp_path / "LATEST").exists()
    monkeypatch.undo()
    atomic_write_text(tmp_path / "LATEST", "step-000000001\n")  # unpredictable names: nothing planted there
    assert (tmp_path / "LATEST").read_text() == "step-000000001\n"


def test_rng_state_with_a_position_past_the_key_array_is_skipped():
    from hpctrain.ckpt._state import capture_rng, restore_rng

    state = capture_rng()
    name, keys, _, has_gauss, cached = state["numpy"]
    state["numpy"] = [name, keys[:623], 623, has_gauss, cached]  # numpy raises IndexError for this one
    assert restore_rng(state) == ["numpy (malformed state)"]
