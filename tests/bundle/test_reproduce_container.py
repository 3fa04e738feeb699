"""``reproduce`` of a containerised run: the same image, runtime and mounts; an image whose digest differs is one
line, exit 2, nothing submitted, unless ``--accept-image-digest``; the crate names the image (``ContainerImage``,
Process Run Crate) from every CreateAction; ``bundle verify`` shows it.

The original is a real local run whose records are then made those of an apptainer job (its submission config and
its submit identity's ``container`` record, as :func:`hpctrain._container.image_record` writes it); the login
node's tools are fakes on PATH (sbatch logs what it was given, apptainer answers ``--version``): the checks and
the submission run hpctrain's real code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from hpctrain import _container
from hpctrain.bundle.crate import CONTAINER_IMAGE_ID, container_image
from tests.bundle.test_crate import _graph, _validate

ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]
ARGS = ["--steps", "4", "--log-every", "2", "--ckpt-every", "2", "--batch-size", "16", "--hidden", "16", "--quiet"]
FAKES = {
    "sbatch": 'echo "$@" >>"$FAKE_LOG"; cp "$1" "$FAKE_LOG.script"; echo "Submitted batch job 4242"',
    "sinfo": 'echo "debug*"',
    "squeue": 'echo "PENDING|||Priority"',
    "sacct": "true",
    "apptainer": 'echo "apptainer version 1.3.0"',
}


def _fake_run(argv, **kwargs):
    return subprocess.CompletedProcess(argv, 0, stdout="apptainer version 1.3.0\n", stderr="")


@pytest.fixture(scope="module")
def ctr(tmp_path_factory) -> tp.Dict[str, tp.Any]:
    base = tmp_path_factory.mktemp("ctr")
    repo = base / "repo"
    repo.mkdir()
    (repo / "mymod.py").write_text(
        "from hpctrain.examples import demo\n\n\ndef main(ctx):\n    return demo.main(ctx)\n"
    )
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "entry"], check=True)
    run = base / "run"
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    sub = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", "--nodes", "1", "--entry", "mymod:main",
         "--run-dir", str(run), "--", *ARGS],
        cwd=repo, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stdout[-2000:] + sub.stderr[-2000:]
    image, data = base / "images" / "pt.sif", base / "datasets"
    image.parent.mkdir()
    image.write_bytes(b"SIF image, version 1")
    data.mkdir()
    # the records of an apptainer job: its submitted settings and the identity's container record
    submission = json.loads((run / "submission.json").read_text())
    submission["config"].update(
        cluster="slurm", container=str(image), container_runtime="apptainer", container_mounts=[f"{data}:/data"]
    )
    (run / "submission.json").write_text(json.dumps(submission))
    ident = json.loads((run / "identity" / "submit.json").read_text())
    mounts = [_container.Mount(str(run), str(run)), _container.Mount(str(repo), str(repo))]
    mounts.append(_container.Mount(str(data), "/data"))
    ident["container"] = _container.image_record("apptainer", str(image), mounts, run=_fake_run)
    (run / "identity" / "submit.json").write_text(json.dumps(ident))
    bundle = base / "bundle"
    got = subprocess.run(
        [sys.executable, "-m", "hpctrain", "bundle", str(run), "-o", str(bundle)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    bindir = base / "bin"
    bindir.mkdir()
    for name, body in FAKES.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    return {"base": base, "bundle": bundle, "image": image, "data": data, "bin": bindir, "digest": ident["container"]}


def reproduce(ctr, name: str, *args: str) -> tp.Tuple[subprocess.CompletedProcess, Path, Path]:
    """``reproduce BUNDLE --cluster slurm`` with the fakes first on PATH: (result, new run dir, sbatch's log)."""
    log, new = ctr["base"] / f"{name}.sbatch-log", ctr["base"] / name
    env = dict(os.environ, PATH=f"{ctr['bin']}:{os.environ['PATH']}", FAKE_LOG=str(log), TORCH_CPP_LOG_LEVEL="ERROR")
    argv = [sys.executable, "-m", "hpctrain", "reproduce", str(ctr["bundle"]), "-o", str(new), "--cluster", "slurm"]
    got = subprocess.run([*argv, *args], cwd=ctr["base"], env=env, capture_output=True, text=True, timeout=240)
    return got, new, log


def _record(new: Path) -> tp.Dict[str, tp.Any]:
    return json.loads(next(new.glob("**/reproduce.json")).read_text())


def test_the_same_digest_submits_with_the_recorded_image_runtime_and_mounts(ctr):
    got, new, log = reproduce(ctr, "same")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert len(log.read_text().splitlines()) == 1  # sbatch was called once
    script = Path(f"{log}.script").read_text()
    assert "apptainer exec --pwd" in script and str(ctr["image"]) in script and f"{ctr['data']}:/data" in script
    assert "hpctrain._container relay" in script
    rec = _record(new)["container"]
    assert rec["status"] == "same" and rec["digest"] == rec["recorded_digest"] == ctr["digest"]["digest"]
    assert rec["runtime"] == "apptainer" and rec["mounts"] == [f"{ctr['data']}:/data"]
    assert "as recorded" in got.stdout
    ran = json.loads((new / "identity" / "submit.json").read_text())["container"]
    assert ran["digest"] == ctr["digest"]["digest"] and ran["image"] == str(ctr["image"])


def test_a_different_digest_is_one_line_exit_2_nothing_submitted_unless_accepted(ctr):
    image, before = ctr["image"], ctr["image"].read_bytes()
    image.write_bytes(b"SIF image, version 2 (rebuilt under the same name)")
    try:
        now = _container.sha256_file(image)
        got, new, log = reproduce(ctr, "differs")
        assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1, got.stderr
        assert now in lines[0] and ctr["digest"]["digest"] in lines[0] and "--accept-image-digest" in lines[0]
        assert not log.exists() and not new.exists()  # sbatch never ran; nothing written
        got, new, log = reproduce(ctr, "accepted", "--accept-image-digest", "--json")
        assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
        assert len(log.read_text().splitlines()) == 1
        report = json.loads(got.stdout)
        assert report["container"]["status"] == "differs, accepted" and report["container"]["accepted"]
        assert any("--accept-image-digest" in n for n in report["notes"])
        rec = _record(new)["container"]
        assert (rec["digest"], rec["recorded_digest"], rec["accepted"]) == (now, ctr["digest"]["digest"], True)
        assert json.loads((new / "identity" / "submit.json").read_text())["container"]["digest"] == now
    finally:
        image.write_bytes(before)


def test_a_missing_image_is_one_line_exit_2(ctr):
    moved = ctr["image"].with_suffix(".moved")
    ctr["image"].rename(moved)
    try:
        got, new, log = reproduce(ctr, "missing")
    finally:
        moved.rename(ctr["image"])
    assert got.returncode == 2 and "no such image file" in got.stderr, got.stderr[-2000:]
    assert len(got.stderr.strip().splitlines()) == 1 and not log.exists() and not new.exists()


def test_the_crate_names_the_image_from_every_create_action_and_verify_shows_it(ctr, tmp_path):
    doc, by_id = _graph(ctr["bundle"])
    image = by_id[CONTAINER_IMAGE_ID]
    assert image["@type"] == "ContainerImage" and image["name"] == "pt.sif"
    assert image["additionalType"] == {"@id": "https://w3id.org/ro/terms/workflow-run#SIFImage"}
    assert "sha256:" + image["sha256"] == ctr["digest"]["digest"] and image["registry"]
    actions = [e for e in doc["@graph"] if e["@type"] == "CreateAction"]
    assert actions and all(a["containerImage"] == {"@id": CONTAINER_IMAGE_ID} for a in actions)
    assert doc["@context"][1]["containerImage"] == "https://w3id.org/ro/terms/workflow-run#containerImage"
    got = subprocess.run(
        [sys.executable, "-m", "hpctrain", "bundle", "verify", str(ctr["bundle"]), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-2000:]
    shown = json.loads(got.stdout)["container"]
    assert shown["digest"] == ctr["digest"]["digest"] and shown["runtime"] == "apptainer"
    text = subprocess.run(
        [sys.executable, "-m", "hpctrain", "bundle", "verify", str(ctr["bundle"])],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"),
    ).stdout  # fmt: skip
    assert "image" in text and ctr["digest"]["digest"] in text


@pytest.mark.slow
def test_the_crate_of_a_containerised_run_passes_roc_validator(ctr, tmp_path):
    ok, issues = _validate(ctr["bundle"], tmp_path)
    assert ok, issues


def test_image_references_as_container_images():
    podman = container_image(
        {"image": "localhost/hpctrain-devcluster:latest", "runtime": "podman", "kind": "podman", "digest": "sha256:ab"}
    )
    assert (podman["registry"], podman["name"], podman["tag"], podman["sha256"]) == (
        "localhost", "hpctrain-devcluster", "latest", "ab",
    )  # fmt: skip
    pyxis = container_image({"image": "nvcr.io#nvidia/pytorch:24.01-py3", "runtime": "pyxis", "digest": None})
    assert (pyxis["registry"], pyxis["name"], pyxis["tag"]) == ("nvcr.io", "nvidia/pytorch", "24.01-py3")
    assert "sha256" not in pyxis and "no digest recorded" in pyxis["description"]
    hub = container_image({"image": "docker://pytorch/pytorch:2.3", "runtime": "apptainer", "kind": "reference"})
    assert (hub["registry"], hub["name"], hub["tag"]) == ("docker.io", "pytorch/pytorch", "2.3")
    assert container_image(None) is None and container_image({"image": ""}) is None
