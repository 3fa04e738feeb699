"""Prefetching reader processes and the shared-memory batch slots they fill. numpy/h5py only, no torch.

Life of a batch: the loader computes the sample ids of a *task* (a few consecutive local batches, so
that a worker reads each block of a shuffle window once) → the task goes to worker ``t % W`` → the
worker reads whole blocks and gathers the samples straight into free *slots* of one shared-memory
file → "done" comes back → the loader hands the slots out in task order and recycles a slot when the
consumer asks for the next batch.

Workers open the HDF5 files themselves, lazily, once (nothing h5py is ever pickled), ignore SIGINT,
SIGTERM and SIGUSR2 (Slurm signals the whole step; the parent decides), and exit on their own within
about a second when the loader process disappears.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import mmap
import multiprocessing as mp
import os
import re
import select
import signal
import tempfile
import time
import traceback
import typing as tp
import weakref

import numpy as np

from hpctrain._procs import pid_alive
from hpctrain.data._h5 import Layout, Reader
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.runtime.preemption import DEFAULT_SIGNALS

__all__ = ["SlotArena", "WorkerPool", "InlineReader"]

Spec = tp.List[tp.Tuple[str, str, tp.Tuple[int, ...]]]  # (name, dtype, shape of one batch)


def batch_spec(layout: Layout, rows: int, with_valid: bool) -> Spec:
    ki = layout.files[0].keys
    spec: Spec = [(k, ki[k].dtype, (rows,) + ki[k].sample_shape) for k in layout.keys]
    spec.append(("index", "int64", (rows,)))
    if with_valid:
        spec.append(("valid", "bool", (rows,)))
    return spec


def memory_available(shm_dir: tp.Optional[str] = None) -> tp.Tuple[int, str]:
    """Bytes of memory this process can still take for shared batches, and where that limit comes from:
    the smallest of MemAvailable, the cgroup (Slurm's --mem) headroom and, for a file-backed arena, the
    free space of its tmpfs."""
    limits: tp.List[tp.Tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: the job's memory limit minus what it uses already
        with open("/proc/self/cgroup") as f:
            rel = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
        base = os.path.join("/sys/fs/cgroup", rel.lstrip("/"))
        with open(os.path.join(base, "memory.max")) as f:
            cap = f.read().strip()
        with open(os.path.join(base, "memory.current")) as f:
            used = int(f.read().strip())
        if cap != "max":
            limits.append((max(0, int(cap) - used), "the job's cgroup memory limit"))
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    if shm_dir is not None:
        try:
            st = os.statvfs(shm_dir)
            limits.append((st.f_bavail * st.f_frsize, f"free space in {shm_dir}"))
        except OSError:
            pass
    return min(limits) if limits else (1 << 62, "unknown")


_LEFTOVER = re.compile(r"^hpctrain-data-(\d+)-")


def sweep_leftovers(shm_dir: str) -> int:
    """Remove arena files of dead processes of this user (a file-backed arena killed in the microseconds
    between create and unlink). Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    for name in names:
        m = _LEFTOVER.match(name)
        if m is None:
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
        except OSError:
            continue
    return removed


def _shared_fd(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory that no name refers to: ``memfd_create`` (nothing
    in /dev/shm at all, so a SIGKILL at any moment leaves nothing behind), else a /dev/shm file unlinked
    right after it is created (the descriptor, not the name, is handed to the workers)."""
    if hasattr(os, "memfd_create"):
        try:
            fd = os.memfd_create("hpctrain-data", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            return fd
        except OSError:
            pass
    shm_dir = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else None
    if shm_dir is not None:
        sweep_leftovers(shm_dir)
    fd, path = tempfile.mkstemp(prefix=f"hpctrain-data-{os.getpid()}-", dir=shm_dir)
    os.unlink(path)
    os.ftruncate(fd, size)
    return fd


SHM_DIR = "/dev/shm"


class FdHandle:
    """An open descriptor that travels to a worker process: inherited under ``fork``, passed over the
    start-up channel (``multiprocessing.reduction.DupFd``) under ``spawn`` and ``forkserver``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tp.Tuple[tp.Any, ...]:
        from multiprocessing import reduction

        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup: tp.Any) -> FdHandle:  # pragma: no cover - child
    return FdHandle(dup.detach())


class SlotArena:
    """``nslots`` batch slots in one shared mapping. The memory has no name (see :func:`_shared_fd`), so
    it goes away with the last process that maps it, however that process ends."""

    def __init__(self, spec: Spec, nslots: int, shared: bool = False, fd: tp.Optional[int] = None) -> None:
        self.spec, self.nslots = spec, nslots
        self.offsets: tp.List[int] = []
        off = 0
        for _, dtype, shape in spec:
            self.offsets.append(off)
            nbytes = int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
            off += -(-nbytes // 64) * 64
        self.slot_bytes = max(off, 64)
        size = self.slot_bytes * nslots
        self.handle: tp.Optional[FdHandle] = None
        if fd is not None:  # a worker attaching to the parent's arena
            self.mm = mmap.mmap(fd, size)
            os.close(fd)
        elif shared:
            self.handle = FdHandle(_shared_fd(size))
            self.mm = mmap.mmap(self.handle.fd, size)
        else:
            self.mm = mmap.mmap(-1, size)
        self._views = [self._make_views(s) for s in range(nslots)]

    @staticmethod
    def nbytes(spec: Spec, nslots: int) -> int:
        per = sum(-(-int(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64))) // 64) * 64 for _, d, s in spec)
        return max(per, 64) * nslots

    def _make_views(self, slot: int) -> tp.Dict[str, np.ndarray]:
        base = slot * self.slot_bytes
        out = {}
        for (name, dtype, shape), off in zip(self.spec, self.offsets):
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(self.mm, dtype=dtype, count=count, offset=base + off).reshape(shape)
        return out

    def views(self, slot: int) -> tp.Dict[str, np.ndarray]:
        return self._views[slot]

    def release_handle(self) -> None:
        """Close the parent's descriptor once every worker holds its own (the mapping stays)."""
        if self.handle is not None:
            os.close(self.handle.fd)
            self.handle = None

    def close(self) -> None:
        self.release_handle()
        self._views = []
        try:
            self.mm.close()
        except BufferError:  # a consumer still holds a view; the mapping goes with the last reference
            pass


Task = tp.List[tp.Tuple[int, np.ndarray, tp.Optional[np.ndarray]]]  # (slot, ids, valid)


def fill(reader: Reader, arena: SlotArena, task: Task) -> None:
    outs = [arena.views(slot) for slot, _, _ in task]
    reader.read([ids for _, ids, _ in task], outs)
    for (_slot, ids, valid), out in zip(task, outs):
        out["index"][...] = ids
        if valid is not None:
            out["valid"][...] = valid


def _parent_gone(pid: int) -> bool:
    return pid_alive(pid) is False


_SLURM_SIGNALS = DEFAULT_SIGNALS  # the Runner's stop signals: the parent decides what they mean


def _worker_main(
    wid: int,
    layout: Layout,
    rdcc: int,
    spec: Spec,
    nslots: int,
    shm: FdHandle,
    conn: tp.Any,
    parent_pid: int,
) -> None:  # pragma: no cover - child
    # Slurm signals the whole step (the parent decides what to do); the parent started us with these
    # signals blocked, so none arrived before they are ignored here
    for sig in _SLURM_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SLURM_SIGNALS)
    if os.getppid() == parent_pid:  # fork/spawn: die with the loader; forkserver: EOF on conn, or the poll
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    try:
        arena = SlotArena(spec, nslots, fd=shm.fd)
        reader = Reader(layout, rdcc)
        conn.send(("ready", -1, None))
    except (EOFError, OSError, BrokenPipeError):
        os._exit(0)  # the loader is gone already
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", -1, f"data worker {wid} could not start: {type(exc).__name__}: {exc}"))
        os._exit(0)
    while True:
        try:
            if not conn.poll(1.0):
                if _parent_gone(parent_pid):
                    break
                continue
            item = conn.recv()
        except (EOFError, OSError):  # the loader closed the channel or died: leave quietly
            break
        if item is None:
            break
        task_id, task = item
        t0 = time.perf_counter()
        before = reader.bytes_read
        try:
            fill(reader, arena, task)
            reply = ("done", task_id, (reader.bytes_read - before, time.perf_counter() - t0))
        except UsageError as exc:
            reply = ("usage", task_id, str(exc))
        except HpctrainError as exc:
            reply = ("error", task_id, str(exc))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
            where = traceback.extract_tb(exc.__traceback__)[-1]
            reply = (
                "error",
                task_id,
                f"data worker {wid} failed: {type(exc).__name__}: {exc} (at {os.path.basename(where.filename)}:"
                f"{where.lineno}); please report this",
            )
        try:
            conn.send(reply)
        except (OSError, EOFError):
            break
    reader.close()
    os._exit(0)  # no interpreter teardown: nothing to flush, and no atexit noise at job end


class InlineReader:
    """``num_workers=0``: the same reads, synchronously in the calling process."""

    def __init__(self, layout: Layout, rdcc: int, arena: SlotArena) -> None:
        self.reader, self.arena = Reader(layout, rdcc), arena
        self._done: tp.Dict[int, tp.Tuple[int, float]] = {}

    def submit(self, task_id: int, task: Task) -> None:
        t0, before = time.perf_counter(), self.reader.bytes_read
        fill(self.reader, self.arena, task)
        self._done[task_id] = (self.reader.bytes_read - before, time.perf_counter() - t0)

    def wait(self, task_id: int) -> tp.Tuple[int, float]:
        return self._done.pop(task_id)

    def ready(self, task_id: int) -> bool:
        return task_id in self._done

    def close(self) -> None:
        self.reader.close()

    def alive_pids(self) -> tp.List[int]:
        return []


_ATEXIT_REGISTERED = False
_LIVE_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


def _close_live_pools() -> None:
    """At interpreter exit, before multiprocessing's own handler (which SIGTERMs daemonic children, which
    ignore it, and then joins them forever): ask our workers to leave."""
    for pool in list(_LIVE_POOLS):
        pool.close(timeout=1.0)


class WorkerPool:
    """``n`` persistent reader processes; tasks are sent to worker ``task_id % n`` and collected in order.

    Each worker talks to the loader over its own socket pair (``multiprocessing.Pipe``): no queues, locks
    or named semaphores, so nothing is registered with multiprocessing's resource tracker and nothing is
    left in /dev/shm when the job is killed. A worker leaves when the loader says so, closes its end, or
    dies."""

    def __init__(
        self, layout: Layout, rdcc: int, arena: SlotArena, n: int, start_method: str, timeout_s: float
    ) -> None:
        global _ATEXIT_REGISTERED
        ctx = mp.get_context(start_method)
        if not _ATEXIT_REGISTERED:  # after multiprocessing.util's handler, so that ours runs first (LIFO)
            import multiprocessing.util  # noqa: F401

            atexit.register(_close_live_pools)
            _ATEXIT_REGISTERED = True
        self.n, self.timeout_s = n, timeout_s
        self._done: tp.Dict[int, tp.Tuple[int, float]] = {}
        self.procs: tp.List[tp.Any] = []
        self.conns: tp.List[tp.Any] = []
        assert arena.handle is not None
        # block the signals Slurm sends to the whole step while children start: a child inherits the mask,
        # so it cannot die (or print a KeyboardInterrupt traceback) before it has ignored them; the parent
        # gets anything that arrived in between when the mask is restored
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SLURM_SIGNALS)
        try:
            for w in range(n):
                mine, theirs = ctx.Pipe(duplex=True)
                p = ctx.Process(
                    target=_worker_main,
                    name=f"hpctrain-data-{w}",
                    daemon=True,
                    args=(w, layout, rdcc, arena.spec, arena.nslots, arena.handle, theirs, os.getpid()),
                )
                p.start()
                theirs.close()  # only the worker holds its end: its death is EOF here
                self.procs.append(p)
                self.conns.append(mine)
            _LIVE_POOLS.add(self)
            # one poll set for the pool's life: the loader asks "is this task done?" for every batch, and
            # multiprocessing.connection.wait builds and fills a new selector on each call (0.4-0.6 % of all
            # samples in issue 34's py-spy profile, 0.2-0.3 % with this)
            self._poller = select.poll()
            self._by_fd = {conn.fileno(): i for i, conn in enumerate(self.conns)}
            for fd in self._by_fd:
                self._poller.register(fd, select.POLLIN)
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        try:
            ready = 0
            deadline = time.monotonic() + max(timeout_s, 60.0)
            while ready < n:
                for kind, _tid, _payload in self._receive(max(0.0, deadline - time.monotonic()), startup=True):
                    ready += kind == "ready"
        except BaseException:
            self.close()
            raise
        finally:
            arena.release_handle()

    def _receive(self, timeout: float, startup: bool = False) -> tp.List[tp.Tuple[str, int, tp.Any]]:
        """Messages available within ``timeout``; raises for a worker error, a dead worker or a time-out."""
        deadline = time.monotonic() + timeout
        while True:
            wait_ms = math.ceil(1000 * min(0.5, max(0.0, deadline - time.monotonic())))
            out = []
            for fd, _events in self._poller.poll(wait_ms):  # POLLHUP/POLLERR too: recv then says EOF
                i = self._by_fd[fd]
                conn = self.conns[i]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    p = self.procs[i]
                    p.join(1.0)
                    raise HpctrainError(
                        f"data worker {i} died (exit code {p.exitcode}; killed by a signal if "
                        f"negative, e.g. out of memory); see the job's stderr"
                    ) from None
                kind, task_id, payload = msg
                if kind == "usage":
                    raise UsageError(payload)
                if kind == "error":
                    raise HpctrainError(payload)
                out.append(msg)
            if out or timeout == 0:
                return out
            if time.monotonic() >= deadline:
                what = "started" if startup else "produced anything"
                raise HpctrainError(
                    f"data workers have not {what} for {timeout:.0f} s (filesystem hang?); "
                    f"raise H5DataConfig.worker_timeout_s if reads are this slow"
                )

    def _absorb(self, msgs: tp.List[tp.Tuple[str, int, tp.Any]]) -> None:
        for kind, task_id, payload in msgs:
            if kind == "done":
                self._done[task_id] = payload

    def submit(self, task_id: int, task: Task) -> None:
        try:
            self.conns[task_id % self.n].send((task_id, task))
        except (OSError, EOFError):
            self._absorb(self._receive(1.0))  # reports the dead worker
            raise HpctrainError(f"data worker {task_id % self.n} stopped accepting work") from None

    def ready(self, task_id: int) -> bool:
        if task_id not in self._done:
            self._absorb(self._receive(0.0))
        return task_id in self._done

    def wait(self, task_id: int) -> tp.Tuple[int, float]:
        while task_id not in self._done:
            self._absorb(self._receive(self.timeout_s))
        return self._done.pop(task_id)

    def alive_pids(self) -> tp.List[int]:
        return [p.pid for p in self.procs if p.is_alive() and p.pid is not None]

    def close(self, timeout: float = 2.0) -> None:
        """Stop every worker: ask, then kill; never leaves a child behind."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, EOFError):
                pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()  # SIGTERM is ignored by workers
                p.join(1.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self._poller, self._by_fd = select.poll(), {}  # nothing left to poll
        _LIVE_POOLS.discard(self)
