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

from tests.cluster.nodes import failed_node, rank_host
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


def _submit(
    run_dir: Path,
    args,
    *,
    constraint: str,
    partition: str,
    container=(),
    conf: str = "",
    nodes: int = 2,
    time_: str = "10",
) -> str:
    where = ["--constraint", constraint] if constraint else []  # no constraint: any node of the partition
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--nodes", str(nodes), "--tasks-per-node", "2", "--time", time_,
         "--partition", partition, *where, "--max-requeues", "4", "--job-name", run_dir.name,
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
    # one relay directory per attempt: a container outliving its step is never answered by the next attempt's relay
    attempts = sorted(p.name for p in (ctr_dir / ".slurm-relay").iterdir())
    assert attempts == [f"{job}-r{r}" for r in range(3)] and os.path.isdir(
        ctr_dir / ".slurm-relay" / attempts[0] / "bin"
    )
    logs = [ctr_dir / ".slurm-relay" / a / "log" for a in attempts]  # an attempt that asked nothing has none
    relayed = [json.loads(line)["argv"][0] for log in logs if log.exists() for line in log.read_text().splitlines()]
    assert "squeue" in relayed, relayed  # the deciding rank's Slurm view came from outside the container
    for high in highs:
        assert wait_final(high, timeout=60) == "COMPLETED"


def test_time_limit_and_a_failed_node_inside_podman_end_as_they_do_outside(image, tmp_path):
    """The two other paths that ask Slurm from the node: the time-limit warning (USR2 from sbatch --signal, then the
    save and the requeue) and a failed node (the survivors' attribution, the exclusion through scontrol). Both run
    at once, inside the image, and end as tests/cluster/test_preemption.py and test_node_failure.py see them end
    outside: requeued by the same causes, the failed node excluded, resumed at the committed step."""
    flags, conf = image
    data = tmp_path / "data.h5"
    write_data(data, SAMPLES)
    common = ["--data", str(data), "--batch", str(BATCH), "--steps", str(STEPS)]
    container = [*flags, "--container-mounts", str(tmp_path)]
    limit_dir, fail_dir = tmp_path / "limit", tmp_path / "fail"
    # --time 2 and 0.7 s a step (112 s of steps, more than the limit with the start-up): the warning (15-75 s before
    # the end) always comes before the last step (with 0.5 s, 80 s of steps, a fast start-up once finished first)
    limit = _submit(limit_dir, [*common, "--sleep", "0.7"], constraint="steady", partition="debug", nodes=1,
                    time_="2", container=container, conf=conf)  # fmt: skip
    # no constraint: after the exclusion the requeued job needs two of the three other nodes; 0.25 s a step leaves
    # ~34 s of steps after step 25 for the node failure to land (0.1 s lost that race under load: 13 s)
    fail = _submit(fail_dir, [*common, "--sleep", "0.25", "--ckpt-every", "20"], constraint="", partition="debug",
                   time_="5", container=container, conf=conf)  # fmt: skip
    try:
        _wait("25 steps", lambda: len(_calls(fail_dir, 0)) >= 25, timeout=300)
        host = rank_host(fail_dir, fail, 0, 3)
        with failed_node(host):
            (ex,) = _wait("the exit record", lambda: _exits(fail_dir), timeout=90)
        assert ex["cause"] == "node_failure" and ex["requeued"] and ex["failed_nodes"] == [host], ex
        assert host in ex["excluded_nodes"], ex
        assert wait_final(fail, timeout=300) == "COMPLETED", (fail_dir / "logs" / f"{fail}_0_log.err").read_text()[
            -3000:
        ]
        assert f"ExcNodeList={host}" in subprocess.run(["scontrol", "show", "job", fail], capture_output=True,
                                                       text=True).stdout  # fmt: skip
        second = [s for s in _starts(fail_dir) if s["restart_count"] == 1][0]
        assert host not in second["hosts"] and second["resumed_from_step"] == ex["committed_step"] == ex["agreed_step"]

        assert wait_final(limit, timeout=480) == "COMPLETED", (limit_dir / "logs" / f"{limit}_0_log.err").read_text()[
            -3000:
        ]
        exits = _exits(limit_dir)
        stops = [e for e in exits if e["cause"] != "finished"]
        assert stops and all(e["cause"] == "time_limit" and e["requeued"] for e in stops), exits
        assert all(e["agreed_step"] == e["committed_step"] for e in stops)
        assert [s["resumed_from_step"] for s in _starts(limit_dir)[1:]] == [e["committed_step"] for e in stops]
    finally:
        subprocess.run(["scancel", limit, fail], capture_output=True)
    for d, job in ((limit_dir, limit), (fail_dir, fail)):  # both inside the image, Slurm asked from outside
        err = (d / "logs" / f"{job}_0_log.err").read_text()
        assert "no scontrol in the container; Slurm commands run outside" in err, err[-2000:]
