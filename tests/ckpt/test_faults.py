"""Fault injection: SIGKILL at every protocol point, corrupted files, a full filesystem, retention across faults."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from hpctrain.ckpt import Checkpointer
from hpctrain.ckpt._commit import FAULT_POINTS
from hpctrain.ckpt._index import verify_dir
from hpctrain.ckpt._scan import scan
from hpctrain.errors import CheckpointFormatError, HpctrainError
from tests.ckpt import workers as w
from tests.multiproc import run_world

ROOT = Path(__file__).resolve().parents[2]

# rank that dies at each point: shard-writing points on a non-zero rank, publishing points on rank 0
KILLS = [(p, 1) for p in ("start", "before_write", "after_write", "after_fsync", "after_agree")] + [
    (p, 0) for p in ("after_agree", "after_manifest", "after_rename", "after_latest")
]


def statuses(d: Path):
    return {e.step: e.status for e in scan(d) if e.status != "deleting"}


@pytest.mark.parametrize("point,rank", KILLS, ids=[f"{p}-rank{r}" for p, r in KILLS])
def test_sigkill_at_any_protocol_point_leaves_old_or_new_committed_step(tmp_path, point, rank):
    assert point in FAULT_POINTS
    res = run_world(w.save_steps, 2, str(tmp_path), [1, 2], True, 2, f"{point}:{rank}", allow_failures=True, timeout=90)
    assert res.exitcodes[rank] == -9  # really killed
    # once every rank has reported a durable shard, rank 0 publishes even if that peer dies now
    published = point in ("after_rename", "after_latest") or (point, rank) == ("after_agree", 1)
    got = w.restore_hash(0, 1, str(tmp_path))  # a fresh process group of one (a different world size)
    assert got["step"] == (2 if published else 1)
    assert got["hash"] == w.expected_hash(got["step"])  # bit-exact, never a mix of steps
    assert got["quarantined"] == []
    for e in scan(tmp_path):
        if e.status == "committed":
            verify_dir(e.path)
    # the restore-side Checkpointer removed the abandoned tmp dir in the background
    ck = Checkpointer(w.cfg(str(tmp_path)))
    ck.join_gc()
    ck.close()
    assert set(statuses(tmp_path).values()) == {"committed"}


def _flip(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt(kind: str, ckpt: Path) -> str:
    shard = ckpt / "rank-00000-of-00001.shard"
    if kind == "flip":
        _flip(shard)
    elif kind == "truncate":
        shard.write_bytes(shard.read_bytes()[:-300])
    elif kind == "delete":
        shard.unlink()
    elif kind == "manifest":
        (ckpt / "MANIFEST.json").write_text('{"format": "hpctrain-ckpt", "step": ')
    elif kind == "header":  # same size, crc fixed up: only the header parse can catch it
        data = bytearray(shard.read_bytes())
        data[20:24] = b"\xff\xfe\x00{"
        shard.write_bytes(bytes(data))
        m = json.loads((ckpt / "MANIFEST.json").read_text())
        m["shards"][0]["crc32"] = zlib.crc32(bytes(data))
        (ckpt / "MANIFEST.json").write_text(json.dumps(m))
    return shard.name


@pytest.mark.parametrize("kind", ["flip", "truncate", "delete", "manifest", "header"])
def test_corrupted_newest_step_is_named_quarantined_and_restore_falls_back(tmp_path, kind, caplog):
    w.save_steps(0, 1, str(tmp_path), [1, 2])
    name = _corrupt(kind, tmp_path / "step-000000002")
    cli = subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert cli.returncode == 1
    assert "step-000000002" in cli.stdout and (name in cli.stdout or "MANIFEST" in cli.stdout)
    assert "step-000000001: OK" in cli.stdout
    got = w.restore_hash(0, 1, str(tmp_path))
    if kind == "manifest":  # no valid manifest: never a committed candidate, nothing to quarantine
        assert got["quarantined"] == []
    else:
        assert got["quarantined"] == [2]
        assert "CORRUPT" in caplog.text
        assert [e.status for e in scan(tmp_path) if e.step == 2] == ["quarantined"]
    assert got["step"] == 1 and got["hash"] == w.expected_hash(1)


def test_multi_rank_restore_agrees_on_fallback_when_one_rank_sees_corruption(tmp_path):
    run_world(w.save_steps, 2, str(tmp_path), [1, 2])
    _flip(tmp_path / "step-000000002" / "rank-00001-of-00002.shard")  # only rank 1 checksums this shard
    res = run_world(w.restore_hash, 2, str(tmp_path)).results
    assert [r["step"] for r in res] == [1, 1] and [r["quarantined"] for r in res] == [[2], [2]]
    assert {r["hash"] for r in res} == {w.expected_hash(1)}


def test_latest_pointing_at_missing_dir_is_ignored(tmp_path):
    w.save_steps(0, 1, str(tmp_path), [1, 2])
    (tmp_path / "LATEST").write_text("step-000000009\n")
    assert w.restore_hash(0, 1, str(tmp_path))["step"] == 2


def test_malicious_pickle_shard_is_never_executed(tmp_path):
    w.save_steps(0, 1, str(tmp_path), [1])
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = tmp_path / "step-000000001"
    shard = ckpt / "rank-00000-of-00001.shard"
    torch.save({"model": Evil()}, shard)  # a torch.save (pickle) file whose unpickling runs a command
    payload = shard.read_bytes()
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    m["shards"][0].update(bytes=len(payload), crc32=zlib.crc32(payload))  # a consistent, hostile checkpoint
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointFormatError, match="not an hpctrain shard"):
        verify_dir(ckpt)
    assert w.restore_hash(0, 1, str(tmp_path)) is None
    assert not marker.exists()
    # a header with the right magic that points outside the file, or names a non-tensor dtype
    from hpctrain.ckpt._format import encode_header

    for entry, msg in [({"offset": 1 << 40}, "past the end"), ({"dtype": "object"}, "unsupported dtype")]:
        e = {"key": "model/x", "dtype": "float32", "shape": [4], "start": 0, "stop": 4, "offset": 0, "nbytes": 16}
        e.update(entry)
        bad = tmp_path / "bad.shard"
        bad.write_bytes(encode_header({"entries": [e]}) + bytes(16))
        from hpctrain.ckpt._reader import read_header

        with pytest.raises(CheckpointFormatError, match=msg):
            read_header(bad)


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("precheck", [True, False])
def test_full_filesystem_fails_clearly_and_keeps_previous_checkpoint(tiny_fs, precheck):
    ck = Checkpointer(w.cfg(str(tiny_fs / "ck"), check_free_space=precheck, keep_last=5))
    model, opt, sched = w.build(1)
    ck.save(1, model=model, optimizer=opt, extra={"blob": torch.ones(200_000)})  # ~0.8 MB: fits
    with pytest.raises(HpctrainError) as exc:
        ck.save(2, model=model, optimizer=opt, extra={"blob": torch.ones(700_000)})  # ~2.8 MB: does not
    assert ("not enough free space" if precheck else "disk full") in str(exc.value)
    assert "\n" not in str(exc.value)
    ck.close()
    assert statuses(tiny_fs / "ck") == {1: "committed"}  # the tmp dir was removed, space given back
    verify_dir(tiny_fs / "ck" / "step-000000001")
    model2, opt2, _ = w.build(999, 0)
    res = Checkpointer(w.cfg(str(tiny_fs / "ck"))).restore(model=model2, optimizer=opt2)
    assert res.step == 1 and w.state_hash(model2, opt2) == w.state_hash(model, opt)


def test_async_writer_error_surfaces_on_next_call_and_step_is_never_committed(tmp_path, monkeypatch):
    ck = Checkpointer(w.cfg(str(tmp_path)))
    model, opt, sched = w.build(1)
    ck.save(1, model=model, optimizer=opt, blocking=False)
    ck.wait()
    monkeypatch.setenv("HPCTRAIN_CKPT_FAULT", "after_write:0:raise")
    assert ck.save(2, model=model, optimizer=opt, blocking=False) is None  # staged; the writer fails later
    with pytest.raises(HpctrainError, match="step 2 not committed.*injected fault"):
        ck.save(3, model=model, optimizer=opt, blocking=False)  # raises before starting step 3
    monkeypatch.delenv("HPCTRAIN_CKPT_FAULT")
    ck.save(3, model=model, optimizer=opt, blocking=False)  # the error was reported once; saving goes on
    ck.close()
    assert statuses(tmp_path) == {1: "committed", 3: "committed"}


def test_abandon_drops_in_flight_save_uncommitted(tmp_path, monkeypatch):
    ck = Checkpointer(w.cfg(str(tmp_path)))
    model, opt, _ = w.build(1)
    ck.save(1, model=model, optimizer=opt)
    monkeypatch.setenv("HPCTRAIN_CKPT_FAULT", "before_write:0:sleep1.0")
    ck.save(2, model=model, optimizer=opt, blocking=False)
    assert ck.in_flight
    assert ck.abandon() is True
    ck.close()
    assert statuses(tmp_path) == {1: "committed"}


def test_retention_keeps_exactly_last_k_and_every_n_across_faults(tmp_path):
    d = str(tmp_path)
    w.save_steps(0, 1, d, [1, 2, 3, 4, 5], keep_last=2)
    # a save killed half-way (abandoned tmp dir) and a quarantined step must not count as kept checkpoints
    res = run_world(w.save_steps, 1, d, [6], True, 6, "after_fsync:0", allow_failures=True, timeout=60)
    assert res.exitcodes == [-9]
    shutil.copytree(tmp_path / "step-000000005", tmp_path / "step-000000007")
    m = json.loads((tmp_path / "step-000000007" / "MANIFEST.json").read_text())
    (tmp_path / "step-000000007" / "MANIFEST.json").write_text(json.dumps({**m, "step": 7}))  # committed-looking
    _flip(tmp_path / "step-000000007" / "rank-00000-of-00001.shard")
    assert w.restore_hash(0, 1, d)["step"] == 5  # 7 quarantined
    ck = Checkpointer(w.cfg(d, keep_last=2, keep_every=4))
    model, opt, _ = w.build(8)
    for s in (8, 9, 10):
        ck.save(s, model=model, optimizer=opt, blocking=(s != 9))
    ck.close()
    st = statuses(tmp_path)
    # last 2 (9, 10) + every 4th (4, 8); 5 deleted; the abandoned 6 and quarantined 7 never counted
    assert {s for s, v in st.items() if v == "committed"} == {4, 8, 9, 10}
    assert [s for s, v in st.items() if v == "quarantined"] == [7]
    assert "abandoned" not in st.values()


def test_differently_shaped_state_across_ranks_is_refused_on_every_rank(tmp_path):
    res = run_world(w.save_mismatched, 2, str(tmp_path)).results
    assert all("differently shaped" in r and "not committed" in r for r in res), res
    assert statuses(tmp_path) == {}
