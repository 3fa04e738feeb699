"""GPU check: loader → pinned buffers → non-blocking H2D on a side stream, under a synthetic GPU step.

    python benchmarks/gpu_check_loader.py --out DIR [--size-mb 1024] [--workers N] [--batch 1024] [--step-ms 5]

Prints JSON (also written to DIR/gpu_check.json): samples/s, the pinned H2D bandwidth (a bare copy, and
what the loader delivered), and the data-wait fraction measured on the GPU with CUDA events: per step,
the time the compute stream sat idle between the end of step i and the moment batch i+1 was on the
device (``max(0, ready - drained)``), over the total GPU time. Without CUDA it exits 3 with one line.
Budget: < 2 minutes on a 16-core H200 node (data generation included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON (and the temporary dataset)")
    ap.add_argument("--size-mb", type=float, default=1024.0)
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 4)))
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--step-ms", type=float, default=5.0, help="synthetic GPU compute per step")
    ap.add_argument("--seconds", type=float, default=30.0, help="max measured time")
    ap.add_argument("--compression", choices=("none", "gzip"), default="none")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check_loader: error: CUDA is not available (torch.cuda.is_available() is False); run this on "
            "a GPU node",
            file=sys.stderr,
        )
        return 3
    from hpctrain.data import H5DataConfig, H5Loader, make_dataset

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    tmp = tempfile.mkdtemp(prefix="hpctrain-gpucheck-", dir=args.out)
    result: dict = {
        "device": torch.cuda.get_device_name(dev),
        "workers": args.workers,
        "batch": args.batch,
        "step_ms": args.step_ms,
        "cpus": os.cpu_count(),
    }
    try:
        n = max(args.batch * 8, int(args.size_mb * 2**20 / (3 * 32 * 32 * 4 + 8)))
        t0 = time.perf_counter()
        comp = None if args.compression == "none" else "gzip"
        path = make_dataset(os.path.join(tmp, "data.h5"), n, compression=comp, fill="fast" if not comp else "random")
        result["generate_s"] = time.perf_counter() - t0

        # bare pinned H2D bandwidth, for reference
        host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        devbuf = torch.empty_like(host, device=dev)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        devbuf.copy_(host, non_blocking=True)
        a.record()
        for _ in range(5):
            devbuf.copy_(host, non_blocking=True)
        b.record()
        b.synchronize()
        result["h2d_pinned_gbps_bare"] = 5 * host.numel() / (a.elapsed_time(b) / 1000) / 1e9
        del host, devbuf

        # a synthetic step of known duration: calibrated matmuls
        m = torch.randn(4096, 4096, device=dev)
        a.record()
        for _ in range(10):
            m = torch.tanh(m @ m * 1e-3)
        b.record()
        b.synchronize()
        per = a.elapsed_time(b) / 10
        reps = max(1, round(args.step_ms / per))
        result["step_ms_actual"] = reps * per

        def step(x: torch.Tensor) -> torch.Tensor:
            y = m
            for _ in range(reps):
                y = torch.tanh(y @ y * 1e-3)
            return y.sum() + x.float().mean()

        cfg = H5DataConfig(
            files=[path],
            keys=("x", "y"),
            global_batch_size=args.batch,
            num_workers=args.workers,
            start_method="forkserver",
            pin_memory=True,
        )
        with H5Loader(cfg, rank=0, world_size=1, device=dev) as loader:
            it = iter(loader)
            step(next(it)["x"])  # warm-up: workers started, first task read
            torch.cuda.synchronize()
            loader.metrics.reset()
            drained, ready = [], []
            steps, t_start = 0, time.perf_counter()
            e0 = torch.cuda.Event(enable_timing=True)
            e0.record()
            for batch in it:
                r = torch.cuda.Event(enable_timing=True)
                r.record()  # on the compute stream, after it was made to wait for this batch's copy
                ready.append(r)
                step(batch["x"])
                d = torch.cuda.Event(enable_timing=True)
                d.record()
                drained.append(d)
                steps += 1
                if time.perf_counter() - t_start > args.seconds:
                    break
            torch.cuda.synchronize()
            wall = time.perf_counter() - t_start
            gpu_total = e0.elapsed_time(drained[-1]) / 1000
            waits = [max(0.0, drained[i].elapsed_time(ready[i + 1])) / 1000 for i in range(len(ready) - 1)]
            summary = loader.metrics.summary()
        sample_bytes = 3 * 32 * 32 * 4 + 8
        result.update(
            {
                "steps": steps,
                "samples_per_s": steps * args.batch / wall,
                "h2d_delivered_gbps": steps * args.batch * sample_bytes / wall / 1e9,
                "data_wait_frac_gpu": sum(waits) / gpu_total if gpu_total > 0 else 0.0,
                "data_wait_ms_p50": sorted(waits)[len(waits) // 2] * 1000 if waits else 0.0,
                "data_wait_frac_host": summary["data_wait_frac"],
                "mean_queue_depth": summary["mean_queue_depth"],
                "read_amplification": summary["read_amplification"],
            }
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
