"""The sweep file: parsing, the task table and its names, and bad files (one line, exit 2, nothing written)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.submit import cli
from hpctrain.submit.config import toml_kwargs
from hpctrain.sweep.plan import load_sweep, parse_sweep, read_plan, task_name, write_plan
from hpctrain.testing import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]
GRID = """
[sweep]
max_parallel = 2
[sweep.grid]
"--lr" = ["0.01", "0.003"]
"--seed" = ["1", "2", "3"]
"""


def write(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_expands_in_file_order_last_key_fastest(tmp_path):
    plan = load_sweep(write(tmp_path, GRID))
    assert plan.max_parallel == 2 and plan.parallelism() == 2 and plan.parallelism(5) == 5
    assert [t.index for t in plan.tasks] == list(range(6))
    assert [t.args for t in plan.tasks[:4]] == [
        ["--lr", "0.01", "--seed", "1"],
        ["--lr", "0.01", "--seed", "2"],
        ["--lr", "0.01", "--seed", "3"],
        ["--lr", "0.003", "--seed", "1"],
    ]
    assert [t.name for t in plan.tasks] == [
        "0000-lr=0.01-seed=1",
        "0001-lr=0.01-seed=2",
        "0002-lr=0.01-seed=3",
        "0003-lr=0.003-seed=1",
        "0004-lr=0.003-seed=2",
        "0005-lr=0.003-seed=3",
    ]


def test_explicit_tasks_numbers_booleans_and_job_tables(tmp_path):
    text = """
[job]
time = "00:10:00"
nodes = 2
[train]
entry = "hpctrain.examples.demo:main"
args = ["--steps", "30"]
[sweep.grid]
"--lr" = [0.1, 3e-4]
"--amp" = [true, false]
[[sweep.tasks]]
"--lr" = "1"
"--tag" = "a b/c"
"""
    plan = load_sweep(write(tmp_path, text), config=toml_kwargs)
    assert plan.config == {"time": "00:10:00", "nodes": 2, "entry": "hpctrain.examples.demo:main",
                           "entry_args": ["--steps", "30"]}  # fmt: skip
    assert plan.max_parallel is None and plan.parallelism() == 5
    assert [t.args for t in plan.tasks] == [
        ["--lr", "0.1", "--amp"],
        ["--lr", "0.1"],
        ["--lr", "0.0003", "--amp"],
        ["--lr", "0.0003"],
        ["--lr", "1", "--tag", "a b/c"],
    ]
    assert plan.tasks[1].name == "0001-lr=0.1-amp=false"
    assert plan.tasks[4].name == "0004-lr=1-tag=a_b_c"  # filesystem-safe: no '/', no spaces


def test_names_are_safe_short_and_widen_with_the_count():
    long = task_name(7, {"--x": "y" * 500})
    assert len(long) <= 120 and "/" not in long and long.startswith("0007-x=yyy")
    assert task_name(7, {"--x": "y" * 500}) == long and task_name(7, {"--x": "y" * 499}) != long
    assert task_name(3, {"--p": "../../etc"}) == "0003-p=.._.._etc"
    plan = parse_sweep({"grid": {"--i": list(range(12000))}})
    assert plan.tasks[0].name == "00000-i=0" and plan.tasks[-1].name == "11999-i=11999"


BAD = [
    ("[sweep]\nmax_paralel = 2\n[sweep.grid]\n'--a' = [1]\n", "unknown key(s) ['max_paralel'] in [sweep]"),
    ("[sweep.grid]\n", "[sweep.grid] is empty"),
    ("[sweep.grid]\n'--a' = []\n", "an empty list makes an empty grid"),
    ("[sweep]\nmax_parallel = 2\n", "[sweep] has no tasks"),
    ("[job]\nnodes = 1\n", "no [sweep] table"),
    ("[sweep.grid]\n'lr' = [1]\n", "must be the entry's flag"),
    ("[sweep.grid]\n'--a' = [[1]]\n", "a value must be a string, a number or a boolean"),
    ("[sweep.grid]\n'--a' = [\"x\\ny\"]\n", "one line without control characters"),
    ("[sweep]\nmax_parallel = 0\n[sweep.grid]\n'--a' = [1]\n", "max_parallel = 0 must be a whole number"),
    ("[sweeps.grid]\n'--a' = [1]\n", "unknown table(s) ['sweeps']"),
    ("[job]\nnode = 1\n[sweep.grid]\n'--a' = [1]\n", "unknown key(s) ['node'] in [job]"),
    ("[sweep]\ntasks = [1]\n", "sweep.tasks must be a list of tables"),
    ("[sweep.grid]\n" + "".join(f"'--a{i}' = [{','.join(map(str, range(20)))}]\n" for i in range(6)), "64000000 tasks"),
    ("[sweep.grid\n", "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_sweep_files_are_one_usage_error_and_nothing_is_written(tmp_path, text, message):
    path = write(tmp_path, text)
    out = tmp_path / "out"
    with pytest.raises(UsageError) as err:
        cli.main(["--sweep", str(path), "--run-dir", str(out), "--entry", "hpctrain.examples.demo:main",
                  "--cluster", "slurm"], slurm=FakeSlurm())  # fmt: skip
    assert message in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 2
    assert not out.exists()


def test_more_tasks_than_max_array_size_is_refused_before_anything(tmp_path):
    fake = FakeSlurm()
    fake.config["MaxArraySize"] = "5"  # indices 0-4: the 6-task grid does not fit
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        with pytest.raises(UsageError, match=r"6 tasks, but this cluster's MaxArraySize is 5 \(array indices 0-4\)"):
            cli.main(["--sweep", str(write(tmp_path, GRID)), "--run-dir", str(out), "--entry",
                      "hpctrain.examples.demo:main", "--cluster", "slurm", *extra], slurm=fake)  # fmt: skip
    assert ["scontrol", "show", "config"] in fake.calls and not out.exists()
    assert fake.max_array_size() == 5


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--resume", "x"], "--sweep submits a new sweep; --resume continues one run"),
        (["--follow"], "--follow follows one job"),
        (["--spare-nodes", "1"], "--spare-nodes is not supported with --sweep"),
        (["--cluster", "local"], "--sweep submits a Slurm job array"),
    ],
)
def test_flags_a_sweep_does_not_take(tmp_path, extra, message):
    out = tmp_path / "out"
    argv = ["--sweep", str(write(tmp_path, GRID)), "--entry", "hpctrain.examples.demo:main", *extra]
    if "--resume" not in extra:
        argv += ["--run-dir", str(out)]
    if "--cluster" not in extra:
        argv += ["--cluster", "slurm"]
    with pytest.raises(UsageError, match=message.replace("-", r"\-")):
        cli.main(argv, slurm=FakeSlurm())
    assert not out.exists()


def test_max_parallel_without_a_sweep_is_refused(tmp_path):
    with pytest.raises(UsageError, match="--max-parallel applies to a sweep"):
        cli.main(["--max-parallel", "2", "--entry", "hpctrain.examples.demo:main", "--dry-run"], slurm=FakeSlurm())


def test_cli_subprocess_one_line_exit_2(tmp_path):
    path = write(tmp_path, "[sweep.grid]\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--sweep", str(path), "--run-dir", str(tmp_path / "out"),
         "--entry", "hpctrain.examples.demo:main", "--dry-run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("hpctrain submit: error: ")
    assert "[sweep.grid] is empty" in proc.stderr and not (tmp_path / "out").exists()


def test_plan_record_round_trip(tmp_path):
    write_plan(tmp_path, {"tasks": [{"index": 0, "name": "0000-a=1"}], "max_parallel": 1})
    assert read_plan(tmp_path)["tasks"][0]["name"] == "0000-a=1"
    with pytest.raises(UsageError, match="no sweep.json"):
        read_plan(tmp_path / "nope")
