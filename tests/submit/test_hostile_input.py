"""Hostile and broken input to `python -m hpctrain.submit`: one error line, exit 2, no hang, nothing written,
and no user code run on the login-node path (`--dry-run` and the static entry check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain._entry import find_module_file
from hpctrain.errors import UsageError
from hpctrain.submit.entry import check_entry_static

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["--entry", "hpctrain.examples.demo:main"]


def run_submit(args, cwd, timeout=60):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,  # a FIFO or a hanging import must not hang the CLI: TimeoutExpired fails the test
        stdin=subprocess.DEVNULL,
    )


def toml(text):
    def setup(tmp):
        (tmp / "bad.toml").write_bytes(text if isinstance(text, bytes) else text.encode())
        return [*DEMO, "--config", "bad.toml"]

    return setup


def module(name, source):
    def setup(tmp):
        (tmp / f"{name}.py").write_bytes(source)
        return ["--entry", f"{name}:main"]

    return setup


def package(init, mod=b"def main(ctx):\n    pass\n"):
    def setup(tmp):
        (tmp / "userpkg").mkdir()
        (tmp / "userpkg" / "__init__.py").write_bytes(init)
        (tmp / "userpkg" / "train.py").write_bytes(mod)
        return ["--entry", "userpkg.train:main"]

    return setup


def mkdir_config(tmp):
    (tmp / "cfgdir").mkdir()
    return [*DEMO, "--config", "cfgdir"]


def fifo_config(tmp):
    os.mkfifo(tmp / "cfg.fifo")
    return [*DEMO, "--config", "cfg.fifo"]


def default_toml_is_fifo(tmp):
    os.mkfifo(tmp / "hpctrain.toml")
    return [*DEMO]


def fifo_module(tmp):
    os.mkfifo(tmp / "piped.py")
    return ["--entry", "piped:main"]


# id -> (setup(tmp) -> args, text the one error line must contain)
CASES = {
    "run-dir component of 300 chars": (lambda t: [*DEMO, "--run-dir", str(t / ("r" * 300))], "255"),
    "run-dir of 5000 bytes": (
        lambda t: [*DEMO, "--run-dir", str(t / "/".join(["d" * 200] * 25))],
        "this system allows",
    ),
    "job name of 300 chars": (lambda t: [*DEMO, "--job-name", "j" * 300], "--job-name"),
    "nodes with 5000 digits": (lambda t: [*DEMO, "--nodes", "9" * 5000], "argument --nodes"),
    "tasks-per-node not a number": (lambda t: [*DEMO, "--tasks-per-node", "two"], "argument --tasks-per-node"),
    "time with 5000 digits": (lambda t: [*DEMO, "--time", "9" * 5000], "--time"),
    "mem with 5000 digits": (lambda t: [*DEMO, "--mem", "9" * 5000 + "G"], "--mem"),
    "nodes beyond any cluster": (lambda t: [*DEMO, "--nodes", "999999999999"], "--nodes 999999999999 is too large"),
    "toml [job] is a string": (toml('job = "x"\n'), "job must be a table"),
    "toml [train] is an array": (toml("train = [1, 2]\n"), "train must be a table"),
    "toml nodes is a string": (toml('[job]\nnodes = "x"\n'), "--nodes 'x' must be an integer"),
    "toml nodes is an array": (toml("[job]\nnodes = [1, 2]\n"), "--nodes [1, 2] must be an integer"),
    "toml time is an array": (toml("[job]\ntime = [1]\n"), "--time [1] must be a string"),
    "toml nodes is a table": (toml("[job.nodes]\na = 1\n"), "--nodes {'a': 1} must be an integer"),
    "toml args is a string": (toml('[train]\nargs = "--lr 3"\n'), "[train] args must be a list of strings"),
    "toml args holds a number": (toml('[train]\nargs = ["--lr", 3]\n'), "[train] args must be a list of strings"),
    "toml integer of 5000 digits": (toml("[job]\nnodes = " + "9" * 5000 + "\n"), "not usable TOML"),
    "toml array nested 100000 deep": (toml("[job]\nnodes = " + "[" * 100000 + "]" * 100000 + "\n"), "TOML"),
    "toml not UTF-8": (toml(b"[job]\nnodes = 2 # \xff\xfe\n"), "not UTF-8"),
    "toml is not TOML": (toml("[job\n"), "not valid TOML"),
    "config is a directory": (mkdir_config, "is a directory"),
    "config is a FIFO": (fifo_config, "not a regular file"),
    "./hpctrain.toml is a FIFO": (default_toml_is_fifo, "not a regular file"),
    "config missing": (lambda t: [*DEMO, "--config", "nope.toml"], "no such file"),
    "entry syntax error": (module("syn", b"def main(:\n"), "syn.py, line 1: invalid syntax"),
    "entry not UTF-8": (module("latin", b'S = "\xe9t\xe9"\ndef main(ctx):\n    pass\n'), "can't decode byte"),
    "entry null byte": (module("nul", b"def main(ctx):\n    pass\x00\n"), "nul.py"),
    "entry is a FIFO": (fifo_module, "no module named 'piped'"),  # the import system skips it too
    "entry is an int": (module("notfn", b"main = 3\n"), "value of type int"),
    "entry is a list": (module("notfn2", b"main = [1]\n"), "value of type list"),
    "entry package __init__ syntax error": (package(b"def (\n"), "__init__.py, line 1"),
    "entry package __init__ raises": (package(b"raise RuntimeError('boom from init')\n"), "boom from init"),
    "entry module raises at import": (module("raiser", b"raise ValueError('nope')\ndef main(ctx): pass\n"), "nope"),
    "entry is a callable-looking non-callable": (module("inst", b"class K: pass\nmain = K()\n"), "not callable"),
    "entry of 5000 chars": (lambda t: ["--entry", "m" * 5000 + ":main"], "is 5005 characters"),
    "entry module name of 300 chars": (lambda t: ["--entry", "m" * 300 + ":main"], "no module named"),
    "entry parent is a module": (lambda t: ["--entry", "hpctrain.errors.sub:main"], "is not a package"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_hostile_input_is_one_line_exit_2_and_nothing_written(tmp_path, case):
    setup, message = CASES[case]
    args = setup(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    # A real (non dry-run) local submission: every check must come before anything is written.
    proc = run_submit([*args, "--cluster", "local"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain submit: error: "), proc.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout and len(lines[0]) < 1000
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == before  # no run dir, no runs/
    assert not (tmp_path / "runs").exists()


def test_local_job_larger_than_the_machine_is_refused_naming_the_flags(tmp_path):
    # --dry-run: were the check ever lost, a real run would set out to start 100000 processes.
    proc = run_submit([*DEMO, "--cluster", "local", "--nodes", "100000", "--dry-run"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--nodes 100000 x --tasks-per-node 1 = 100000 processes" in lines[0]
    assert "--cluster local" in lines[0] and proc.stdout == ""
    # The same size for Slurm is the scheduler's business (it says PartitionConfig; see tests/cluster).
    ok = run_submit([*DEMO, "--cluster", "slurm", "--nodes", "100000", "--dry-run"], tmp_path)
    assert ok.returncode == 0 and "#SBATCH --nodes=100000\n" in ok.stdout, ok.stderr


MARKER_INIT = b"import pathlib\npathlib.Path(__file__).parent.parent.joinpath('MARKER').write_text('ran')\n"


def test_dry_run_and_static_check_run_no_user_code(tmp_path, monkeypatch):
    (tmp_path / "userpkg" / "sub").mkdir(parents=True)
    for init in (tmp_path / "userpkg" / "__init__.py", tmp_path / "userpkg" / "sub" / "__init__.py"):
        init.write_bytes(MARKER_INIT)
    (tmp_path / "userpkg" / "sub" / "train.py").write_bytes(MARKER_INIT + b"def main(ctx):\n    pass\n")
    proc = run_submit(["--entry", "userpkg.sub.train:main", "--cluster", "local", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n") and not (tmp_path / "MARKER").exists()
    # In process too: the module is found and checked, and nothing of the package is imported.
    monkeypatch.syspath_prepend(str(tmp_path))
    check_entry_static("userpkg.sub.train:main")
    origin, inits = find_module_file("userpkg.sub.train")
    assert origin == str(tmp_path / "userpkg" / "sub" / "train.py") and len(inits) == 2
    assert not (tmp_path / "MARKER").exists() and "userpkg" not in sys.modules
    with pytest.raises(UsageError, match="defines no top-level 'nope'"):
        check_entry_static("userpkg.sub.train:nope")
    # A real submission does import it, in a child interpreter, to catch import errors before the queue.
    from hpctrain.submit.entry import check_entry_imports

    monkeypatch.chdir(tmp_path)
    check_entry_imports("userpkg.sub.train:main")
    assert (tmp_path / "MARKER").read_text() == "ran" and "userpkg" not in sys.modules


def test_find_module_file_handles_namespace_packages_and_missing_levels(tmp_path, monkeypatch):
    (tmp_path / "nspkg" / "inner").mkdir(parents=True)  # no __init__.py: namespace packages
    (tmp_path / "nspkg" / "inner" / "mod.py").write_text("def main(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_module_file("nspkg.inner.mod") == (str(tmp_path / "nspkg" / "inner" / "mod.py"), [])
    assert find_module_file("nspkg") == (None, [])  # nothing to parse: checked on import instead
    with pytest.raises(UsageError, match="no module named 'nspkg.inner.nope'"):
        find_module_file("nspkg.inner.nope")
    with pytest.raises(UsageError, match="'hpctrain.errors' is not a package"):
        find_module_file("hpctrain.errors.x")
    # Entries behind an `if`/`try` at top level are found (optional imports, fallbacks).
    (tmp_path / "guarded.py").write_text("try:\n    from os import getcwd as main\nexcept ImportError:\n    pass\n")
    check_entry_static("guarded:main")
