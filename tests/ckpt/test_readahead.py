"""The restore's read-ahead (``hpctrain.ckpt._readahead``): which shard files a rank asks the kernel to read while it
builds the index and the plan, that the kernel does start reading them, that a hostile file never holds it (a FIFO
is never opened), and that the restore ends its thread."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from hpctrain.ckpt._format import shard_name, step_name
from hpctrain.ckpt._readahead import readahead, shards_to_read_ahead
from tests.ckpt import workers as w
from tests.multiproc import run_world


def test_which_shards_a_rank_reads_ahead():
    assert shards_to_read_ahead(4, 2, 4, "read_once") == [2]  # the shard it wrote: its part of the packed buffer
    assert shards_to_read_ahead(4, 0, 2, "read_once") == []  # another world: which files is known from the plan only
    assert shards_to_read_ahead(2, 1, 4, "read_once") == []
    assert shards_to_read_ahead(3, 1, 2, "read_all") == [0, 1, 2]  # every rank reads every shard
    assert shards_to_read_ahead(1, 0, 1, "read_all") == [0]
    assert shards_to_read_ahead(4, 0, 1, "read_once") == [0, 1, 2, 3]  # one process reads every byte in any mode


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readahead")
    run_world(w.save_steps, 2, str(d), [1, 2])
    return d


def _recorder(got: list):
    def advise(fd: int, path: Path, offset: int, length: int) -> None:
        assert offset == 0 and length == os.fstat(fd).st_size  # shards smaller than a step: one step each
        got.append((length, path.name))

    return advise


def test_the_thread_reads_the_manifest_and_names_the_files_it_was_asked_for(saved):
    step = saved / step_name(2)
    got: list = []
    readahead(step, None, 1, 2, "read_once", advise=_recorder(got)).wait(30)
    assert got == [((step / shard_name(1, 2)).stat().st_size, shard_name(1, 2))]
    got.clear()
    readahead(step, None, 0, 1, "read_all", advise=_recorder(got)).wait(30)
    assert [n for _, n in got] == [shard_name(0, 2), shard_name(1, 2)]
    got.clear()
    readahead(step, None, 0, 3, "read_once", advise=_recorder(got)).wait(30)  # restored by another world
    assert got == []


def test_the_hint_asks_step_by_step_and_stops_between_two_steps(saved):
    """A restore that is done with its step (read, or failed before reading) stops the hint: no step is asked for
    after that, so it never waits for a whole shard to be read ahead; the steps tile the file."""
    step = saved / step_name(2)
    size = (step / shard_name(0, 2)).stat().st_size
    steps: list = []
    readahead(step, None, 0, 2, "read_once", advise=lambda fd, p, o, n: steps.append((o, n)), step_bytes=4096).wait(30)
    assert steps == [(o, min(4096, size - o)) for o in range(0, size, 4096)] and len(steps) > 2
    asked, release, calls = threading.Event(), threading.Event(), []

    def slow(fd: int, path: Path, offset: int, length: int) -> None:
        calls.append(offset)
        asked.set()
        release.wait(30)  # the kernel's queue full: the call blocks

    hint = readahead(step, None, 0, 2, "read_once", advise=slow, step_bytes=4096)
    assert asked.wait(30)
    threading.Timer(0.2, release.set).start()
    hint.stop()  # returns once the step being asked for is queued
    assert calls == [0] and hint.wait(0)


def test_a_hostile_or_missing_file_ends_the_hint_quietly_and_never_opens_a_fifo(tmp_path, saved):
    import shutil

    step = tmp_path / step_name(2)
    shutil.copytree(saved / step_name(2), step)
    fifo = step / shard_name(0, 2)
    fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    got: list = []
    t0 = time.monotonic()
    readahead(step, None, 0, 2, "read_all", advise=_recorder(got)).wait(30)
    assert time.monotonic() - t0 < 5 and got == []  # refused before the open, and the hint ends there
    (step / "MANIFEST.json").unlink()
    readahead(step, None, 1, 2, "read_once", advise=_recorder(got)).wait(30)  # no manifest: nothing, no error
    assert got == []


def test_the_kernel_reads_the_file_ahead(tmp_path):
    """The default hint's effect, seen from outside: a page evicted from the page cache (``RWF_NOWAIT`` refuses to
    read it without I/O) is resident again after the hint, with nobody reading the file."""
    d = tmp_path / step_name(1)
    d.mkdir()
    name = shard_name(0, 1)
    size = 8 << 20
    with open(d / name, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    manifest = {"shards": [{"file": name, "bytes": size, "crc32": 0}]}
    fd = os.open(d / name, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        page = bytearray(4096)

        def resident() -> bool:
            try:
                return os.preadv(fd, [page], size - len(page), os.RWF_NOWAIT) == len(page)
            except BlockingIOError:
                return False

        if resident():
            pytest.skip(f"{tmp_path} keeps its files in memory (tmpfs?): nothing to read ahead there")
        readahead(d, manifest, 0, 1, "read_once").wait(30)
        deadline = time.monotonic() + 10
        while not resident() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert resident()
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", ["read_once", "read_all"])
def test_a_restore_reads_ahead_what_it_reads_and_ends_the_thread(saved, mode):
    got = run_world(w.restore_read_ahead, 2, str(saved), mode).results
    for rank, g in enumerate(got):
        assert g["step"] == 2 and g["hash"] == w.expected_hash(2)
        mine = [f"{step_name(2)}/{shard_name(rank, 2)}"]
        every = [f"{step_name(2)}/{shard_name(r, 2)}" for r in range(2)]
        assert g["advised"] == (mine if mode == "read_once" else every), g
        assert g["alive"] == []  # joined before restore returned


@pytest.mark.parametrize("mode", ["read_once", "read_all"])
def test_one_process_restoring_reads_ahead_every_shard_it_reads(saved, mode):
    g = w.restore_read_ahead(0, 1, str(saved), mode)  # one process reads every byte, whatever the mode
    assert g["step"] == 2 and g["hash"] == w.expected_hash(2)
    assert g["advised"] == [f"{step_name(2)}/{shard_name(r, 2)}" for r in range(2)] and g["alive"] == []
