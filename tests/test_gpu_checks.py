"""The GPU checks (benchmarks/gpu_check_*.py, gpu_checks.sh) as far as a CPU machine can take them: they
parse their arguments, fail with one line and exit 2 without CUDA (the runner calls that skipped), and
their comparison logic passes on correct data and fails on torn data (torch.cuda calls made no-ops)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["gpu_check_ckpt", "gpu_check_loader", "gpu_check_ddp", "gpu_check_trainer"]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")


def load(name: str) -> tp.Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", CHECKS)
def test_help_parses(name):
    r = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True
    )
    assert r.returncode == 0 and "--out" in r.stdout


@no_cuda
@pytest.mark.parametrize("name", CHECKS)
def test_without_cuda_each_check_exits_2_with_one_line(name, tmp_path):
    r = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", "--out", str(tmp_path)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"{name}: CUDA is not available on this machine; run this check on a GPU node"


@no_cuda
def test_the_runner_reports_every_check_skipped_and_exits_2_without_cuda(tmp_path):
    assert subprocess.run(["bash", "-n", "benchmarks/gpu_checks.sh"], cwd=ROOT).returncode == 0
    r = subprocess.run(
        ["bash", "benchmarks/gpu_checks.sh", str(tmp_path / "out")],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    runs = [
        line.split()[1]
        for line in (ROOT / "benchmarks" / "gpu_checks.sh").read_text().splitlines()
        if line.startswith("run ")
    ]
    assert {"ckpt", "loader", "ddp"} <= set(runs)
    assert [line.split()[:2] for line in r.stdout.splitlines()] == [["SKIP", f"{name}:"] for name in runs]


@pytest.fixture
def cuda_noops(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda's stream/device/sleep calls as no-ops, so a check's logic runs on CPU tensors."""
    null = lambda *a, **k: contextlib.nullcontext()  # noqa: E731
    for name, fn in {
        "device": null,
        "stream": null,
        "current_stream": lambda *a, **k: None,
        "_sleep": lambda cycles: None,
        "synchronize": lambda *a, **k: None,
    }.items():
        monkeypatch.setattr(torch.cuda, name, fn)


def _cpu_state() -> tp.Dict[str, torch.Tensor]:
    return {
        "big": torch.randn(5000),
        "transposed": torch.randn(30, 30).t(),
        "strided": torch.randn(100)[::2],
        "bf16": torch.randn(64).to(torch.bfloat16),
    }


def test_ckpt_check_round_passes_on_a_correct_save(tmp_path, cuda_noops):
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    check = load("gpu_check_ckpt")
    state = _cpu_state()
    ck = Checkpointer(CheckpointConfig(dir=tmp_path, keep_last=2))
    try:
        assert check.one_round(ck, 1, state, {"cpu": None}) == []
        assert check.one_round(ck, 2, state, {"cpu": None}) == []
    finally:
        ck.close()


def test_ckpt_check_round_catches_a_save_that_copies_after_returning(tmp_path, cuda_noops):
    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    class Torn:
        """save() returns before anything is copied; the copy happens at wait(), after the overwrite."""

        def __init__(self) -> None:
            self.real = Checkpointer(CheckpointConfig(dir=tmp_path))
            self.config = self.real.config

        def save(self, step: int, **kw: tp.Any) -> None:
            self.pending = (step, kw)

        def wait(self) -> None:
            step, kw = self.pending
            self.real.save(step, **{**kw, "blocking": True})

    check = load("gpu_check_ckpt")
    torn = Torn()
    try:
        bad = check.one_round(torn, 1, _cpu_state(), {"cpu": None})
    finally:
        torn.real.close()
    assert sorted(bad) == ["bf16", "big", "strided", "transposed"]


def test_loader_check_counts_wrong_missing_and_extra_batches(cuda_noops):
    check = load("gpu_check_loader")
    ref = [(torch.full((2, 3), float(i)), torch.tensor([2 * i, 2 * i + 1])) for i in range(4)]
    batches = [{"x": x.clone(), "index": idx.clone()} for x, idx in ref]
    assert check.consume(iter(batches), ref) == 0
    batches[2]["x"][1, 1] = -1.0
    assert check.consume(iter(batches), ref) == 1
    assert check.consume(iter(batches[:3]), ref) == 2  # one wrong, one missing
    assert check.consume(iter(batches + batches[:1]), ref) == 2  # one wrong, one extra


def test_trainer_check_runs_its_logic_on_two_cpu_ranks(tmp_path):
    # the demo under fsdp (saved, resumed) and the meta-built model (trained, saved, restored, compared),
    # with the GPU switches off: what the GPU run asserts, on gloo
    r = subprocess.run(
        [sys.executable, "benchmarks/gpu_check_trainer.py", "--cpu", "--out", str(tmp_path)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["ok"] and res["ranks"] == 2 and res["demo_resume"]["resumed"]["step"] == 4
    big = res["big"]
    assert big["mismatched_tensors"] == [0, 0] and big["resumed_step"] == [2, 2]
    assert 0 < big["state_gib_per_rank"] * 2**30 <= 12 * big["params"] / 2 * 1.05 + 4096
