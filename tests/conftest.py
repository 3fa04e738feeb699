"""Shared fixtures and the `slurm` marker policy.

`slurm` tests run on the real dev cluster (`tests/cluster/devcluster up`). When it is not up they
skip with the reason; with HPCTRAIN_REQUIRE_SLURM=1 (CI sets it) a missing cluster fails them
instead, so a green CI proves the cluster path was exercised.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def slurm_cluster_reason() -> str:
    """Empty string when a Slurm controller answers, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo not on PATH (start the dev cluster: tests/cluster/devcluster up)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()[:200]} (tests/cluster/devcluster up)"
    if not any(s.strip().rstrip("*") in ("idle", "mixed", "allocated") for s in out.stdout.split()):
        return f"no usable Slurm node: {out.stdout.split()}"
    return ""


CLUSTER_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster") + os.sep


def pytest_itemcollected(item):
    """`serial`: the tests that share the machine's one dev cluster (every `slurm` test, and everything under
    tests/cluster, whose devcluster tests shape its links and cgroups). tools/test runs them one at a time in one
    session (`-m serial`) beside a session of all the others (`-m "not serial"`)."""
    if "slurm" in item.keywords or str(item.path).startswith(CLUSTER_TESTS):
        item.add_marker(pytest.mark.serial)


@pytest.hookimpl(trylast=True)  # after `-m` deselected: a session without slurm tests never asks the cluster
def pytest_collection_modifyitems(config, items):
    # `measures` (tests that compare timings they measure on the cluster against a prediction) run last: in
    # tools/test's serial session that is after the other session has most likely ended, on a quieter machine
    items.sort(key=lambda i: "measures" in i.keywords)  # stable: every other test keeps its place
    slurm_items = [i for i in items if "slurm" in i.keywords]
    if not slurm_items:
        return
    reason = slurm_cluster_reason()
    if not reason:
        return
    if os.environ.get("HPCTRAIN_REQUIRE_SLURM") == "1":
        raise pytest.UsageError(f"HPCTRAIN_REQUIRE_SLURM=1 but the Slurm cluster is not usable: {reason}")
    for item in slurm_items:
        item.add_marker(pytest.mark.skip(reason=f"Slurm dev cluster not running: {reason}"))


@pytest.fixture(autouse=True, scope="session")
def _private_hpctrain_home(tmp_path_factory):
    """Every test (and every process it starts) records runs in a throwaway registry, never in ~/.hpctrain.

    Session-scoped and set in os.environ so subprocesses and Slurm jobs (sbatch exports the environment)
    inherit it; a test that needs its own registry sets HPCTRAIN_HOME with monkeypatch on top.
    """
    old = os.environ.get("HPCTRAIN_HOME")
    os.environ["HPCTRAIN_HOME"] = str(tmp_path_factory.mktemp("hpctrain-home"))
    yield
    if old is None:
        os.environ.pop("HPCTRAIN_HOME", None)
    else:
        os.environ["HPCTRAIN_HOME"] = old
