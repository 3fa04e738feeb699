"""The run registry (hpctrain.registry): whole lines from concurrent real processes, a torn last line skipped
with one warning, a missing or unwritable home, and the record's fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain import registry
from hpctrain.registry import read_runs, record_run, registry_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_path_from_env_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "h"))
    assert registry_path() == tmp_path / "h" / "runs.jsonl"
    monkeypatch.delenv("HPCTRAIN_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert registry_path() == tmp_path / "user" / ".hpctrain" / "runs.jsonl"


def test_a_record_has_every_field_and_reads_back(home, tmp_path, capsys):
    assert read_runs() == [] and not home.exists()  # a missing home is no runs, no warning
    got = record_run(tmp_path / "r", 42, name="lr0.1", cluster="slurm", submitted_at=1000.0)
    assert got == registry_path() and oct(home.stat().st_mode & 0o777) == "0o700"
    record_run("rel", "7_3", name="t", cluster="slurm", kind="sweep-task", sweep=tmp_path / "sw")
    line = json.loads(registry_path().read_text().splitlines()[0])
    assert line["schema"] == "hpctrain.registry/1"
    assert {"run_dir", "job_id", "name", "cluster", "submitted_at", "user", "kind", "host"} <= set(line)
    first, second = read_runs()
    assert first.run_dir == str(tmp_path / "r") and first.job_id == "42" and first.kind == "submit"
    assert first.submitted_at == 1000.0 and first.sweep is None
    assert os.path.isabs(second.run_dir) and second.kind == "sweep-task" and second.sweep == str(tmp_path / "sw")
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="kind"):
        record_run("x", 1, name="n", cluster="slurm", kind="nope")


WRITER = textwrap.dedent(
    """
    import sys
    from hpctrain.registry import record_run
    who, n = sys.argv[1], int(sys.argv[2])
    sys.stdin.readline()  # start together
    for i in range(n):
        record_run(f"/runs/{who}/{i}", f"{who}{i}", name=who + "x" * 3000, cluster="slurm", strict=True)
    """
)


def test_concurrent_appends_from_real_processes_give_whole_lines(home):
    procs, n = 6, 40
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, f"p{k}", str(n)], stdin=subprocess.PIPE, env=env)
        for k in range(procs)
    ]
    for w in writers:
        w.stdin.write(b"go\n")
        w.stdin.flush()
    for w in writers:
        w.stdin.close()
        assert w.wait(timeout=120) == 0
    raw = registry_path().read_bytes()
    lines = raw.split(b"\n")
    assert lines[-1] == b"" and len(lines) == procs * n + 1
    records = [json.loads(x) for x in lines[:-1]]  # every line is one whole record
    for k in range(procs):
        mine = [r["run_dir"] for r in records if r["job_id"].startswith(f"p{k}")]
        assert mine == [f"/runs/p{k}/{i}" for i in range(n)]  # each writer's records whole and in order
    assert len(read_runs()) == procs * n


def test_a_torn_last_line_is_skipped_with_one_warning(home, capsys):
    record_run("/a", 1, name="a", cluster="slurm")
    record_run("/b", 2, name="b", cluster="slurm")
    with open(registry_path(), "ab") as f:
        f.write(b'{"schema": "hpctrain.registry/1", "run_dir": "/c", "jo')  # a writer died mid-line
    assert [r.run_dir for r in read_runs()] == ["/a", "/b"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "line 3" in err[0] and "writer died" in err[0], err
    # the next record starts on a line of its own: only the torn one is lost
    record_run("/d", 4, name="d", cluster="slurm")
    assert [r.run_dir for r in read_runs()] == ["/a", "/b", "/d"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "line 3" in err[0] and "writer died" not in err[0], err


def test_many_bad_lines_are_still_one_warning(home, capsys):
    record_run("/a", 1, name="a", cluster="slurm")
    with open(registry_path(), "a") as f:
        f.write("garbage\n[1, 2]\n" + '{"run_dir": 5}\n' + "\x00\xff\n")
    record_run("/b", 2, name="b", cluster="slurm")
    assert [r.run_dir for r in read_runs()] == ["/a", "/b"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "and 3 more" in err[0], err


def test_an_unwritable_home_is_one_warning_never_an_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "file"))  # a file where the directory should be
    assert record_run("/a", 1, name="a", cluster="slurm") is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain: warning: run not added to the registry"), err
    with pytest.raises(OSError):
        record_run("/a", 1, name="a", cluster="slurm", strict=True)
    assert read_runs() == []  # a registry under a file: no runs, no traceback


def test_a_held_lock_times_out_as_a_warning(home, monkeypatch, capsys):
    import fcntl

    monkeypatch.setattr(registry, "LOCK_TIMEOUT_S", 0.2)
    monkeypatch.setattr(registry, "READ_LOCK_TIMEOUT_S", 0.2)
    record_run("/a", 1, name="a", cluster="slurm")
    fd = os.open(registry_path(), os.O_RDONLY)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(30)", str(registry_path())],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == b"held\n"
        assert record_run("/b", 2, name="b", cluster="slurm") is None
        assert "was not free" in capsys.readouterr().err
        assert [r.run_dir for r in read_runs()] == ["/a"]  # a reader does not wait long on a stuck writer
    finally:
        holder.kill()
        holder.wait()
        os.close(fd)
    del fcntl


class _Job:
    def __init__(self, folder: Path) -> None:
        self.job_id = "4242"
        self.paths = type("P", (), {"stdout": folder / "4242_%t_log.out", "stderr": folder / "4242_%t_log.err"})()


class _Executor:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def submit(self, runner):
        return _Job(self.folder)


@pytest.mark.parametrize("writable", [True, False])
def test_submit_records_the_run_once_and_a_failed_write_never_fails_it(tmp_path, monkeypatch, capsys, writable):
    from hpctrain.submit import backend
    from hpctrain.submit.config import SubmitConfig

    if writable:
        monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    else:
        (tmp_path / "home").write_text("a file where the directory should be")
        monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(backend, "_executor", lambda cfg, folder, **kw: _Executor(folder))
    run_dir = tmp_path / "run"
    cfg = SubmitConfig(entry="hpctrain.examples.demo:main", job_name="reg-test")
    sub = backend.submit(cfg, run_dir=run_dir, cluster="local", argv=["--entry", "x"])
    assert sub.job_id == "4242" and json.loads((run_dir / "submission.json").read_text())["state"] == "submitted"
    err = capsys.readouterr().err
    if writable:
        (entry,) = read_runs()
        assert (entry.run_dir, entry.job_id, entry.name, entry.cluster, entry.kind) == (
            str(run_dir),
            "4242",
            "reg-test",
            "local",
            "submit",
        )
        assert entry.submitted_at == sub.submitted_at and err == ""
    else:
        lines = [line for line in err.splitlines() if "registry" in line]
        assert len(lines) == 1 and lines[0].startswith("hpctrain: warning: run not added"), err
