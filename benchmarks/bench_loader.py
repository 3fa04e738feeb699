"""Throughput of the hpctrain HDF5 loader against the ceiling and the peer a user would write, in one run.

    python benchmarks/bench_loader.py [--size-mb 256] [--workers 2] [--batch 256] [--repeat 3] [--json PATH]

Two variants of the same data (float32 samples (3, 32, 32) + int64 labels): contiguous uncompressed,
and chunked (64 samples a chunk) gzip level 4. Page cache warm. For each:

* ceiling: the fastest sequential single-process read (pread into a preallocated buffer; one big h5py
  read with decompression for gzip);
* peer: torch DataLoader over an h5py per-sample Dataset (opened lazily per worker) with
  DistributedSampler(shuffle=True), same batch size and workers;
* hpctrain: H5Loader, shuffled epoch.

``--repeat N`` rounds, interleaved: each round measures ceiling, peer and hpctrain of both variants once, in
that order, and takes the ratios within the round; the top-level ratios and ``samples_per_s`` are the medians
over the rounds, ``spread`` has every figure's median and min-max, ``rounds`` each round's figures and the 1-min
load average before / after it (``load_changed``: it moved by more than one core; see ``_rounds.py``) and
``foreign_cpu_s.<variant>``: CPU-seconds that other processes took while hpctrain's loader was timed (its two
workers need both cores of a 2-core machine where the ceiling needs one, so other work lowers the ratio).
``file_huge_pages_mb``: the page cache in 2 MB folios before the data was written and after it was warmed (the
ceiling's copy is about twice as fast from those as from 4 kB pages; the loader's gains less).
Rates are steady state (timed from the first batch, so worker start-up is excluded for both loaders).
Plus: loader RSS at 10x the data / at 1x, and the data-wait fraction under a synthetic step of known
duration. Data lives in a temp dir, removed at the end. Prints JSON. Like any user, it reaches hpctrain
through public names only (``hpctrain.data.meters``, ``contiguous_regions``, ``epoch_order``, ``open_h5``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import typing as tp

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rounds  # noqa: E402
from _common import emit  # noqa: E402

from hpctrain.data import (  # noqa: E402
    H5DataConfig,
    H5Loader,
    contiguous_regions,
    epoch_order,
    make_dataset,
    meters,
    open_h5,
)

SHAPE = (3, 32, 32)
SAMPLE_BYTES = 3 * 32 * 32 * 4 + 8


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def file_huge_pages_mb() -> tp.Optional[float]:
    """The machine's page cache held in 2 MB folios (``FileHugePages``, MB; None off Linux): its growth over
    writing and warming the data is about how much of the data files sits in such folios."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("FileHugePages:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def ceiling_pread(path: str, reps: int = 3) -> float:
    """Samples/s of reading both datasets' bytes with large preads into a preallocated buffer (the bytes
    the loader preads: ``hpctrain.data.contiguous_regions``)."""
    found = contiguous_regions(path, ["x", "y"])
    n = found["x"].samples
    regions = [(found[k].offset, found[k].nbytes) for k in ("x", "y")]
    buf = np.empty(max(size for _, size in regions), dtype=np.uint8)
    view = memoryview(buf)
    best = 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            for off, size in regions:
                pos = 0
                while pos < size:
                    pos += os.preadv(fd, [view[pos : min(size, pos + (8 << 20))]], off + pos)
            best = max(best, n / (time.perf_counter() - t0))
    finally:
        os.close(fd)
    return best


def ceiling_h5(path: str, reps: int = 2) -> float:
    """Samples/s of one big h5py read (with decompression) per dataset, into preallocated arrays."""
    best = 0.0
    with open_h5(path, rdcc_nbytes=64 << 20) as f:
        bufs = {k: np.empty(f[k].shape, f[k].dtype) for k in ("x", "y")}
        n = f["x"].shape[0]
        for _ in range(reps):
            t0 = time.perf_counter()
            for k in ("x", "y"):
                f[k].read_direct(bufs[k])
            best = max(best, n / (time.perf_counter() - t0))
    return best


class PerSampleH5:
    """What users write: h5py opened lazily in each worker, one sample per __getitem__."""

    def __init__(self, path: str) -> None:
        self.path, self.f = path, None
        with open_h5(path) as f:
            self.n = f["x"].shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tp.Tuple[np.ndarray, np.ndarray]:
        if self.f is None:  # dataset handles cached too: f["x"] on every call costs ~10x more
            import h5py

            self.f = h5py.File(self.path, "r", locking=False)
            self.x, self.y = self.f["x"], self.f["y"]
        return self.x[i], self.y[i]


def timed(epochs: tp.Callable[[int], tp.Iterable[tp.Any]], batch: int, budget_s: float, min_s: float = 3.0) -> float:
    """Samples/s over whole shuffled epochs (each epoch's pipeline fill included) until ``min_s`` has
    passed, or over ``budget_s`` seconds if one epoch takes longer than that."""
    t0, count, epoch = time.perf_counter(), 0, 1
    while True:
        for _ in epochs(epoch):
            count += batch
            if time.perf_counter() - t0 > budget_s:
                return count / (time.perf_counter() - t0)
        epoch += 1
        if time.perf_counter() - t0 > min_s:
            return count / (time.perf_counter() - t0)


def peer_rate(path: str, batch: int, workers: int, budget_s: float) -> float:
    from torch.utils.data import DataLoader, DistributedSampler

    ds = PerSampleH5(path)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    dl = DataLoader(
        ds,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        drop_last=True,
        multiprocessing_context="fork",
        persistent_workers=True,
        prefetch_factor=2,
    )
    next(iter(dl))  # start the workers; then time epochs 1, 2, ... from the first request

    def epochs(e: int) -> tp.Iterable[tp.Any]:
        sampler.set_epoch(e)
        return dl

    return timed(epochs, batch, budget_s)  # the workers go with ``dl`` when this returns


def loader_cfg(path: str, batch: int, workers: int) -> H5DataConfig:
    return H5DataConfig(
        files=[path], keys=("x", "y"), global_batch_size=batch, seed=0, num_workers=workers, start_method="fork"
    )


def cpu_seconds() -> tp.Tuple[float, float]:
    """(busy CPU-seconds of the whole machine since boot, CPU-seconds of this process and its reaped children):
    over a measurement, the first's growth minus the second's is what other work took meanwhile (NaN off
    Linux). The loader's workers are reaped when it closes, so they count as this process's."""
    import resource

    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        machine = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        machine = float("nan")
    mine = sum(
        u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )
    return machine, mine


def loader_rate(path: str, batch: int, workers: int, budget_s: float) -> tp.Tuple[float, tp.Dict[str, tp.Any]]:
    """Samples/s of H5Loader and its metrics summary, plus ``foreign_cpu_s``: CPU-seconds other processes took
    while it ran (its workers need both cores of a 2-core machine, the ceiling one: other work lowers the ratio)."""
    m0, s0 = cpu_seconds()
    with H5Loader(loader_cfg(path, batch, workers), rank=0, world_size=1) as loader:
        next(iter(loader))  # start the workers; then time epochs 1, 2, ... from the first request
        loader.metrics.reset()

        def epochs(e: int) -> tp.Iterable[tp.Any]:
            loader.set_epoch(e)
            return loader

        rate = timed(epochs, batch, budget_s)
        summary = loader.metrics.summary()
    m1, s1 = cpu_seconds()
    other = (m1 - m0) - (s1 - s0)
    summary["foreign_cpu_s"] = other if math.isnan(other) else max(0.0, other)
    return rate, summary


def pss_tree(pid: int) -> int:
    """Proportional set size of a process and its children (shared pages counted once overall)."""
    import psutil

    p = psutil.Process(pid)
    total = 0
    for q in [p] + p.children(recursive=True):
        try:
            total += q.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def loader_peak_rss(path: str, batch: int, workers: int, batches: int) -> int:
    """Peak RSS of the loader process tree while reading ``batches`` batches (sampled every 20 ms)."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], pss_tree(os.getpid()))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    with H5Loader(loader_cfg(path, batch, workers), rank=0, world_size=1) as loader:
        t.start()
        done = 0
        while done < batches:  # across epochs if the data is small
            for _ in loader:
                done += 1
                if done >= batches:
                    break
        stop.set()
        t.join()
    return peak[0]


def data_wait(path: str, batch: int, workers: int, step_ms: float, steps: int, warmup: int = 25) -> tp.Dict[str, float]:
    """Fraction of wall time a loop with a ``step_ms`` step spends blocked on data (epoch ends included)."""

    def forever(loader: H5Loader) -> tp.Iterator[tp.Any]:
        while True:
            yield from loader

    t_start = time.perf_counter()
    with H5Loader(loader_cfg(path, batch, workers), rank=0, world_size=1) as loader:
        it = forever(loader)
        next(it)
        first_batch_s = time.perf_counter() - t_start
        for _ in range(warmup):  # start-up and the ramp excluded: steady state, as in a long run
            next(it)
            time.sleep(step_ms / 1000)
        loader.metrics.reset()
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
            time.sleep(step_ms / 1000)  # the "GPU" step: frees the CPU as an async CUDA step does
        total = time.perf_counter() - t0
        return {
            "data_wait_frac": loader.metrics.total_wait_s / total,
            "step_ms": step_ms,
            "steps": steps,
            "warmup_steps": warmup,
            "mean_queue_depth": loader.metrics.summary()["mean_queue_depth"],
            "time_to_first_batch_s": first_batch_s,
        }


def mixing(path: str, batch: int) -> tp.Dict[str, float]:
    """How mixed the chunk+window order is (the same figures docs/data.md quotes)."""
    cfg = loader_cfg(path, batch, 0)  # seed 0, shuffled
    ids, block_starts = epoch_order(cfg, epoch=0)
    blk = np.searchsorted(block_starts, ids, side="right") - 1
    nb = len(ids) // batch
    per_batch = [len(np.unique(blk[i * batch : (i + 1) * batch])) for i in range(nb)]
    pos = np.arange(len(ids))
    return {
        "chunk_samples": float(np.diff(block_starts).mean()),
        "window_chunks": cfg.window_chunks,
        "distinct_chunks_per_batch": float(np.mean(per_batch)),
        "adjacent_same_chunk_frac": float(np.mean(blk[1:] == blk[:-1])),
        "spearman_position_vs_id": float(np.corrcoef(pos, ids)[0, 1]),
    }


def _rss_in_child(path: str, batch: int, workers: int, batches: int) -> int:
    """Measure in a fresh interpreter so dataset generation in this one does not pollute the figure."""
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import bench_loader as b; print(b.loader_peak_rss({path!r}, {batch}, {workers}, {batches}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _inflater() -> str:
    """Which inflate hpctrain's gzip path uses: 'isal' (pip install 'hpctrain[fast]') or 'zlib'."""
    return meters()["inflater"]


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=256.0, help="dataset size per variant (default 256)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--budget-s", type=float, default=20.0, help="max seconds per throughput measurement")
    ap.add_argument(
        "--repeat", type=int, default=3, help="interleaved rounds of ceiling, peer, hpctrain (median and spread)"
    )
    ap.add_argument(
        "--rss-base-mb",
        type=float,
        default=None,
        help="1x size for the RSS check (default: size-mb; 10x is written too)",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        help="synthetic step (a sleep, like an async GPU step) for the data-wait fraction",
    )
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--dir", help="where to write the data (default: a temp dir, removed afterwards)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    n = max(args.batch * 4, int(args.size_mb * 2**20 / SAMPLE_BYTES))
    tmp = tempfile.mkdtemp(prefix="hpctrain-bench-", dir=args.dir)
    out: tp.Dict[str, tp.Any] = {
        "samples": n,
        "size_mb": n * SAMPLE_BYTES / 2**20,
        "workers": args.workers,
        "batch": args.batch,
        "cpus": os.cpu_count(),
        "inflater": _inflater(),
    }
    huge_before = file_huge_pages_mb()
    try:
        t0 = time.perf_counter()
        plain = make_dataset(os.path.join(tmp, "plain.h5"), n, shape=SHAPE)
        gz = make_dataset(os.path.join(tmp, "gzip.h5"), n, shape=SHAPE, chunk_samples=64, compression="gzip", level=4)
        out["gzip_file_mb"] = os.path.getsize(gz) / 2**20
        out["generate_s"] = time.perf_counter() - t0
        for p in (plain, gz):
            warm(p)
        # the ceiling's contiguous copy ran 1.6-2.2x faster from 2 MB page-cache folios than from 4 kB ones (the
        # loader's scattered copy gains less), and which one a fresh file gets depends on how fragmented memory
        # is: the ratio moves with it, so the run says which it was (docs/data.md, Measured)
        out["file_huge_pages_mb"] = {"before_data": huge_before, "after_warm": file_huge_pages_mb()}

        def one_round(i: int) -> tp.Dict[str, float]:
            """Ceiling, peer, hpctrain of each variant, once; the ratios within this round."""
            res: tp.Dict[str, tp.Dict[str, float]] = {}
            foreign: tp.Dict[str, float] = {}  # CPU-seconds other work took while hpctrain's loader was timed
            for name, path, ceil in (("uncompressed", plain, ceiling_pread), ("gzip", gz, ceiling_h5)):
                r: tp.Dict[str, tp.Any] = {"ceiling": ceil(path)}
                r["peer"] = peer_rate(path, args.batch, args.workers, args.budget_s)
                r["hpctrain"], summary = loader_rate(path, args.batch, args.workers, args.budget_s)
                r["read_amplification"] = summary["read_amplification"]
                foreign[name] = summary["foreign_cpu_s"]
                res[name] = r
                print(f"round {i} {name}: {json.dumps(r)}", file=sys.stderr)
            figures = _rounds.flatten({"samples_per_s": res})
            figures.update({f"foreign_cpu_s.{name}": foreign[name] for name in foreign})
            for name in ("uncompressed", "gzip"):
                figures[f"{name}_vs_ceiling"] = res[name]["hpctrain"] / res[name]["ceiling"]
                figures[f"{name}_vs_peer"] = res[name]["hpctrain"] / res[name]["peer"]
            return figures

        rounds = _rounds.report(_rounds.run_rounds(args.repeat, one_round))
        med = {k: v["median"] for k, v in rounds["spread"].items()}
        out["samples_per_s"] = {
            name: {k: med[f"samples_per_s.{name}.{k}"] for k in ("ceiling", "peer", "hpctrain", "read_amplification")}
            for name in ("uncompressed", "gzip")
        }
        for name in ("uncompressed", "gzip"):
            for vs in ("ceiling", "peer"):
                out[f"{name}_vs_{vs}"] = med[f"{name}_vs_{vs}"]
        out.update(rounds)
        out["mixing"] = mixing(gz, args.batch)
        waits = {
            "uncompressed": data_wait(plain, args.batch, args.workers, args.step_ms, steps=150),
            "gzip": data_wait(gz, args.batch, args.workers, args.step_ms, steps=150),
        }
        out["data_wait_frac"] = waits["gzip"]["data_wait_frac"]  # the harder variant
        out["data_wait"] = waits
        # below ~200 MB an epoch is shorter than the prefetch window, so 1x would not fill the pipeline
        base_mb = args.rss_base_mb or args.size_mb
        nb = max(args.batch * 4, int(base_mb * 2**20 / SAMPLE_BYTES))
        small = make_dataset(os.path.join(tmp, "rss1.h5"), nb, shape=SHAPE, fill="fast")
        big = make_dataset(os.path.join(tmp, "rss10.h5"), nb * 10, shape=SHAPE, fill="fast")
        steps = 3 * (nb // args.batch)  # three epochs of the 1x data: every prefetch slot gets used
        rss1, rss10 = (_rss_in_child(p, args.batch, args.workers, steps) for p in (small, big))
        out["rss_mb"] = {
            "1x": rss1 / 2**20,
            "10x": rss10 / 2**20,
            "base_data_mb": base_mb,
            "measure": "peak PSS of the loader process + workers, same batch count",
        }
        out["rss_growth_10x"] = rss10 / rss1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
