"""Predicted vs measured data wait at 1-4 nodes on storage that saturates (docs/capacity.md, "Validation of the
input path").

Needs root, the dev cluster (``tests/cluster/devcluster up``) and cgroup v1's ``blkio`` controller. The storage: an
ext4 file system on a loop device (``--image``, made if missing, mounted for the run and unmounted after) holding
the demo's HDF5 input (64 KiB float32 samples, one sample per HDF5 chunk so that a read task covers a few steps),
read through a cgroup v1 ``blkio`` throttle (``blkio.throttle.read_bps_device`` of the loop device: ``--read-mbps``
in all, shared by every reader in the cgroup). The loop device's read-ahead is set to 0 while mounted, so the device
serves the bytes the loader asks for (the model's assumption; the default 2.5 MiB read-ahead turns each random 64 KiB
chunk read into more device bytes than the loader counts). The four nodes' ``slurmd`` processes are moved into the
cgroup while the benchmark runs (the jobs they start inherit it; only reads of the loop device are limited) and
moved back after, also on failure, Ctrl-C or SIGTERM; a cgroup left by a killed run is emptied at the next start.

1. Calibrate at 1 and 2 nodes with the storage unthrottled (``capacity --calibrate``'s path, all-reduce probe
   included): a node's own read rate, the compute, the communication. The demo waits ``--sleep-ms`` in each forward
   (a GPU's compute that leaves the two CPUs free). Every rank runs with ``--cores-per-rank`` cores of its own
   (``devcluster cpu``, its loader workers included; lifted at the end), so a rank's reads, decode and all-reduce
   do not slow when more nodes run.
2. Measure the aggregate bandwidth ``A``: one sequential read of a cold file inside the throttled cgroup (the rate
   after its first 10 %, so the throttle's first time slice does not count).
3. Predict the data wait at 1-4 nodes (``capacity_report`` with ``read_bw=A``, ``local_batch``), then run each
   node count throttled, with a cold page cache, ``--repeats`` times, interleaved (the order reversed every other
   repeat), and compare. Measured: each run's data wait as the step saw it, the slowest rank's (the max over ranks,
   then the median over its interval records, the first left out: ``Calibration.data_wait_slowest_s``; the median
   rank's is reported beside it), and its step time. Each run also checks that the throttle saw the job's reads
   (the cgroup's ``blkio.throttle.io_service_bytes`` of the loop device against the loader's bytes read).

``python benchmarks/input_path_validation.py [--out runs/input-path] [--read-mbps 20] [--repeats 2] [--json PATH]``
(6.6 minutes with the defaults on the dev cluster). Run directories go to a fresh ``OUT/<UTC time>/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, Shaper, emit, evict, signals_raise  # noqa: E402
from hpctrain.capacity import Targets, capacity_report, read_calibrations  # noqa: E402
from hpctrain.capacity.cli import calibrate  # noqa: E402

BLKIO = Path("/sys/fs/cgroup/blkio")
CGROUP = BLKIO / "hpctrain-input-path"
SAMPLE_SHAPE = (16384,)  # float32: 64 KiB a sample
NODE_NS_PREFIX = "hpct-node"  # tests/cluster/devcluster's namespaces (no DEVCLUSTER_PREFIX)
ENTRY = "hpctrain.examples.demo:main"


def _sh(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout.strip()


def requirements() -> str:
    """Empty when this machine can run the benchmark, else why not (one line)."""
    if os.geteuid() != 0:
        return "needs root (a loop device, mount, cgroup v1 blkio)"
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        return f"no cgroup v1 blkio throttle at {BLKIO}"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount", "findmnt", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control (no loop devices)"
    return ""


def slurmd_pids() -> tp.List[int]:
    """The dev cluster's slurmd processes (one per node namespace)."""
    pids = []
    for ns in _sh("ip", "netns", "list").splitlines():
        name = ns.split(" ")[0]
        if not name.startswith(NODE_NS_PREFIX):
            continue
        for pid in _sh("ip", "netns", "pids", name).split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
                    pids.append(int(pid))
            except OSError:  # ended meanwhile
                pass
    return sorted(pids)


def blkio_cgroup(pid: int) -> Path:
    """The blkio cgroup directory ``pid`` is in."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return BLKIO / path.lstrip("/")
    return BLKIO


def _procs(cgroup: Path) -> tp.List[int]:
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _move(pid: int, cgroup: Path) -> None:
    try:
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")
    except ProcessLookupError:  # ended meanwhile
        pass
    except OSError as exc:
        if exc.errno != 3:  # ESRCH
            raise


def release_cgroup(cgroup: Path = CGROUP) -> None:
    """Empty and remove ``cgroup`` (every process in it back to the root blkio cgroup, its read limits cleared); a
    no-op when it does not exist. Used at the end of a run and at the start (a run killed with SIGKILL leaves it)."""
    if not cgroup.exists():
        return
    for _ in range(50):
        procs = _procs(cgroup)
        if not procs:
            break
        for pid in procs:
            _move(pid, BLKIO)
        time.sleep(0.05)
    rules = (cgroup / "blkio.throttle.read_bps_device").read_text().split("\n")
    for rule in filter(None, rules):
        (cgroup / "blkio.throttle.read_bps_device").write_text(f"{rule.split()[0]} 0\n")
    for _ in range(50):
        try:
            cgroup.rmdir()
            return
        except OSError:
            for pid in _procs(cgroup):
                _move(pid, BLKIO)
            time.sleep(0.1)
    raise RuntimeError(f"{cgroup}: cannot be removed (processes {_procs(cgroup)} remain)")


class Storage:
    """The loop-device file system: made (``mkfs.ext4``) when ``image`` is missing, attached to a free loop device
    with read-ahead 0, mounted on ``mnt``; unmounted and detached on exit (read-ahead needs no restoring: the loop
    device is released)."""

    def __init__(self, image: Path, mnt: Path, size_mb: int) -> None:
        self.image, self.mnt, self.size_mb = image, mnt, size_mb
        self.loop: tp.Optional[str] = None
        self.dev = ""

    def stale(self) -> None:
        """Unmount and detach what a killed run left: every loop device of ``image`` (and ``mnt`` if it is one)."""
        if not self.image.exists():
            return
        for line in _sh("losetup", "-j", str(self.image)).splitlines():
            loop = line.split(":")[0]
            found = subprocess.run(
                ["findmnt", "-n", "-o", "TARGET", "-S", loop, "--raw"], capture_output=True, text=True
            )
            for target in found.stdout.split():
                subprocess.run(["umount", target], check=True)
            subprocess.run(["losetup", "-d", loop], check=True)

    def __enter__(self) -> "Storage":
        self.stale()
        if os.path.ismount(self.mnt):
            raise RuntimeError(f"{self.mnt} is mounted, not from {self.image}: give another --mnt")
        if not self.image.exists() or self.image.stat().st_size < self.size_mb << 20:
            self.image.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["truncate", "-s", f"{self.size_mb}M", str(self.image)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.loop = _sh("losetup", "--find", "--show", str(self.image))
        try:
            name = Path(self.loop).name
            Path(f"/sys/block/{name}/queue/read_ahead_kb").write_text("0\n")
            self.dev = Path(f"/sys/block/{name}/dev").read_text().strip()
            subprocess.run(["mount", self.loop, str(self.mnt)], check=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: tp.Any) -> None:
        for _ in range(20):
            if not os.path.ismount(self.mnt):
                break
            if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)  # a reader (a job being cancelled) still has a file open
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = None


class Throttle:
    """The blkio cgroup the dev cluster's slurmd processes are moved into (and back out of, on exit: each to the
    cgroup it came from; any job process still inside to the root cgroup; the cgroup removed). ``set(rate)``: the
    read limit of the loop device ``dev`` in bytes/s. The kernel counts a cgroup's bytes only while a rule is set,
    so "unthrottled" is a rule far above any rate here (``UNLIMITED``)."""

    UNLIMITED = 100 << 30

    def __init__(self, dev: str, pids: tp.Sequence[int], cgroup: Path = CGROUP) -> None:
        self.dev, self.pids, self.cgroup = dev, list(pids), cgroup
        self.home: tp.Dict[int, Path] = {}

    def __enter__(self) -> "Throttle":
        release_cgroup(self.cgroup)
        self.cgroup.mkdir()
        try:
            self.set(self.UNLIMITED)
            for pid in self.pids:
                self.home[pid] = blkio_cgroup(pid)
                _move(pid, self.cgroup)
        except BaseException:
            self.__exit__()
            raise
        return self

    def set(self, bytes_per_s: float) -> None:
        (self.cgroup / "blkio.throttle.read_bps_device").write_text(f"{self.dev} {int(bytes_per_s)}\n")

    def bytes_read(self) -> int:
        """Bytes read from the loop device by the cgroup's processes so far (while a rule was set)."""
        for line in (self.cgroup / "blkio.throttle.io_service_bytes").read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == self.dev and parts[1] == "Read":
                return int(parts[2])
        return 0

    def __exit__(self, *exc: tp.Any) -> None:
        for pid, home in self.home.items():
            _move(pid, home if home.exists() else BLKIO)
        release_cgroup(self.cgroup)


PROBE = r"""
import os, sys, time
path, out = sys.argv[1], []
fd = os.open(path, os.O_RDONLY)
t0 = time.perf_counter()
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    out.append((time.perf_counter() - t0, len(b)))
total = sum(n for _, n in out)
got = 0
for t, n in out:
    got += n
    if got >= total / 10:
        t10, b10 = t, got
        break
print((total - b10) / (out[-1][0] - t10))
"""


def probe_bandwidth(path: Path, mb: int, cgroup: Path = CGROUP) -> float:
    """A sequential read of a cold ``mb`` MB file inside the throttled cgroup: bytes/s over its last 90 %."""
    if not path.exists() or path.stat().st_size != mb << 20:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
    evict(path)
    script = f'echo $$ > {cgroup}/cgroup.procs && exec "$0" -c "$1" "$2"'
    out = _sh("sh", "-c", script, sys.executable, PROBE, str(path))
    return float(out)


def _job_id(run_dir: Path) -> tp.Optional[str]:
    try:
        got = json.loads((run_dir / "submission.json").read_text()).get("job_id")
    except (OSError, ValueError):
        return None
    return str(got) if got else None


def run_demo(run_dir: Path, nodes: int, demo_args: tp.Sequence[str], submit_args: tp.Sequence[str]) -> None:
    """One demo job on ``nodes`` nodes (one rank each), followed to its end; cancelled when interrupted."""
    argv = [sys.executable, "-m", "hpctrain.submit", "--nodes", str(nodes), "--tasks-per-node", "1"]
    argv += ["--job-name", f"input-{run_dir.name}", "--run-dir", str(run_dir), "--follow", *submit_args]
    argv += ["--entry", ENTRY, "--", *demo_args]
    log = run_dir.parent / f"{run_dir.name}.log"
    try:
        with open(log, "wb") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    except BaseException:
        job = _job_id(run_dir)
        if job:
            subprocess.run(["scancel", job], capture_output=True)
        raise
    if rc != 0:
        raise RuntimeError(f"demo run {run_dir} failed (submit exit {rc}); see {log}")


def _interval_waits(run_dir: Path) -> tp.List[float]:
    """The per-step data wait of each interval record after the first (median over ranks), seconds."""
    out = []
    for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "interval":
            got = ((rec.get("per_step") or {}).get("data_wait_s") or {}).get("median")
            out.append(float(got) if isinstance(got, (int, float)) else math.nan)
    return out[1:]


def _loader_bytes(run_dir: Path) -> int:
    """Rank 0's loader bytes read over the whole run (the interval records' ``input``)."""
    total = 0
    for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "interval":
            total += int((rec.get("input") or {}).get("bytes_read") or 0)
    return total


def make_data(path: Path, samples: int) -> None:
    """The demo's input: ``samples`` x 64 KiB float32, one sample per chunk (read tasks of a few steps; a whole
    chunk is read, so no read amplification), unless ``path`` already holds exactly that."""
    import h5py

    from hpctrain.data import make_dataset

    if path.exists():
        try:
            with h5py.File(path, "r") as f:
                if f["x"].shape == (samples, *SAMPLE_SHAPE) and f["x"].chunks == (1, *SAMPLE_SHAPE):
                    return
        except (OSError, KeyError):
            pass
        path.unlink()
    make_dataset(path, samples, shape=SAMPLE_SHAPE, chunk_samples=1, fill="fast")


def demo_args(data: Path, nodes: int, ns: argparse.Namespace) -> tp.List[str]:
    args = ["--data", str(data), "--steps", str(ns.steps), "--log-every", str(ns.log_every), "--workers", "2"]
    args += ["--batch-size", str(ns.local_batch * nodes), "--hidden", "4", "--layers", "0", "--quiet"]
    return args + ["--sleep-ms", str(ns.sleep_ms)]


def validate(ns: argparse.Namespace, echo: tp.Callable[[str], None] = print) -> tp.Dict[str, tp.Any]:
    """The whole benchmark (see the module doc); returns the JSON it emits."""
    why = requirements()
    if why:
        raise SystemExit(f"input_path_validation: {why}")
    os.environ["PYTHONPATH"] = str(ROOT)  # the jobs run this checkout's hpctrain (sbatch exports the environment)
    nodes = [int(x) for x in ns.nodes.split(",")]
    out = Path(ns.out).resolve() / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True)
    submit = shlex.split(ns.submit_args)
    # every rank's reads of one run (steps x local batch, plus the tasks read ahead) come from its own partition of
    # 1/N of the file: no sample is read twice in a run, so no read hits the page cache
    samples = ns.samples or max(nodes) * (ns.steps + 16) * ns.local_batch
    size_mb = int(samples * 0.0656 * 1.15) + ns.probe_mb + 200
    pids = slurmd_pids()
    if len(pids) < max(nodes):
        raise SystemExit(f"input_path_validation: {len(pids)} slurmd processes found; start the dev cluster")
    started = time.time()
    shaper = Shaper(bool(ns.cores_per_rank), ns.cores_per_rank or None)
    with signals_raise(), shaper, Storage(Path(ns.image), Path(ns.mnt), size_mb) as storage:
        shaper.set(None)  # every rank (and its loader workers) its own cores; the links stay unshaped
        data = Path(ns.mnt) / "data.h5"
        make_data(data, samples)
        with Throttle(storage.dev, pids) as throttle:
            cal: tp.List[Path] = []
            for n in [int(x) for x in ns.calibrate.split(",")]:
                evict(data)
                cal += calibrate([(n, 1)], entry=ENTRY, entry_args=demo_args(data, n, ns), out_dir=out / "calibration",
                                 submit_args=submit, echo=echo)  # fmt: skip
            throttle.set(ns.read_mbps * 1e6)
            agg = probe_bandwidth(Path(ns.mnt) / "probe.bin", ns.probe_mb, throttle.cgroup)
            echo(f"aggregate read bandwidth (probe in the cgroup): {agg / 1e6:.2f} MB/s (throttle {ns.read_mbps} MB/s)")
            targets = Targets(nodes=tuple(nodes), local_batch=ns.local_batch, read_bw=agg)
            report = capacity_report(cal, targets)
            runs: tp.Dict[int, tp.List[tp.Dict[str, tp.Any]]] = {}
            measure = [int(x) for x in ns.measure.split(",")] if ns.measure else nodes
            for rep in range(ns.repeats):
                for n in measure if rep % 2 == 0 else measure[::-1]:
                    run_dir = out / f"r{rep}" / f"n{n}"
                    run_dir.parent.mkdir(parents=True, exist_ok=True)
                    evict(data)
                    before, load = throttle.bytes_read(), os.getloadavg()[0]
                    echo(f"repeat {rep}: {n} node(s) -> {run_dir}")
                    run_demo(run_dir, n, demo_args(data, n, ns), submit)
                    device = throttle.bytes_read() - before
                    (c,) = read_calibrations(run_dir)
                    loader = _loader_bytes(run_dir) * n
                    runs.setdefault(n, []).append(
                        {
                            "run_dir": str(run_dir),
                            "data_wait_s": c.data_wait_slowest_s,
                            "data_wait_median_rank_s": c.data_wait_s,
                            "step_s": c.step_s,
                            "interval_waits_s": _interval_waits(run_dir),
                            "device_bytes": device,
                            "loader_bytes": loader,
                            "load_average": [load, os.getloadavg()[0]],
                        }
                    )
                    if device < 0.5 * loader:
                        raise RuntimeError(
                            f"{run_dir}: the throttled cgroup saw {device} bytes read of the loop device, the loaders "
                            f"{loader}: the jobs' reads are not throttled (slurmd not in {CGROUP}?)"
                        )
    return _result(ns, report, runs, agg, time.time() - started, echo)


def _err(pred: float, meas: float) -> tp.Optional[float]:
    return (pred - meas) / meas if meas > 0 else None


def _result(
    ns: argparse.Namespace,
    report: tp.Dict[str, tp.Any],
    runs: tp.Dict[int, tp.List[tp.Dict[str, tp.Any]]],
    agg: float,
    seconds: float,
    echo: tp.Callable[[str], None],
) -> tp.Dict[str, tp.Any]:
    predicted = {r["nodes"]: r for r in report["rows"]}
    rows = []
    for n, got in sorted(runs.items()):
        row = predicted[n]
        waits = [g["data_wait_s"] for g in got]
        median_rank = statistics.median(g["data_wait_median_rank_s"] for g in got)
        steps = [g["step_s"] for g in got]
        pr, ms = row["parts"]["data_wait_s"], statistics.median(waits)
        bound = bool(row["input"]["storage_bound"])
        rows.append(
            {
                "nodes": n,
                "storage_bound": bound,
                "data_wait_predicted_s": pr,
                "data_wait_measured_s": ms,
                "data_wait_runs_s": waits,
                "data_wait_error": _err(pr, ms),
                "data_wait_median_rank_s": median_rank,
                "data_wait_median_rank_error": _err(pr, median_rank),
                "data_wait_noise": (max(waits) - min(waits)) / ms if ms > 0 else None,
                "step_predicted_s": row["step_s"],
                "step_measured_s": statistics.median(steps),
                "step_runs_s": steps,
                "step_error": _err(row["step_s"], statistics.median(steps)),
                "device_over_loader_bytes": [g["device_bytes"] / g["loader_bytes"] for g in got if g["loader_bytes"]],
                "load_average": [g["load_average"] for g in got],
                "runs": got,
            }
        )
        noise = rows[-1]["data_wait_noise"]
        err = rows[-1]["data_wait_error"]
        echo(
            f"{n} node(s){' (storage-bound)' if bound else ''}: data wait predicted {pr * 1e3:.1f} ms, measured "
            f"{ms * 1e3:.1f} ms {[round(w * 1e3, 1) for w in waits]}"
            + (f", error {err:+.1%}" if err is not None else "")
            + (f", repeat spread {noise:.1%}" if noise is not None else "")
            + f" (the median rank's: {median_rank * 1e3:.1f} ms)"
            + f"; step predicted {row['step_s'] * 1e3:.1f} ms, measured {statistics.median(steps) * 1e3:.1f} ms"
        )
    bound = [abs(r["data_wait_error"]) for r in rows if r["storage_bound"] and r["data_wait_error"] is not None]
    step = [abs(r["step_error"]) for r in rows if r["step_error"] is not None]
    summary = {
        "storage_bound_from": report["summary"].get("storage_bound_from"),
        "bound_mean_abs_error": statistics.mean(bound) if bound else None,
        "bound_max_abs_error": max(bound) if bound else None,
        "step_mean_abs_error": statistics.mean(step) if step else None,
        "step_max_abs_error": max(step) if step else None,
    }
    echo(f"storage becomes the bound at {summary['storage_bound_from']} nodes (predicted)")
    if bound:
        echo(f"storage-bound rows: data wait |error| mean {statistics.mean(bound):.1%}, max {max(bound):.1%}")
    if step:
        echo(f"all rows: step |error| mean {statistics.mean(step):.1%}, max {max(step):.1%}")
    model = report["model"]
    return {
        "benchmark": "input_path_validation",
        "argv": sys.argv[1:],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "aggregate_bps": agg,
        "throttle_bps": ns.read_mbps * 1e6,
        "cores_per_rank": ns.cores_per_rank or None,
        "model": {k: model[k] for k in ("bytes_per_sample", "node_read_rate", "read_bw", "data_floor_s") if k in model},
        "summary": summary,
        "rows": rows,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/input-path", help="run directories go to OUT/<UTC time>/")
    p.add_argument("--image", default="/tmp/hpctrain-input-path.img", help="the loop device's image file (kept)")
    p.add_argument("--mnt", default="/tmp/hpctrain-input-path", help="where it is mounted while the benchmark runs")
    p.add_argument("--read-mbps", type=float, default=20.0, help="the throttle: MB/s of reads in all")
    p.add_argument("--samples", type=int, default=0, help="samples in the input file (0: enough for one pass)")
    p.add_argument("--probe-mb", type=int, default=64, help="size of the bandwidth probe's file")
    p.add_argument("--local-batch", type=int, default=32)
    p.add_argument("--sleep-ms", type=float, default=140.0)
    p.add_argument("--steps", type=int, default=108)
    p.add_argument(
        "--log-every",
        type=int,
        default=12,
        help="steps per metrics interval: a multiple of the loader's read task (4 steps here), so that every interval "
        "holds whole tasks (10 would alternate between 2 and 3 tasks' reads and waits)",
    )
    p.add_argument("--nodes", default="1,2,3,4", help="node counts to predict and measure (throttled)")
    p.add_argument("--calibrate", default="1,2", help="node counts of the calibration runs (unthrottled)")
    p.add_argument("--measure", default="", help="node counts to run throttled (default: --nodes)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--cores-per-rank",
        type=float,
        default=0.45,
        help="devcluster cpu: cores of each rank's own, its loader workers included (0: uncapped, the ranks share "
        "the machine)",
    )
    p.add_argument("--submit-args", default="--cluster slurm --cpus-per-task 1 --time 10")
    p.add_argument("--json", help="also write the JSON here")
    return p


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ns = parser().parse_args(argv)
    emit(validate(ns), ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
