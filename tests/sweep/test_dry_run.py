"""``submit --sweep --dry-run``: the job array's sbatch script and the task table, nothing submitted or written."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hpctrain.submit import cli
from hpctrain.testing import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]
SWEEP = """
[sweep]
max_parallel = 2
[sweep.grid]
"--lr" = ["0.01", "0.003"]
"--seed" = ["1", "2", "3"]
[job]
time = "00:10:00"
job_name = "lrsweep"
"""


def _sweep(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP)
    return path


def test_dry_run_prints_the_array_script_and_the_task_table(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["--sweep", str(_sweep(tmp_path)), "--run-dir", str(out), "--entry", "hpctrain.examples.demo:main",
            "--cluster", "slurm", "--dry-run", "--", "--steps", "40"]  # fmt: skip
    assert cli.main(argv, slurm=FakeSlurm()) == 0
    got = capsys.readouterr()
    script = got.out
    assert script.startswith("#!/bin/bash\n")
    lines = script.splitlines()
    assert "#SBATCH --array=0-5%2" in lines
    assert "#SBATCH --time=10" in lines and "#SBATCH --job-name=lrsweep" in lines  # the file's [job] table
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append" in lines
    assert f"#SBATCH --output={out}/logs/%A_%a_0_log.out" in lines  # one submitit folder for the whole array
    assert f"--output {out}/logs/%A_%a_%t_log.out" in script
    assert "nothing submitted; a job array of 6 task(s), at most 2 at once" in got.err
    table = [line for line in got.err.splitlines() if line.startswith("#   ")]
    assert table[0].split() == ["#", "task", "run", "dir", "arguments"]
    assert table[4].split() == ["#", "3", "0003-lr=0.003-seed=1", "--lr", "0.003", "--seed", "1"]
    assert not out.exists()


def test_max_parallel_flag_overrides_the_file_and_json_lists_every_task(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["--sweep", str(_sweep(tmp_path)), "--max-parallel", "3", "--run-dir", str(out), "--entry",
            "hpctrain.examples.demo:main", "--cluster", "slurm", "--dry-run", "--json", "--", "--steps",
            "40"]  # fmt: skip
    assert cli.main(argv, slurm=FakeSlurm()) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["dry_run"] is True and obj["max_parallel"] == 3 and "#SBATCH --array=0-5%3\n" in obj["sbatch"]
    assert [t["index"] for t in obj["tasks"]] == list(range(6))
    assert obj["tasks"][5] == {
        "index": 5,
        "name": "0005-lr=0.003-seed=3",
        "params": {"--lr": "0.003", "--seed": "3"},
        "args": ["--lr", "0.003", "--seed", "3"],
        "run_dir": str(out / "0005-lr=0.003-seed=3"),
    }
    assert not out.exists()


def test_max_parallel_above_the_task_count_is_capped(tmp_path, capsys):
    argv = ["--sweep", str(_sweep(tmp_path)), "--max-parallel", "50", "--run-dir", str(tmp_path / "sw"),
            "--entry", "hpctrain.examples.demo:main", "--cluster", "slurm", "--dry-run"]  # fmt: skip
    assert cli.main(argv, slurm=FakeSlurm()) == 0
    assert "#SBATCH --array=0-5%6\n" in capsys.readouterr().out


def test_task_configs_carry_common_then_own_args(tmp_path):
    from hpctrain.submit.sweep import task_configs
    from hpctrain.sweep.plan import load_sweep

    cfg, _ = cli.resolve_config(["--sweep", str(_sweep(tmp_path)), "--entry", "m:f", "--", "--steps", "40"])
    configs = task_configs(cfg, load_sweep(_sweep(tmp_path)), tmp_path / "sw")
    assert configs[4].entry_args == ["--steps", "40", "--lr", "0.003", "--seed", "2"]
    assert configs[4].run_dir == str(tmp_path / "sw" / "0004-lr=0.003-seed=2")
    assert {c.time for c in configs} == {"00:10:00"} and {c.job_name for c in configs} == {"lrsweep"}


def test_dry_run_subprocess_imports_no_torch(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpctrain.submit", "--sweep", str(_sweep(tmp_path)),
         "--run-dir", str(tmp_path / "sw"), "--entry", "hpctrain.examples.demo:main", "--dry-run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --array=0-5%2\n" in proc.stdout
    mods = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hpctrain.sweep.plan" in mods and "torch" not in mods and "numpy" not in mods
    assert not (tmp_path / "sw").exists()
