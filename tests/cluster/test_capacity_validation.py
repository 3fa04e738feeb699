"""The capacity validation's short form (``benchmarks/capacity_validation.py``, docs/capacity.md "Validation") on
the dev cluster: the communication-bound configuration on shaped links with a CPU cap per rank, calibrated at 1 and
2 nodes, 4 x 1 predicted and run once; and the cluster left as it was found (unshaped, uncapped)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVCLUSTER = ROOT / "tests" / "cluster" / "devcluster"


def _load() -> tp.Any:
    spec = importlib.util.spec_from_file_location("capacity_validation", ROOT / "benchmarks" / "capacity_validation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


cv = _load()


def _state(what: str) -> str:
    return subprocess.run([str(DEVCLUSTER), what], capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.mark.measures
@pytest.mark.slurm
def test_short_validation_predicts_the_comm_bound_step_at_4_nodes(tmp_path):
    """About 95 s. The bounds come from the full form's repeats (docs/capacity.md "Validation", 2026-12-04: 3 rounds
    of 3 layouts): the communication-bound step missed by -1.8 % to +8.3 % in single runs (+1.4 % in a run of this
    form), its exposed communication by up to +5 %; bounds 12 % and 15 %, 1.4x and 3x the worst. They still fail
    each error this validation found and fixed: the uncapped cluster's contention (-58 %), a model without the
    all-reduce's 2(n-1)/n growth from 2 to 4 ranks (comm about -30 %, step about -27 %). The interconnect itself (the
    bare all-reduce of 1 MiB and more at 4 ranks against the 2-rank probe's fit) stayed within -4.7 % to +5.6 % in
    those runs, and missed by -10.1 % at 1 MiB once since (2026-12-08 01:03 UTC, a full test run; the next two runs
    passed): bound 14 %, 1.4x that worst, as the step's, still failing the missing 2(n-1)/n growth's -30 %."""
    assert _state("link") == "link: unshaped" and _state("cpu") == "cpu: uncapped"
    ns = cv.parser().parse_args(
        ["--out", str(tmp_path / "runs"), "--configs", "comm", "--repeats", "1", "--steps-scale", "0.5",
         "--held-out", "4x1"]
    )  # fmt: skip
    try:
        got = cv.validate(ns, echo=print)
    finally:
        assert _state("link") == "link: unshaped" and _state("cpu") == "cpu: uncapped"
    (row,) = got["rows"]
    assert row["layout"] == "4x1" and row["checkpoint_MB"] > 4
    # the interconnect itself: the bare all-reduce at 4 ranks against the 2-rank probe's latency-bandwidth fit
    big = [p for p in row["probe"] if p["bytes"] >= 1 << 20]
    assert big and all(abs(p["error"]) <= 0.14 for p in big), row["probe"]
    assert row["comm"]["measured_ms"] > 3 * row["compute"]["measured_ms"], row  # communication-bound
    assert abs(row["step"]["error"]) <= 0.12, row
    assert abs(row["comm"]["error"]) <= 0.15, row
