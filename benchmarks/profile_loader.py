"""Where a batch of the loader spends its time between the file and the batch slot: a sampling profile.

    pip install py-spy
    python benchmarks/profile_loader.py [--size-mb 256] [--rounds 3] [--rate 200]

Runs ``bench_loader.py``'s contiguous measurement (its ceiling, then hpctrain's H5Loader with 2 workers,
per round) under ``py-spy record --subprocesses`` and sorts every sample into a few buckets: the workers'
``preadv`` into the shared-memory slots (the one copy the ceiling also makes: samples whose innermost frame
is a ``preadv`` line of ``_read_direct``, i.e. the kernel copying page cache into the slots), the workers'
Python around it (index bookkeeping, iovec lists, the labels' reads), their messaging, the consumer's side
(asking the workers what is done, each task's sample ids, handing out slots), the ceiling. Prints the table
and each round's rates; ``--json PATH`` writes them. A profile, not a benchmark: the ratios come from
``bench_loader.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import typing as tp

HERE = os.path.dirname(os.path.abspath(__file__))


def _preadv_lines() -> tp.FrozenSet[int]:
    """Lines of hpctrain/data/_h5.py that call ``os.preadv``: a sample whose innermost frame is on one of them
    is in the syscall (the kernel's copy), anything else in ``_read_direct`` is its Python bookkeeping."""
    with open(os.path.join(os.path.dirname(HERE), "hpctrain", "data", "_h5.py")) as f:  # its text, not imported
        return frozenset(i for i, line in enumerate(f, 1) if "os.preadv(" in line)


_PREADV = _preadv_lines()


def _leaf_line(leaf: str) -> int:
    m = re.search(r":(\d+)\)$", leaf)
    return int(m.group(1)) if m else -1


# (bucket, test on the ';'-joined stack and its innermost frame); the first that matches takes the sample
BUCKETS: tp.List[tp.Tuple[str, tp.Callable[[str, str], bool]]] = [
    (
        "worker: preadv of the samples into the batch slots (the kernel's copy)",
        lambda s, leaf: "_read_direct" in leaf and "_h5.py" in leaf and _leaf_line(leaf) in _PREADV,
    ),
    ("worker: _read_direct's index bookkeeping and iovec lists", lambda s, leaf: "_read_direct" in s),
    ("worker: small keys (labels): staging preadv + gather", lambda s, leaf: "_read_run" in s),
    ("worker: Reader.read's bookkeeping (searchsorted, unique, take)", lambda s, leaf: "Reader.read" in s),
    ("worker: task loop, messages, start", lambda s, leaf: "_worker_main" in s),
    # blocked until the head task is done: idle, but py-spy --nonblocking cannot always tell a thread asleep in
    # poll() from a running one, so it gets its own line instead of inflating the next one
    ("consumer: waiting for the next task (blocked in poll)", lambda s, leaf: "WorkerPool.wait" in s),
    (
        "consumer: asking the workers what is done",
        lambda s, leaf: "H5Loader" in s and ("WorkerPool._receive" in s or "WorkerPool.ready" in s),
    ),
    ("consumer: each task's sample ids (epoch order)", lambda s, leaf: "H5Loader" in s and "_order.py" in s),
    ("consumer: H5Loader hands out slots, submits tasks", lambda s, leaf: "H5Loader" in s),
    ("ceiling: pread into one buffer", lambda s, leaf: "ceiling_pread" in s),
]


def _measure(size_mb: float, rounds: int, out: str) -> None:
    """The profiled process: bench_loader's own functions, contiguous variant, interleaved per round."""
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    import bench_loader as bl

    from hpctrain.data import make_dataset

    tmp = tempfile.mkdtemp(prefix="hpctrain-profile-loader-")
    try:
        path = make_dataset(os.path.join(tmp, "plain.h5"), int(size_mb * 2**20 // bl.SAMPLE_BYTES), shape=bl.SHAPE)
        bl.warm(str(path))
        got = []
        for r in range(rounds):
            ceiling = bl.ceiling_pread(str(path))
            rate, summary = bl.loader_rate(str(path), 256, 2, 8.0)
            got.append({"round": r, "ceiling_samples_per_s": ceiling, "hpctrain_samples_per_s": rate,
                        "ratio": rate / ceiling, "read_amplification": summary.get("read_amplification")})  # fmt: skip
        with open(out, "w") as f:
            json.dump(got, f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _buckets(raw: str) -> tp.Dict[str, int]:
    counts: tp.Counter[str] = collections.Counter()
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            leaf = stack.rsplit(";", 1)[-1]
            name = next((b for b, test in BUCKETS if test(stack, leaf)), "other (imports, data set-up, interpreter)")
            counts[name] += int(n)
    return dict(counts)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=256.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--json", help="also write the table and the rounds here")
    ap.add_argument("--measure-only", metavar="OUT", help=argparse.SUPPRESS)  # the profiled child
    a = ap.parse_args(argv)
    if a.measure_only:
        _measure(a.size_mb, a.rounds, a.measure_only)
        return 0
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("profile_loader: py-spy is not installed; run: pip install py-spy", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hpctrain-profile-") as tmp:
        raw, rounds_path = os.path.join(tmp, "raw.txt"), os.path.join(tmp, "rounds.json")
        cmd = [spy, "record", "--subprocesses", "--nonblocking", "-r", str(a.rate), "-f", "raw", "-o", raw, "--",
               sys.executable, os.path.abspath(__file__), "--measure-only", rounds_path,
               "--size-mb", str(a.size_mb), "--rounds", str(a.rounds)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(rounds_path):
            print(f"profile_loader: the profiled run failed: {done.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        counts, rounds = _buckets(raw), json.load(open(rounds_path))
    total = sum(counts.values()) or 1
    worker = sum(v for k, v in counts.items() if k.startswith("worker")) or 1
    print(f"{'samples':>8} {'of all':>7} {'of workers':>10}  where")
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        share = f"{100 * n / worker:9.1f}%" if name.startswith("worker") else " " * 10
        print(f"{n:8d} {100 * n / total:6.1f}% {share}  {name}")
    for r in rounds:
        c, h = r["ceiling_samples_per_s"], r["hpctrain_samples_per_s"]
        print(f"round {r['round']}: ceiling {c:.0f}/s, hpctrain {h:.0f}/s ({r['ratio']:.2f}x), "
              f"read amplification {r['read_amplification']}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"samples": counts, "rounds": rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
