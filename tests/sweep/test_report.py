"""The sweep report: one self-contained page, a curve per task, the table, which parameters mattered; opened in
headless Chromium (when installed) with no console error."""

import json
import shutil
import subprocess

import pytest

from hpctrain.errors import UsageError
from hpctrain.report.cli import main
from hpctrain.report.sweep import render_sweep, write_sweep_report
from hpctrain.sweep.plan import write_plan
from hpctrain.sweep.table import sweep_table, task_curves
from hpctrain.testing import FakeSlurm

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = '<script>alert(1)</script>"'


def _sweep(tmp_path, n=4):
    tasks = []
    for i in range(n):
        name = f"000{i}-lr={i}"
        tasks.append({"index": i, "name": name, "run_dir": name, "params": {"--lr": str(i), "--tag": HOSTILE},
                      "job_id": f"7_{i}"})  # fmt: skip
        d = tmp_path / name / "train"
        d.mkdir(parents=True)
        ledger = [
            {"event": "start", "job_id": f"7_{i}", "restart_count": 0, "time": 1.0, "total_steps": 50},
            {"event": "exit", "job_id": f"7_{i}", "restart_count": 0, "time": 9.0, "cause": "finished"},
        ]
        (d / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
        metrics = [{"kind": "interval", "step": s, "loss": 2.0 / (s + i), "time": 1.0 + s} for s in range(10, 51, 10)]
        metrics.append({"kind": "eval", "step": 50, "loss": 1.0 / (1 + i), "time": 60.0})
        metrics.append({"kind": "interval", "step": 20, "loss": float("nan"), "time": 70.0})  # a redone step
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    write_plan(tmp_path, {"tasks": tasks, "array_job_id": "7", "max_parallel": 2, "state": "submitted"})


def test_page_has_a_curve_per_task_the_table_and_escapes_recorded_text(tmp_path):
    _sweep(tmp_path)
    table = sweep_table(tmp_path, slurm=FakeSlurm())
    curves = {r["index"]: task_curves(tmp_path / r["name"]) for r in table["tasks"]}
    assert [s for s, _ in curves[0]["train"]] == [10, 20, 30, 40, 50] and curves[0]["eval"] == [(50, 1.0)]
    page = render_sweep(table, curves)
    assert page.count('class="curve"') == 8  # 4 train + 4 eval curves
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "Which parameters mattered" in page and "class=best" in page
    out = tmp_path / "r.html"
    assert main([str(tmp_path), "-o", str(out)], slurm=FakeSlurm()) == 0 and out.read_text().startswith("<!DOCTYPE")
    with pytest.raises(UsageError, match="--force"):  # the one overwrite rule
        main([str(tmp_path), "-o", str(out)], slurm=FakeSlurm())
    assert main([str(tmp_path), "-o", str(out), "--force", "--json"], slurm=FakeSlurm()) == 0


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_sweep_report_renders_in_headless_chromium(tmp_path):
    _sweep(tmp_path)
    page = write_sweep_report(tmp_path, slurm=FakeSlurm()).path
    assert page == tmp_path / "sweep-report.html"
    dom, console = chromium_dom(page, tmp_path)
    assert dom.count('class="curve"') == 8 and "Sweep report" in dom
    assert not console, console


def chromium_dom(page, work):
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", f"--user-data-dir={work / 'p'}",
           "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
