"""``python -m hpctrain data inspect|synth`` and the no-torch rule for login-node tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

from hpctrain.data.cli import inspect_file, main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, code="from hpctrain.__main__ import run; run()"):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-c", code + "", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_synth_then_inspect_without_torch(tmp_path):
    out = tmp_path / "demo.h5"
    code = (
        "import sys; sys.argv[0] = 'hpctrain'; from hpctrain.__main__ import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; raise SystemExit(rc)"
    )
    r = run_cli(
        "data", "synth", str(out), "--samples", "300", "--compression", "gzip", "--chunk-samples", "32", code=code
    )
    assert r.returncode == 0, r.stderr
    assert "300 samples" in r.stdout
    r = run_cli("data", "inspect", str(out), code=code)
    assert r.returncode == 0, r.stderr
    assert "gzip (4)" in r.stdout and "(32, 3, 32, 32)" in r.stdout and "outside the 1-8 MiB" in r.stdout
    with h5py.File(out, "r") as f:
        assert f["x"].shape == (300, 3, 32, 32) and f["x"][7].ravel()[0] == 7 and f["y"][13] == 3


def test_inspect_warnings(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((600, 64, 64), np.float32), chunks=(1, 64, 32))
        f["y"] = np.zeros(500)
    info = inspect_file(str(path))
    json.dumps(info)
    text = " ".join(info["warnings"])
    assert "split a sample" in text and "outside the 1-8 MiB" in text and "x=600, y=500" in text


def test_errors_are_one_line_exit_2(tmp_path):
    r = run_cli("data", "inspect", str(tmp_path / "nope.h5"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith("hpctrain data: error:") and "nope.h5: no such file" in r.stderr
    r = run_cli("data", "synth", str(tmp_path / "o.h5"))
    assert r.returncode == 2 and "--samples" in r.stderr


def test_main_in_process(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "c.h5"), "--samples", "10", "--shape", "4"]) == 0
    assert main(["inspect", str(tmp_path / "c.h5"), "--keys", "x"]) == 0
    assert "contiguous" in capsys.readouterr().out


def test_public_api():
    import hpctrain.data as d

    assert sorted(d.__all__) == sorted(["H5DataConfig", "H5Loader", "LoaderMetrics", "StepMetrics", "make_dataset"])
    for name in d.__all__:
        assert getattr(d, name) is not None


def test_gpu_check_fails_cleanly_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check_loader.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 3 and "CUDA" in r.stderr and r.stderr.strip().count("\n") == 0


def test_synth_into_a_missing_directory_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", "synth", str(tmp_path / "no" / "d.h5"), "--samples", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hpctrain data: error: data synth: {tmp_path / 'no'} is not a directory; create it first or choose another OUT"
    ]


def test_inspect_prints_bracketed_paths_literally(tmp_path):
    import subprocess
    import sys

    from hpctrain.data import make_dataset

    path = tmp_path / "run[red]1.h5"
    make_dataset(path, 50, shape=(2,))
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="400"),
    )
    import re

    # rich wraps a long title to the table's width: undo the wrap, then look for the literal path
    assert proc.returncode == 0 and str(path) in re.sub(r"\s*\n\s*", "", proc.stdout)
