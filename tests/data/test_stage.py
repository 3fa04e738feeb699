"""Node-local staging, the node side (hpctrain.data.stage): copy, verify, reuse, refetch a damaged copy, atomicity,
and the loader's and the identity's view of the copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.data import make_dataset, stage
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "nodeA")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv("HPCTRAIN_STAGE_RUN_DIR", raising=False)
    stage._CACHE.clear()
    stage._SAID.clear()


@pytest.fixture()
def data(tmp_path):
    src = tmp_path / "shared" / "train.h5"
    src.parent.mkdir()
    make_dataset(str(src), samples=600, shape=(16,), chunk_samples=64)
    return src


def run(src, tmp_path, **kw):
    return stage.stage([str(src)], run_dir=tmp_path / "run", stage_dir=str(tmp_path / "local"), **kw)


def test_copy_is_verified_recorded_and_keeps_the_base_name(data, tmp_path):
    rec = run(data, tmp_path)
    (entry,) = rec["files"]
    local = Path(entry["local"])
    assert local.name == "train.h5" and local.read_bytes() == data.read_bytes()
    assert not entry["reused"] and rec["bytes_copied"] == data.stat().st_size and rec["verified"]
    assert "/nodeA/" in str(local) and str(local).startswith(str(tmp_path / "local"))
    saved = json.loads(RunDir(tmp_path / "run").stage_record("7", 0, "nodeA").read_text())
    assert saved["files"] == rec["files"] and saved["copy_seconds"] >= 0
    # the copy has the source's fingerprint essentials (name, size, structure, sampled content)
    assert stage._essentials(str(local)) == stage._essentials(str(data))


def test_a_second_attempt_reuses_the_verified_copy(data, tmp_path, capsys):
    first = run(data, tmp_path)
    mtime = os.stat(first["files"][0]["local"]).st_mtime_ns
    again = run(data, tmp_path, restart_count=1)
    assert again["files"][0]["reused"] and again["bytes_copied"] == 0 and again["bytes_reused"] > 0
    assert os.stat(again["files"][0]["local"]).st_mtime_ns == mtime  # not rewritten
    assert RunDir(tmp_path / "run").stage_record("7", 1, "nodeA").exists()


@pytest.mark.parametrize("verify", ["full", "sample"])
def test_a_truncated_copy_is_refetched(data, tmp_path, capsys, verify):
    local = Path(run(data, tmp_path)["files"][0]["local"])
    os.chmod(local, 0o644)
    with open(local, "r+b") as f:
        f.truncate(local.stat().st_size - 100)
    rec = run(data, tmp_path, verify=verify)
    assert not rec["files"][0]["reused"] and local.read_bytes() == data.read_bytes()
    assert "failed verification (size" in capsys.readouterr().out


def test_a_flipped_byte_anywhere_is_refetched_with_the_full_check(data, tmp_path, capsys):
    local = Path(run(data, tmp_path)["files"][0]["local"])
    os.chmod(local, 0o644)
    raw = bytearray(local.read_bytes())
    raw[len(raw) // 2 + 7] ^= 0xFF  # size unchanged
    local.write_bytes(bytes(raw))
    rec = run(data, tmp_path)
    assert not rec["files"][0]["reused"] and local.read_bytes() == data.read_bytes()
    out = capsys.readouterr().out
    assert out.count("failed verification (sha256") == 1, out


def test_a_changed_source_is_fetched_again(data, tmp_path, capsys):
    run(data, tmp_path)
    make_dataset(str(data), samples=700, shape=(16,), chunk_samples=64)
    rec = run(data, tmp_path)
    assert not rec["files"][0]["reused"] and Path(rec["files"][0]["local"]).read_bytes() == data.read_bytes()
    assert "changed since it was staged" in capsys.readouterr().out


def test_a_directory_is_staged_file_by_file(tmp_path):
    src = tmp_path / "shared" / "ds"
    (src / "sub").mkdir(parents=True)
    make_dataset(str(src / "a.h5"), samples=200, shape=(8,))
    (src / "sub" / "labels.txt").write_text("x" * 5000)
    rec = stage.stage([str(src)], run_dir=tmp_path / "run", stage_dir=str(tmp_path / "local"))
    locals_ = sorted(Path(e["local"]) for e in rec["files"])
    assert [p.name for p in locals_] == ["a.h5", "labels.txt"] and locals_[1].parent.name == "sub"
    assert all(Path(e["local"]).read_bytes() == Path(e["source"]).read_bytes() for e in rec["files"])


def test_no_partial_file_under_the_final_name_when_the_copy_dies(data, tmp_path, monkeypatch):
    def dying(path, digest):
        yield b"x" * 1000
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(stage, "_reader", dying)
    with pytest.raises(OSError):
        run(data, tmp_path)
    root = stage.node_root(str(tmp_path / "local"), tmp_path / "run")
    assert [p for p in root.rglob("*") if p.is_file()] == []  # no copy, no temporary file, no marker


def test_a_copy_that_differs_from_its_source_is_removed_and_fails(data, tmp_path, monkeypatch):
    def wrong(path, digest):
        data_ = Path(path).read_bytes()
        digest.update(data_)
        yield data_[:-10] + b"0123456789"

    monkeypatch.setattr(stage, "_reader", wrong)
    with pytest.raises(HpctrainError, match="does not match the source's fingerprint"):
        run(data, tmp_path)
    root = stage.node_root(str(tmp_path / "local"), tmp_path / "run")
    assert not list(root.rglob("train.h5")) and not list((root / "verified").iterdir())


def test_stage_dir_variables_are_expanded_on_the_node(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "tmpdir"))
    assert stage.expand("${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/s") == f"{tmp_path}/tmpdir/s"
    monkeypatch.delenv("SLURM_TMPDIR")
    monkeypatch.delenv("TMPDIR", raising=False)
    assert stage.expand("${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/s") == "/tmp/s"
    with pytest.raises(UsageError, match=r"\$NOPE_X is not set on node nodeA"):
        stage.expand("$NOPE_X/s")


def test_the_loader_and_the_identity_see_the_local_copy(data, tmp_path, monkeypatch, capsys):
    from hpctrain import identity

    rec = run(data, tmp_path)
    local = rec["files"][0]["local"]
    other = str(tmp_path / "other.h5")
    assert stage.local_files([str(data), other]) == [str(data), other]  # no HPCTRAIN_STAGE_RUN_DIR: as given
    monkeypatch.setenv("HPCTRAIN_STAGE_RUN_DIR", str(tmp_path / "run"))
    assert stage.local_files([str(data), other]) == [local, other]
    assert f"reading the node-local copy {local}" in capsys.readouterr().err
    ident = identity.record_data(tmp_path / "run", "7", 0, [str(data)])
    manifest = json.loads(RunDir(tmp_path / "run").identity_attempt("7", 0).read_text())
    (print_,) = manifest["data"]["files"]
    assert print_["cheap"]["path"] == str(data)  # the original's fingerprint: the same data
    assert print_["staged"] == {"to": local, "reused": False, "sha256": rec["files"][0]["sha256"]}
    # the next attempt reads the originals (no staging): the same data, the same data section
    monkeypatch.delenv("HPCTRAIN_STAGE_RUN_DIR")
    again = identity.record_data(tmp_path / "run", "7", 1, [str(data)])
    assert again.sections["data"] == ident.sections["data"] and "data" not in again.changed


def test_the_loader_reads_the_staged_copy(data, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from hpctrain.data import H5DataConfig, H5Loader

    local = run(data, tmp_path)["files"][0]["local"]
    monkeypatch.setenv("HPCTRAIN_STAGE_RUN_DIR", str(tmp_path / "run"))
    cfg = H5DataConfig(files=[str(data)], keys=("x", "y"), global_batch_size=32, num_workers=0)
    with H5Loader(cfg, rank=0, world_size=1) as loader:
        assert [f.path for f in loader.layout.files] == [local]
        assert next(iter(loader))["x"].shape == (32, 16)


def test_a_missing_record_reads_the_originals_with_a_warning(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HPCTRAIN_STAGE_RUN_DIR", str(tmp_path / "run"))
    assert stage.local_files([str(data)]) == [str(data)]
    assert "warning: node-local staging: no record" in capsys.readouterr().err


def test_cli_bad_stage_dir_is_one_line(data, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLURMD_NODENAME="nodeA")
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.data.stage", "--run-dir", str(tmp_path / "run"), "--stage-dir",
         str(data / "x"), "--", str(data)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "hpctrain stage: error: --stage-dir" in lines[0] and "cannot create" in lines[0]


def test_a_fifo_inside_a_staged_directory_is_refused_not_opened(tmp_path):
    src = tmp_path / "ds"
    src.mkdir()
    os.mkfifo(src / "pipe")
    with pytest.raises(UsageError, match="pipe: not a regular file"):
        stage.stage([str(src)], run_dir=tmp_path / "run", stage_dir=str(tmp_path / "local"))
