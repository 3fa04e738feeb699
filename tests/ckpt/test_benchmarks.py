"""The benchmark scripts run from a fresh clone with one command (tiny sizes here; the GPU check only
checks its clean failure without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest
import torch

from tests.test_gpu_checks import load  # a benchmark script as a module

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(script: str, *argv: str, timeout: float) -> subprocess.CompletedProcess:
    """``python benchmarks/SCRIPT ARGV...`` from the repository's root, as a fresh clone runs it."""
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


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
    assert res["small_tensors"] == 1000 and res["tensors"] == 4016  # the default state, as the suite measures it
    for key in (
        "save_vs_raw",
        "save_vs_dcp",
        "save_vs_torch_save",
        "async_block_vs_copy",
        "async_block_vs_dcp",
        "restore_vs_raw",
        "restore_vs_raw_own_read",
        "restore_vs_raw_gloo",
        "restore_read_all_vs_raw_all",
        "restore_vs_dcp",
    ):
        assert res[key] > 0
    # where the read_once restore's time went, per round: every rank's CPU by the phases the restore reports
    cpu = res["restore_cpu_ms"]
    assert {"index", "index_exchange", "plan", "read", "views", "verify", "load", "other"} <= cpu.keys()
    assert cpu["read"] > 0 and cpu["load"] > 0 and min(cpu.values()) >= 0
    # the saves and the reads each in mirrored order, A B B A, the ceilings leading in an odd round (--round 1)
    saves = [n for n in res["order"] if n in ("hp_save_s", "raw_write_s")]
    assert saves == ["raw_write_s", "hp_save_s", "hp_save_s", "raw_write_s"] and res["hpctrain_first"] == 0
    reads = [n[:3] for n in res["order"] if n.startswith(("raw_read", "hp_restore"))]
    assert reads == ["raw"] * 4 + ["hp_"] * 4 + ["raw"] * 4
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [
        "LATEST",
        "step-000000002",
        "step-000000003",
        "step-000000004",
    ]
    ls = subprocess.run(
        [sys.executable, "-m", "hpctrain", "ckpt", "verify", str(tmp_path / "kept")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**ENV, "PYTHONPATH": str(ROOT)},
    )
    assert ls.returncode == 0, ls.stdout + ls.stderr


def test_the_state_in_fewer_small_tensors_holds_the_same_bytes():
    """``--small-tensors``: the benchmark's state with its small parameters' bytes in fewer tensors (each parameter
    is 4 tensors with its optimizer state), so that a run with few tensors measures the same data path."""
    bench = load("bench_checkpoint")

    def count(small: int) -> tp.Tuple[int, int]:
        model, optim = bench.make_state(8, small)
        tensors = list(bench._tensors({"model": model, "optim": optim}))
        return len(tensors), sum(t.numel() * t.element_size() for t in tensors)

    (many, many_bytes), (few, few_bytes) = count(bench.SMALL_TENSORS), count(4)
    assert (many, few) == (4 * (4 + bench.SMALL_TENSORS), 32)
    assert abs(many_bytes - few_bytes) < 1e-3 * many_bytes and many_bytes > 7.9 * 2**20


def test_profile_restore_reports_the_phases_and_the_ceiling_per_rank(tmp_path):
    out = tmp_path / "p.json"
    tiny = ["--size-mb", "4", "--world", "2", "--rounds", "3", "--dir", str(tmp_path / "work"), "--json", str(out)]
    r = _run("profile_restore.py", *tiny, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert (
        res["rounds"] == 2 and len(res["ratios"]) == 2 and res["ratio_min"] <= res["ratio_median"] <= res["ratio_max"]
    )
    cpu = res["cpu_ms"]
    for row in ("ceiling read", "ceiling copy", "restore index", "restore index_exchange", "restore read"):
        assert len(cpu[row]) == 2 and all(v > 0 for v in cpu[row]), row
    # the restore's phases add up to its main thread's CPU, rank by rank (medians of each: within rounding)
    phases = [k for k in cpu if k.startswith("restore ") and k != "restore main thread" and "process" not in k]
    for rank in range(2):
        assert sum(cpu[k][rank] for k in phases) == pytest.approx(cpu["restore main thread"][rank], rel=0.3)
    assert "restore main thread" in r.stdout and "ceiling/restore per round" in r.stdout and res["verified"] is True
    assert not (tmp_path / "work").exists()  # its checkpoint is removed, and the directory it made


def test_profile_restore_what_if_takes_the_index_and_the_plan_away(tmp_path):
    """``--what-if free-metadata``: the rounds after the first reuse the first round's index and plan (their phases
    cost nothing) and still restore the saved values (the worker asserts them); ``--what-if no-verify`` restores
    without checksums. Both are named in the result, so a figure taken with them is never mistaken for a restore's."""
    out = tmp_path / "p.json"
    tiny = ["--size-mb", "4", "--world", "2", "--rounds", "3", "--dir", str(tmp_path / "work"), "--json", str(out)]
    r = _run("profile_restore.py", *tiny, "--what-if", "no-verify", "--what-if", "free-metadata", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["what_if"] == ["free-metadata", "no-verify"] and "what if: free-metadata, no-verify" in r.stdout
    assert res["verified"] is False  # the ranks' checkpointers restored without checksums
    cpu = res["cpu_ms"]
    assert all(v < 0.5 for v in cpu["restore index"] + cpu["restore plan"]), cpu  # 4016 tensors: ~4-9 ms each, unreused
    assert all(v > 0 for v in cpu["restore read"] + cpu["restore load"] + cpu["restore index_exchange"])
    bad = _run("profile_restore.py", *tiny, "--what-if", "free-index", timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'free-index'" in bad.stderr


def test_profile_restore_cold_with_and_without_the_read_ahead(tmp_path):
    """``--cold`` drops the files from the page cache before each side; every restore reads its shard ahead (the
    result says so, as the ranks did it), and ``--what-if no-readahead`` none, restoring the same values."""
    for what_if, read_ahead in (([], True), (["--what-if", "no-readahead"], False)):
        out = tmp_path / "p.json"
        tiny = ["--size-mb", "4", "--world", "2", "--rounds", "2", "--dir", str(tmp_path / "work"), "--json", str(out)]
        r = _run("profile_restore.py", *tiny, "--cold", *what_if, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads(out.read_text())
        assert res["cold"] is True and res["verified"] is True and res["read_ahead"] is read_ahead, res
        assert res["what_if"] == (["no-readahead"] if what_if else [])


@pytest.mark.slow
def test_bench_tiers_runs_and_reports_every_figure(tmp_path):
    out, g, local = tmp_path / "r.json", tmp_path / "bench" / "global", tmp_path / "local"
    tiny = ["--size-mb", "2", "--world", "4", "--ranks-per-node", "2", "--repeat", "1", "--json", str(out)]
    tiny += ["--global-dir", str(g), "--local-dir", str(local), "--step-width", "32", "--overhead-steps", "4"]
    tiny += ["--overhead-every", "4", "--overhead-saves", "2", "--direct-interval", "0.2", "--direct-seconds", "0.4"]
    tiny += ["--demo-steps", "36", "--demo-local-every", "9", "--demo-pairs", "1"]
    r = _run("bench_tiers.py", *tiny, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in (
        "local_save_vs_global",
        "local_async_block_vs_global_save",
        "restore_local_vs_global",
        "restore_partner_vs_global",
    ):
        assert res[key] > 0
    ovh = res["overhead"]
    assert ovh["step_s"] > 0
    for tier in ("local", "global", "local_then_global"):
        t = ovh[tier]
        assert len(t["save_costs_s"]) == 2 and t["save_block_s"] > 0 and 1 <= t["in_flight_steps"] <= 4
        assert t["overhead_at_60s"] == pytest.approx(t["save_cost_s"] / 60)
        assert t["overhead_at_300s"] == pytest.approx(t["save_cost_s"] / 300)
    direct = ovh["direct"]
    assert 1 <= direct["saves"] <= 2 and direct["block_steps"] >= 2 and direct["step_s_with"] > 0
    assert {"overhead", "predicted_overhead", "save_cost_s"} <= set(direct)
    demo = res["demo"]
    assert demo["local_every"] == 9 and len(demo["runs_step_s"]["with"]) == 1
    assert demo["step_s_without"] > 0 and demo["step_s_with"] > 0 and demo["save_block_s"] > 0
    assert demo["save_cost_s"] == pytest.approx((demo["step_s_with"] - demo["step_s_without"]) * 9)
    assert demo["saves_within"] == 2  # the saves at steps 18 and 27 (9: the first; 36: no interval after it)
    assert demo["overhead_within_at_60s"] == pytest.approx(demo["save_cost_within_s"] / 60)
    assert not g.exists() and not local.exists() and not (g.parent / "tiers-demo").exists()  # cleaned up
    bad = _run("bench_tiers.py", "--no-overhead", "--overhead-only", timeout=120)
    assert bad.returncode == 2 and "exclude each other" in bad.stderr.splitlines()[-1]
