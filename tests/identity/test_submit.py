"""Identity at submission: --require-clean, the record in submission.json, and a local job whose rank 0
writes its attempt record (the Runner integration)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.identity import manifest as mf
from hpctrain.rundir import RunDir
from hpctrain.submit import backend, cli
from hpctrain.testing import FakeSlurm

from .conftest import fake_cfg

ROOT = Path(__file__).resolve().parents[2]


def test_require_clean_refuses_a_dirty_tree_naming_the_files_and_writes_nothing(repo, tmp_path, monkeypatch):
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 2\n")
    (repo / "scratch.py").write_text("")
    monkeypatch.chdir(repo)
    run = tmp_path / "run"
    with pytest.raises(UsageError) as err:
        cli.main(
            ["--entry", "mypkg.train:main", "--cluster", "local", "--require-clean", "--run-dir", str(run)],
            slurm=FakeSlurm(),
        )
    line = str(err.value)
    assert "\n" not in line and line.startswith("--require-clean: the entry's repository ")
    assert f"{repo.resolve()} is dirty: mypkg/train.py, scratch.py" in line and "commit or stash" in line
    assert not run.exists() and not (repo / "runs").exists()


def test_require_clean_from_toml_and_clean_trees_pass():
    mf.require_clean({"repositories": {"entry": {"kind": "git", "dirty": False}, "hpctrain": {"kind": "files"}}})
    with pytest.raises(UsageError, match=r"^--require-clean: hpctrain's repository /x is dirty: a.py; commit or stash"):
        mf.require_clean(
            {
                "repositories": {
                    "hpctrain": {"kind": "git", "root": "/x", "dirty": True, "dirty_files": ["a.py"], "dirty_count": 1}
                }
            }
        )


def test_capture_submit_refuses_under_require_clean_too(repo, tmp_path):
    (repo / "new.py").write_text("")
    with pytest.raises(UsageError, match="new.py"):
        mf.capture_submit(fake_cfg(require_clean=True), [], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_submission_record_names_the_identity_and_its_cost(repo, tmp_path):
    run = tmp_path / "run"
    record = backend._capture_identity(fake_cfg(), run, ["-m", "hpctrain.submit"])
    assert record["path"] == "identity/submit.json" and record["written"] is True
    assert record["identity"] == json.loads(RunDir(run).identity_submit.read_text())["identity"]
    assert 0 < record["capture_s"] < 60


def test_a_failed_capture_is_a_warning_not_a_lost_submission(repo, tmp_path, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("hpctrain.identity.capture_submit", broken)
    record = backend._capture_identity(fake_cfg(), tmp_path / "run", [])
    assert record["error"] == "RuntimeError: disk on fire"
    assert "warning: run identity not captured: RuntimeError: disk on fire" in capsys.readouterr().err


@pytest.mark.slow
def test_local_job_writes_the_submit_and_attempt_records(tmp_path):
    """The whole path: submit (login side) -> Runner on rank 0 (node side), on this machine."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", "--owner", "ada", "--team", "vision"]
        + ["--notes", "smoke test", "--entry", "hpctrain.examples.demo:main", "--run-dir", str(run), "--"]
        + ["--steps", "2", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    paths = RunDir(run)
    submission = json.loads(paths.submission.read_text())
    assert submission["identity"]["path"] == "identity/submit.json" and submission["config"]["owner"] == "ada"
    submit = json.loads(paths.identity_submit.read_text())
    attempt = json.loads(paths.identity_attempt(submission["job_id"], 0).read_text())
    assert submit["ownership"]["team"] == "vision" and attempt["ownership"] == submit["ownership"]
    assert attempt["runtime"]["where"] == "node" and attempt["runtime"]["torch"]["version"]
    assert attempt["attempt"]["launcher"] == "submitit-local" and attempt["attempt"]["world_size"] == 1
    assert attempt["code"]["vs_submit"]["same"] is True
    assert attempt["identity_sections"]["code"] == submit["identity_sections"]["code"]
    # the Trainer adds what only it knows (its TrainConfig and seed); the submitted part is the same
    submitted_part = {k: v for k, v in attempt["config"].items() if k not in ("train", "seed")}
    assert submitted_part == {k: v for k, v in submit["config"].items() if k not in ("train", "seed")}
    assert attempt["config"]["train"]["steps"] == 2 and attempt["config"]["seed"] == 0
    assert attempt["identity_sections"]["runtime"] == submit["identity_sections"]["runtime"]
    log = paths.log_file(submission["job_id"], 0).read_text()
    # the start's capture (before the Trainer added its part, which changes the attempt's hash)
    assert re.search(r"hpctrain: identity [0-9a-f]{12} captured in ", log), log[-2000:]
