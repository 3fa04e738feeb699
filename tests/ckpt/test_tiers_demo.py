"""The demo with the local tier: killed in its first global save, it resumes from the local+partner tier, and the
result, the ledger and ``status`` say so."""

from __future__ import annotations

import os
import subprocess
import sys

from hpctrain.ckpt.tiers import SIM_NODES_ENV
from hpctrain.rundir import RunDir, read_jsonl
from hpctrain.status.cli import collect
from tests.multiproc import run_world
from tests.test_demo import _demo


def test_demo_resumes_from_the_local_tier_and_says_so(tmp_path):
    run_dir, ck, local = tmp_path / "run", str(tmp_path / "ck"), str(tmp_path / "local")
    args = ["--steps", "8", "--batch-size", "16", "--log-every", "1", "--ckpt-dir", ck]
    args += ["--local-every", "2", "--global-every", "3", "--local-dir", local]
    env = {SIM_NODES_ENV: "1"}  # two simulated nodes: each rank's replica on the other
    # local saves at steps 2 and 4; step 6 is committed locally, then its copy to the global tier dies as it
    # starts (both ranks): no global step exists, the local tier has 4 and 6
    killed = run_world(
        _demo, 2, str(run_dir), args, init_pg=False, allow_failures=True, env={**env, "HPCTRAIN_CKPT_FAULT": "start"}
    )
    assert killed.exitcodes == [-9, -9]
    got = run_world(_demo, 2, str(run_dir), args, init_pg=False, env=env).results[0]
    assert got["resumed"]["step"] == 6 and "/local/node-0/" in got["resumed"]["path"]
    assert got["steps"] == 8 and got["steps_run"] == 2 and got["weights_in_sync"]
    ledger, problems = read_jsonl(RunDir(run_dir).ledger)
    starts = [r for r in ledger if r["event"] == "start"]
    assert problems == [] and starts[-1]["resumed_from_step"] == 6
    assert starts[-1]["restored_tier"] == "local" and starts[-1]["local_tier_saved_steps"] == 6
    report = collect(run_dir)
    assert any(r.get("restored_tier") == "local" for r in report["ledger"])
    shown = subprocess.run(
        [sys.executable, "-m", "hpctrain", "status", str(run_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=60,
    )
    assert "6 (local +6)" in shown.stdout, shown.stdout + shown.stderr
