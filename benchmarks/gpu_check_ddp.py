"""GPU check for the runtime: 1 node x 1 GPU through the local submit path, NCCL, a DDP step on cuda:0.

    python benchmarks/gpu_check_ddp.py --out DIR

Runs ``python -m hpctrain.submit --cluster local --gpus-per-node 1`` twice: the all-reduce + DDP
probe entry and the demo (100 steps). Prints a JSON summary; exits 1 if any check fails and 2
(with a message) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_ddp: CUDA is not available here; run this on a GPU node", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    summary: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    runs = {
        "probe": ("tests.entries:allreduce_probe", []),
        "demo": ("hpctrain.examples.demo:main", ["--steps", "100", "--hidden", "1024", "--dim", "256"]),
    }
    ok = True
    for name, (entry, extra) in runs.items():
        run_dir = out / name
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpctrain.submit",
                "--cluster",
                "local",
                "--nodes",
                "1",
                "--gpus-per-node",
                "1",
                "--time",
                "10",
                "--entry",
                entry,
                "--run-dir",
                str(run_dir),
                "--",
                *extra,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        summary[f"{name}_exit"] = proc.returncode
        summary[f"{name}_wall_s"] = round(time.perf_counter() - t0, 2)
        (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
        ok &= proc.returncode == 0
    probe_file = out / "probe" / "probe" / "rank-0.json"
    if probe_file.exists():
        probe = json.loads(probe_file.read_text())
        summary.update(probe_backend=probe["backend"], probe_reduced=probe["reduced"], probe_world=probe["dist_world"])
        ok &= probe["backend"] == "nccl" and probe["reduced"] == 1.0
    demo_file = out / "demo" / "demo_result.json"
    if demo_file.exists():
        demo = json.loads(demo_file.read_text())
        summary.update(
            demo_device=demo["device"],
            demo_backend=demo["backend"],
            demo_final_loss=demo["final_loss"],
            demo_seconds=round(demo["seconds"], 3),
            demo_weights_in_sync=demo["weights_in_sync"],
        )
        ok &= demo["device"] == "cuda:0" and demo["backend"] == "nccl" and demo["weights_in_sync"]
    ranks = list((out / "demo" / "ranks").glob("*/rank-0.json"))
    if ranks:
        r = json.loads(ranks[0].read_text())
        summary["demo_rank0_join_s"] = round(r["joined_at"] - r["started_at"], 2)
    summary["ok"] = bool(ok)
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
