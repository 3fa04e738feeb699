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
from hpctrain.submit.sbatch import slurm_parameters, task_python

__all__ = [
    "Submission",
    "default_run_dir",
    "prepare_run_dir",
    "prepare_task_dir",
    "submit",
    "submit_sweep",
    "check_clean",
]


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
        manifest = capture_submit(cfg, argv, run_dir, container=_container_record(cfg, run_dir))
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


def _container_record(cfg: SubmitConfig, run_dir: Path) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The identity's ``container``: the image and its digest, the runtime and its version, the mounts."""
    if not cfg.container:
        return None
    from hpctrain._container import image_record
    from hpctrain.submit.sbatch import container_mounts

    return image_record(cfg.container_runtime, cfg.container, container_mounts(cfg, run_dir))


def _recorded_argv(argv: tp.Sequence[str]) -> tp.List[str]:
    from hpctrain.identity.redact import redact_argv

    return redact_argv(argv)


def _submission_record(
    cfg: SubmitConfig,
    run_dir: Path,
    *,
    cluster: str,
    argv: tp.Sequence[str],
    folder: Path,
    extra: tp.Optional[tp.Mapping[str, tp.Any]] = None,
) -> tp.Dict[str, tp.Any]:
    """Capture the run's identity and write its ``submission.json`` in state ``submitting``; returns the record."""
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
        **(extra or {}),
    }
    atomic_write_json(RunDir(run_dir).submission, record)
    return record


def _executor(cfg: SubmitConfig, folder: Path, *, cluster: str, run_dir: Path) -> tp.Any:
    import submitit

    if cluster == "slurm":
        # The Runner replaces submitit's signal handlers and requeues by itself (hpctrain.launch.ending);
        # submitit's timeout counter is never used, the bound is cfg.max_requeues against SLURM_RESTART_COUNT.
        executor: tp.Any = submitit.SlurmExecutor(folder=folder, max_num_timeout=cfg.max_requeues)
        host_python = executor.python  # the batch script's (outside any container): spares loop, Slurm relay
        executor.update_parameters(**slurm_parameters(cfg, python=host_python, run_dir=run_dir))
        if cfg.container:
            # submitit joins `python` into each task's command unquoted: the runtime's command goes in front
            executor.python = task_python(cfg, sys.executable, run_dir=run_dir)
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
    return executor


def _submission_failed(records: tp.Sequence[tp.Tuple[RunDir, tp.Dict[str, tp.Any]]], exc: Exception) -> HpctrainError:
    """Record the failure in every run's ``submission.json``; the one-line error to raise."""
    for paths, record in records:
        record["state"] = "submission failed"
        record["error"] = str(exc)
        atomic_write_json(paths.submission, record)
    text = str(exc).strip().splitlines()
    return HpctrainError(f"submission failed: {text[-1] if text else type(exc).__name__}")


def _record_submitted(
    paths: RunDir, record: tp.Dict[str, tp.Any], job: tp.Any, *, submitted_at: float, script: tp.Optional[str]
) -> None:
    """``submission.json`` once sbatch answered: the job id, the script given to sbatch, the log paths."""
    record.update(state="submitted", job_id=str(job.job_id), submitted_at=submitted_at)
    if script is not None:
        atomic_write_text(paths.sbatch_script, script)
        record["sbatch_script"] = str(paths.sbatch_script)
    record["logs"] = {
        "stdout": str(job.paths.stdout).replace("%t", "<rank>"),
        "stderr": str(job.paths.stderr).replace("%t", "<rank>"),
    }
    atomic_write_json(paths.submission, record)


def submit(cfg: SubmitConfig, *, run_dir: Path, cluster: str, argv: tp.Sequence[str]) -> Submission:
    """Submit ``cfg`` to ``cluster`` ('slurm' or 'local'); writes the run records; returns the job."""
    paths = RunDir(run_dir)
    folder = paths.logs
    record = _submission_record(cfg, run_dir, cluster=cluster, argv=argv, folder=folder)
    runner = _runner(cfg, run_dir)
    executor = _executor(cfg, folder, cluster=cluster, run_dir=run_dir)
    try:
        with _terminal_interrupts_ignored(cluster == "local"):
            job = executor.submit(runner)
    except Exception as exc:  # submitit raises FailedSubmissionError / CalledProcessError with sbatch's text
        raise _submission_failed([(paths, record)], exc) from exc
    submitted_at = time.time()
    script = Path(job.paths.submission_file).read_text() if cluster == "slurm" else None
    _record_submitted(paths, record, job, submitted_at=submitted_at, script=script)
    from hpctrain.registry import record_run  # the user's run list (`runs`); a failed write is one warning

    kind = "reproduce" if paths.reproduced_code.exists() else "submit"
    record_run(run_dir, job.job_id, name=cfg.job_name, cluster=cluster, kind=kind, submitted_at=submitted_at)
    return Submission(job=job, job_id=str(job.job_id), run_dir=run_dir, cluster=cluster, submitted_at=submitted_at)


def prepare_task_dir(run_dir: Path, logs: Path) -> None:
    """A sweep task's run directory: created empty (one that holds a submission is refused); its ``logs`` is a
    relative link to the sweep's one submitit folder, where Slurm writes every task's ``A_T_<rank>_log.*`` (a
    job array has one output pattern), so :meth:`RunDir.log_file` of the task's job id finds its own logs."""
    paths = RunDir(run_dir)
    try:
        if paths.submission.exists():
            raise UsageError(f"{run_dir} already holds a submission; choose a new --run-dir for the sweep")
        run_dir.mkdir(parents=True, exist_ok=True)
        if not paths.logs.is_symlink():
            if paths.logs.exists():
                raise UsageError(f"{paths.logs} exists; choose a new --run-dir for the sweep")
            paths.logs.symlink_to(os.path.relpath(logs, run_dir), target_is_directory=True)
    except OSError as exc:
        raise UsageError(f"--run-dir {run_dir}: cannot create it ({exc.strerror or exc})") from None


def submit_sweep(
    cfgs: tp.Sequence[SubmitConfig],
    *,
    run_dirs: tp.Sequence[Path],
    sweep_dir: Path,
    parallelism: int,
    argv: tp.Sequence[str],
    extras: tp.Sequence[tp.Mapping[str, tp.Any]] = (),
) -> tp.List[Submission]:
    """Submit one Slurm job array, a task per config (``cfgs[i]`` runs as ``SLURM_ARRAY_TASK_ID`` i in
    ``run_dirs[i]``, with its own Runner, submission record, identity, ledger and checkpoints); at most
    ``parallelism`` tasks run at once. The job settings of ``cfgs[0]`` are the array's (one sbatch script);
    the others differ in their run directory, entry arguments and the Runner's settings only."""
    folder = sweep_dir / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i, (cfg, run_dir) in enumerate(zip(cfgs, run_dirs)):
        prepare_task_dir(run_dir, folder)
        extra = extras[i] if i < len(extras) else {}
        records.append(
            (RunDir(run_dir), _submission_record(cfg, run_dir, cluster="slurm", argv=argv, folder=folder, extra=extra))
        )
    runners = [_runner(cfg, run_dir) for cfg, run_dir in zip(cfgs, run_dirs)]
    executor = _executor(cfgs[0], folder, cluster="slurm", run_dir=sweep_dir)
    executor.update_parameters(array_parallelism=max(1, min(parallelism, len(cfgs))))
    try:
        jobs = executor.submit_array(runners)  # one sbatch --array=0-N%K; job i is "<array id>_i"
    except Exception as exc:
        raise _submission_failed(records, exc) from exc
    submitted_at = time.time()
    array_id = str(jobs[0].job_id).split("_")[0]
    script_file = submitit_paths(folder, array_id).submission_file
    script = Path(script_file).read_text() if Path(script_file).exists() else None
    if script is not None:
        atomic_write_text(RunDir(sweep_dir).sbatch_script, script)  # the array's one script, also in each task's dir
    from hpctrain.registry import record_run  # each task is one run of the user's list (`runs`)

    out = []
    for (paths, record), job, run_dir, cfg in zip(records, jobs, run_dirs, cfgs):
        _record_submitted(paths, record, job, submitted_at=submitted_at, script=script)
        record_run(
            run_dir,
            job.job_id,
            name=cfg.job_name,
            cluster="slurm",
            kind="sweep-task",
            sweep=sweep_dir,
            submitted_at=submitted_at,
        )
        out.append(
            Submission(job=job, job_id=str(job.job_id), run_dir=run_dir, cluster="slurm", submitted_at=submitted_at)
        )
    return out


def submitit_paths(folder: Path, job_id: str) -> tp.Any:
    """submitit's file names of ``job_id`` in ``folder`` (``submission_file``, ``stdout``, the pickles)."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id)
