"""The login-node CLI (json output, exit codes, no torch import) and the public API surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpctrain.ckpt
from hpctrain.errors import UsageError
from tests.ckpt import workers as w

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def ckdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    w.save_steps(0, 1, str(d), [1, 2, 3])
    abandoned = d / "step-000000004.tmp-jlocal-r0-abc"
    abandoned.mkdir()  # a save abandoned two hours ago (no owner file, untouched since)
    os.utime(abandoned, (time.time() - 7200,) * 2)
    return d


def test_ls_json_and_table(ckdir):
    r = cli("ls", str(ckdir), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # one object: {"schema": ..., "checkpoints": [...]}
    assert doc["schema"] == "hpctrain.ckpt.ls/1"
    rows = doc["checkpoints"]
    assert [(x["step"], x["status"]) for x in rows] == [
        (1, "committed"),
        (2, "committed"),
        (3, "committed"),
        (4, "abandoned"),
    ]
    assert rows[0]["world_size"] == 1 and rows[0]["bytes"] > 1000 and rows[0]["run_id"] == "run-abc"
    table = cli("ls", str(ckdir))
    assert table.returncode == 0 and "committed" in table.stdout and "abandoned" in table.stdout


def test_verify_and_digest_json(ckdir):
    r = cli("verify", str(ckdir), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] and all(x["valid"] for x in doc["checkpoints"])
    d = json.loads(cli("digest", str(ckdir), "--step", "2", "--json").stdout)
    assert d["step"] == 2 and set(d["digests"]) == {"model", "optimizer", "scheduler", "extra", "data_state"}
    assert cli("digest", str(ckdir), "--step", "9").returncode == 1


def test_manifest_checksums_are_plain_crc32(ckdir):
    """Whichever crc32 implementation wrote the checkpoint (ISA-L when installed), the manifest holds
    the standard CRC-32 of each shard file, so a machine without ISA-L verifies it."""
    import zlib

    m = json.loads((ckdir / "step-000000002" / "MANIFEST.json").read_text())
    for s in m["shards"]:
        assert zlib.crc32((ckdir / "step-000000002" / s["file"]).read_bytes()) == s["crc32"]


def test_gc_keeps_newest_k_and_removes_abandoned(tmp_path):
    w.save_steps(0, 1, str(tmp_path), [1, 2, 3])
    abandoned = tmp_path / "step-000000004.tmp-jlocal-r0-abc"
    abandoned.mkdir()
    os.utime(abandoned, (time.time() - 7200,) * 2)
    dry = json.loads(cli("gc", str(tmp_path), "--keep", "1", "--dry-run", "--json").stdout)
    assert dry["would_delete"] == ["step-000000001", "step-000000002", "step-000000004.tmp-jlocal-r0-abc"]
    assert len(os.listdir(tmp_path)) == 5
    r = cli("gc", str(tmp_path), "--keep", "1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["kept"] == ["step-000000003"]
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "step-000000003"]


def test_bad_input_is_one_line_exit_2(tmp_path):
    r = cli("gc", str(tmp_path), "--keep", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--keep must be >= 1" in r.stderr
    r = cli("ls", str(tmp_path / "nope"))
    assert r.returncode == 2 and "is not a directory" in r.stderr
    r = cli("frobnicate", str(tmp_path))
    assert r.returncode == 2 and r.stderr.startswith("hpctrain ckpt: error:")


def test_cli_never_imports_torch(ckdir):
    code = (
        "import sys; from hpctrain.__main__ import main\n"
        f"for cmd in (['ls', {str(ckdir)!r}], ['verify', {str(ckdir)!r}], ['digest', {str(ckdir)!r}],"
        f" ['gc', {str(ckdir)!r}, '--keep', '5', '--dry-run']):\n"
        "    assert main(['ckpt', *cmd]) == 0\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr


def test_public_api_is_exported_and_config_errors_name_the_option(tmp_path):
    assert sorted(hpctrain.ckpt.__all__) == [
        "CheckpointConfig",
        "Checkpointer",
        "Entry",
        "RESTORE_PHASES",
        "RESTORE_TIERS",
        "RestoreResult",
        "committed",
        "digest",
        "latest_committed",
        "manifest_sha256",
        "meters",
        "read_index",
        "read_manifest",
        "replicated_share",
        "scan",
        "verify",
    ]
    for name in hpctrain.ckpt.__all__:
        assert getattr(hpctrain.ckpt, name) is not None
    for kw, needle in [
        ({"keep_last": -1}, "keep_last"),
        ({"keep_every": -2}, "keep_every"),
        ({"agreement_timeout_s": 0}, "agreement_timeout_s"),
        ({"free_space_margin": 0.5}, "free_space_margin"),
        ({"lustre_stripe": "-c -1"}, "lustre_stripe"),
        ({"restore_mode": "read_some"}, "restore_mode"),
        ({"restore_exchange": "nccl"}, "restore_exchange"),
    ]:
        with pytest.raises(UsageError, match=needle):
            hpctrain.ckpt.CheckpointConfig(dir=str(tmp_path), **kw)


LOGIN_API = (
    "Entry",
    "scan",
    "committed",
    "latest_committed",
    "read_manifest",
    "manifest_sha256",
    "verify",
    "read_index",
)


def test_login_api_reads_a_saved_checkpoint_without_torch(ckdir):
    """What other packages read a checkpoint directory with (approvals, bundle, capacity, report, run): the
    public login-side names, torch-free, on a saved checkpoint."""
    code = (
        "import hashlib, json, sys\n"
        "from pathlib import Path\n"
        f"from hpctrain.ckpt import {', '.join(LOGIN_API)}, digest\n"
        f"d = Path({str(ckdir)!r})\n"
        "entries = scan(d)\n"
        "assert all(isinstance(e, Entry) for e in entries)\n"
        "assert [(e.step, e.status) for e in entries] == [(1, 'committed'), (2, 'committed'), (3, 'committed'),"
        " (4, 'abandoned')], entries\n"
        "steps = committed(d)\n"
        "assert [e.step for e in steps] == [1, 2, 3] and committed(d / 'nope') == []\n"
        "latest = latest_committed(d)\n"
        "assert latest.step == 3 and latest.path == steps[-1].path and latest.world_size == 1\n"
        "step = steps[1].path\n"
        "m = read_manifest(step)\n"
        "assert m == verify(step) == verify(step, checksums=False) == steps[1].manifest\n"
        "assert manifest_sha256(step) == hashlib.sha256((step / 'MANIFEST.json').read_bytes()).hexdigest()\n"
        "index = read_index(step)\n"
        "assert index.manifest == m and any(k.startswith('model/') for k in index.tensors)\n"
        "assert set(digest(step)) == {'model', 'optimizer', 'scheduler', 'extra', 'data_state'}\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('torch', 'numpy')]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr


def test_login_api_names_a_damaged_checkpoint(tmp_path):
    from hpctrain.errors import CheckpointFormatError

    w.save_steps(0, 1, str(tmp_path), [1])
    step = hpctrain.ckpt.committed(tmp_path)[0].path
    shard = next(p for p in step.iterdir() if p.name != "MANIFEST.json")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last tensor byte: structure intact, checksum wrong
    shard.write_bytes(bytes(data))
    hpctrain.ckpt.verify(step, checksums=False)  # the structure still holds
    with pytest.raises(CheckpointFormatError, match="checksum mismatch"):
        hpctrain.ckpt.verify(step)
    (step / "MANIFEST.json").write_text("{")
    for read in (hpctrain.ckpt.read_manifest, hpctrain.ckpt.manifest_sha256, hpctrain.ckpt.read_index):
        with pytest.raises(CheckpointFormatError, match="MANIFEST.json"):
            read(step)
    assert hpctrain.ckpt.committed(tmp_path) == [] and hpctrain.ckpt.latest_committed(tmp_path) is None
    assert [e.status for e in hpctrain.ckpt.scan(tmp_path)] == ["incomplete"]


def test_save_rejects_unserialisable_state_without_writing(tmp_path):
    ck = hpctrain.ckpt.Checkpointer(w.cfg(str(tmp_path)))
    model, opt, _ = w.build(1)
    with pytest.raises(UsageError, match="data_state"):
        ck.save(1, model=model, data_state={"x": object()})
    with pytest.raises(UsageError, match="extra/fn.*never pickles"):
        ck.save(1, model=model, extra={"fn": object()})
    ck.close()
    assert os.listdir(tmp_path) == []
