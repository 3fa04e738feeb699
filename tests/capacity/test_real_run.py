"""The capacity command on real runs: the demo at world 1 and 2 (gloo, local processes through hpctrain's
Runner, as tests/test_demo.py runs it), then the prediction from their records."""

from __future__ import annotations

import json
import math

import pytest

from hpctrain.__main__ import main as hpctrain_main
from tests.multiproc import run_world


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    return Runner(entry="hpctrain.launch.probe:main", run_dir=run_dir, entry_args=args)()


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    from hpctrain.data import make_dataset

    root = tmp_path_factory.mktemp("cal")
    data = str(make_dataset(root / "d.h5", 2000, shape=(16,)))
    args = ["--reps", "3", "--sizes", "4,65536", "--entry", "hpctrain.examples.demo:main", "--"]
    args += ["--data", data, "--steps", "30", "--log-every", "5", "--ckpt-every", "10", "--workers", "0", "--quiet"]
    dirs = []
    for world in (1, 2):
        run_dir = root / f"w{world}"
        run_world(_demo, world, str(run_dir), args, init_pg=False)
        dirs.append(str(run_dir))
    return dirs


def test_capacity_of_the_demo_from_its_own_records(calibration, capsys):
    assert hpctrain_main(["capacity", *calibration, "--nodes", "1,2,4,64", "--local-batch", "64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cal = report["calibration"]
    assert [c["world_size"] for c in cal] == [1, 2]
    # what the records hold: the model's gradient bytes (the demo's 16 -> 128 -> 10 network, float32), the dataset
    from hpctrain.examples.demo import _model

    assert cal[0]["grad_bytes"] == 4 * sum(p.numel() for p in _model(16, 128, 10, 2).parameters())
    assert cal[0]["dataset_samples"] == 2000 and cal[0]["bytes_per_sample"] == 16 * 4 + 8
    # the loader's own reads (the interval records' input): at least the 72 bytes a sample holds (more: the
    # whole 144 KB file is one read block, and the readers read ahead), at a measured rate
    assert all(c["read_bytes_per_sample"] >= 72 and c["rank_read_rate"] > 0 for c in cal)
    assert report["model"]["node_read_rate"]["source"] == "measured"
    assert cal[1]["probe"]["world_size"] == 2 and len(cal[1]["probe"]["sizes"]) == 2 and cal[0]["probe"] is None
    assert all(c["save_commit_s"] and c["startup_s"] and c["checkpoint_bytes"] for c in cal)
    assert report["model"]["comm_latency_s"]["source"] == "measured"  # from the probe
    for row in report["rows"]:
        assert row["feasible"] and math.isfinite(row["step_s"]) and row["step_s"] > 0 and 0 < row["ettr"] <= 1
    assert report["rows"][0]["efficiency"] == pytest.approx(1.0)


def test_calibrate_submits_through_the_submit_path_and_reuses_its_runs(tmp_path, capsys):
    from hpctrain.data import make_dataset

    data = str(make_dataset(tmp_path / "d.h5", 1000, shape=(8,)))
    argv = ["capacity", "--calibrate", "2", "--entry", "hpctrain.examples.demo:main", "--calibrate-dir", str(tmp_path)]
    argv += ["--submit-args", "--cluster local --time 5", "--nodes", "1,2,4", "--json", "--"]
    argv += ["--data", data, "--steps", "20", "--log-every", "5", "--ckpt-every", "10", "--workers", "0", "--quiet"]
    assert hpctrain_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    (cal,) = report["calibration"]
    assert cal["run_dir"] == str(tmp_path / "n2x1") and cal["world_size"] == 2 and cal["probe"]["world_size"] == 2
    assert (tmp_path / "n2x1.log").exists() and [r["nodes"] for r in report["rows"]] == [1, 2, 4]
    assert hpctrain_main(argv) == 0  # the second time the run directory is reused: nothing is submitted
    assert "calibration n2x1: reusing" in capsys.readouterr().err
