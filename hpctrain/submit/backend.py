"""Hand a :class:`SubmitConfig` to submitit: Slurm (``SlurmExecutor``) or this machine (``LocalExecutor``).

A submission creates the run directory (:class:`hpctrain.rundir.RunDir` owns its layout) and writes
``submission.json`` (resolved config, argv, cwd, cluster, job id, paths; atomic), ``sbatch.sh`` (Slurm
runs) and submitit's ``logs/`` folder. :class:`~hpctrain.launch.Runner` is the one hand-off from this
login side to the node side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain._atomic import atomic_write_json, atomic_write_text
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.launch.runner import Runner
from hpctrain.launch.settings import RunnerSettings
from hpctrain.rundir import RunDir
from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import slurm_parameters

__all__ = ["Submission", "default_run_dir", "prepare_run_dir", "submit", "check_clean"]


@dataclass
class Submission:
    job: tp.Any
    """The submitit Job (``job.job_id``, ``job.paths``, ``job.results()``)."""
    job_id: str
    run_dir: Path
    cluster: str
    submitted_at: float

    def log_path(self, rank: int = 0, stream: str = "out") -> Path:
        return RunDir(self.run_dir).log_file(self.job_id, rank, stream)


def default_run_dir(cfg: SubmitConfig, cwd: tp.Optional[Path] = None, now: tp.Optional[float] = None) -> Path:
    """``runs/<job-name>-<YYYYmmdd-HHMMSS>`` (a ``-N`` suffix when that exists already)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cfg.job_name)
    base = (cwd or Path.cwd()) / "runs" / f"{safe}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def prepare_run_dir(run_dir: Path, *, resume: bool = False, slurm: tp.Any = None) -> None:
    """Create the run directory; refuse one that already holds a submission (never overwrite a run), unless
    ``resume``: then its job must have ended, and its submission record is kept as
    :meth:`RunDir.previous_submission` before the new one is written."""
    paths = RunDir(run_dir)
    try:
        if resume:
            _archive_ended_submission(paths, slurm)
        elif paths.submission.exists():
            raise UsageError(
                f"--run-dir {run_dir} already holds a submission; choose a new directory, or continue that run "
                f"with --resume {run_dir}"
            )
        if run_dir.exists() and not run_dir.is_dir():
            raise UsageError(f"--run-dir {run_dir} exists and is not a directory")
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir {run_dir}: cannot create it ({exc.strerror or exc})") from None


def _archive_ended_submission(paths: RunDir, slurm: tp.Any) -> None:
    """Move the ended job's ``submission.json`` aside (``submissions/<n>.json``); refuse a job still running."""
    from hpctrain._procs import pid_alive
    from hpctrain.rundir import read_json

    old = read_json(paths.submission, [])
    if old is None:
        raise UsageError(f"--resume {paths.root}: no readable {RunDir.SUBMISSION}; name a run directory to continue")
    job_id = str(old.get("job_id") or "")
    if old.get("cluster") == "slurm" and job_id:
        from hpctrain._slurm import SlurmCommands

        state = (slurm or SlurmCommands()).job_state(job_id)
        if state.source == "squeue":
            raise UsageError(f"--resume {paths.root}: job {job_id} is still {state.state}; wait for it or scancel it")
    elif old.get("cluster") == "local" and job_id.isdigit() and old.get("host") in (None, socket.gethostname()):
        if pid_alive(int(job_id)):
            raise UsageError(f"--resume {paths.root}: its local job (pid {job_id}) still runs; stop it first")
    n = 0
    while paths.previous_submission(n).exists():
        n += 1
    paths.previous_submission(n).parent.mkdir(parents=True, exist_ok=True)
    os.replace(paths.submission, paths.previous_submission(n))


@contextlib.contextmanager
def _terminal_interrupts_ignored(active: bool) -> tp.Iterator[None]:
    """Start a local job's processes with SIGINT ignored, so that a Ctrl-C in this terminal never kills
    submitit's local controller (which would SIGKILL the ranks mid-save). The ranks install their own
    handler (:class:`~hpctrain.runtime.preemption.StopSignals`): a Ctrl-C reaches them as a clean stop."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited across fork and exec
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _runner(cfg: SubmitConfig, run_dir: Path) -> Runner:
    assert cfg.entry is not None
    settings = RunnerSettings.from_config(cfg)  # every setting by its name: nothing here lists them
    return Runner(entry=cfg.entry, run_dir=str(run_dir), entry_args=cfg.entry_args, settings=settings)


def check_clean(cfg: SubmitConfig) -> None:
    """``--require-clean``: one UsageError line naming the dirty files of the entry's (or hpctrain's) git tree."""
    from hpctrain.identity.code import capture_code
    from hpctrain.identity.manifest import require_clean

    require_clean(capture_code(cfg.entry))


def _capture_identity(cfg: SubmitConfig, run_dir: Path, argv: tp.Sequence[str]) -> tp.Dict[str, tp.Any]:
    """The submit-time identity manifest (hpctrain.identity); what submission.json says about it. A dirty tree
    under --require-clean stops the submission; any other failure to capture is a warning, never a lost job."""
    from hpctrain.identity import capture_submit

    started = time.perf_counter()
    try:
        manifest = capture_submit(cfg, argv, run_dir)
    except UsageError:
        raise
    except Exception as exc:
        print(f"hpctrain submit: warning: run identity not captured: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}", "capture_s": round(time.perf_counter() - started, 4)}
    return {
        "path": os.path.relpath(manifest["path"], run_dir),
        "identity": manifest["identity"],
        "written": manifest["written"],
        "differs_from_first": manifest.get("differs_from_first"),
        "capture_s": round(time.perf_counter() - started, 4),
    }


def _recorded_argv(argv: tp.Sequence[str]) -> tp.List[str]:
    from hpctrain.identity.redact import redact_argv

    return redact_argv(argv)


def submit(cfg: SubmitConfig, *, run_dir: Path, cluster: str, argv: tp.Sequence[str]) -> Submission:
    """Submit ``cfg`` to ``cluster`` ('slurm' or 'local'); writes the run records; returns the job."""
    import submitit

    paths = RunDir(run_dir)
    folder = paths.logs
    identity = _capture_identity(cfg, run_dir, argv)
    record: tp.Dict[str, tp.Any] = {
        "hpctrain_version": __version__,
        "config": cfg.to_dict(),
        "argv": _recorded_argv(argv),  # a --token VALUE typed at submit is never recorded (docs/bundle.md)
        "cwd": os.getcwd(),
        "python": sys.executable,
        "cluster": cluster,
        "world_size": cfg.world_size,
        "run_dir": str(run_dir),
        "log_dir": str(folder),
        "host": socket.gethostname(),
        "state": "submitting",
        "identity": identity,
    }
    atomic_write_json(paths.submission, record)
    runner = _runner(cfg, run_dir)
    if cluster == "slurm":
        # The Runner replaces submitit's signal handlers and requeues by itself (hpctrain.launch.ending);
        # submitit's timeout counter is never used, the bound is cfg.max_requeues against SLURM_RESTART_COUNT.
        executor: tp.Any = submitit.SlurmExecutor(folder=folder, max_num_timeout=cfg.max_requeues)
        executor.update_parameters(**slurm_parameters(cfg, python=executor.python, run_dir=run_dir))
    else:
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=cfg.max_requeues)
        # One node, the same number of processes as the Slurm job would start.
        executor.update_parameters(
            timeout_min=cfg.time_min,
            tasks_per_node=cfg.world_size,
            nodes=1,
            signal_delay_s=cfg.signal_lead_s,
            gpus_per_node=cfg.gpus_per_node,
        )
    try:
        with _terminal_interrupts_ignored(cluster == "local"):
            job = executor.submit(runner)
    except Exception as exc:  # submitit raises FailedSubmissionError / CalledProcessError with sbatch's text
        record["state"] = "submission failed"
        record["error"] = str(exc)
        atomic_write_json(paths.submission, record)
        text = str(exc).strip().splitlines()
        raise HpctrainError(f"submission failed: {text[-1] if text else type(exc).__name__}") from exc
    submitted_at = time.time()
    record.update(state="submitted", job_id=str(job.job_id), submitted_at=submitted_at)
    if cluster == "slurm":
        script = Path(job.paths.submission_file).read_text()
        atomic_write_text(paths.sbatch_script, script)
        record["sbatch_script"] = str(paths.sbatch_script)
    record["logs"] = {
        "stdout": str(job.paths.stdout).replace("%t", "<rank>"),
        "stderr": str(job.paths.stderr).replace("%t", "<rank>"),
    }
    atomic_write_json(paths.submission, record)
    return Submission(job=job, job_id=str(job.job_id), run_dir=run_dir, cluster=cluster, submitted_at=submitted_at)
