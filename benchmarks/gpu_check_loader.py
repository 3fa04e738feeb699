"""GPU check for the loader: every GPU batch equals the CPU reference while the consumer is slow.

    python benchmarks/gpu_check_loader.py --out DIR [--samples 8192] [--batch 256] [--workers 2]

Reference: the same config read to CPU. Then on the GPU, each batch is compared with the reference on
the GPU behind ``torch.cuda._sleep`` (a deliberately slow step) and dropped at once, so a copy that
the consumer stream does not wait for, or batch memory the allocator reuses too early (a missing
``record_stream``), shows as a mismatch. Cases: the default stream across an epoch boundary; a step
inside ``with torch.cuda.stream(s):`` with ``H5Loader(stream=s)``; a loader resumed mid-epoch with
``load_state_dict``. After ``close()`` the loader holds no pinned memory and torch's pinned host
cache is back to what it held before.

Prints one JSON object (also DIR/gpu_check_loader.json); exit 0 when every assertion held, 1 when one
failed, 2 (one line on stderr) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import typing as tp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SLEEP_CYCLES = 5_000_000  # a few ms of GPU time per batch: the consumer lags the copies


def reference(cfg: tp.Any, epochs: int) -> tp.List[tp.Tuple[tp.Any, tp.Any, tp.Dict[str, tp.Any]]]:
    """(x, index, loader state after this batch) for every batch of ``epochs`` epochs, on CPU."""
    from hpctrain.data import H5Loader

    out = []
    with H5Loader(cfg, rank=0, world_size=1) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for b in loader:
                out.append((b["x"].clone(), b["index"].clone(), loader.state_dict()))
    return out


def consume(batches: tp.Iterator[tp.Dict[str, tp.Any]], ref: tp.List[tp.Any], stream: tp.Any = None) -> int:
    """Compare each batch with ``ref`` on the GPU after a slow step; the number of mismatching batches."""
    import torch

    checks, extra = [], 0
    for i, batch in enumerate(batches):
        if i >= len(ref):
            extra += 1
            continue
        with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream()):
            torch.cuda._sleep(SLEEP_CYCLES)
            x, idx = ref[i]
            checks.append((batch["x"] == x).all() & (batch["index"] == idx).all())
        del batch  # dropped at once: its memory is reusable as soon as the allocator thinks it is
    torch.cuda.synchronize()
    return sum(int(not bool(c)) for c in checks) + extra + (len(ref) - len(checks))


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON (and the temporary dataset)")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_loader: CUDA is not available on this machine; run this check on a GPU node", file=sys.stderr)
        return 2
    from hpctrain.data import H5DataConfig, H5Loader, make_dataset

    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="hpctrain-gpucheck-", dir=args.out)
    dev = torch.device("cuda")
    failures: tp.List[str] = []
    res: tp.Dict[str, tp.Any] = {"device": torch.cuda.get_device_name(dev)}
    try:
        path = make_dataset(os.path.join(tmp, "data.h5"), args.samples, fill="fast")
        cfg = H5DataConfig(
            files=[path], keys=("x",), global_batch_size=args.batch, num_workers=args.workers, seed=5, pin_memory=True
        )
        ref_cpu = reference(cfg, epochs=2)
        ref = [(x.to(dev), i.to(dev)) for x, i, _ in ref_cpu]
        per_epoch = len(ref) // 2
        torch.cuda.synchronize()
        host_before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)

        with H5Loader(cfg, rank=0, world_size=1, device=dev) as loader:  # default stream, two epochs

            def two_epochs() -> tp.Iterator[tp.Dict[str, tp.Any]]:
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    yield from loader

            res["default_stream_bad_batches"] = consume(two_epochs(), ref)
            res["pinned_bytes_in_use"] = loader.pinned_bytes

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # the reference tensors are ready for the side stream
        with H5Loader(cfg, rank=0, world_size=1, device=dev, stream=side) as loader:
            res["side_stream_bad_batches"] = consume(iter(loader), ref[:per_epoch], stream=side)

        k = per_epoch // 2
        with H5Loader(cfg, rank=0, world_size=1, device=dev) as loader:
            loader.load_state_dict(ref_cpu[k - 1][2])  # resume after batch k-1 of epoch 0
            res["resumed_bad_batches"] = consume(iter(loader), ref[k:per_epoch])
            pinned_open = loader.pinned_bytes
        res["pinned_bytes_after_close"] = loader.pinned_bytes
        res["torch_host_cache_after_close"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
        res["torch_host_cache_before"] = host_before
        for name in ("default_stream_bad_batches", "side_stream_bad_batches", "resumed_bad_batches"):
            if res[name]:
                failures.append(f"{name}: {res[name]}")
        if not pinned_open or res["pinned_bytes_after_close"]:
            failures.append(f"pinned bytes: {pinned_open} while open, {res['pinned_bytes_after_close']} after close")
        if res["torch_host_cache_after_close"] > host_before:
            failures.append("torch's pinned host cache holds more after close() than before the loaders")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["failures"] = failures
    res["ok"] = not failures
    text = json.dumps(res, indent=2)
    print(text)
    with open(os.path.join(args.out, "gpu_check_loader.json"), "w") as f:
        f.write(text + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
