"""The identity manifest: submit and start records, the identity hash (stable, and changed by exactly what
should change it), comparisons between attempts, ownership, and a login path without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.identity import (
    attempt_history,
    capture_start,
    capture_submit,
    current_identity,
    identity_hash,
    record_config,
)
from hpctrain.identity import manifest as mf
from hpctrain.identity.runtime import capture_runtime
from hpctrain.rundir import RunDir

from .conftest import fake_cfg

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_torch_probe(monkeypatch):
    """The node-side runtime without importing torch (tested on its own below)."""
    monkeypatch.setattr(
        mf, "capture_runtime", lambda node, hostnames=(), cuda=None: capture_runtime(node=False, hostnames=hostnames)
    )


def start(run_dir, restart, **kw):
    kw.setdefault("entry", "mypkg.train:main")
    kw.setdefault("world_size", 1)
    kw.setdefault("gpus_per_node", 0)
    return capture_start(run_dir, job_id="77", restart_count=restart, hostnames=["node1"], **kw)


def test_submit_record_is_written_once_with_the_code_snapshot(repo, tmp_path):
    run = tmp_path / "run"
    m = capture_submit(fake_cfg(owner="ada", team="vision", notes="baseline"), ["-m", "hpctrain.submit"], run)
    paths = RunDir(run)
    assert m["written"] and paths.identity_submit.exists() and paths.code_snapshot.exists()
    on_disk = json.loads(paths.identity_submit.read_text())
    assert on_disk["identity"] == m["identity"] == identity_hash(on_disk)
    assert on_disk["kind"] == "submit" and on_disk["schema"] == mf.SCHEMA
    assert on_disk["ownership"] == {"owner": "ada", "owner_source": "config", "team": "vision", "notes": "baseline"}
    assert on_disk["code"]["snapshot"]["path"] == "identity/code.tar.gz"
    assert on_disk["runtime"]["where"] == "login" and on_disk["runtime"]["torch"]["imported"] is False
    assert on_disk["config"]["entry"] == "mypkg.train:main" and on_disk["config"]["submit"]["owner"] == "ada"
    assert not any(k.startswith("_") for k in on_disk["code"]["repositories"]["entry"])
    # --resume: the first record and snapshot are kept; the new capture says what differs from it
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 3\n")
    snapshot = paths.code_snapshot.read_bytes()
    again = capture_submit(fake_cfg(), ["-m", "hpctrain.submit", "--resume", str(run)], run)
    assert not again["written"] and again["differs_from_first"] == ["code"] and again["first_identity"] == m["identity"]
    assert json.loads(paths.identity_submit.read_text()) == on_disk and paths.code_snapshot.read_bytes() == snapshot


def test_owner_defaults_to_the_user(repo, tmp_path, monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "bob")
    m = capture_submit(fake_cfg(), [], tmp_path / "run")
    assert m["ownership"] == {"owner": "bob", "owner_source": "user", "team": None, "notes": None}


def test_identity_is_stable_and_changes_with_config_or_code_but_not_with_place_time_or_owner(repo, tmp_path):
    a = capture_submit(fake_cfg(), [], tmp_path / "a")
    b = capture_submit(
        fake_cfg(job_name="other", time="02:00:00", owner="zed", run_dir="/x"), ["other"], tmp_path / "b"
    )
    assert a["identity"] == b["identity"]  # scheduling, names, paths, argv and owner are not the identity
    c = capture_submit(fake_cfg(entry_args=["--lr", "0.1"]), [], tmp_path / "c")
    assert c["identity"] != a["identity"] and c["identity_sections"]["code"] == a["identity_sections"]["code"]
    d = capture_submit(fake_cfg(nodes=2), [], tmp_path / "d")
    assert d["identity"] != a["identity"]  # the world size is
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 9\n")
    e = capture_submit(fake_cfg(), [], tmp_path / "e")
    assert e["identity"] != a["identity"] and e["identity_sections"]["config"] == a["identity_sections"]["config"]
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 1\n")  # back as committed
    assert capture_submit(fake_cfg(), [], tmp_path / "f")["identity"] == a["identity"]
    (repo / "untracked.py").write_text("")
    assert capture_submit(fake_cfg(), [], tmp_path / "g")["identity"] != a["identity"]


def test_start_records_each_attempt_and_compares_with_the_previous(repo, tmp_path):
    run = tmp_path / "run"
    capture_submit(fake_cfg(), [], run)
    first = start(run, 0)
    paths = RunDir(run)
    assert paths.identity_attempt("77", 0).exists() and first["kind"] == "attempt"
    assert first["code"]["vs_submit"] == {"same": True, "differences": []}
    assert first["previous"]["attempt"] is None and first["attempt"]["hostnames"] == ["node1"]
    assert first["identity"] == identity_hash(json.loads(paths.identity_attempt("77", 0).read_text()))
    second = start(run, 1)  # a requeue, nothing changed
    assert second["identity"] == first["identity"]
    assert second["previous"] == {"attempt": "77-r0", "identity": first["identity"], "changed": [], "details": []}
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 5\n")  # someone edits between attempts
    third = start(run, 2)
    assert third["identity"] != first["identity"] and third["previous"]["changed"] == ["code"]
    assert third["previous"]["details"] == ["entry uncommitted changes differ"]
    assert third["code"]["vs_submit"]["same"] is False
    assert paths.identity_submit.exists() and json.loads(paths.identity_submit.read_text())["kind"] == "submit"
    history = attempt_history(run)
    assert [h["attempt"] for h in history] == ["77-r0", "77-r1", "77-r2"]
    assert [h["changed"] for h in history] == [[], [], ["code"]]
    ident = current_identity(run, "77", 2)
    assert ident.identity == third["identity"] and ident.changed == ("code",) and ident.previous_attempt == "77-r1"
    assert ident.as_record()["identity_changed"] == ["code"]


def test_start_reuses_the_submitted_code_when_the_entry_is_not_visible(repo, tmp_path):
    run = tmp_path / "run"
    sub = capture_submit(fake_cfg(), [], run)
    m = start(run, 0, entry="not_on_this_node.train:main")
    assert "not visible from this node" in m["code"]["reused_from_submit"]
    assert m["code"]["repositories"]["entry"]["commit"] == sub["code"]["repositories"]["entry"]["commit"]
    assert m["identity_sections"]["code"] == sub["identity_sections"]["code"]


def test_train_config_and_seed_join_the_identity_without_a_false_change(repo, tmp_path):
    run = tmp_path / "run"
    start(run, 0)
    a = record_config(run, "77", 0, train={"steps": 100, "lr": 3e-4, "fn": print}, seed=1)
    rec = json.loads(RunDir(run).identity_attempt("77", 0).read_text())
    assert rec["config"]["train"]["steps"] == 100 and isinstance(rec["config"]["train"]["fn"], str)
    m = start(run, 1)  # before the Trainer records its config: not a change
    assert m["previous"]["changed"] == []
    b = record_config(run, "77", 1, train={"steps": 100, "lr": 3e-4, "fn": print}, seed=1)
    assert b.identity == a.identity and b.changed == ()
    start(run, 2)
    c = record_config(run, "77", 2, train={"steps": 100, "lr": 1e-3, "fn": print}, seed=1)
    assert c.identity != a.identity and c.changed == ("config",) and any("lr" in d for d in c.details)


def test_node_runtime_records_gpus_through_the_cuda_seam():
    from hpctrain.testing import FakeCuda

    rt = capture_runtime(node=True, hostnames=["n1", "n2"], cuda=FakeCuda(count=2, uuids=["GPU-a", "GPU-b"]))
    assert rt["torch"]["version"] and rt["torch"]["cuda_available"] is True
    assert [g["uuid"] for g in rt["torch"]["gpus"]] == ["GPU-a", "GPU-b"]
    assert rt["hostnames"] == ["n1", "n2"] and rt["where"] == "node"
    assert mf.runtime_essentials(rt) == mf.runtime_essentials(capture_runtime(node=False))  # same venv, same essentials


def test_runtime_records_modules_container_and_every_slurm_variable(monkeypatch):
    monkeypatch.setenv("LOADEDMODULES", "gcc/12:cuda/12.4:nccl/2.21")
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("APPTAINER_NAME", "torch.sif")
    rt = capture_runtime(node=False)
    assert rt["modules"] == ["gcc/12", "cuda/12.4", "nccl/2.21"]
    assert rt["slurm"]["SLURM_JOB_ID"] == "123" and rt["slurm"]["SLURM_JOB_NODELIST"] == "node[1-2]"
    assert rt["container"]["APPTAINER_NAME"] == "torch.sif"
    assert rt["distributions"]["h5py"] and rt["cpu"]["count"] >= 1
    monkeypatch.setenv("SLURM_JOB_ID", "456")  # Slurm ids are recorded, never part of the identity
    assert mf.runtime_essentials(capture_runtime(node=False)) == mf.runtime_essentials(rt)


def test_capture_submit_does_not_import_torch_or_numpy(repo, tmp_path):
    code = (
        "import sys; sys.path.insert(0, {repo!r});"
        "from hpctrain.identity import capture_submit; from hpctrain.submit.config import SubmitConfig;"
        "capture_submit(SubmitConfig(entry='mypkg.train:main'), [], {run!r});"
        "print(sorted(m for m in ('torch', 'numpy', 'h5py') if m in sys.modules))"
    ).format(repo=str(repo), run=str(tmp_path / "run"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _retar(src: Path, dst: Path, change=None) -> None:
    """Rewrite a snapshot tar.gz member by member (new times; ``change(name, data)`` may edit a file)."""
    import io
    import tarfile

    with tarfile.open(src, "r:gz") as a, tarfile.open(dst, "w:gz") as b:
        for m in a.getmembers():
            data = a.extractfile(m).read() if m.isreg() else None
            if data is not None and change is not None:
                data = change(m.name, data)
                m.size = len(data)
            m.mtime += 1000
            b.addfile(m, io.BytesIO(data) if data is not None else None)


def test_the_identity_binds_the_code_snapshots_content(repo, tmp_path):
    """Issue 28 group 3: an edit inside the snapshot (a committed file) is a different identity."""
    run = tmp_path / "run"
    m = capture_submit(fake_cfg(), [], run)
    paths = RunDir(run)
    snap = m["code"]["snapshot"]
    assert m["identity_format"] == mf.IDENTITY_FORMAT == 2
    digest = mf.snapshot_digest(paths.code_snapshot)
    assert snap["content_sha256"] == digest["content_sha256"] and snap["sha256"] == digest["sha256"]
    # the same content archived again (other times): the same content hash, other bytes
    _retar(paths.code_snapshot, tmp_path / "again.tar.gz")
    again = mf.snapshot_digest(tmp_path / "again.tar.gz")
    assert again["content_sha256"] == digest["content_sha256"] and again["sha256"] != digest["sha256"]
    # a committed file edited inside: another content hash, and another identity for the record that binds it
    _retar(paths.code_snapshot, tmp_path / "edited.tar.gz", lambda n, d: d.replace(b"return 1", b"return 7"))
    edited = mf.snapshot_digest(tmp_path / "edited.tar.gz")
    assert edited["content_sha256"] != digest["content_sha256"]
    rec = json.loads(paths.identity_submit.read_text())
    rec["code"]["snapshot"].update(sha256=edited["sha256"], content_sha256=edited["content_sha256"])
    assert identity_hash(rec) != m["identity"]
    # every attempt binds the submitted snapshot (what reproduce rebuilds)
    first = start(run, 0)
    assert first["code"]["snapshot"] == snap and first["identity_format"] == 2


def test_format_1_records_keep_their_identity_and_unknown_formats_are_refused(repo, tmp_path):
    m = capture_submit(fake_cfg(), [], tmp_path / "run")
    old = {k: v for k, v in m.items() if k != "identity_format"}
    old["code"] = {k: v for k, v in m["code"].items() if k != "snapshot"}
    legacy = mf._sha({"schema": mf.SCHEMA, "sections": mf.section_digests(old, 1)})
    assert identity_hash(old) == legacy  # a record written before format 2 recomputes to what it recorded
    old["code"]["snapshot"] = {"sha256": "0" * 64, "content_sha256": "1" * 64}
    assert identity_hash(old) == legacy  # format 1 never bound the snapshot
    assert identity_hash(dict(old, identity_format=2)) != legacy  # a downgrade or upgrade is another identity
    for bad in (3, 0, "2", True, None):
        with pytest.raises(ValueError, match="identity format"):
            identity_hash(dict(old, identity_format=bad))


def test_an_upgrade_between_attempts_is_not_a_code_change(repo, tmp_path):
    run = tmp_path / "run"
    capture_submit(fake_cfg(), [], run)
    first = start(run, 0)
    path = RunDir(run).identity_attempt("77", 0)
    rec = json.loads(path.read_text())
    rec.pop("identity_format")  # as an hpctrain before format 2 wrote it
    rec["identity"] = identity_hash(rec)
    path.write_text(json.dumps(rec))
    second = start(run, 1)
    assert second["identity"] != rec["identity"] == identity_hash(rec) and first["identity"] == second["identity"]
    assert second["previous"]["changed"] == []


def test_snapshot_digest_refuses_what_is_not_a_snapshot(tmp_path):
    (tmp_path / "x.tar.gz").write_bytes(b"not gzip at all")
    with pytest.raises(mf.SnapshotUnreadable, match="not a readable code snapshot"):
        mf.snapshot_digest(tmp_path / "x.tar.gz")
    import gzip

    (tmp_path / "big.tar.gz").write_bytes(gzip.compress(b"\0" * 4096))  # an empty tar: no members
    assert mf.snapshot_digest(tmp_path / "big.tar.gz")["members"] == 0
    _retar_src = tmp_path / "one.tar.gz"
    import io
    import tarfile

    with tarfile.open(_retar_src, "w:gz") as tf:
        info = tarfile.TarInfo("entry/tree/zeros.bin")
        info.size = 1 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    with pytest.raises(mf.SnapshotUnreadable, match="unpacks to more than 4096 bytes"):
        mf.snapshot_digest(_retar_src, limit=4096)  # a bound on what it reads, decided at the member's header
