"""Cost of the always-on measurement, and latency of ``python -m hpctrain status``.

Compared in the same run (ratios hold on a noisy machine, seconds do not):

- metrics overhead: the demo (``hpctrain.examples.demo:main``, synthetic data, DDP over gloo on
  ``--world`` local processes) with metrics on vs ``--no-metrics``, alternating on/off rounds.
  Steps/s of a round = steps / seconds over the intervals after the first (warm-up and the FLOP count
  of step 1 excluded), from the run's own ``train/metrics.jsonl`` (``interval_s`` is measured in
  both modes). The figure is the median over rounds of ``1 - on/off``; the goal is <= 1 %.
- status latency: wall time of ``python -m hpctrain status RUN_DIR --json`` on a finished run, vs the
  interpreter floor (``python -c pass``).

Usage: python benchmarks/bench_train.py [--world 2] [--steps 400] [--rounds 4] [--hidden 128] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, run_dir: str, args: list) -> None:  # child process
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    from hpctrain.launch.runner import Runner

    Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()


def demo_steps_per_s(world: int, run_dir: Path, args: list) -> float:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(run_dir), args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"demo run in {run_dir} failed: exit codes {[p.exitcode for p in procs]}")
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    intervals = [r for r in map(json.loads, lines) if r["kind"] == "interval"][1:]
    return sum(r["steps"] for r in intervals) / sum(r["interval_s"] for r in intervals)


def instrumentation_s_per_step(n: int = 20000) -> float:
    """In-process cost of what the Trainer adds to each step with metrics on (CPU: five perf_counter marks,
    the loss added to a tensor sum), minus the same loop with the recorder disabled: a low-noise figure
    to set against the step time when the end-to-end A/B drowns in the machine's noise."""
    import torch

    from hpctrain.train.metrics import MetricsRecorder

    loss = torch.tensor(1.0)

    def loop(enabled: bool) -> float:
        rec = MetricsRecorder(
            rank=0, world_size=1, device="cpu", run_dir=None, total_steps=n, log_every=n + 1, enabled=enabled
        )
        timer = rec.timer
        t0 = time.perf_counter()
        for _ in range(n):
            timer.start()
            timer.mark("data_wait")
            timer.mark("forward_backward")
            timer.mark("optimizer")
            rec.step_done(loss, samples=128)
        return (time.perf_counter() - t0) / n

    return min(loop(True) for _ in range(3)) - min(loop(False) for _ in range(3))


def wall(argv: list, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, env=ENV, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=4, help="on/off pairs, alternating")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--status-repeats", type=int, default=15)
    ap.add_argument("--json", help="also write the result here")
    opts = ap.parse_args()
    demo = ["--steps", str(opts.steps), "--hidden", str(opts.hidden), "--dim", str(opts.dim), "--quiet"]
    demo += ["--log-every", str(opts.log_every)]
    on, off = [], []
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        for i in range(opts.rounds):
            # alternate which goes first so that a drift in machine load does not favour one side
            order = (("on", []), ("off", ["--no-metrics"])) if i % 2 == 0 else (("off", ["--no-metrics"]), ("on", []))
            for name, extra in order:
                rate = demo_steps_per_s(opts.world, Path(tmp) / f"{name}-{i}", demo + extra)
                (on if name == "on" else off).append(rate)
                print(f"round {i} metrics {name}: {rate:.1f} steps/s", file=sys.stderr, flush=True)
        run_dir = Path(tmp) / "on-0"
        status_s = wall([sys.executable, "-m", "hpctrain", "status", str(run_dir), "--json"], opts.status_repeats)
        floor_s = wall([sys.executable, "-c", "pass"], opts.status_repeats)
    overheads = [1 - a / b for a, b in zip(on, off)]
    added = instrumentation_s_per_step()
    result = {
        "world": opts.world,
        "steps": opts.steps,
        "model": {"dim": opts.dim, "hidden": opts.hidden, "global_batch": 128},
        "steps_per_s_metrics_on": on,
        "steps_per_s_metrics_off": off,
        "on_vs_off_per_round": [a / b for a, b in zip(on, off)],
        "metrics_overhead_median": statistics.median(overheads),
        "metrics_overhead_goal": 0.01,
        "instrumentation_us_per_step": added * 1e6,
        "instrumentation_vs_step_time_off": added * statistics.median(off),
        "status_s_median": status_s,
        "python_pass_s_median": floor_s,
        "status_vs_python_pass": status_s / floor_s,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if opts.json:
        Path(opts.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
