"""``python -m hpctrain capacity``: the table, ``--json`` and its schema, the plot, bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from hpctrain.__main__ import main as hpctrain_main
from tests.capacity.synth import make_run

ROW_KEYS = {
    "nodes",
    "gpus",
    "local_batch",
    "global_batch",
    "feasible",
    "step_s",
    "parts",
    "samples_per_s",
    "efficiency",
    "mfu",
    "read_bw_per_node",
    "input",
    "staging",
    "steps",
    "train_s",
    "checkpoint",
    "failures",
    "ettr",
    "segments",
    "wall_s",
    "gpu_hours",
    "ettr_overall",
    "bound",
    "advice",
}

INPUT_KEYS = {
    "node_bytes_per_step",
    "node_read_rate",
    "node_read_need",
    "storage_share",
    "read_demand",
    "storage_bound",
}
STAGING_KEYS = {"copy_s", "local_wait_s", "saved_per_step_s", "pays_off_after", "steps", "verdict"}


@pytest.fixture
def runs(tmp_path):
    w1 = make_run(tmp_path / "w1", world=1, nodes=1, global_batch=64, data_ms=1, compute_ms=10, comm_ms=0.5)
    w2 = make_run(tmp_path / "w2", world=2, nodes=2, global_batch=64, data_ms=1, compute_ms=6, comm_ms=4.5)
    return [str(w1), str(w2)]


def test_json_report_follows_the_documented_schema(runs, capsys):
    rc = hpctrain_main(
        [
            "capacity",
            *runs,
            "--nodes",
            "1,8,64,512",
            "--local-batch",
            "32",
            "--samples",
            "1e8",
            "--peak-flops",
            "989e12",
            "--busbw",
            "25",
            "--latency-us",
            "20",
            "--time-limit",
            "04:00:00",
            "--queue-wait",
            "600",
            "--mtbf-node-hours",
            "2000",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(out)
    assert report["schema"] == "hpctrain.capacity/1"
    assert set(report) >= {"run_dirs", "calibration", "targets", "model", "rows", "points", "summary", "notes"}
    assert [c["world_size"] for c in report["calibration"]] == [1, 2]
    assert [r["nodes"] for r in report["rows"]] == [1, 8, 64, 512]
    for row in report["rows"]:
        assert set(row) == ROW_KEYS, set(row) ^ ROW_KEYS
        assert set(row["parts"]) == {"data_wait_s", "compute_s", "comm_s", "optimizer_s", "other_s"}
        assert set(row["checkpoint"]) == {"save_stall_s", "save_commit_s", "young_s", "daly_s", "interval_steps"}
        assert set(row["failures"]) == {"job_mtbf_s", "restart_s", "expected", "lost_s"}
        assert set(row["input"]) == INPUT_KEYS and set(row["staging"]) == STAGING_KEYS
        assert 0 < row["ettr"] <= 1 and row["mfu"] > 0 and row["segments"] >= 1
    for name, param in report["model"].items():
        if name != "notes":
            assert set(param) == {"value", "source", "note"} and param["source"] in (
                "measured",
                "fitted",
                "given",
                "assumed",
            )
    assert report["model"]["comm_inv_busbw"]["source"] == "given" and report["targets"]["busbw"] == 25e9
    assert report["model"]["mtbf_node_hours"] == {"value": 2000.0, "source": "given", "note": ""}


def test_table_and_plot(runs, tmp_path, capsys):
    svg = tmp_path / "cap.svg"
    assert hpctrain_main(["capacity", *runs, "--samples", "1e9", "--local-batch", "32", "--plot", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "predicted per node count" in out and "512" in out and "network" in out and f"plot      {svg}" in out
    assert svg.read_bytes().startswith(b"<?xml") and b"<svg" in svg.read_bytes()


def test_render_plot_is_public_and_deterministic(runs):
    from hpctrain.capacity import capacity_report, render_plot

    report = capacity_report(runs)
    assert render_plot(report, "svg") == render_plot(report, "svg")


def test_the_plot_is_one_svg_of_three_panels_with_a_star_per_calibration_point(runs):
    from hpctrain.capacity import capacity_report, render_plot

    report = capacity_report(runs)
    root = ET.fromstring(render_plot(report, "svg"))
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    titles = [t.text for t in root.iter(f"{ns}text") if t.get("class") == "panel-title"]
    assert titles == ["time to train", "scaling efficiency", "effective training time ratio"]
    comparable = [p for p in report["points"] if p["comparable"]]
    assert comparable
    panels = [g for g in root.iter(f"{ns}g") if g.get("class") == "panel"]
    assert len(panels) == 3
    stars = [e for e in panels[0].iter(f"{ns}path") if (e.findtext(f"{ns}title") or "").startswith("calibration")]
    assert len(stars) == len([p for p in comparable if p.get("train_s")])


def test_a_png_plot_is_exit_2_with_one_line_and_nothing_written(runs, tmp_path):
    png = tmp_path / "cap.png"
    res = subprocess.run(
        [sys.executable, "-m", "hpctrain", "capacity", *runs, "-o", str(png)], capture_output=True, text=True
    )
    assert res.returncode == 2 and not png.exists()
    assert len(res.stderr.strip().splitlines()) == 1 and "SVG" in res.stderr and "rsvg-convert" in res.stderr
    from hpctrain.capacity import capacity_report, render_plot
    from hpctrain.errors import HpctrainError

    with pytest.raises(HpctrainError, match="SVG only"):
        render_plot(capacity_report(runs), "png")


@pytest.mark.parametrize(
    "args, says",
    [
        (["/nonexistent/run"], "RUN_DIR /nonexistent/run: no such directory"),
        (["{w1}", "--nodes", "0,4"], "--nodes '0,4': node counts must be integers"),
        (["{w1}", "--nodes", "a"], "is not a comma-separated list"),
        (["{w1}", "--samples", "5", "--epochs", "2"], "not allowed with argument"),
        (["{w1}", "--busbw", "-3"], "--busbw '-3' must be a number > 0"),
        (["{w1}", "--time-limit", "soon"], "--time-limit 'soon' is not a Slurm time"),
        (["{w1}", "--plot", "x.pdf"], "name a .svg file"),
        (["{w1}", "--entry", "m:f"], "belong to --calibrate"),
        (["--calibrate", "1,2"], "--calibrate needs --entry"),
        ([], "give at least one calibration RUN_DIR"),
        (["{w1}", "--epochs", "2"], "--epochs needs the dataset size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(runs, args, says):
    argv = [a.format(w1=runs[0]) for a in args]
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "capacity", *argv], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("hpctrain capacity: error: ") and says in proc.stderr, proc.stderr


def test_the_login_path_imports_no_torch(runs):
    code = (
        "import sys; from hpctrain.__main__ import main; "
        f"rc = main(['capacity', {runs[0]!r}, {runs[1]!r}, '--json']); "
        "assert rc == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
