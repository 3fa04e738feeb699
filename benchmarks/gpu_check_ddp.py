"""GPU check for the runtime: NCCL probe, demo on HDF5 data with checkpoints, a resume, one GPU per rank.

    python benchmarks/gpu_check_ddp.py --out DIR [--gpus N]

Through ``python -m hpctrain.submit --cluster local --gpus-per-node N`` (N: every GPU here, at most 8):

* the all-reduce + DDP probe (``tests.entries:allreduce_probe``): every rank on NCCL, the reduced value
  is 1 + 2 + ... + N;
* with N >= 2, every rank reports a different GPU UUID (``uuid_probe`` below), and each rank record in
  ``run_dir/ranks/`` names a CUDA device;
* the demo with ``--data`` (an HDF5 file made here) and ``--ckpt-every``: ends in sync on NCCL;
* the demo again with more steps and the same checkpoint directory: it resumes and finishes.

Prints one JSON object (also DIR/gpu_check_ddp.json); exit 0 when every assertion held, 1 when one
failed, 2 (one line on stderr) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def uuid_probe(ctx: tp.Any) -> None:
    """Entry: each rank writes the UUID of the GPU it holds to run_dir/uuids/rank-N.json."""
    import torch

    uuid = str(torch.cuda.get_device_properties(ctx.device).uuid)
    (ctx.run_dir / "uuids").mkdir(exist_ok=True)
    record = {"rank": ctx.rank, "host": ctx.hostname, "device": str(ctx.device), "uuid": uuid}
    path = ctx.run_dir / "uuids" / f"rank-{ctx.rank}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # whole or absent: a reader never sees half a record
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def submit(out: Path, name: str, gpus: int, entry: str, args: tp.Sequence[str]) -> int:
    """One local job; its output goes to OUT/NAME.log; the exit status of the submit command."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", "--nodes", "1"]
    cmd += ["--gpus-per-node", str(gpus), "--time", "10", "--entry", entry, "--run-dir", str(out / name), "--", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode


def read(path: Path) -> tp.Dict[str, tp.Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, default=0, help="GPUs (ranks) to use (default: all here, at most 8)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_ddp: CUDA is not available on this machine; run this check on a GPU node", file=sys.stderr)
        return 2
    from hpctrain.data import make_dataset

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = args.gpus or min(8, torch.cuda.device_count())
    res: tp.Dict[str, tp.Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "ranks": n}
    failures: tp.List[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    rc = submit(out, "probe", n, "tests.entries:allreduce_probe", [])
    probes = [read(out / "probe" / "probe" / f"rank-{r}.json") for r in range(n)]
    res["probe"] = {
        "exit": rc,
        "backends": [q.get("backend") for q in probes],
        "reduced": [q.get("reduced") for q in probes],
    }
    expect(rc == 0, f"probe exit {rc} (see probe.log)")
    expect(all(q.get("backend") == "nccl" for q in probes), "probe: not every rank on NCCL")
    expect(all(q.get("reduced") == n * (n + 1) / 2 for q in probes), "probe: wrong all-reduce result")

    if n >= 2:
        rc = submit(out, "uuids", n, "gpu_check_ddp:uuid_probe", [])
        uuids = [read(out / "uuids" / "uuids" / f"rank-{r}.json").get("uuid") for r in range(n)]
        ranks = [read(f) for f in sorted((out / "uuids" / "ranks").glob("*/rank-*.json"))]
        res["uuids"] = {"exit": rc, "uuids": uuids, "rank_devices": [r.get("device") for r in ranks]}
        expect(rc == 0 and None not in uuids and len(set(uuids)) == n, f"ranks do not hold distinct GPUs: {uuids}")
        expect(len(ranks) == n and all(str(r.get("device", "")).startswith("cuda") for r in ranks), "rank records")

    data = make_dataset(out / "demo-data.h5", 4096, shape=(64,), fill="fast")
    ckpt = out / "demo-ckpt"
    common = ["--data", data, "--batch-size", str(32 * n), "--ckpt-every", "10", "--ckpt-dir", str(ckpt), "--quiet"]
    for name, steps in (("demo", 30), ("resume", 50)):
        rc = submit(out, name, n, "hpctrain.examples.demo:main", ["--steps", str(steps), *common])
        d = read(out / name / "demo_result.json")
        res[name] = {k: d.get(k) for k in ("steps", "steps_run", "resumed", "device", "backend", "weights_in_sync")}
        res[name]["exit"] = rc
        expect(rc == 0 and d.get("steps") == steps, f"{name}: exit {rc}, steps {d.get('steps')} (see {name}.log)")
        expect(str(d.get("device", "")).startswith("cuda") and d.get("backend") == "nccl", f"{name}: not on NCCL/GPU")
        expect(bool(d.get("weights_in_sync")), f"{name}: replicas diverged")
    resumed_at = (res["resume"].get("resumed") or {}).get("step")
    expect(resumed_at == 30 and res["resume"].get("steps_run") == 20, f"resume: resumed at {resumed_at}, not 30")
    res["failures"] = failures
    res["ok"] = not failures
    text = json.dumps(res, indent=2)
    print(text)
    (out / "gpu_check_ddp.json").write_text(text + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
