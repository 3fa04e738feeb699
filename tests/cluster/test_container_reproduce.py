"""A containerised run bundled and reproduced on the dev cluster: a short demo (2 nodes x 2 ranks) in podman with the
image of `devcluster image`, bundled, then `reproduce` with the same image -> the image's digest is checked against
the recorded one, the reproduction runs in the same image with the same mounts, completes, and its identity shows
the same digest. The helpers are test_container_podman's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.preempt_entry import write_data
from tests.cluster.test_container_podman import _submit, image  # noqa: F401  (image: the fixture)
from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final

pytestmark = [pytest.mark.slurm]
STEPS, BATCH, SAMPLES = 8, 16, 64


def test_a_bundle_of_a_containerised_run_reproduces_in_the_same_image(image, tmp_path):  # noqa: F811
    flags, conf = image
    data = tmp_path / "data.h5"
    write_data(data, SAMPLES)
    run = tmp_path / "ctr"
    # the repository is mounted too: the image's venv imports hpctrain from it (the reproduction runs elsewhere)
    container = [*flags, "--container-mounts", f"{tmp_path},{ROOT}"]
    args = ["--steps", str(STEPS), "--data", str(data), "--batch", str(BATCH), "--ckpt-every", "4"]
    job = _submit(run, args, constraint="steady", partition="debug", container=container, conf=conf)
    assert wait_final(job, timeout=300) == "COMPLETED", (run / "logs" / f"{job}_0_log.err").read_text()[-3000:]
    recorded = json.loads((run / "identity" / "submit.json").read_text())["container"]
    assert recorded["runtime"] == "podman" and recorded["digest"].startswith("sha256:")
    env = dict(ENV, CONTAINERS_CONF=conf)
    bundle = tmp_path / "bundle"
    got = subprocess.run([sys.executable, "-m", "hpctrain", "bundle", str(run), "-o", str(bundle)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    new = tmp_path / "again"
    got = subprocess.run(
        [sys.executable, "-m", "hpctrain", "reproduce", str(bundle), "--data", str(data), "-o", str(new),
         "--cluster", "slurm", "--follow", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    err = got.stderr[-3000:]
    assert got.returncode == 0, got.stdout[-3000:] + err
    report = json.loads(got.stdout)
    assert report["container"]["status"] == "same" and report["container"]["digest"] == recorded["digest"]
    assert report["submission"]["cluster"] == "slurm" and report["comparison"]["ok"], report["comparison"]
    ran = json.loads((new / "identity" / "submit.json").read_text())["container"]
    assert ran["digest"] == recorded["digest"] and ran["image"] == recorded["image"]
    assert report["identity"]["container_digest"] == {"original": recorded["digest"], "reproduction": ran["digest"]}
    job2 = report["submission"]["job_id"]
    assert wait_final(str(job2), timeout=60) == "COMPLETED"
    log = (new / "logs" / f"{job2}_0_log.err").read_text()
    assert "no scontrol in the container" in log  # it ran inside the image
