"""Training inside a real container on the dev cluster: podman (Debian's), the image of `devcluster image` (the
host's own Python and venv, no Slurm client inside), the demo entry on 2 nodes x 2 ranks, preempted twice at random
moments by 'high' jobs -> requeued through the batch script's relay (no scontrol in the image), resumed, and
finished with the same `ckpt digest` as the same run without a container. Entry: tests/cluster/preempt_entry.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.preempt_entry import write_data
from tests.cluster.test_preemption import BATCH, ENTRY, SAMPLES, STEPS, _calls, _exits, _starts, _wait
from tests.cluster.test_slurm_ddp import ENV, ROOT, model_digest, wait_final

pytestmark = [pytest.mark.slurm]
DEVCLUSTER = ROOT / "tests" / "cluster" / "devcluster"


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None or shutil.which("runc") is None:
        why = "podman/runc not installed (apt-get install -y podman runc; tools/test does)"
        if os.environ.get("HPCTRAIN_REQUIRE_SLURM") == "1":  # CI installs them: a missing runtime is a failure
            pytest.fail(why)
        pytest.skip(why)
    out = subprocess.run([str(DEVCLUSTER), "image"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    conf = next(line.split("CONTAINERS_CONF=")[1] for line in out.stderr.splitlines() if "CONTAINERS_CONF=" in line)
    return out.stdout.split(), conf


def _submit(run_dir: Path, args, *, constraint: str, partition: str, container=(), conf: str = "") -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", "2", "--tasks-per-node", "2", "--time", "10",
         "--partition", partition, "--constraint", constraint, "--max-requeues", "4", "--job-name", run_dir.name,
         "--entry", ENTRY, "--run-dir", str(run_dir), *container, "--", *args],
        cwd=ROOT, env=dict(ENV, CONTAINERS_CONF=conf) if conf else ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads((run_dir / "submission.json").read_text())["job_id"])


def test_demo_in_podman_preempted_twice_resumes_bit_exact(image, tmp_path):
    flags, conf = image
    data = tmp_path / "data.h5"
    write_data(data, SAMPLES)
    run = ["--steps", str(STEPS), "--data", str(data), "--batch", str(BATCH)]
    ctr_dir, ref_dir = tmp_path / "ctr", tmp_path / "ref"
    container = [*flags, "--container-mounts", str(tmp_path)]
    job = _submit(ctr_dir, [*run, "--sleep", "0.25"], constraint="preemptible", partition="low", container=container,
                  conf=conf)  # fmt: skip
    ref = _submit(ref_dir, run, constraint="steady", partition="debug")
    highs = []
    for restart, at in enumerate(sorted(random.sample(range(8, 40), 2))):  # two random moments, one per attempt
        _wait(f"attempt {restart} at step {at}", lambda r=restart, a=at: len(_calls(ctr_dir, r)) >= a, timeout=300)
        node = json.loads((ctr_dir / "ranks" / f"{job}-r{restart}" / "rank-0.json").read_text())["hostname"]
        highs.append(subprocess.run(
            ["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
            capture_output=True, text=True, check=True,
        ).stdout.strip())  # fmt: skip
        _wait(f"restart {restart + 1}", lambda r=restart: len(_calls(ctr_dir, r + 1)) >= 1, timeout=300)
    assert wait_final(job, timeout=400) == "COMPLETED", (ctr_dir / "logs" / f"{job}_0_log.err").read_text()[-3000:]
    assert wait_final(ref, timeout=300) == "COMPLETED"
    exits = _exits(ctr_dir)
    stops = [e for e in exits if e["cause"] != "finished"]
    assert len(stops) == 2 and all(e["cause"] == "preemption" and e["requeued"] for e in stops), exits
    assert [s["resumed_from_step"] for s in _starts(ctr_dir)[1:]] == [e["committed_step"] for e in stops]
    assert model_digest(ctr_dir, STEPS) == model_digest(ref_dir, STEPS)  # bit-identical to the run outside
    # inside the image: no scontrol, every task said so, and the image is in the identity with its digest
    err = "".join((ctr_dir / "logs" / f"{job}_{r}_log.err").read_text() for r in range(4))
    assert err.count("no scontrol in the container; Slurm commands run outside") >= 4 * 3, err[-2000:]
    identity = json.loads((ctr_dir / "identity" / "submit.json").read_text())["container"]
    assert identity["runtime"] == "podman" and identity["digest"].startswith("sha256:")
    assert str(tmp_path) in identity["mounts"] and os.path.isdir(ctr_dir / ".slurm-relay" / "bin")
    relayed = [json.loads(line)["argv"][0] for line in (ctr_dir / ".slurm-relay" / "log").read_text().splitlines()]
    assert "squeue" in relayed, relayed  # the deciding rank's Slurm view came from outside the container
    for high in highs:
        assert wait_final(high, timeout=60) == "COMPLETED"
