"""``submit --stage``: flag checks on the login node (one line, exit 2, nothing written), the batch script's stage
step (golden file) and its order and failure in a real bash run with a fake srun."""

from __future__ import annotations

import difflib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import render_sbatch
from hpctrain.submit.staging import check_stage
from tests.submit.test_cli import imported_modules, submit

GOLDEN = Path(__file__).with_name("sbatch_golden_stage.txt")
DEMO = ["--entry", "hpctrain.examples.demo:main"]


def test_stage_sbatch_matches_golden_file():
    cfg = SubmitConfig(nodes=2, tasks_per_node=2, spare_nodes=1, job_name="golden", entry="pkg.train:main",
                       stage=["/lustre/proj/train.h5", "/lustre/proj/eval dir"])  # fmt: skip
    text = render_sbatch(cfg, folder="/scratch/runs/golden/logs", python="/opt/venv/bin/python",
                         run_dir="/scratch/runs/golden")  # fmt: skip
    if not GOLDEN.exists():
        GOLDEN.write_text(text)
        pytest.fail(f"created {GOLDEN}; review it and commit it")
    diff = "\n".join(difflib.unified_diff(GOLDEN.read_text().splitlines(), text.splitlines(), lineterm=""))
    assert text == GOLDEN.read_text(), f"sbatch text changed (delete {GOLDEN.name} if intended):\n{diff}"
    # the stage step comes before the spares' srun() function, so it is not run through the restart loop
    assert text.index("hpctrain.data.stage") < text.index("srun() {")


def test_without_stage_the_script_has_no_stage_step():
    assert "hpctrain.data.stage" not in render_sbatch(SubmitConfig(entry="a:b"), folder="/f", python="py", run_dir="/r")


def test_the_stage_step_runs_before_training_and_its_failure_ends_the_script(tmp_path):
    data = tmp_path / "d.h5"
    data.write_bytes(b"x")
    run_dir = tmp_path / "run; touch PWNED"
    cfg = SubmitConfig(entry="a:b", nodes=2, run_dir=str(run_dir), stage=[str(data)], stage_dir="$SLURM_TMPDIR/s")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    srun = bindir / "srun"
    srun.write_text(
        f'#!/bin/bash\necho "$HPCTRAIN_STAGE_RUN_DIR|$*" >> {calls}\n[[ "$*" != *data.stage* ]] || exit "$RC"\n'
    )
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "job.sh").write_text(render_sbatch(cfg, folder=run_dir / "logs", python="py", run_dir=run_dir))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_NUM_NODES="2", RC="0")
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env, check=True, timeout=30)
    first, second = calls.read_text().splitlines()
    assert first == (f"{run_dir}|--ntasks=2 --ntasks-per-node=1 --nodes=2 --kill-on-bad-exit=1 py -m "
                     f"hpctrain.data.stage --run-dir {run_dir} --stage-dir $SLURM_TMPDIR/s -- {data}")  # fmt: skip
    assert "submitit.core._submit" in second and not list(tmp_path.rglob("PWNED"))
    calls.unlink()
    proc = subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env={**env, "RC": "3"}, timeout=30)
    assert proc.returncode == 3 and len(calls.read_text().splitlines()) == 1  # training never started


def test_check_stage_makes_paths_absolute(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "f.h5").write_bytes(b"x")
    cfg = check_stage(SubmitConfig(entry="a:b", stage=["d", "f.h5"]), cwd=str(tmp_path))
    assert cfg.stage == [str(tmp_path / "d"), str(tmp_path / "f.h5")]


@pytest.mark.parametrize(
    "make, args, message",
    [
        (None, ["--stage", "missing.h5"], "--stage missing.h5: No such file or directory"),
        ("fifo", ["--stage", "pipe"], "--stage pipe: not a regular file or a directory"),
        ("file", ["--stage", "f.h5", "--stage-dir", "STAGE/f.h5/sub"], "is not a writable directory"),
        ("file", ["--stage", "f.h5", "--stage-dir", "rel/dir"], "--stage-dir rel/dir: must be absolute"),
        ("file", ["--stage", "f.h5", "f.h5"], "names one path twice"),
        (None, ["--stage-dir", "/tmp"], "--stage-dir says where --stage copies inputs: add --stage PATH"),
        ("file", ["--stage", "f.h5", "--container", "img.sif"], "--stage with --container needs --stage-dir"),
    ],
)
def test_bad_stage_input_is_one_line_exit_2_and_nothing_written(tmp_path, make, args, message):
    if make == "fifo":
        os.mkfifo(tmp_path / "pipe")
    elif make == "file":
        (tmp_path / "f.h5").write_bytes(b"x")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.replace("STAGE", str(tmp_path)) for a in args]
    proc = submit([*DEMO, *args, "--cluster", "slurm", "--dry-run"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain submit: error: ") and message in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_stage_with_sweep_is_refused(tmp_path, monkeypatch):
    from hpctrain.submit import cli

    (tmp_path / "f.h5").write_bytes(b"x")
    (tmp_path / "s.toml").write_text('[train]\nentry = "hpctrain.examples.demo:main"\n[sweep.grid]\n"--lr" = [1, 2]\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="--stage stages the inputs of one run"):
        cli.main(["--sweep", "s.toml", "--stage", "f.h5", "--dry-run"])


def test_dry_run_with_stage_imports_neither_torch_nor_numpy(tmp_path):
    (tmp_path / "f.h5").write_bytes(b"x")
    proc = submit([*DEMO, "--stage", "f.h5", "--cluster", "slurm", "--dry-run"], tmp_path, "-X", "importtime")
    assert proc.returncode == 0, proc.stderr
    mods = imported_modules(proc)
    assert "hpctrain.submit.staging" in mods and "torch" not in mods and "numpy" not in mods
    assert f"-- {tmp_path / 'f.h5'} || exit $?" in proc.stdout


def test_toml_stage_keys(tmp_path):
    from hpctrain.submit.config import load_toml

    (tmp_path / "h.toml").write_text('[job]\nstage = ["/a.h5"]\nstage_dir = "/nvme/s"\n[train]\nentry = "a:b"\n')
    cfg = SubmitConfig(**load_toml(tmp_path / "h.toml"))
    assert cfg.stage == ["/a.h5"] and cfg.stage_dir == "/nvme/s"


def test_the_plain_sbatch_template_stages_too(tmp_path):
    root = Path(__file__).resolve().parents[2]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    srun = bindir / "srun"
    srun.write_text(f'#!/bin/bash\necho "$HPCTRAIN_STAGE_RUN_DIR|$*" >> {calls}\n')
    srun.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NAME="j",
               SLURM_JOB_ID="5", HPCTRAIN_RUN_DIR=str(tmp_path / "run"), HPCTRAIN_PYTHON="py",
               HPCTRAIN_STAGE="/d/a.h5 /d/b")  # fmt: skip
    script = str(root / "sbatch_templates" / "ddp.sbatch")
    subprocess.run(["bash", script], cwd=tmp_path, env=env, check=True, timeout=30)
    stage_call, train_call = calls.read_text().splitlines()
    assert stage_call == (f"{tmp_path / 'run'}|--ntasks=2 --ntasks-per-node=1 --nodes=2 --kill-on-bad-exit=1 py -m "
                          f"hpctrain.data.stage --run-dir {tmp_path / 'run'} -- /d/a.h5 /d/b")  # fmt: skip
    assert "hpctrain.launch" in train_call
    calls.unlink()
    subprocess.run(["bash", script], cwd=tmp_path, env={**env, "HPCTRAIN_STAGE_DIR": "/nvme"}, check=True, timeout=30)
    assert "--stage-dir /nvme -- /d/a.h5" in calls.read_text().splitlines()[0]


def test_a_container_job_mounts_the_stage_dir_at_its_own_path():
    from hpctrain.submit.sbatch import container_mounts

    cfg = SubmitConfig(entry="a:b", container="/img.sif", stage=["/d/a.h5"], stage_dir="/nvme/stage")
    assert "/nvme/stage" in [m.src for m in container_mounts(cfg, "/r", cwd="/c")]
    plain = SubmitConfig(entry="a:b", container="/img.sif")
    assert "/nvme/stage" not in [m.src for m in container_mounts(plain, "/r", cwd="/c")]
