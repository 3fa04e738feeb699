"""``capacity`` on degenerate measurements and bad flags: one line saying what is wrong (or a row that says
'not measurable'), never a traceback; its outputs (``--plot``, ``--calibrate-dir``) under a file: one line."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.capacity.calibration import read_calibrations
from hpctrain.capacity.fit import Param, fit
from hpctrain.capacity.rows import predict
from hpctrain.capacity.targets import Targets
from tests.capacity.synth import make_run


def _run(root: Path, **edit: float) -> Path:
    """A one-rank calibration run whose interval records have the ``per_step`` parts (or top-level fields) in
    ``edit`` replaced, on every interval."""
    make_run(root, world=1, nodes=1, global_batch=64, data_ms=1, compute_ms=10, comm_ms=0.5)
    path = root / "train" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        for key, value in edit.items():
            if key in r["per_step"]:
                r["per_step"][key] = {"min": value, "median": value, "max": value, "max_rank": 0}
            else:
                r[key] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", "capacity", *args], capture_output=True, text=True)


def _one_line(res: subprocess.CompletedProcess, code: int = 2) -> str:
    assert res.returncode == code, res.stderr[-3000:]
    assert res.stdout == "" and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.startswith("hpctrain capacity: error: ")
    return res.stderr


ZERO = dict.fromkeys(("step_s", "data_wait_s", "forward_backward_s", "grad_comm_exposed_s", "optimizer_s"), 0.0)


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            {**ZERO, "checkpoint_s": 0.0},
            "the measured step time (per_step.step_s less the checkpoint stall, median) is 0 s, not a positive time",
        ),
        ({"step_s": 0.0}, "is -0.0005 s, not a positive time"),  # parts but no step: less than its checkpoint stall
        ({"samples": 0}, "0 samples per step (samples / steps, median), not a usable batch"),
        ({"step_s": 1e308, "forward_backward_s": 1e308}, "a measured step time or part of one is over 1e+06 s"),
        ({"step_s": float("nan")}, "per_step.step_s.median' is NaN, not a finite number"),
        ({"step_s": -1.0}, "per_step.step_s.median' is -1.0, not a finite number >= 0"),
    ],
)
def test_degenerate_measurements_are_one_line_naming_what_is_wrong(tmp_path, edit, says):
    run = _run(tmp_path / "run", **edit)
    err = _one_line(_cli(str(run)))
    assert says in err and f"RUN_DIR {run}" in err, err


def test_a_prediction_with_no_step_time_says_not_measurable(tmp_path):
    f = fit(read_calibrations(_run(tmp_path / "run")), Targets())
    zero = Param(0.0, "assumed")
    names = ("compute_per_sample_s", "compute_per_step_s", "optimizer_s", "optimizer_multi_s", "other_s")
    names += ("other_multi_s", "comm_base_s", "comm_latency_s", "comm_inv_busbw", "data_floor_s")
    names += ("compute_multi_per_sample_s", "compute_multi_per_step_s", "comm_extra_s")
    rows = predict(dataclasses.replace(f, **dict.fromkeys(names, zero)), (1, 2))  # was: ZeroDivisionError
    assert [(r["feasible"], r["bound"]) for r in rows] == [(False, "not measurable")] * 2
    assert "no prediction can be made" in rows[0]["advice"]


def test_nothing_to_train_and_no_start_up_is_a_row_not_a_division_by_zero(tmp_path):
    f = fit(read_calibrations(_run(tmp_path / "run")), Targets())
    zero = Param(0.0, "assumed")
    f = dataclasses.replace(f, samples=zero, startup_s=zero, queue_wait_s=zero, restore_s=zero)
    (row,) = predict(f, (1,))
    assert row["wall_s"] == 0 and row["bound"] == "nothing to train" and "--samples" in row["advice"]


def test_unbalanced_quotes_in_submit_args_are_one_line_exit_2(tmp_path):
    cal = tmp_path / "cal"
    err = _one_line(_cli("--calibrate", "1", "--entry", "m:f", "--calibrate-dir", str(cal), "--submit-args", "--x 'a"))
    assert '--submit-args "--x \'a" cannot be split into flags (no closing quotation); balance its quotes' in err
    assert not cal.exists()  # nothing submitted, nothing made


def test_outputs_under_a_file_are_one_line_exit_2(tmp_path):
    run = _run(tmp_path / "run")
    (tmp_path / "file").write_text("")
    err = _one_line(_cli(str(run), "--plot", str(tmp_path / "file" / "p.svg")))
    assert f"-o: cannot write {tmp_path}/file/p.svg: {tmp_path}/file is not a directory" in err
    err = _one_line(_cli("--calibrate", "1", "--entry", "m:f", "--calibrate-dir", str(tmp_path / "file" / "c")))
    assert f"--calibrate-dir: cannot write {tmp_path}/file/c: {tmp_path}/file is not a directory" in err
    assert (tmp_path / "file").read_text() == ""


def test_the_table_never_prints_nan_or_inf(tmp_path):
    run = _run(tmp_path / "run")  # one rank and no --busbw: the bandwidth term is not modelled
    res = _cli(str(run), "--nodes", "1,2")
    assert res.returncode == 0, res.stderr
    assert not re.search(r"\b(nan|inf)\b", res.stdout, re.I), res.stdout
    assert "bytes at no cost (not modelled)" in res.stdout
