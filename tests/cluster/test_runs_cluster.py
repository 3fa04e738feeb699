"""``runs`` on the real dev cluster: three runs submitted at once through ``hpctrain.submit`` (each registered),
listed with ONE squeue and at most one sacct call, counted by wrappers on PATH that log each call and exec the
real binary; then again once they ended (COMPLETED, COMPLETED, CANCELLED) and with a run directory deleted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.cluster.test_slurm_ddp import ENV, ROOT, wait_final

pytestmark = [pytest.mark.slurm]


def _wrappers(where: Path, log: Path) -> tp.Dict[str, str]:
    """``squeue`` and ``sacct`` shell wrappers in ``where`` that append their argv to ``log``; the env with them
    first on PATH."""
    where.mkdir()
    for name in ("squeue", "sacct"):
        real = shutil.which(name)
        assert real, f"{name} not on PATH"
        script = where / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{real}" "$@"\n')
        script.chmod(0o755)
    return {"PATH": f"{where}{os.pathsep}{os.environ.get('PATH', '')}"}


def _runs(env: tp.Mapping[str, str], log: Path) -> tp.Tuple[tp.Dict[str, tp.Any], tp.List[str], float]:
    log.write_text("")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", "runs", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), log.read_text().splitlines(), took


def test_runs_asks_squeue_once_and_sacct_at_most_once(tmp_path):
    home, runs = tmp_path / "home", tmp_path / "runs"
    env = dict(ENV, HPCTRAIN_HOME=str(home))
    started = time.monotonic()
    args = {
        "a": ["--nodes", "1", "--", "--steps", "5"],
        "b": ["--nodes", "2", "--", "--steps", "5"],
        "c": ["--nodes", "1", "--", "--steps", "1000000", "--log-every", "1000"],
    }
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpctrain.submit",
                "--time",
                "5",
                "--partition",
                "debug",
                "--job-name",
                f"runs-{name}",
                "--entry",
                "hpctrain.examples.demo:main",
                "--run-dir",
                str(runs / name),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for name, extra in args.items()
    }
    outs = {name: p.communicate(timeout=120)[0] for name, p in procs.items()}
    jobs = {}
    for name, p in procs.items():
        assert p.returncode == 0, outs[name]
        jobs[name] = str(json.loads((runs / name / "submission.json").read_text())["job_id"])
    try:
        # three submissions from three processes at once: three whole registry lines
        lines = [json.loads(x) for x in (home / "runs.jsonl").read_text().splitlines()]
        assert sorted(r["job_id"] for r in lines) == sorted(jobs.values())
        assert {r["kind"] for r in lines} == {"submit"} and {r["name"] for r in lines} == {"runs-a", "runs-b", "runs-c"}
        log = tmp_path / "calls.log"
        wrapped = dict(env, **_wrappers(tmp_path / "bin", log))

        listing, calls, took = _runs(wrapped, log)
        print(
            f"\nfigures: 3 submissions in {time.monotonic() - started:.1f}s; runs (queued) {took:.2f}s, calls {calls}"
        )
        assert listing["count"] == 3 and listing["schema"] == "hpctrain.runs/1"
        assert [c.split()[0] for c in calls].count("squeue") == 1, calls
        assert [c.split()[0] for c in calls].count("sacct") <= 1, calls
        squeue = next(c for c in calls if c.startswith("squeue"))
        assert all(j in squeue for j in jobs.values())  # one call for all of them
        states = {r["name"]: r for r in listing["runs"]}
        assert all(states[f"runs-{n}"]["category"] in ("pending", "running", "done") for n in args), states

        subprocess.run(["scancel", jobs["c"]], check=True)
        for name in ("a", "b", "c"):
            wait_final(jobs[name], timeout=120)
        shutil.rmtree(runs / "b" / "checkpoints", ignore_errors=True)
        listing, calls, took = _runs(wrapped, log)
        print(f"figures: runs (ended) {took:.2f}s, calls {calls}")
        assert [c.split()[0] for c in calls].count("squeue") == 1, calls
        assert [c.split()[0] for c in calls].count("sacct") == 1, calls
        states = {r["name"]: r for r in listing["runs"]}
        assert (states["runs-a"]["state"], states["runs-a"]["category"]) == ("COMPLETED", "done"), states["runs-a"]
        assert states["runs-a"]["step"] == 5 and states["runs-a"]["last_ended"] == "finished"
        assert states["runs-b"]["state"] == "COMPLETED" and states["runs-b"]["nodes"] == 2
        assert (states["runs-c"]["state"], states["runs-c"]["category"]) == ("CANCELLED", "failed")

        shutil.rmtree(runs / "a")  # deleted since: a row that says so, no traceback, no extra call
        listing, calls, _ = _runs(wrapped, log)
        assert {r["name"]: r["state"] for r in listing["runs"]}["runs-a"] == "MISSING"
        assert [c.split()[0] for c in calls].count("squeue") == 1 and len(calls) <= 2, calls
        print(f"figures: test wall time {time.monotonic() - started:.1f}s")
    finally:
        subprocess.run(["scancel", *jobs.values()], capture_output=True)
