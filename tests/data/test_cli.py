"""``python -m hpctrain data inspect|synth`` and the no-torch rule for login-node tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.data.cli import inspect_file, main
from hpctrain.data.synth import sample_ids, teacher_labels

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
        assert f["x"].shape == (300, 3, 32, 32) and sample_ids(f["x"][7:8])[0] == 7
        assert f["y"][13] == teacher_labels(f["x"][13:14])[0]


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

    assert sorted(d.__all__) == sorted(
        [
            "H5DataConfig",
            "H5Loader",
            "LoaderMetrics",
            "StepMetrics",
            "make_dataset",
            # the public meters and building blocks the benchmarks use (tests/test_benchmarks_public.py)
            "meters",
            "open_h5",
            "contiguous_regions",
            "epoch_order",
        ]
    )
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
    assert r.returncode == 2 and "CUDA" in r.stderr and r.stderr.strip().count("\n") == 0


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
        f"hpctrain data: error: data synth: cannot write {tmp_path / 'no' / 'd.h5'}: {tmp_path / 'no'} does not exist; "
        "create it first or choose another path"
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


# ---- the _cli convention: one line, exit 2, nothing written ------------------------------------------


def run_in_process(argv, capsys):
    from hpctrain._cli import run_main

    code = run_main(main, "data", argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "args,match",
    [
        (["--shape", "a,b"], "--shape 'a,b' must be positive integers"),
        (["--shape", "0"], "--shape '0' must be positive integers"),
        (["--shape", "3,-1"], "--shape '3,-1' must be positive integers"),
        (["--dtype", "nonsense"], "--dtype 'nonsense' is not a numeric type"),
        (["--dtype", "U8"], "--dtype 'U8' is not a numeric type"),
        (["--chunk-samples", "-4"], "--chunk-samples must be >= 1"),
        (["--level", "99"], "--level must be a gzip level 0-9"),
        (["--samples", "-1"], "--samples must be >= 0"),
        (["--samples", "x"], "invalid int value"),
        (["--shape", "100000,100000,100"], "GiB; lower --shape"),
        (["--compression", "zstd"], "invalid choice"),
    ],
)
def test_synth_bad_arguments_are_one_line_and_write_nothing(tmp_path, capsys, args, match):
    out = tmp_path / "o.h5"
    argv = ["synth", str(out), "--samples", "10"] + args
    code, stdout, err = run_in_process(argv, capsys)
    assert code == 2 and stdout == ""
    assert err.startswith("hpctrain data: error:") and err.count("\n") == 1 and match in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("samples,extra", [(10, ["--compression", "gzip"]), (0, ["--compression", "lzf"]), (3, [])])
def test_synth_fewer_samples_than_one_chunk(tmp_path, capsys, samples, extra):
    out = tmp_path / "few.h5"
    code, stdout, err = run_in_process(["synth", str(out), "--samples", str(samples), "--shape", "4"] + extra, capsys)
    assert code == 0, err
    with h5py.File(out) as f:
        assert f["x"].shape == (samples, 4) and f["y"].shape == (samples,)
        assert sample_ids(f["x"][:]).tolist() == list(range(samples))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["few.h5"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # the mode of a new file, not mkstemp's 0600


def test_synth_failure_removes_its_temporary_and_keeps_the_old_file(tmp_path, capsys, monkeypatch):
    import hpctrain.data.synth as synth

    out = tmp_path / "keep.h5"
    out.write_bytes(b"previous contents")
    real = synth._write

    def fail_midway(tmp, *a, **kw):
        real(tmp, *a, **kw)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synth, "_write", fail_midway)
    code, _, err = run_in_process(["synth", str(out), "--samples", "100", "--shape", "4", "--force"], capsys)
    assert code == 1 and "cannot write" in err and "No space left on device" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.h5"] and out.read_bytes() == b"previous contents"


def test_inspect_json_is_the_table_content(tmp_path, capsys):
    from hpctrain.data import make_dataset

    a = make_dataset(tmp_path / "a.h5", 100, shape=(8,), chunk_samples=16, compression="gzip")
    b = make_dataset(tmp_path / "b.h5", 50, shape=(8,))
    code, out, err = run_in_process(["inspect", "--json", a, b], capsys)
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report == {"schema": "hpctrain.data.inspect/1", "files": [inspect_file(a), inspect_file(b)]}
    x = report["files"][0]["datasets"][0]
    assert (x["key"], x["shape"], x["chunks"], x["compression"], x["compression_opts"]) == (
        "x",
        [100, 8],
        [16, 8],
        "gzip",
        4,
    )
    code, out, err = run_in_process(["inspect", "--json", a, str(tmp_path / "missing.h5")], capsys)
    assert code == 2 and out == "" and "missing.h5: no such file" in err  # nothing half-printed


def test_inspect_stripe_warning_through_the_lustre_seam(tmp_path, monkeypatch):
    import hpctrain.data.cli as cli
    from hpctrain.data import make_dataset
    from hpctrain.testing import FakeLustre

    path = make_dataset(tmp_path / "big.h5", 100, shape=(8,))
    monkeypatch.setattr(cli, "_ONE_OST_WARN_BYTES", 1000)  # the file stands in for one over 1 GiB
    one_ost = FakeLustre(default=(1, 1 << 20))
    info = inspect_file(path, lustre=one_ost)
    assert info["stripe"] == {"count": 1, "size": 1 << 20}
    assert any("on a single OST (stripe 1 x 1024 KiB)" in w for w in info["warnings"])
    assert one_ost.calls == [["getstripe", "-c", "-S", path]]
    assert not any("OST" in w for w in inspect_file(path, lustre=FakeLustre(default=(8, 4 << 20)))["warnings"])
    failing = inspect_file(path, lustre=FakeLustre(fail=True))
    assert failing["stripe"] is None and not any("OST" in w for w in failing["warnings"])


def test_inspect_reports_links_and_virtual_datasets(tmp_path):
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f["x"] = np.zeros((10, 2), np.float32)
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as f:
        f["ext"] = h5py.ExternalLink("src.h5", "x")
        f["gone"] = h5py.ExternalLink("nope.h5", "x")
        lay = h5py.VirtualLayout((10, 2), "f4")
        lay[:] = h5py.VirtualSource("absent.h5", "x", (10, 2))
        f.create_virtual_dataset("v", lay)
    info = inspect_file(str(path))
    rows = {r["key"]: r for r in info["datasets"]}
    assert rows["ext"]["link"] == "external link to src.h5:x" and rows["v"]["virtual"]
    text = " ".join(info["warnings"])
    assert "gone: dangling external link to nope.h5:x" in text and "absent.h5', which does not exist" in text


def test_synth_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path, capsys):
    import os
    import stat

    import h5py

    real = tmp_path / "store" / "d.h5"
    real.parent.mkdir()
    real.write_bytes(b"old")
    link = tmp_path / "d.h5"
    link.symlink_to(real)
    code, out, err = run_in_process(["synth", str(link), "--samples", "5", "--shape", "4"], capsys)
    assert code == 2 and "already exists; pass --force" in err and real.read_bytes() == b"old"
    code, out, err = run_in_process(["synth", str(link), "--samples", "5", "--shape", "4", "--force"], capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    with h5py.File(real, "r") as f:
        assert f["x"].shape == (5, 4)
    assert sorted(p.name for p in real.parent.iterdir()) == ["d.h5"]
    null = tmp_path / "null.h5"
    null.symlink_to("/dev/null")
    code, out, err = run_in_process(["synth", str(null), "--samples", "5", "--shape", "4"], capsys)
    assert code == 0, err
    assert null.is_symlink() and os.readlink(null) == "/dev/null" and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5", "null.h5", "store"]


def test_synth_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, out, err = run_in_process(["synth", str(tmp_path / "file" / "d.h5"), "--samples", "5"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"data synth: cannot write {tmp_path / 'file' / 'd.h5'}: {tmp_path / 'file'} is not a directory" in err
