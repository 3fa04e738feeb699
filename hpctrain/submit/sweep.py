"""``python -m hpctrain.submit --sweep FILE``: the plan (:mod:`hpctrain.sweep.plan`) -> one Slurm job array, a run
directory per task.

Called by :func:`hpctrain.submit.cli.main` once the flags and the sweep file are read and checked: every check
(the task count against ``MaxArraySize``, the partition, the entry) runs before anything is written; then the
sweep directory gets ``sweep.json`` (the whole plan, atomic), each task its run directory, and one
``sbatch --array=0-N%K`` submits them all (:func:`hpctrain.submit.backend.submit_sweep`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing as tp
from pathlib import Path

from hpctrain._cli import print_json
from hpctrain._files import check_path_limits
from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from hpctrain.submit.config import SubmitConfig, format_time
from hpctrain.sweep.plan import SweepPlan, SweepTask, check_array_size, write_plan

__all__ = ["submit_sweep_cli", "task_configs", "task_table_lines", "SCHEMA"]

SCHEMA = "hpctrain.submit.sweep/1"
"""The shape of ``submit --sweep --json``'s object: the array, its parallelism, the task table."""


def task_configs(cfg: SubmitConfig, plan: SweepPlan, sweep_dir: Path) -> tp.List[SubmitConfig]:
    """One SubmitConfig per task: its run directory under ``sweep_dir``, the common entry arguments then its own."""
    out = []
    for task in plan.tasks:
        run_dir = sweep_dir / task.name
        check_path_limits(run_dir, what=f"sweep task {task.index}'s run directory")
        out.append(dataclasses.replace(cfg, run_dir=str(run_dir), entry_args=[*cfg.entry_args, *task.args]))
    return out


def task_table_lines(tasks: tp.Sequence[SweepTask], job_ids: tp.Sequence[str] = ()) -> tp.List[str]:
    """``index  [job id]  run dir name  arguments`` per task, aligned."""
    import shlex

    ids = list(job_ids)
    rows = [
        [str(t.index), *([ids[i]] if ids else []), t.name, " ".join(shlex.quote(a) for a in t.args)]
        for i, t in enumerate(tasks)
    ]
    head = ["task", *(["job"] if ids else []), "run dir", "arguments"]
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head) - 1)]
    return ["  ".join([*(x.ljust(w) for x, w in zip(r, widths)), r[-1]]).rstrip() for r in [head, *rows]]


def _plan_record(
    cfg: SubmitConfig, plan: SweepPlan, sweep_dir: Path, parallelism: int, argv: tp.Sequence[str]
) -> tp.Dict[str, tp.Any]:
    from hpctrain.identity.redact import redact_argv

    source = Path(plan.source)
    try:
        text = source.read_text("utf-8")
    except OSError:
        text = None
    return {
        "sweep_dir": str(sweep_dir),
        "source": str(source.resolve()) if plan.source else None,
        "sweep_toml": text,
        "entry": cfg.entry,
        "common_args": list(cfg.entry_args),
        "config": cfg.to_dict(),
        "argv": redact_argv(argv),
        "max_parallel": parallelism,
        "task_count": len(plan.tasks),
        "state": "planned",
        "array_job_id": None,
        "tasks": [{**t.to_dict(), "run_dir": t.name, "job_id": None} for t in plan.tasks],
    }


def submit_sweep_cli(
    cfg: SubmitConfig,
    ns: argparse.Namespace,
    argv: tp.Sequence[str],
    *,
    sweep_dir: Path,
    cluster: str,
    slurm: tp.Any = None,
    console: tp.Any = None,
) -> int:
    """The ``--sweep`` branch of ``hpctrain.submit``: dry run (the array script and the task table) or submit."""
    from hpctrain._slurm import SlurmCommands
    from hpctrain.submit.sbatch import render_sbatch

    plan: SweepPlan = ns.sweep_plan
    as_json = bool(getattr(ns, "json", False))
    dry_run = bool(getattr(ns, "dry_run", False))
    if getattr(ns, "follow", False):
        raise UsageError(
            "--follow follows one job; a sweep is many: see them with python -m hpctrain runs --sweep SWEEP_DIR"
        )
    if cfg.spare_nodes or cfg.in_job_recovery:
        flag = "--spare-nodes" if cfg.spare_nodes else "--in-job-recovery"
        raise UsageError(f"{flag} is not supported with --sweep (the in-job restart loop runs one run per job)")
    if cluster != "slurm" and not dry_run:
        raise UsageError("--sweep submits a Slurm job array: run it where sbatch is on PATH (--cluster slurm)")
    parallelism = plan.parallelism(getattr(ns, "max_parallel", None))
    if getattr(ns, "max_parallel", None) is not None and ns.max_parallel < 1:
        raise UsageError(f"--max-parallel {ns.max_parallel} must be at least 1")
    configs = task_configs(cfg, plan, sweep_dir)
    if RunDir(sweep_dir).submission.exists() or (sweep_dir / "sweep.json").exists():
        raise UsageError(f"--run-dir {sweep_dir} already holds a submission or a sweep; choose a new directory")
    slurm = slurm or SlurmCommands()
    if cluster == "slurm":
        check_array_size(len(plan.tasks), slurm, source=f"--sweep {plan.source}")
    folder = sweep_dir / "logs"
    array = (len(plan.tasks), parallelism)
    if dry_run:
        script = render_sbatch(cfg, folder=folder, python=sys.executable, run_dir=sweep_dir, array=array)
        tasks = [{**t.to_dict(), "run_dir": str(sweep_dir / t.name)} for t in plan.tasks]
        if as_json:
            summary = {"dry_run": True, "cluster": cluster, "sweep_dir": str(sweep_dir), "max_parallel": parallelism}
            print_json({**summary, "sbatch": script, "tasks": tasks}, schema=SCHEMA)
            return 0
        sys.stdout.write(script)
        print(
            f"# dry run: nothing submitted; a job array of {len(plan.tasks)} task(s), at most {parallelism} at once, "
            f"cluster={cluster}, sweep dir {sweep_dir}",
            file=sys.stderr,
        )
        for line in task_table_lines(plan.tasks):
            print(f"#   {line}", file=sys.stderr)
        return 0
    return _submit(cfg, ns, argv, plan, configs, sweep_dir, parallelism, slurm, as_json, console)


def _submit(
    cfg: SubmitConfig,
    ns: argparse.Namespace,
    argv: tp.Sequence[str],
    plan: SweepPlan,
    configs: tp.Sequence[SubmitConfig],
    sweep_dir: Path,
    parallelism: int,
    slurm: tp.Any,
    as_json: bool,
    console: tp.Any,
) -> int:
    from hpctrain.submit import backend
    from hpctrain.submit.entry import check_entry_imports

    assert cfg.entry is not None
    names, _ = slurm.partitions()
    if cfg.partition is not None and cfg.partition not in names:
        raise UsageError(
            f"--partition {cfg.partition!r} does not exist on this cluster; sinfo lists: {', '.join(names)}"
        )
    check_entry_imports(cfg.entry)
    if cfg.require_clean:
        backend.check_clean(cfg)
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir {sweep_dir}: cannot create it ({exc.strerror or exc})") from None
    full_argv = ["-m", "hpctrain.submit", *argv]
    record = _plan_record(cfg, plan, sweep_dir, parallelism, full_argv)
    write_plan(sweep_dir, record)
    extras = [
        {"sweep": {"dir": str(sweep_dir), "index": t.index, "name": t.name, "params": dict(t.params)}}
        for t in plan.tasks
    ]
    try:
        subs = backend.submit_sweep(
            configs,
            run_dirs=[sweep_dir / t.name for t in plan.tasks],
            sweep_dir=sweep_dir,
            parallelism=parallelism,
            argv=full_argv,
            extras=extras,
        )
    except Exception as exc:
        record.update(state="submission failed", error=str(exc))
        write_plan(sweep_dir, record)
        raise
    array_id = subs[0].job_id.split("_")[0]
    record.update(state="submitted", array_job_id=array_id, submitted_at=subs[0].submitted_at)
    for task, sub in zip(record["tasks"], subs):
        task["job_id"] = sub.job_id
    write_plan(sweep_dir, record)
    ids = [s.job_id for s in subs]
    if as_json:
        summary = {
            "dry_run": False,
            "cluster": "slurm",
            "array_job_id": array_id,
            "sweep_dir": str(sweep_dir),
            "max_parallel": parallelism,
            "tasks": [{**t, "run_dir": str(sweep_dir / t["run_dir"])} for t in record["tasks"]],
        }
        print_json(summary, schema=SCHEMA)
        return 0
    from rich.console import Console
    from rich.markup import escape

    console = console or Console(highlight=False, soft_wrap=True)
    what = f"{cfg.nodes} node(s) × {cfg.ntasks_per_node} task(s)" + (
        f", {cfg.gpus_per_node} GPU(s)/node (nccl)" if cfg.gpus_per_node else ", CPU (gloo)"
    )
    console.print(
        f"[bold green]Submitted job array {array_id}[/] ({escape(cfg.job_name)}) to Slurm: {len(subs)} task(s), "
        f"at most {parallelism} at once; each {what}, limit {format_time(cfg.time_min * 60)}"
    )
    console.print(f"  sweep dir : {escape(str(sweep_dir))}  (plan: sweep.json; a run directory per task)")
    for line in task_table_lines(plan.tasks, ids):
        console.print(f"    {escape(line)}")
    console.print(f"  table     : python -m hpctrain runs --sweep {escape(str(sweep_dir))}")
    console.print(f"  cancel    : scancel {array_id}   (one task: scancel {array_id}_<task>)")
    return 0
