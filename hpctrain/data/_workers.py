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

import ctypes
import mmap
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
import typing as tp

import numpy as np

from hpctrain.data._h5 import Layout, Reader
from hpctrain.errors import HpctrainError

__all__ = ["SlotArena", "WorkerPool", "InlineReader"]

Spec = tp.List[tp.Tuple[str, str, tp.Tuple[int, ...]]]  # (name, dtype, shape of one batch)


def batch_spec(layout: Layout, rows: int, with_valid: bool) -> Spec:
    ki = layout.files[0].keys
    spec: Spec = [(k, ki[k].dtype, (rows,) + ki[k].sample_shape) for k in layout.keys]
    spec.append(("index", "int64", (rows,)))
    if with_valid:
        spec.append(("valid", "bool", (rows,)))
    return spec


class SlotArena:
    """``nslots`` batch slots in one shared mapping: a file in /dev/shm unlinked as soon as every worker
    has mapped it (so a killed job leaves nothing behind), or anonymous memory without workers."""

    def __init__(self, spec: Spec, nslots: int, path: tp.Optional[str] = None, create: bool = True) -> None:
        self.spec, self.nslots = spec, nslots
        self.offsets: tp.List[int] = []
        off = 0
        for _, dtype, shape in spec:
            self.offsets.append(off)
            nbytes = int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
            off += -(-nbytes // 64) * 64
        self.slot_bytes = max(off, 64)
        size = self.slot_bytes * nslots
        self.path = path
        if path is None and not create:
            raise ValueError("path needed to attach")
        if create and path == "":
            shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            fd, self.path = tempfile.mkstemp(prefix="hpctrain-data-", dir=shm_dir)
            os.ftruncate(fd, size)
        elif self.path is not None:
            fd = os.open(self.path, os.O_RDWR)
        else:
            fd = -1
        try:
            self.mm = mmap.mmap(fd, size) if fd >= 0 else mmap.mmap(-1, size)
        finally:
            if fd >= 0:
                os.close(fd)
        self._views = [self._make_views(s) for s in range(nslots)]

    def _make_views(self, slot: int) -> tp.Dict[str, np.ndarray]:
        base = slot * self.slot_bytes
        out = {}
        for (name, dtype, shape), off in zip(self.spec, self.offsets):
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(self.mm, dtype=dtype, count=count, offset=base + off).reshape(shape)
        return out

    def views(self, slot: int) -> tp.Dict[str, np.ndarray]:
        return self._views[slot]

    def unlink(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _worker_main(
    wid: int,
    layout: Layout,
    rdcc: int,
    spec: Spec,
    nslots: int,
    shm_path: str,
    tasks: tp.Any,
    results: tp.Any,
    parent_pid: int,
    stop: tp.Any,
) -> None:  # pragma: no cover - child
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    try:  # die with the loader when it is our direct parent (fork/spawn); forkserver: polled below
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    try:
        arena = SlotArena(spec, nslots, path=shm_path, create=False)
        reader = Reader(layout, rdcc)
    except BaseException as exc:  # noqa: BLE001
        results.put(("error", -1, wid, f"data worker {wid} could not start: {type(exc).__name__}: {exc}"))
        return
    results.put(("ready", -1, wid, None))
    while True:
        try:
            item = tasks.get(timeout=1.0)
        except queue.Empty:
            if _parent_gone(parent_pid):
                os._exit(0)
            continue
        if item is None or stop.is_set():
            break
        task_id, task = item
        t0 = time.perf_counter()
        before = reader.bytes_read
        try:
            fill(reader, arena, task)
        except HpctrainError as exc:
            results.put(("error", task_id, wid, str(exc)))
            continue
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
            tb = traceback.format_exc(limit=3).replace("\n", " | ")
            results.put(("error", task_id, wid, f"data worker {wid} failed: {type(exc).__name__}: {exc} ({tb})"))
            continue
        results.put(("done", task_id, wid, (reader.bytes_read - before, time.perf_counter() - t0)))
    reader.close()


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


class WorkerPool:
    """``n`` persistent reader processes; tasks are sent to worker ``task_id % n`` and collected in order."""

    def __init__(
        self, layout: Layout, rdcc: int, arena: SlotArena, n: int, start_method: str, timeout_s: float
    ) -> None:
        ctx = mp.get_context(start_method)
        self.n, self.timeout_s = n, timeout_s
        self.results = ctx.Queue()
        self.stop = ctx.Event()
        self.tasks = [ctx.Queue() for _ in range(n)]
        self._done: tp.Dict[int, tp.Tuple[int, float]] = {}
        self.procs = []
        assert arena.path is not None
        for w in range(n):
            p = ctx.Process(
                target=_worker_main,
                name=f"hpctrain-data-{w}",
                daemon=True,
                args=(
                    w,
                    layout,
                    rdcc,
                    arena.spec,
                    arena.nslots,
                    arena.path,
                    self.tasks[w],
                    self.results,
                    os.getpid(),
                    self.stop,
                ),
            )
            p.start()
            self.procs.append(p)
        try:
            ready = 0
            while ready < n:
                kind, _, wid, msg = self._get(timeout=max(timeout_s, 60.0))
                if kind == "error":
                    raise HpctrainError(msg)
                ready += kind == "ready"
        except BaseException:
            self.close()
            raise
        finally:
            arena.unlink()

    def _get(self, timeout: float) -> tp.Tuple[str, int, int, tp.Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return tp.cast(tp.Tuple[str, int, int, tp.Any], self.results.get(timeout=0.5))
            except queue.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    i, code = dead[0]
                    raise HpctrainError(
                        f"data worker {i} died (exit code {code}; killed by a signal if "
                        f"negative, e.g. out of memory); see the job's stderr"
                    ) from None
                if time.monotonic() > deadline:
                    raise HpctrainError(
                        f"data workers produced nothing for {timeout:.0f} s (filesystem "
                        f"hang?); raise H5DataConfig.worker_timeout_s if reads are this slow"
                    )

    def submit(self, task_id: int, task: Task) -> None:
        self.tasks[task_id % self.n].put((task_id, task))

    def _collect(self, timeout: float) -> None:
        kind, task_id, wid, payload = self._get(timeout)
        if kind == "error":
            raise HpctrainError(payload)
        self._done[task_id] = payload

    def ready(self, task_id: int) -> bool:
        if task_id in self._done:
            return True
        while True:
            try:
                kind, tid, wid, payload = self.results.get_nowait()
            except queue.Empty:
                break
            if kind == "error":
                raise HpctrainError(payload)
            self._done[tid] = payload
        return task_id in self._done

    def wait(self, task_id: int) -> tp.Tuple[int, float]:
        while task_id not in self._done:
            self._collect(self.timeout_s)
        return self._done.pop(task_id)

    def alive_pids(self) -> tp.List[int]:
        return [p.pid for p in self.procs if p.is_alive() and p.pid is not None]

    def close(self, timeout: float = 2.0) -> None:
        """Stop every worker: ask, then terminate, then kill; never leaves a child behind."""
        self.stop.set()  # queued tasks are skipped
        for q in self.tasks:
            try:
                q.put_nowait(None)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()  # SIGTERM is ignored by workers: escalate at once
                p.kill()
                p.join(1.0)
        for q in self.tasks + [self.results]:
            q.cancel_join_thread()
            q.close()
        self.procs = []
