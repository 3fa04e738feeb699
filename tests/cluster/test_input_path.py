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


@needs_root
@pytest.mark.measures
@pytest.mark.slurm
def test_short_validation_predicts_the_storage_bound_data_wait_at_3_nodes(tmp_path):
    """The benchmark's short form on the dev cluster: calibrate at 1 and 2 nodes unthrottled, predict 1 and 3 nodes
    at 20 MB/s, run 3 nodes throttled (48 steps, an interval every 8: whole read tasks of 4 steps), and check the
    prediction (about 80 s).

    The bounds come from the repeats (docs/capacity.md "Validation of the input path"). At 3 nodes the step time
    missed by -6.0 % to +4.4 % over the full form's 6 runs (3 rounds of 2) and by -1.4 % and -1.1 % in two runs
    of this form: bound 15 %, 2.5x the worst. The data wait (the slowest rank's) missed by up to +24.9 % in a
    single full-form run and by -3.4 % and +13.7 % here: it is the read time less the predicted rest of the step,
    and the rest carries the 2-node calibration's noisy communication (the step does not), and the slowest rank's
    wait is a lower bound of the step's; bound 40 %. Both still fail each model error that matters here by a wide
    margin: no storage share (a wait of 0: -100 %; a step of 145 ms against 320: -55 %), no prefetch overlap (the
    whole read as the wait: about +100 %), or the median rank's wait taken for the step's (+30 % to +240 %)."""
    ns = ipv.parser().parse_args(
        ["--out", str(tmp_path / "runs"), "--image", str(tmp_path / "fs.img"), "--mnt", str(tmp_path / "mnt"),
         "--nodes", "1,3", "--calibrate", "1,2", "--measure", "3", "--steps", "48", "--log-every", "8",
         "--repeats", "1", "--probe-mb", "48"]
    )  # fmt: skip
    pids = ipv.slurmd_pids()
    homes = {pid: ipv.blkio_cgroup(pid) for pid in pids}
    try:
        got = ipv.validate(ns)
    finally:
        assert {pid: ipv.blkio_cgroup(pid) for pid in pids} == homes  # every slurmd back where it was
        assert not ipv.CGROUP.exists()
        assert not os.path.ismount(tmp_path / "mnt") and not _loops(tmp_path / "fs.img")
        (tmp_path / "fs.img").unlink(missing_ok=True)
    rows = {r["nodes"]: r for r in got["rows"]}
    assert 19e6 < got["aggregate_bps"] < 21e6, got["aggregate_bps"]
    assert got["summary"]["storage_bound_from"] in (2, 3), got["summary"]
    three = rows[3]
    assert three["storage_bound"] and three["runs"][0]["device_bytes"] >= 0.9 * three["runs"][0]["loader_bytes"]
    assert abs(three["step_error"]) <= 0.15, three
    assert abs(three["data_wait_error"]) <= 0.40, three
