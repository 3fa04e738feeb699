"""The background writer of async saves: one thread, one save in flight."""

from __future__ import annotations

import ctypes
import platform
import threading
import typing as tp

__all__ = ["Writer"]


def _lower_io_priority() -> None:
    """Best effort: this thread gets best-effort I/O class, lowest level (Linux ioprio_set)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}.get(platform.machine())
        if nr is not None:
            libc.syscall(nr, 1, threading.get_native_id(), (2 << 13) | 7)
    except Exception:  # noqa: BLE001
        pass


class Writer:
    """A single background thread; ``submit`` waits for the previous job first (one save in flight)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._job: tp.Optional[tp.Callable[[], tp.Any]] = None
        self._busy = False
        self._error: tp.Optional[BaseException] = None
        self._result: tp.Any = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hpctrain-ckpt-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        _lower_io_priority()
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            try:
                result, error = job(), None
            except BaseException as exc:  # noqa: BLE001 - surfaced on the next call
                result, error = None, exc
            with self._cv:
                self._job, self._busy, self._result, self._error = None, False, result, error
                self._cv.notify_all()

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, job: tp.Callable[[], tp.Any]) -> None:
        with self._cv:
            self._job, self._busy = job, True
            self._cv.notify_all()

    def wait(self) -> tp.Any:
        """Block until the in-flight job is done; re-raise its error once."""
        with self._cv:
            while self._busy:
                self._cv.wait()
            error, self._error = self._error, None
            result, self._result = self._result, None
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
