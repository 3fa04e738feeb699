"""Container jobs on the login side: the flags, the checks (one line, exit 2, nothing written), the sbatch text of
each runtime (golden files), the mounts, the image record, and the Slurm-command relay (run here, for real)."""

from __future__ import annotations

import difflib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain import _container
from hpctrain._container import Mount, check_mounts, job_mounts, parse_mounts, task_wrapper
from hpctrain.errors import UsageError
from hpctrain.submit.config import SubmitConfig, toml_kwargs
from hpctrain.submit.sbatch import render_sbatch

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CWD = "/home/ada/proj"
RUN = "/scratch/ada/runs/golden"
IMAGES = {
    "apptainer": "/images/pytorch-24.01.sif",
    "pyxis": "nvcr.io#nvidia/pytorch:24.01-py3",
    "podman": "localhost/pt:24",
}


def golden_config(runtime: str) -> SubmitConfig:
    return SubmitConfig(
        nodes=2, gpus_per_node=4, time="02:00:00", partition="gpu", job_name="golden", entry="pkg.train:main",
        container=IMAGES[runtime], container_runtime=runtime, container_mounts=["/datasets/imagenet:/data", "/scratch"],
        container_python="python3",
    )  # fmt: skip


@pytest.mark.parametrize("runtime", sorted(IMAGES))
def test_sbatch_matches_golden_file_per_runtime(runtime, monkeypatch):
    monkeypatch.setattr(os, "getcwd", lambda: CWD)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    text = render_sbatch(golden_config(runtime), folder=f"{RUN}/logs", python="/opt/venv/bin/python", run_dir=RUN)
    golden = HERE / f"sbatch_golden_{runtime}.txt"
    if not golden.exists():
        golden.write_text(text)
        pytest.fail(f"created {golden}; review it and commit it")
    expected = golden.read_text()
    diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "rendered", lineterm=""))
    assert text == expected, f"sbatch text changed (delete {golden.name} if this is intended):\n{diff}"


def test_each_runtime_uses_its_documented_options():
    mounts = [Mount("/r", "/r"), Mount("/d", "/data")]
    srun, prefix = task_wrapper("apptainer", "/i.sif", mounts, gpus=True, workdir="/w")
    assert srun == [] and prefix == ["apptainer", "exec", "--nv", "--pwd", "/w", "--bind", "/r,/d:/data", "/i.sif"]
    srun, prefix = task_wrapper("pyxis", "nvcr.io#nvidia/pytorch:24.01-py3", mounts, gpus=True, workdir="/w")
    assert prefix == [] and srun == [
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-workdir=/w",
        "--container-mounts=/r,/d:/data",
    ]  # fmt: skip
    srun, prefix = task_wrapper("podman", "img", mounts, gpus=True, workdir="/w")
    assert srun == [] and prefix[:3] == ["podman", "run", "--rm"] and prefix[-1] == "img"
    for flag in ("--network=host", "--ipc=host", "--pid=host", "--userns=keep-id", "nvidia.com/gpu=all"):
        assert flag in prefix
    assert prefix[prefix.index("--workdir") + 1] == "/w" and "/d:/data" in prefix and "SLURM_*" in prefix
    _, root = task_wrapper("podman", "img", mounts, gpus=False, workdir="/w", as_root=True)
    assert "--userns=keep-id" not in root and "nvidia.com/gpu=all" not in root


def test_dry_run_script_names_no_slurm_command_inside_the_container():
    # the task command runs in the image; the only Slurm command of the script (srun) and the relay are outside
    text = render_sbatch(golden_config("apptainer"), folder=f"{RUN}/logs", python="py", run_dir=RUN)
    setup, command = text.split("# command")
    assert "hpctrain._container relay" in setup and "HPCTRAIN_SLURM_RELAY" in setup
    assert command.count("srun ") == 1 and "scontrol" not in command


def test_mounts_parse_and_the_job_mounts_its_own_paths():
    assert parse_mounts("/a:/b, /c") == [Mount("/a", "/b"), Mount("/c", "/c")]
    assert parse_mounts(["/a/"]) == [Mount("/a", "/a")]
    for bad in ("a:/b", "/a:b", "/a:/b:/c", "/a:"):
        with pytest.raises(UsageError, match="--container-mounts"):
            parse_mounts(bad)
    # a user mount of the same path above the run directory carries it: not mounted twice
    assert job_mounts([Mount("/scratch", "/scratch")], same_path=["/scratch/runs/x", "/home/p"]) == [
        Mount("/home/p", "/home/p"), Mount("/scratch", "/scratch"),
    ]  # fmt: skip


def test_mount_checks(tmp_path):
    run = tmp_path / "run"
    check_mounts([Mount(str(tmp_path), str(tmp_path))], run)  # the usual /scratch:/scratch above the run dir
    with pytest.raises(UsageError, match="does not exist"):
        check_mounts([Mount(str(tmp_path / "nope"), "/data")], run)
    for dst in (str(run), str(run / "ckpt"), str(tmp_path)):
        with pytest.raises(UsageError, match="over the run directory"):
            check_mounts([Mount("/usr", dst)], run)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"container_runtime": "docker"}, "--container-runtime 'docker' must be one of apptainer, pyxis, podman"),
        ({"container_mounts": ["/data"]}, "apply to a container"),
        ({"container": "a\nb"}, "--container"),
        ({"container": "/i.sif", "container_mounts": [5]}, "--container-mounts"),
    ],
)
def test_config_names_the_option(kwargs, match):
    with pytest.raises(UsageError, match=match):
        SubmitConfig(entry="a:b", **kwargs)


def test_toml_keys(tmp_path):
    data = {"job": {"container": "/i.sif", "container_runtime": "pyxis", "container_mounts": "/a:/b,/c"}}
    cfg = SubmitConfig(entry="a:b", **toml_kwargs(data, tmp_path / "hpctrain.toml"))
    assert cfg.container_runtime == "pyxis" and cfg.container_mounts == ["/a:/b", "/c"]


def _submit(*args: str, cwd: Path, path: str = os.environ["PATH"]) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hpctrain.submit", "--cluster", "slurm", "--entry", "hpctrain.examples.demo:main"]
    env = dict(os.environ, PATH=path, PYTHONPATH=str(ROOT))
    return subprocess.run([*argv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--container", "{tmp}/missing.sif", "--container-runtime", "apptainer"], "no such image file"),
        (["--container", "{tmp}/i.sif", "--container-mounts", "{tmp}/nope:/data"], "does not exist"),
        (["--container", "{tmp}/i.sif", "--container-mounts", "/usr:{tmp}/run"], "over the run directory"),
        (["--container", "{tmp}/i.sif", "--container-runtime", "apptainer"], "apptainer is not on PATH"),
        (["--container", "{tmp}/i.sif", "--container-runtime", "pyxis"], "pyxis"),
    ],
)
def test_bad_container_input_is_one_line_exit_2_nothing_written(tmp_path, args, message):
    (tmp_path / "i.sif").write_bytes(b"SIF")
    bindir = tmp_path / "bin"  # a PATH with sbatch/srun (no pyxis) and no apptainer: the checks are real
    bindir.mkdir()
    for name in ("sbatch", "srun", "sinfo"):
        (bindir / name).write_text("#!/bin/sh\necho 'Usage: srun [OPTIONS...] executable'\n")
        (bindir / name).chmod(0o755)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = _submit(*args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path, path=f"{bindir}:/usr/bin:/bin")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_image_record_digests_a_file_image(tmp_path):
    image = tmp_path / "i.sif"
    image.write_bytes(b"image bytes")
    record = _container.image_record("apptainer", str(image), [Mount("/d", "/data")])
    assert record["digest"] == "sha256:" + __import__("hashlib").sha256(b"image bytes").hexdigest()
    assert record["path"] == str(image) and record["mounts"] == ["/d:/data"] and record["runtime"] == "apptainer"
    ref = _container.image_record("pyxis", "nvcr.io#nvidia/pytorch:24.01-py3", [])
    assert ref["kind"] == "reference" and ref["digest"] is None


def _outside_env(tmp_path: Path, scontrol: str) -> tp.Dict[str, str]:
    """The environment outside the container: a fake ``scontrol`` (shell ``scontrol``'s body) first on PATH."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/sh\n{scontrol}\n")
    (fake / "scontrol").chmod(0o755)
    return dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))


def _wait_until_serving(where: Path) -> None:
    deadline = time.monotonic() + 20
    while not (where / "bin" / "scontrol").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_relay_runs_slurm_commands_outside_and_only_them(tmp_path, monkeypatch):
    where = tmp_path / "relay"
    env = _outside_env(tmp_path, 'echo "outside: $*"; exit 3')
    relay = subprocess.Popen([sys.executable, "-m", "hpctrain._container", "relay", str(where)], env=env)
    try:
        _wait_until_serving(where)
        # the node side: no scontrol on PATH, the relay's directory in the environment -> probe puts it first
        environ = {"PATH": "/nonexistent", _container.RELAY_ENV: str(where)}
        line = _container.probe_node(environ)
        assert "Slurm commands run outside" in line and environ["PATH"].startswith(str(where / "bin"))
        inside = dict(environ, PYTHONPATH=str(ROOT), PATH=f"{environ['PATH']}:/usr/bin:/bin")
        out = subprocess.run(["scontrol", "requeue", "42"], env=inside, capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout) == (3, "outside: requeue 42\n")
        box = {}
        threading.Thread(target=lambda: box.update(rc=_container.ask(where, ["rm", "-rf", "/"]))).start()
        deadline = time.monotonic() + 20
        while "rc" not in box and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box["rc"] == 2
        # a requeue or a node failure SIGTERMs the batch script: the relay keeps answering the survivors
        relay.send_signal(signal.SIGTERM)
        out = subprocess.run(["scontrol", "show", "job"], env=inside, capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout) == (3, "outside: show job\n") and relay.poll() is None
    finally:
        relay.kill()  # as Slurm ends it, with the job's other processes
        relay.wait(10)
    assert [json.loads(line)["argv"] for line in (where / "log").read_text().splitlines()] == [
        ["scontrol", "requeue", "42"],
        ["rm", "-rf", "/"],
        ["scontrol", "show", "job"],
    ]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except OSError:
        return True


def test_a_relay_whose_batch_script_ended_answers_for_its_grace_then_exits(tmp_path):
    """Where Slurm tracks a job's processes by parentage (proctrack/linuxproc: the dev cluster's), its SIGKILL misses
    the relay once the batch script is gone; the relay must not live on for ever, deaf to signals."""
    where = tmp_path / "relay"
    env = _outside_env(tmp_path, 'echo "outside: $*"')
    # the batch script: starts the relay in the background (as relay_setup writes it) and ends at once
    relay = f"{shlex.quote(sys.executable)} -m hpctrain._container relay {shlex.quote(str(where))}"
    script = f"{relay} --batch-pid $$ --orphan-grace-s 4 >/dev/null 2>&1 & echo $!"
    pid = int(subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout)
    try:
        _wait_until_serving(where)
        assert _container.ask(where, ["scontrol", "show", "job"], timeout_s=30) == 0  # still answers, orphaned
        assert not _gone(pid)
        deadline = time.monotonic() + 30
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the orphaned relay outlived its grace"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert [json.loads(line)["argv"] for line in (where / "log").read_text().splitlines()] == [
        ["scontrol", "show", "job"]
    ]


def test_each_attempt_has_its_own_relay_directory(tmp_path):
    """A task of attempt 0 whose container outlived its step asks attempt 0's relay (gone), never attempt 1's."""
    script = "\n".join(["set -e", *_container.relay_setup("true", tmp_path), 'echo "$HPCTRAIN_SLURM_RELAY"'])
    seen = [
        subprocess.run(["bash", "-c", script], env=dict(os.environ, SLURM_JOB_ID="7", **extra), capture_output=True,
                       text=True, check=True).stdout.strip()
        for extra in ({}, {"SLURM_RESTART_COUNT": "1"})
    ]  # fmt: skip
    assert seen == [f"{tmp_path}/.slurm-relay/7-r0", f"{tmp_path}/.slurm-relay/7-r1"]


def test_orphan_guard_ends_a_rank_whose_task_process_is_gone(tmp_path):
    """Inside podman a rank is conmon's child: when Slurm kills the task process (podman run), the guard ends it."""
    task = subprocess.Popen(["sleep", "600"])
    code = (
        "import os, sys, time\n"
        "from hpctrain import _container\n"
        f"assert _container.start_orphan_guard({{'SLURM_TASK_PID': '{task.pid}', _container.RELAY_ENV: 'x'}}, 0.05)\n"
        "print('guarded', flush=True)\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert rank.stdout.readline() == "guarded\n"
        time.sleep(0.3)
        assert rank.poll() is None  # the task lives: the rank too
        task.kill()
        task.wait(10)
        assert rank.wait(20) == 137
        assert "Slurm task process" in rank.stderr.read()
    finally:
        for p in (task, rank):
            if p.poll() is None:
                p.kill()
    # nothing to watch outside a container, or without a task pid
    assert _container.start_orphan_guard({"SLURM_TASK_PID": str(task.pid)}) is None
    assert _container.start_orphan_guard({_container.RELAY_ENV: "x"}) is None
