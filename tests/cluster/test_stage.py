"""``submit --stage`` on the real dev cluster: a 2-node job stages an HDF5 file to each node, the loaders read the
node-local copies, a requeue (``scontrol requeue``) reuses the verified copy, and a copy damaged between the attempts
(one flipped byte, same size) is fetched again, never read. The four nodes share one file system, so each node's
copy lives under its own node name (docs/data.md, "Node-local staging"). About a minute."""

from __future__ import annotations

import json
import os
import subprocess
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain.data import make_dataset
from tests.cluster.test_slurm_ddp import submit, wait_final

pytestmark = [pytest.mark.slurm]
OPENED = "reading the node-local copy "  # the loader's line (hpctrain.data.stage.local_files)
NODES = ("node1", "node2")  # the `steady` half: both attempts land on the same two nodes
RANKS = range(4)  # 2 tasks per node: the stage step must still run one task per node


def _wait(what: str, probe: tp.Callable[[], tp.Any], timeout: float = 120) -> tp.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"no {what} after {timeout}s")


def _records(run_dir: Path, job: str, restart: int) -> tp.Optional[tp.Dict[str, tp.Any]]:
    paths = {n: run_dir / "stage" / f"{job}-r{restart}" / f"{n}.json" for n in NODES}
    if not all(p.exists() for p in paths.values()):
        return None
    return {n: json.loads(p.read_text()) for n, p in paths.items()}


def _staged_identity(run_dir: Path, job: str, restart: int) -> tp.Optional[tp.Dict[str, tp.Any]]:
    path = run_dir / "identity" / f"{job}-r{restart}.json"
    try:
        files = (json.loads(path.read_text()).get("data") or {}).get("files") or []
    except (OSError, ValueError):
        return None
    return files[0] if files and "staged" in files[0] else None


def _opened(run_dir: Path, job: str) -> tp.Dict[int, tp.List[str]]:
    """The local copy each rank's loader said it opened, per rank, in attempt order (the logs are appended)."""
    out = {}
    for rank in RANKS:
        log = run_dir / "logs" / f"{job}_{rank}_log.err"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        out[rank] = [ln.split(OPENED)[1] for ln in lines if OPENED in ln]
    return out


def _host(run_dir: Path, job: str, rank: int) -> str:
    return str(json.loads((run_dir / "ranks" / f"{job}-r0" / f"rank-{rank}.json").read_text())["hostname"])


def test_stage_copies_per_node_reuses_on_requeue_and_refetches_a_damaged_copy(tmp_path):
    data = tmp_path / "shared" / "train.h5"
    data.parent.mkdir()
    make_dataset(str(data), samples=100_000, shape=(64,), chunk_samples=512)  # 26.5 MB
    run_dir, local = tmp_path / "run", tmp_path / "nvme"
    proc = submit(["--nodes", "2", "--tasks-per-node", "2", "--constraint", "steady", "--time", "10",
                   "--max-requeues", "3", "--job-name", "stage", "--run-dir", str(run_dir), "--stage", str(data),
                   "--stage-dir", str(local), "--entry", "hpctrain.examples.demo:main", "--", "--data", str(data),
                   "--steps", "1000000", "--workers", "1", "--ckpt-every", "50", "--quiet"])  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = str(json.loads((run_dir / "submission.json").read_text())["job_id"])
    try:
        first = _wait("stage records of attempt 0", lambda: _records(run_dir, job, 0))
        for node, rec in first.items():
            (entry,) = rec["files"]
            assert not entry["reused"] and rec["bytes_copied"] == data.stat().st_size and rec["verified"]
            assert entry["local"].startswith(f"{local}/") and f"/{node}/" in entry["local"]
            assert Path(entry["local"]).read_bytes() == data.read_bytes()
        copies = {n: r["files"][0]["local"] for n, r in first.items()}
        # each rank's loader opened its own node's copy, and the identity records the original as the same data
        opened = _wait("every loader's line", lambda: (o := _opened(run_dir, job)) and all(o.values()) and o)
        assert {rank: paths[0] for rank, paths in opened.items()} == {r: copies[_host(run_dir, job, r)] for r in RANKS}
        ident = _wait("identity with the staged copy", lambda: _staged_identity(run_dir, job, 0))
        assert ident["cheap"]["path"] == str(data) and ident["staged"]["to"] in copies.values()
        assert ident["staged"]["reused"] is False
        # damage node2's copy: one byte, size unchanged (only the full check sees it)
        damaged = Path(copies["node2"])
        os.chmod(damaged, 0o644)
        with open(damaged, "r+b") as f:
            f.seek(damaged.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
        second = _wait("stage records of attempt 1", lambda: _records(run_dir, job, 1))
        assert second["node1"]["files"][0]["reused"] and second["node1"]["bytes_copied"] == 0
        assert not second["node2"]["files"][0]["reused"]
        assert second["node2"]["bytes_copied"] == data.stat().st_size
        assert damaged.read_bytes() == data.read_bytes()  # refetched before any loader opened it
        batch_log = (run_dir / "logs" / f"{job}_0_log.out").read_text(errors="replace")
        assert batch_log.count("failed verification (sha256") == 1, batch_log[-3000:]
        assert batch_log.count("hpctrain stage: node1: 1 file(s)") == 2  # one stage task per node per attempt
        ident = _wait("attempt 1's identity", lambda: _staged_identity(run_dir, job, 1))
        assert ident["staged"]["to"] == copies["node1"] and ident["staged"]["reused"] is True
        _wait("attempt 1's loaders", lambda: all(len(v) >= 2 for v in _opened(run_dir, job).values()))
        print(f"\nstage figures: attempt 0 {json.dumps({n: _figures(r) for n, r in first.items()})}")
        print(f"stage figures: attempt 1 {json.dumps({n: _figures(r) for n, r in second.items()})}")
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    assert wait_final(job, timeout=120) in ("CANCELLED", "COMPLETED")


def _figures(rec: tp.Mapping[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    keys = ("bytes_copied", "bytes_reused", "copy_seconds", "copy_mb_per_s", "verify_seconds", "seconds")
    return {k: rec[k] for k in keys}
