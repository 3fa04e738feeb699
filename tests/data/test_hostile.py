"""Odd dtypes, absurd sample sizes, and signals or kills to the whole job: clear errors at construction,
quiet exits, and nothing left in /dev/shm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest

from hpctrain.data import H5DataConfig, H5Loader
from hpctrain.data._workers import sweep_leftovers
from hpctrain.data.synth import make_dataset
from hpctrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SHM = "/dev/shm"


def loader(path, keys=("x",), **kw):
    kw.setdefault("global_batch_size", 8)
    kw.setdefault("num_workers", 0)
    return H5Loader(H5DataConfig(files=[str(path)], keys=keys, **kw), rank=0, world_size=1)


@pytest.mark.parametrize("dtype", ["f16", "c32"])  # long double, complex long double
def test_dtypes_torch_cannot_hold_are_refused_at_construction(tmp_path, dtype):
    if np.dtype(dtype).itemsize <= 8 or (dtype == "c32" and np.dtype(dtype).itemsize <= 16):
        pytest.skip("no extended precision on this platform")
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((32, 3), dtype=dtype)
    with pytest.raises(UsageError, match=r"odd.h5: 'x' has dtype .* which torch tensors cannot hold"):
        loader(path)


@pytest.mark.parametrize("dtype", [">f4", ">i8", "u4", "u8", "f2", "b1", "c8"])
def test_dtypes_torch_holds_read_like_h5py(tmp_path, dtype):
    path = tmp_path / "ok.h5"
    with h5py.File(path, "w") as f:
        f["x"] = (np.arange(64 * 5) % 7).astype(dtype).reshape(64, 5)
    with h5py.File(path) as f:
        ref = f["x"][()]
    with loader(path, num_workers=1, start_method="fork") as ld:
        for batch in ld:
            np.testing.assert_array_equal(batch["x"].numpy(), ref[batch["index"].numpy()])


def test_a_tiny_file_declaring_huge_samples_is_refused(tmp_path):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:  # never written: the file stays a few KB
        f.create_dataset("x", (64, 1 << 16, 1 << 16), dtype="f4", chunks=(1, 64, 1 << 16))
    assert os.path.getsize(path) < 64 << 10
    with pytest.raises(UsageError) as e:
        loader(path, global_batch_size=8, num_workers=2)
    msg = str(e.value)
    assert "huge.h5" in msg and "GiB available" in msg and "lower global_batch_size" in msg and "\n" not in msg


def test_sweep_removes_only_dead_processes_leftovers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"hpctrain-data-{dead.pid}-abc"
    live = tmp_path / f"hpctrain-data-{os.getpid()}-abc"
    other = tmp_path / "unrelated-file"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert sweep_leftovers(str(tmp_path)) == 1
    assert not stale.exists() and live.exists() and other.exists()


# ---- whole-job signals and kills, on real process groups ---------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even when this test runs from a background job
    # (whose shell started it with SIGINT ignored, a disposition Python then keeps)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from hpctrain.data import H5DataConfig, H5Loader
    path, method, handle_usr2 = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    got = []
    if handle_usr2:  # a training process that checkpoints on USR2 and goes on
        signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
    cfg = H5DataConfig(files=[path], keys=("x", "y"), global_batch_size=8, num_workers=2, start_method=method)
    ld = H5Loader(cfg, rank=0, world_size=1)
    it = iter(ld)
    next(it)
    shm_maps = sum("/dev/shm/" in line for line in open("/proc/self/maps"))
    print("READY", shm_maps, *ld.worker_pids(), flush=True)
    n = 0
    while not got or n < 3 * len(ld):
        for b in ld:
            n += 1
            time.sleep(0.002)
    print("SURVIVED", n, flush=True)
    ld.close()
    """
)


def _shm_ours():
    return {n for n in os.listdir(SHM) if n.startswith("hpctrain-data-")} if os.path.isdir(SHM) else set()


def _group_gone(pgid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _start(path, method, handle_usr2=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(path), method, "1" if handle_usr2 else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a Slurm step's tasks are
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("sig") / "d.h5", 2000, shape=(16,), chunk_samples=64, compression="gzip"
    )


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT])
def test_signal_to_the_job_exits_quietly_and_leaves_nothing(data, method, sig):
    before = _shm_ours()
    proc = _start(data, method)
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["READY"], proc.stderr.read()
        assert line[1] == "0"  # neither the batch memory nor any semaphore has a name in /dev/shm
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
        assert _group_gone(proc.pid), "a worker outlived the job"
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err.replace("KeyboardInterrupt", "") or sig == signal.SIGINT, err
    if sig == signal.SIGINT:  # the training script's own KeyboardInterrupt, nothing from the workers
        assert err.count("Traceback") <= 1 and "data worker" not in err, err
    assert "resource_tracker" not in err and "leaked" not in err, err
    assert _shm_ours() <= before


def test_usr2_to_the_job_does_not_stop_the_workers(data):
    """Slurm's warning signal goes to every process of the step; a training process that handles it to
    checkpoint must keep its data workers (forkserver, whose server would otherwise die of it)."""
    proc = _start(data, "forkserver", handle_usr2=True)
    try:
        assert proc.stdout.readline().startswith("READY")
        os.killpg(proc.pid, signal.SIGUSR2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "SURVIVED" in out, err
    assert "Traceback" not in err


def test_sigkill_during_worker_start_leaves_nothing_in_dev_shm(data):
    before = _shm_ours()
    rng = np.random.default_rng(0)
    for delay in rng.uniform(0.05, 0.8, size=6):
        proc = _start(data, "spawn")
        time.sleep(float(delay))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _group_gone(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
    assert _shm_ours() <= before
