"""Sweeps as one Slurm job array: a sweep file -> a task table (``plan``), one run directory per task, the
sweep's table (``table``) and report. Torch-free (docs/sweeps.md)."""

from hpctrain.sweep.plan import SweepPlan, SweepTask, load_sweep, parse_sweep, task_name

__all__ = ["SweepPlan", "SweepTask", "load_sweep", "parse_sweep", "task_name"]
