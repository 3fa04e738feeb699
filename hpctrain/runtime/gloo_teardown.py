"""Free gloo process groups without the teardown deadlock in torch.

Why this exists: every backward stashes a Python object (a ``contextvars`` context) in the thread-local state
that a DDP all-reduce launched from it captures, so the gloo work's destructor takes the GIL. A gloo worker
thread drops its reference to a work right after running it; when it is the last holder, it destroys the
work there and waits for the GIL. ``~ProcessGroupGloo`` joins those threads, and it runs when the last
reference to the group goes, which is a Python ``del`` (a DDP wrapper freed, a frame left) on a thread that
holds the GIL. If the group goes while a worker is still between finishing its last work and dropping it
(a worker the OS did not schedule for a while, a collective of a broken generation still timing out), the
two wait for each other for ever. Seen as a survivor that never exited after an in-job recovery (1 run in
12 on two loaded cores; the stack: ``Reducer::~Reducer`` -> ``~ProcessGroupGloo`` -> ``thread::join`` on the
main thread, ``AsyncWork::~AsyncWork`` -> ``gil_scoped_acquire`` on a ``pt_gloo_runloop`` thread).

The cure: hold the groups (:func:`hold_groups`) so that no ``del`` elsewhere frees them, leave them, and free
them only once every gloo worker thread of the process is parked in its idle wait
(:func:`wait_for_idle_workers`, which gives up the GIL while it waits, so a worker that needs it gets it).
Groups whose workers do not go idle in time stay held to the end of the process (an ``atexit`` wait gives
them their chance before the interpreter goes away). NCCL has no such worker threads; nothing to do there.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import typing as tp

import torch.distributed as dist

__all__ = ["hold_groups", "busy_workers", "wait_for_idle_workers", "release_when_idle"]

_WORKER_NAME = "pt_gloo_runloop"  # ProcessGroupGloo's worker threads (/proc/self/task/TID/comm)
# futex(2)'s number, which /proc/self/task/TID/syscall names (x86-64 and the generic table differ)
_FUTEX_BY_ARCH = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "riscv64": 98}

_EXIT_WAIT_S = 30.0
_held: tp.List[tp.Any] = []
_held_lock = threading.Lock()
_atexit_armed = False


def _futex_number() -> int:
    return _FUTEX_BY_ARCH.get(os.uname().machine, 202)


def hold_groups() -> tp.List[tp.Any]:
    """References to every process group this process has now (the default one and its subgroups): while the
    list lives, freeing a DDP wrapper or leaving the group does not destroy them."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    return list(dist.distributed_c10d._world.pg_map.keys())


def busy_workers() -> tp.Optional[tp.List[int]]:
    """Thread ids of this process's gloo workers that are not parked in an untimed wait (running, in a timed
    wait: a collective's deadline or the GIL's 5 ms slices); None when the kernel does not tell (no
    /proc/self/task/*/syscall)."""
    futex = _futex_number()
    busy: tp.List[int] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != _WORKER_NAME:
                    continue
            with open(f"/proc/self/task/{tid}/syscall") as f:
                fields = f.read().split()
        except FileNotFoundError:
            continue  # the thread ended
        except OSError:
            return None
        # "NR arg1..arg6 sp pc" when blocked; futex(uaddr, op, val, timeout, ...): idle is a futex with no timeout
        idle = len(fields) >= 5 and fields[0] == str(futex) and int(fields[4], 16) == 0
        if not idle:
            busy.append(int(tid))
    return busy


def wait_for_idle_workers(timeout_s: float, *, poll_s: float = 0.005) -> bool:
    """Give up the GIL until every gloo worker thread is idle twice in a row (``poll_s`` apart), at most
    ``timeout_s``; True when they are. Without /proc's answer: one short sleep, then True (best effort)."""
    deadline = time.monotonic() + timeout_s
    calm = 0
    while True:
        busy = busy_workers()
        if busy is None:
            time.sleep(0.05)
            return True
        calm = calm + 1 if not busy else 0
        if calm >= 2:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def release_when_idle(groups: tp.List[tp.Any], timeout_s: float) -> bool:
    """Free ``groups`` (from :func:`hold_groups`, already left) once the workers are idle; if they are not
    within ``timeout_s``, keep them to the end of the process and return False."""
    if not groups:
        return True
    if wait_for_idle_workers(timeout_s):
        groups.clear()
        return True
    global _atexit_armed
    with _held_lock:
        _held.extend(groups)
        if not _atexit_armed:
            atexit.register(_release_at_exit)
            _atexit_armed = True
    groups.clear()
    return False


def _release_at_exit() -> None:  # pragma: no cover - at interpreter exit
    # Wait a while for a work still running (bounded by its collective timeout) while the interpreter is whole.
    # Still busy: the groups go with the interpreter's teardown, where a worker that asks for the GIL ends.
    if wait_for_idle_workers(_EXIT_WAIT_S):
        with _held_lock:
            _held.clear()
