"""A restart with ``TrainConfig.parallel.compile``: warm (the run directory's compile cache) against cold, in one run.

    python benchmarks/bench_compile.py [--repeat 3] [--steps 3] [--hidden 256] [--layers 2] [--json PATH]

A requeued attempt lands on other nodes; torch's own cache (``/tmp/torchinductor_$USER``) is node-local, so
there it compiles **cold**, while hpctrain keeps the cache in the run directory (``RunDir.compile_cache``)
and the attempt compiles **warm**. Each round runs three fresh processes of the demo (1 rank, gloo, the same
``--steps`` from step 0), interleaved: ``eager`` (no compile: the ceiling, what a start costs at least),
``cold`` (compile, an empty cache directory: a new node) and ``warm`` (compile, the cache a priming run left:
the requeue). Each is timed from the process's start to its exit (start-up, the compile on the first
compiled step, the steps). Ratios per round: ``warm_vs_cold`` (< 1: the warm restart is cheaper) and
``warm_vs_eager`` (what compiling still costs a warm restart). Prints JSON (``_rounds`` format).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import typing as tp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _rounds  # noqa: E402
from _common import emit, free_port  # noqa: E402

CHILD = """
import os, sys
sys.path.insert(0, {root!r})
from hpctrain.launch.runner import Runner
Runner(entry="hpctrain.examples.demo:main", run_dir={run!r}, entry_args={args!r})()
"""


def _one(tmp: str, name: str, args: tp.List[str], cache: tp.Optional[str]) -> float:
    run = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    env["MASTER_PORT"] = str(free_port())
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if cache is not None:  # the job's own value wins over the run directory's (ParallelConfig.compile_cache)
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    code = CHILD.format(root=os.path.dirname(HERE), run=run, args=args)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench_compile: the {name} run failed: {done.stderr.strip()[-600:]}")
    shutil.rmtree(run, ignore_errors=True)
    return took


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (eager, cold, warm each round)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the first compiled step is step 2)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--json", help="also write the JSON here")
    a = ap.parse_args(argv)
    demo = ["--steps", str(a.steps), "--hidden", str(a.hidden), "--layers", str(a.layers), "--quiet"]
    tmp = tempfile.mkdtemp(prefix="hpctrain-bench-compile-")
    try:
        warm = os.path.join(tmp, "warm-cache")
        primed = _one(tmp, "prime", [*demo, "--compile"], warm)  # the attempt before the requeue: fills the cache

        def measure(i: int) -> tp.Dict[str, float]:
            eager = _one(tmp, "eager", demo, None)
            cold = _one(tmp, "cold", [*demo, "--compile"], os.path.join(tmp, f"cold-cache-{i}"))
            warm_s = _one(tmp, "warm", [*demo, "--compile"], warm)
            return {"eager_s": eager, "cold_s": cold, "warm_s": warm_s,
                    "warm_vs_cold": warm_s / cold, "warm_vs_eager": warm_s / eager}  # fmt: skip

        rounds = _rounds.run_rounds(a.repeat, measure)
        out: tp.Dict[str, tp.Any] = {"steps": a.steps, "hidden": a.hidden, "layers": a.layers, "prime_s": primed}
        out.update(_rounds.medians([r.figures for r in rounds]))
        out.update(_rounds.report(rounds))
        emit(out, a.json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
