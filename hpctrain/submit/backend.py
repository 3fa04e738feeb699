"""Hand a :class:`SubmitConfig` to submitit: Slurm (``SlurmExecutor``) or this machine (``LocalExecutor``).

A submission creates the run directory (:class:`hpctrain.rundir.RunDir` owns its layout) and writes
``submission.json`` (resolved config, argv, cwd, cluster, job id, paths; atomic), ``sbatch.sh`` (Slurm
runs) and submitit's ``logs/`` folder. :class:`~hpctrain.launch.Runner` is the one hand-off from this
login side to the node side.
"""

from __future__ import annotations

import os
import sys
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain._atomic import atomic_write_json, atomic_write_text
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.launch.runner import Runner
from hpctrain.rundir import RunDir
from hpctrain.submit.config import SubmitConfig
from hpctrain.submit.sbatch import slurm_parameters

__all__ = ["Submission", "default_run_dir", "prepare_run_dir", "submit"]


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


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run directory; refuse one that already holds a submission (never overwrite a run)."""
    try:
        if RunDir(run_dir).submission.exists():
            raise UsageError(f"--run-dir {run_dir} already holds a submission; choose a new directory")
        if run_dir.exists() and not run_dir.is_dir():
            raise UsageError(f"--run-dir {run_dir} exists and is not a directory")
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir {run_dir}: cannot create it ({exc.strerror or exc})") from None


def _runner(cfg: SubmitConfig, run_dir: Path) -> Runner:
    assert cfg.entry is not None
    return Runner(
        entry=cfg.entry,
        run_dir=str(run_dir),
        entry_args=cfg.entry_args,
        gpus_per_node=cfg.gpus_per_node,
        dist_timeout_s=cfg.dist_timeout,
        max_requeues=cfg.max_requeues,
        signal_lead_s=cfg.signal_lead_s,
        time_limit_s=cfg.time_min * 60,
    )


def submit(cfg: SubmitConfig, *, run_dir: Path, cluster: str, argv: tp.Sequence[str]) -> Submission:
    """Submit ``cfg`` to ``cluster`` ('slurm' or 'local'); writes the run records; returns the job."""
    import submitit

    paths = RunDir(run_dir)
    folder = paths.logs
    record: tp.Dict[str, tp.Any] = {
        "hpctrain_version": __version__,
        "config": cfg.to_dict(),
        "argv": list(argv),
        "cwd": os.getcwd(),
        "python": sys.executable,
        "cluster": cluster,
        "world_size": cfg.world_size,
        "run_dir": str(run_dir),
        "log_dir": str(folder),
        "state": "submitting",
    }
    atomic_write_json(paths.submission, record)
    runner = _runner(cfg, run_dir)
    if cluster == "slurm":
        # The Runner replaces submitit's signal handlers and requeues by itself (hpctrain.launch.ending);
        # submitit's timeout counter is never used, the bound is cfg.max_requeues against SLURM_RESTART_COUNT.
        executor: tp.Any = submitit.SlurmExecutor(folder=folder, max_num_timeout=cfg.max_requeues)
        executor.update_parameters(**slurm_parameters(cfg))
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
