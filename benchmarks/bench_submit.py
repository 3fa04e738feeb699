"""Submission overhead: `--dry-run` latency on the login node, and sbatch -> all ranks in the process group.

Compared in the same run (ratios hold on a noisy machine, seconds do not):

- dry run: ``python -m hpctrain.submit --dry-run`` vs the floor (``python -c pass``) and vs what a
  tool that imports torch on the login node pays (``python -c "import torch"``).
- start-up on the dev cluster (skipped without Slurm): hpctrain.submit of a 2 nodes x 2 tasks gloo
  job, time from submission to every rank having joined the process group, vs the peer a user
  would hand-write: ``sbatch`` of a script whose ``srun python`` imports torch and calls
  ``init_process_group`` (env:// from SLURM_* variables) and records the same instant.

Usage: python benchmarks/bench_submit.py [--repeats N] [--json PATH] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, emit, wait_job, wall  # noqa: E402

RAW_RANK = textwrap.dedent(
    """
    import os, sys, time, json, datetime
    import torch, torch.distributed as dist
    nodes = os.popen("scontrol show hostnames " + os.environ["SLURM_JOB_NODELIST"]).read().split()
    dist.init_process_group("gloo", init_method=f"tcp://{nodes[0]}:{29000 + int(os.environ['SLURM_JOB_ID']) % 1000}",
                            rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]),
                            timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1); dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.json"), "w") as f:
        json.dump({"joined_at": time.time()}, f)
    dist.barrier(); dist.destroy_process_group()
    """
)


def hpctrain_startup(tmp: Path, i: int) -> float:
    run_dir = tmp / f"hp{i}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.submit",
            "--nodes",
            "2",
            "--tasks-per-node",
            "2",
            "--time",
            "5",
            "--entry",
            "tests.entries:allreduce_probe",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        env=ENV,
        check=True,
        capture_output=True,
    )
    record = json.loads((run_dir / "submission.json").read_text())
    wait_job(record["job_id"])
    joined = [json.loads(p.read_text())["joined_at"] for p in (run_dir / "ranks").glob("*/rank-*.json")]
    assert len(joined) == 4, f"hpctrain job {record['job_id']} did not start 4 ranks"
    return max(joined) - record["submitted_at"]


def raw_startup(tmp: Path, i: int) -> float:
    out = tmp / f"raw{i}"
    out.mkdir()
    (out / "rank.py").write_text(RAW_RANK)
    script = out / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun {sys.executable} -u {out / 'rank.py'} {out}\n")
    t0 = time.time()
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", "--time=5", f"--output={out}/log", str(script)],
        cwd=ROOT,
        env=ENV,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    wait_job(job_id)
    joined = [json.loads(p.read_text())["joined_at"] for p in out.glob("rank-*.json")]
    assert len(joined) == 4, f"raw job {job_id} did not start 4 ranks: {(out / 'log').read_text()[-500:]}"
    return max(joined) - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--no-cluster", action="store_true", help="only the login-node figures")
    args = p.parse_args()

    py = sys.executable
    result: dict = {}
    dry = wall(
        [py, "-m", "hpctrain.submit", "--nodes", "8", "--entry", "hpctrain.examples.demo:main", "--dry-run"],
        args.repeats * 3,
    )
    floor = wall([py, "-c", "pass"], args.repeats * 3)
    torch_import = wall([py, "-c", "import torch"], args.repeats)
    result.update(
        dry_run_s=round(dry, 3),
        python_startup_s=round(floor, 3),
        torch_import_s=round(torch_import, 3),
        dry_run_vs_python_startup=round(dry / floor, 2),
        dry_run_vs_torch_import=round(dry / torch_import, 3),
    )

    if not args.no_cluster and shutil.which("sbatch"):
        hp, raw = [], []
        with tempfile.TemporaryDirectory(prefix="bench-submit-", dir="/tmp") as tmp:
            for i in range(args.repeats):  # interleaved, so drift hits both alike
                hp.append(hpctrain_startup(Path(tmp), i))
                raw.append(raw_startup(Path(tmp), i))
        result.update(
            startup_hpctrain_s=round(statistics.median(hp), 2),
            startup_raw_sbatch_s=round(statistics.median(raw), 2),
            startup_vs_raw_sbatch=round(statistics.median(hp) / statistics.median(raw), 2),
            startup_samples_hpctrain=[round(x, 2) for x in hp],
            startup_samples_raw=[round(x, 2) for x in raw],
        )
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
