"""The sbatch script, as a pure function of the configuration (golden-file tested).

Submission goes through submitit's ``SlurmExecutor``; :func:`slurm_parameters` is the one mapping
from :class:`SubmitConfig` to its parameters, and :func:`render_sbatch` renders exactly the text the
executor writes for them (submitit's own ``_make_sbatch_string``, the same call it makes), so
``--dry-run`` prints what would really be submitted. Every value is shell-quoted by submitit and
:class:`SubmitConfig` rejects newlines, so hostile names cannot inject commands.
"""

from __future__ import annotations

import os
import shlex
import typing as tp
from pathlib import Path

from hpctrain.submit.config import SubmitConfig

__all__ = [
    "slurm_parameters",
    "render_sbatch",
    "submitit_command",
    "array_parameters",
    "container_mounts",
    "task_python",
]

WCKEY = "hpctrain"


def slurm_parameters(
    cfg: SubmitConfig, *, python: str = "python3", run_dir: tp.Union[str, Path, None] = None
) -> tp.Dict[str, tp.Any]:
    """``SlurmExecutor.update_parameters`` keyword arguments for ``cfg``; ``python`` and ``run_dir`` are used by
    a job with spare nodes only (its batch script runs the training srun through hpctrain.launch.spares)."""
    params: tp.Dict[str, tp.Any] = {
        "job_name": cfg.job_name,
        "nodes": cfg.nodes + cfg.spare_nodes,
        "ntasks_per_node": cfg.ntasks_per_node,
        "time": cfg.time_min,
        "signal_delay_s": cfg.signal_lead_s,
        "wckey": WCKEY,
        # --requeue: Slurm may requeue the job on preemption / node failure (the survive path).
        "additional_parameters": {"requeue": True},
    }
    if cfg.gpus_per_node:
        # --gres=gpu:N works with select/cons_res and cons_tres alike (--gpus-per-node needs cons_tres).
        params["gres"] = f"gpu:{cfg.gpus_per_node}"
    for name in ("cpus_per_task", "partition", "account", "qos", "constraint"):
        value = getattr(cfg, name)
        if value is not None:
            params[name] = value
    if cfg.mem is not None:
        # Passed through unchanged ("16G"): submitit's own `mem` wants float GB and rewrites it.
        params["additional_parameters"]["mem"] = cfg.mem
    if cfg.spare_nodes or cfg.in_job_recovery:
        if run_dir is None:
            raise ValueError("slurm_parameters: a job with spare nodes or in-job recovery needs run_dir")
        # submitit writes one `srun ... python -m submitit.core._submit` line; this shell function puts the
        # in-job restart loop in front of it (the loop runs the real srun binary, sized to cfg.nodes, on healthy
        # nodes; with in-job recovery it also serves the recovery store for each step).
        # a failed node leaves the allocation, not ends it: the spare-node loop restarts on a spare, or (in-job
        # recovery: one step per node) the other nodes' ranks go on in the job
        params["additional_parameters"]["no_kill"] = True
        mode = ["--warm-spares"] if cfg.warm_spares else ["--in-job-recovery"] if cfg.in_job_recovery else []
        loop = [
            shlex.quote(python),
            "-m hpctrain.launch.spares",
            f"--nodes {cfg.nodes} --tasks-per-node {cfg.ntasks_per_node} --spares {cfg.spare_nodes}",
            f"--run-dir {shlex.quote(str(run_dir))}",
        ] + mode
        what = (
            f"{cfg.spare_nodes} spare node(s)"
            if cfg.spare_nodes
            else "in-job recovery (no spare node: the smaller world)"
        )
        params["setup"] = [
            f"# {what}: the srun below runs through hpctrain's in-job restart loop",
            f'srun() {{ {" ".join(loop)} -- srun "$@"; }}',
        ]
    if cfg.stage:
        if run_dir is None:
            raise ValueError("slurm_parameters: a job that stages needs run_dir")
        from hpctrain.submit.staging import stage_setup

        # before the spares' srun() function: the stage step runs once, on every node, not through the loop
        params["setup"] = stage_setup(cfg, python, run_dir) + params.get("setup", [])
    if cfg.container:
        if run_dir is None:
            raise ValueError("slurm_parameters: a container job needs run_dir")
        from hpctrain._container import relay_setup, task_wrapper

        srun_args, _ = task_wrapper(
            cfg.container_runtime, cfg.container, container_mounts(cfg, run_dir), gpus=bool(cfg.gpus_per_node),
            workdir=os.getcwd(),
        )  # fmt: skip
        if srun_args:
            params["srun_args"] = srun_args
        params["setup"] = relay_setup(python, run_dir) + params.get("setup", [])
    return params


def container_mounts(cfg: SubmitConfig, run_dir: tp.Union[str, Path], cwd: tp.Optional[str] = None) -> tp.List[tp.Any]:
    """The container job's mounts: the run directory (its checkpoints, ledger, logs), the submitting directory (the
    entry's code, imported from there as outside), ``[job] code_path``, then ``--container-mounts``."""
    from hpctrain._container import job_mounts, parse_mounts
    from hpctrain.submit.staging import stage_mount

    same = [str(run_dir), cwd or os.getcwd()] + ([cfg.code_path] if cfg.code_path else []) + stage_mount(cfg)
    return job_mounts(parse_mounts(cfg.container_mounts), same_path=same)


def task_python(cfg: SubmitConfig, python: str, *, run_dir: tp.Union[str, Path, None] = None) -> str:
    """What each task's command line starts with: the interpreter, shell-quoted; in a container job, behind the
    runtime's command (apptainer exec / podman run ... IMAGE) and run from inside the image."""
    if not cfg.container:
        return shlex.quote(python)
    from hpctrain._container import task_wrapper

    assert run_dir is not None, "a container job needs run_dir"
    _, prefix = task_wrapper(
        cfg.container_runtime, cfg.container, container_mounts(cfg, run_dir), gpus=bool(cfg.gpus_per_node),
        workdir=os.getcwd(), as_root=os.geteuid() == 0,
    )  # fmt: skip
    return " ".join([*map(shlex.quote, prefix), shlex.quote(cfg.container_python or python)])


def submitit_command(python: str, folder: tp.Union[str, Path]) -> str:
    """The command line submitit runs on every task (``SlurmExecutor._submitit_command_str``); ``python`` as given
    (:func:`task_python` quotes it, and wraps it in a container job)."""
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def render_sbatch(
    cfg: SubmitConfig,
    *,
    folder: tp.Union[str, Path],
    python: str,
    run_dir: tp.Union[str, Path, None] = None,
    array: tp.Optional[tp.Tuple[int, int]] = None,
) -> str:
    """The sbatch script submitit will write for ``cfg`` with logs in ``folder``, run by ``python``
    (``run_dir``: the run directory, needed with spare nodes). ``array``: ``(tasks, parallelism)`` of a sweep's
    job array (``--array=0-<tasks-1>%<parallelism>``, logs ``%A_%a_%t``), as ``SlurmExecutor.submit_array``
    writes it for more than one task."""
    from submitit.slurm.slurm import _make_sbatch_string  # submitit imports no torch; ~0.1 s

    params = slurm_parameters(cfg, python=python, run_dir=run_dir)
    if array is not None and array[0] > 1:
        params.update(array_parameters(*array))
    command = submitit_command(task_python(cfg, python, run_dir=run_dir), folder)
    return str(_make_sbatch_string(command=command, folder=folder, **params))


def array_parameters(tasks: int, parallelism: int) -> tp.Dict[str, int]:
    """submitit's parameters of a job array of ``tasks`` tasks, at most ``parallelism`` running at once: its
    ``map_count`` (set by ``submit_array`` itself) and ``array_parallelism``."""
    return {"map_count": tasks, "array_parallelism": max(1, min(parallelism, tasks))}
