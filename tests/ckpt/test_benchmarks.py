"""The benchmark scripts run from a fresh clone with one command (tiny sizes here; the GPU check only
checks its clean failure without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA failure path")
def test_gpu_check_fails_cleanly_without_cuda(tmp_path):
    r = subprocess.run(
        [sys.executable, "benchmarks/gpu_check_ckpt.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "gpu_check_ckpt: CUDA is not available on this machine; run this check on a GPU node"


@pytest.mark.slow
def test_bench_checkpoint_runs_and_reports_every_ratio(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_checkpoint.py",
            "--size-mb",
            "4",
            "--world",
            "2",
            "--repeat",
            "1",
            "--json",
            str(out),
            "--keep",
            str(tmp_path / "kept"),
            "--dir",
            str(tmp_path / "work"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in (
        "save_vs_raw",
        "save_vs_dcp",
        "save_vs_torch_save",
        "async_block_vs_copy",
        "async_block_vs_dcp",
        "restore_vs_raw",
        "restore_vs_raw_own_read",
        "restore_read_all_vs_raw_all",
        "restore_vs_dcp",
    ):
        assert res[key] > 0
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [
        "LATEST",
        "step-000000001",
        "step-000000002",
        "step-000000003",
    ]
    ls = subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", "verify", str(tmp_path / "kept")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**ENV, "PYTHONPATH": str(ROOT)},
    )
    assert ls.returncode == 0, ls.stdout + ls.stderr
