"""What every benchmark here shares: where the repository is, the environment its child processes get,
how a whole command is timed (median of repeats: the machines are noisy, so the benchmarks print
ratios of medians measured in the same run), a free local port for a process group, a cold page cache
for one's own files, waiting for a Slurm job to leave the queue, and the JSON output every benchmark
prints (and writes to ``--json PATH``), which ``benchmarks/run.py`` collects; and the dev cluster's links and
CPU caps for the validations that need a cluster behaving like one (:class:`Shaper`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
import typing as tp
from pathlib import Path

__all__ = [
    "ROOT",
    "ENV",
    "wall",
    "free_port",
    "run_ranks",
    "evict",
    "wait_job",
    "emit",
    "devcluster",
    "Shaper",
    "signals_raise",
]

ROOT = Path(__file__).resolve().parents[1]
DEVCLUSTER = ROOT / "tests" / "cluster" / "devcluster"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TORCH_CPP_LOG_LEVEL="ERROR")


def wall(argv: tp.Sequence[str], repeats: int, env: tp.Optional[tp.Mapping[str, str]] = None) -> float:
    """Median wall-clock seconds of running ``argv`` to completion ``repeats`` times (it must exit 0)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(list(argv), cwd=ROOT, env=dict(env or ENV), check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a local process group's MASTER_PORT): the
    product's pick (``hpctrain.runtime.ports``), below the kernel's ephemeral range that the ranks' own
    connections draw from."""
    from hpctrain.runtime.ports import free_port as pick

    return pick()


def run_ranks(worker: tp.Callable[..., None], world: int, args: tp.Any, out: Path, name: str) -> bool:
    """Run ``worker(rank, world, port, args, str(out))`` in ``world`` spawned processes (``port``: a free one for
    their process group) and wait for them. True when every rank exited 0 and ``out`` was written; else False, after
    saying on stderr which ranks failed. No rank outlives the call."""
    import multiprocessing as mp
    import sys

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, args, str(out))) for r in range(world)]
    try:
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
    if any(pr.exitcode for pr in procs) or not Path(out).exists():
        print(f"{name}: a rank failed (exit codes {[pr.exitcode for pr in procs]})", file=sys.stderr)
        return False
    return True


def evict(path: tp.Union[str, Path]) -> None:
    """Drop the pages of ``path`` (a file, or every file under a directory) from the page cache after an
    fsync, so the next read is cold: no drop_caches, and nobody else's cache is touched."""
    root = Path(path)
    files = [Path(d, f) for d, _, names in os.walk(root) for f in names] if root.is_dir() else [root]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def wait_job(job_id: str, timeout: float = 300) -> None:
    """Return once Slurm job ``job_id`` has left the queue (``squeue`` polled every 0.2 s); TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.2)
    raise TimeoutError(job_id)


def emit(result: tp.Any, path: tp.Union[str, Path, None]) -> None:
    """A benchmark's output: ``result`` as indented JSON on stdout and, with ``--json PATH``, in PATH too."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def devcluster(*args: str) -> str:
    """Run ``tests/cluster/devcluster ARGS`` (root; it must succeed); its stdout."""
    return subprocess.run([str(DEVCLUSTER), *args], check=True, capture_output=True, text=True, timeout=60).stdout


class Shaper:
    """The dev cluster's link (``devcluster link``) and every rank's CPU cap (``devcluster cpu``) for a benchmark's
    runs, changed only when asked for another; both lifted on exit (also on an exception). ``enabled`` False (a
    real cluster): nothing is touched."""

    def __init__(self, enabled: bool, cores_per_rank: tp.Optional[float]) -> None:
        self.enabled, self.cores_per_rank = enabled, cores_per_rank
        self.link: tp.Optional[str] = "unset"
        self.capped = False

    def set(self, link: tp.Optional[str]) -> None:
        if not self.enabled:
            return
        if self.cores_per_rank and not self.capped:
            devcluster("cpu", f"{self.cores_per_rank:g}")
            self.capped = True
        if link != self.link:
            devcluster("link", link or "off")
            self.link = link

    def __enter__(self) -> "Shaper":
        return self

    def __exit__(self, *exc: tp.Any) -> None:
        if self.enabled:
            for args in (("link", "off"), ("cpu", "off")):
                try:
                    devcluster(*args)
                except (subprocess.SubprocessError, OSError):
                    pass


@contextlib.contextmanager
def signals_raise() -> tp.Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (as Ctrl-C raises KeyboardInterrupt), so a benchmark's ``with`` blocks
    (a throttle's cgroup, a mounted image, the dev cluster's shaping) are undone before the process ends."""

    def stop(signum: int, frame: tp.Any) -> None:  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
