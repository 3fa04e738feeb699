"""Cost of run identity capture: at submit (login node) and at each start (rank 0), with the data content tier
uncached (first start) and cached (a restart), on a realistic repository and a multi-GB HDF5 file.

Setup (in a temporary directory, removed at the end unless --keep):
- a git repository of --files files (Python sources of 1-8 KB in 60 folders, 12 binary files of 256 KB),
  one commit, then a dirty tree: 40 edited files, 2 binary changes, 2 deletions, 25 untracked files;
- an HDF5 file of --data-gb GB from ``python -m hpctrain data synth`` (x float32 (3, 32, 32) in chunks of 64
  samples, 768 KiB; y int64).

Figures (median of --repeats; the page cache of the data file is dropped with posix_fadvise before every
"cold" measurement, so the sample is read from disk, not memory; nobody else's cache is touched):
- submit: ``capture_submit`` (code of the entry's repository and hpctrain's, runtime, code snapshot tar.gz)
  vs the ceiling ``git status`` + ``git diff HEAD --binary`` + ``git archive HEAD | gzip -1``;
- start, content tier uncached: ``capture_start`` + ``record_data`` of the file (cold) vs the ceiling
  ``git status`` + ``sha256sum`` of as many bytes as the sample reads (cold);
- start, content tier cached (a restart): the same calls vs ``git status``;
- full hash: ``python -m hpctrain data hash FILE`` vs ``sha256sum FILE`` (both warm, then both cold).

torch and h5py are imported before the start figures (the Runner has imported torch when rank 0 captures, the
Trainer's loader h5py before it records the data).

Usage: python benchmarks/bench_identity.py [--files 3000] [--data-gb 3] [--repeats 3] [--json PATH] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, emit, evict  # noqa: E402

sys.path.insert(0, str(ROOT))

GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "-c", "init.defaultBranch=main"]
SAMPLE_BYTES = 3 * 32 * 32 * 4 + 8


def sh(cmd: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=True, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def make_repo(root: Path, files: int) -> None:
    rng = random.Random(0)
    words = ["def", "return", "self", "import", "torch", "model", "layer", "batch", "loss", "grad", "x", "y", "+", "="]
    pkg = root / "benchpkg"
    (pkg).mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("def main(ctx):\n    return 0\n")
    for i in range(files - 14):
        d = pkg / f"mod{i % 60:02d}"
        d.mkdir(exist_ok=True)
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(rng.randint(20, 160))]
        (d / f"f{i:05d}.py").write_text("\n".join(lines) + "\n")
    for i in range(12):
        (pkg / f"asset{i}.bin").write_bytes(rng.randbytes(256 << 10))
    subprocess.run([*GIT, "init", "-q", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-q", "-m", "bench"], check=True)
    py = sorted(pkg.rglob("f*.py"))
    for p in rng.sample(py, 40):  # edits
        p.write_text(p.read_text() + "x = 1  # edited\n")
    for p in sorted(pkg.glob("asset*.bin"))[:2]:  # binary changes
        data = bytearray(p.read_bytes())
        data[1000:1010] = rng.randbytes(10)
        p.write_bytes(bytes(data))
    for p in py[-2:]:  # deletions
        p.unlink()
    for i in range(25):  # untracked, one of them above the 1 MiB content limit
        size = (2 << 20) if i == 0 else rng.randint(200, 50_000)
        (root / "scratch" / f"u{i}.py").parent.mkdir(exist_ok=True)
        (root / "scratch" / f"u{i}.py").write_bytes(rng.randbytes(size))


def make_data(path: Path, gb: float) -> float:
    samples = int(gb * 1e9 / SAMPLE_BYTES)
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "data",
            "synth",
            str(path),
            "--samples",
            str(samples),
            "--chunk-samples",
            "64",
        ],
        env=ENV,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def median(xs):
    return round(statistics.median(xs), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--data-gb", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", help="work directory (default: a new one under $TMPDIR)")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--keep", action="store_true", help="keep the repository and the data file")
    args = ap.parse_args()

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hpctrain-bench-identity-"))
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < args.data_gb * 1e9 * 1.2 + (1 << 30):
        sys.exit(f"bench_identity: {base} has {free / 1e9:.1f} GB free; --data-gb {args.data_gb} needs more")
    repo, data = base / "repo", base / "train.h5"
    try:
        make_repo(repo, args.files)
        synth_s = make_data(data, args.data_gb)
        sys.path.insert(0, str(repo))
        from hpctrain.identity import capture_start, capture_submit, record_data
        from hpctrain.submit.config import SubmitConfig

        cfg = SubmitConfig(entry="benchpkg.train:main", entry_args=["--data", str(data)])
        os.chdir(repo)
        report: dict = {
            "setup": {
                "files": int(
                    subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True).stdout.count("\n")
                ),
                "data_bytes": data.stat().st_size,
                "synth_s": round(synth_s, 2),
                "cpus": os.cpu_count(),
                "load_average_1min": round(os.getloadavg()[0], 2),
            }
        }
        # ------------------------------------------------------------------ submit
        subs, parts = [], []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            m = capture_submit(cfg, ["-m", "hpctrain.submit"], base / f"run-submit-{r}")
            subs.append(time.perf_counter() - t0)
            parts.append(m)
        entry = parts[-1]["code"]["repositories"]["entry"]
        ceiling_submit = [
            sh(
                "git status --porcelain >/dev/null && git diff HEAD --binary >/dev/null"
                " && git archive HEAD | gzip -1 >/dev/null",
                repo,
            )
            for _ in range(args.repeats)
        ]
        report["submit"] = {
            "seconds": median(subs),
            "entry_repo_s": entry["seconds"],
            "hpctrain_repo_s": parts[-1]["code"]["repositories"]["hpctrain"].get("seconds"),
            "runtime_s": parts[-1]["timings"]["runtime_s"],
            "snapshot_s": parts[-1]["timings"]["snapshot_s"],
            "snapshot_bytes": parts[-1]["code"]["snapshot"]["bytes"],
            "dirty_files": entry["dirty_count"],
            "ceiling_s": median(ceiling_submit),
            "ratio_vs_ceiling": round(median(subs) / median(ceiling_submit), 2),
        }
        print(json.dumps({"submit": report["submit"]}), flush=True)
        # ------------------------------------------------------------------ start
        import torch  # noqa: F401  (imported by the Runner before rank 0 captures)

        import hpctrain.data.fingerprint  # noqa: F401  (h5py: imported by the Trainer's loader before record_data)

        cold, warm, reads, capture_only, data_cold, data_warm = [], [], [], [], [], []
        for r in range(args.repeats):
            run = base / f"run-start-{r}"
            capture_submit(cfg, [], run)
            evict(data)
            t0 = time.perf_counter()
            m = capture_start(
                run, job_id="1", restart_count=0, entry=cfg.entry, entry_args=cfg.entry_args, world_size=1
            )
            t1 = time.perf_counter()
            ident = record_data(run, "1", 0, [data])
            t2 = time.perf_counter()
            rec = json.loads(ident.path.read_text())
            assert rec["data"]["content_cached"] is False
            cold.append(t2 - t0)
            capture_only.append(t1 - t0)
            data_cold.append(t2 - t1)
            reads.append(rec["data"]["bytes_read"])
            t0 = time.perf_counter()  # a restart: content tier cached
            capture_start(run, job_id="1", restart_count=1, entry=cfg.entry, entry_args=cfg.entry_args, world_size=1)
            t1 = time.perf_counter()
            again = record_data(run, "1", 1, [data])
            t2 = time.perf_counter()
            assert json.loads(again.path.read_text())["data"]["content_cached"] is True and again.changed == ()
            warm.append(t2 - t0)
            data_warm.append(t2 - t1)
        sample = int(statistics.median(reads))
        ceil_cold, ceil_warm = [], []
        for _ in range(args.repeats):
            evict(data)
            ceil_cold.append(
                sh(f"git status --porcelain >/dev/null && head -c {sample} {data} | sha256sum >/dev/null", repo)
            )
            ceil_warm.append(sh("git status --porcelain >/dev/null", repo))
        report["start"] = {
            "uncached_s": median(cold),
            "cached_s": median(warm),
            "capture_start_s": median(capture_only),
            "record_data_uncached_s": median(data_cold),
            "record_data_cached_s": median(data_warm),
            "sample_bytes_read": sample,
            "sample_fraction": round(sample / data.stat().st_size, 5),
            "ceiling_uncached_s": median(ceil_cold),
            "ceiling_cached_s": median(ceil_warm),
            "ratio_uncached_vs_ceiling": round(median(cold) / median(ceil_cold), 2),
            "ratio_cached_vs_ceiling": round(median(warm) / median(ceil_warm), 2),
        }
        print(json.dumps({"start": report["start"]}), flush=True)
        # ------------------------------------------------------------------ full hash
        ours = [sys.executable, "-m", "hpctrain", "data", "hash", str(data)]
        full = {}
        for label, drop in (("warm", False), ("cold", True)):
            a, b = [], []
            for _ in range(max(1, args.repeats - 1)):
                for argv, out in ((ours, a), (["sha256sum", str(data)], b)):
                    if drop:
                        evict(data)
                    else:
                        subprocess.run(["cat", str(data)], stdout=subprocess.DEVNULL, check=True)
                    t0 = time.perf_counter()
                    subprocess.run(argv, env=ENV, check=True, stdout=subprocess.DEVNULL)
                    out.append(time.perf_counter() - t0)
            full[label] = {"hpctrain_s": median(a), "sha256sum_s": median(b), "ratio": round(median(a) / median(b), 2)}
        report["full_hash"] = full
        print(json.dumps({"full_hash": full}), flush=True)
    finally:
        os.chdir(ROOT)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
