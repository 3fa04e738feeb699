"""The input-path validation's short form (``benchmarks/input_path_validation.py``, docs/capacity.md "Validation of
the input path") and the machinery it relies on: the loop-device file system is unmounted and detached, and the
processes moved into the blkio cgroup are moved back and the cgroup removed, when the body fails and on SIGTERM.

Needs root and cgroup v1's blkio throttle (a loop device, mount); skips otherwise, as the other root-only tests here
do. The short form also needs the dev cluster (the ``slurm`` marker)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "input_path_validation.py"


def _load() -> tp.Any:
    spec = importlib.util.spec_from_file_location(
        "input_path_validation", ROOT / "benchmarks" / "input_path_validation.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ipv = _load()
needs_root = pytest.mark.skipif(bool(ipv.requirements()), reason=ipv.requirements() or "-")


def _loops(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def cgroup() -> tp.Iterator[Path]:
    """A blkio cgroup of this test's own (never the benchmark's), removed after whatever happened."""
    path = ipv.BLKIO / f"hpctrain-test-{os.getpid()}"
    yield path
    ipv.release_cgroup(path)


@pytest.fixture
def sleeper() -> tp.Iterator[subprocess.Popen]:
    """A process standing in for a slurmd (moved into the cgroup and back)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@needs_root
def test_throttle_limits_reads_then_a_failure_restores_the_cgroup_and_unmounts(tmp_path, cgroup, sleeper):
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    home = ipv.blkio_cgroup(sleeper.pid)
    with pytest.raises(RuntimeError, match="boom"):
        with ipv.Storage(image, mnt, 64) as storage:
            assert os.path.ismount(mnt) and _loops(image)
            assert Path(f"/sys/block/{Path(storage.loop).name}/queue/read_ahead_kb").read_text().strip() == "0"
            with ipv.Throttle(storage.dev, [sleeper.pid], cgroup) as throttle:
                assert ipv.blkio_cgroup(sleeper.pid) == cgroup
                throttle.set(20e6)
                got = ipv.probe_bandwidth(mnt / "probe.bin", 24, cgroup)
                assert 17e6 < got < 23e6, got  # 20 MB/s; a short read's first time slice runs a little over
                assert throttle.bytes_read() >= 24 << 20
                raise RuntimeError("boom")
    assert ipv.blkio_cgroup(sleeper.pid) == home
    assert not cgroup.exists()
    assert not os.path.ismount(mnt) and not _loops(image)


@needs_root
def test_sigterm_restores_the_cgroup_and_unmounts(tmp_path, cgroup, sleeper):
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    body = (
        "import sys, time, importlib.util\n"
        "from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('ipv', {str(BENCH)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"with m.signals_raise(), m.Storage(Path({str(image)!r}), Path({str(mnt)!r}), 64) as s:\n"
        f"    with m.Throttle(s.dev, [{sleeper.pid}], Path({str(cgroup)!r})):\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert ipv.blkio_cgroup(sleeper.pid) == cgroup and os.path.ismount(mnt)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert ipv.blkio_cgroup(sleeper.pid) == ipv.BLKIO
    assert not cgroup.exists()
    assert not os.path.ismount(mnt) and not _loops(image)
