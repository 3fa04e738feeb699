"""One ``srun`` step per training node (in-job recovery on Slurm; docs/preemption.md, "A failed node").

Slurm 22.05 SIGKILLs every task of a step that uses a failed node, so one step over all training nodes leaves no
survivor to recover in the job. With ``--warm-spares`` or ``--in-job-recovery`` the spare-node loop
(:mod:`hpctrain.launch.spares`) therefore starts the training as one step per node (``--nodes=1
--ntasks=<tasks per node> --nodelist=<node>``, each with ``--kill-on-bad-exit=0``): a failed node takes only its
own step, and the tasks on the other nodes keep their processes and recover in the job.

Each task of such a step runs this wrapper first (``python -m hpctrain.launch.node_step --output P --error P --
CMD...``, stdlib only, then ``exec`` of the command, so the task's process is the command's). It

* rewrites the task's ``SLURM_*`` variables to those of one step over every training node
  (:func:`hpctrain.runtime.env.node_step_environ`, the one owner of the offset rule): the global rank, the
  world, the node list whose first host is the rendezvous. submitit's JobEnvironment (its log line, its result
  file ``<job>_<rank>_result.pkl``), :mod:`hpctrain.runtime.env` and the Runner then see the same ranks as under
  one step;
* writes the task's stdout and stderr to the global rank's log files (``P`` with ``%t`` the global rank):
  Slurm fills ``%t`` with the step's own task id, which would put every node's task 0 into rank 0's log. srun's
  own files for the step are named ``node<index>-<task>`` instead; they hold only what the task writes before
  this wrapper has redirected (an interpreter that cannot start), and ``hpctrain logs`` does not list them.
"""

from __future__ import annotations

import os
import sys
import typing as tp

__all__ = ["node_step_argv", "split_srun", "fill_pattern", "main"]

MODULE = "hpctrain.launch.node_step"

# srun options that take their value as the next word in the lines hpctrain writes (submitit's ``--output X --error
# Y``); every other option there is written ``--name=value`` or is a flag
_VALUE_OPTIONS = ("--output", "--error", "--input", "-o", "-e", "-i")
_LOGS = {"--output": "--output", "-o": "--output", "--error": "--error", "-e": "--error"}


def split_srun(args: tp.Sequence[str]) -> tp.Tuple[tp.List[str], tp.List[str]]:
    """``srun``'s arguments (without ``srun``) split into its options and the task's command."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _VALUE_OPTIONS else 1
    return list(args[:i]), list(args[i:])


def node_step_argv(srun: tp.Sequence[str], *, python: str, index: int, host: str, tasks_per_node: int) -> tp.List[str]:
    """The ``srun`` of node ``index``'s step on ``host``: its size first, its own log names for srun, the wrapper
    (with the job's log patterns) in front of the command."""
    options, command = split_srun(srun[1:])
    if not command:
        raise ValueError(f"no command in the training srun {' '.join(srun)!r}")
    kept: tp.List[str] = []
    logs: tp.List[str] = []
    i = 0
    while i < len(options):
        name, value = options[i], None
        if name in _VALUE_OPTIONS:
            value, i = options[i + 1], i + 2
        elif name.split("=", 1)[0] in _LOGS and "=" in name:
            name, value = name.split("=", 1)
            i += 1
        else:
            kept.append(name)
            i += 1
            continue
        if name in _LOGS and "%t" in value:
            logs += [_LOGS[name], value]
            value = value.replace("%t", f"node{index}-%t")
        kept += [name, value]
    head = ["--nodes=1", f"--ntasks={tasks_per_node}", f"--ntasks-per-node={tasks_per_node}", f"--nodelist={host}"]
    return [srun[0], *head, *kept, python, "-m", MODULE, *logs, "--", *command]


def fill_pattern(pattern: str, environ: tp.Mapping[str, str]) -> str:
    """Slurm's file name pattern for this task (``%j``, ``%t`` and the other letters Slurm fills for a task)."""
    values = {
        "j": environ.get("SLURM_JOB_ID", ""),
        "t": environ.get("SLURM_PROCID", ""),
        "A": environ.get("SLURM_ARRAY_JOB_ID", ""),
        "a": environ.get("SLURM_ARRAY_TASK_ID", ""),
        "N": environ.get("SLURMD_NODENAME", ""),
        "n": environ.get("SLURM_NODEID", ""),
        "s": environ.get("SLURM_STEP_ID", ""),
        "u": environ.get("SLURM_JOB_USER", ""),
        "x": environ.get("SLURM_JOB_NAME", ""),
        "%": "%",
    }
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern):
            letter = pattern[i + 1]
            if letter not in values:
                raise ValueError(f"the log file pattern {pattern!r} has %{letter}, which this wrapper cannot fill")
            out.append(values[letter])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _redirect(fd: int, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # the job's --open-mode=append
    os.dup2(target, fd)
    os.close(target)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(f"{MODULE}: error: give the task's command after --", file=sys.stderr, flush=True)
        return 2
    cut = args.index("--")
    options, command = args[:cut], args[cut + 1 :]
    if not command or len(options) % 2 or any(o not in ("--output", "--error") for o in options[::2]):
        print(f"{MODULE}: error: usage: [--output PATTERN] [--error PATTERN] -- CMD...", file=sys.stderr, flush=True)
        return 2
    from hpctrain.runtime.env import node_step_environ

    try:
        environ = node_step_environ(os.environ)
        targets = {name: fill_pattern(value, environ) for name, value in zip(options[::2], options[1::2])}
    except Exception as exc:  # DistEnvError, a pattern it cannot fill: one line, in srun's own log of the step
        print(f"{MODULE}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for name, fd in (("--output", 1), ("--error", 2)):
        if name in targets:
            _redirect(fd, targets[name])
    os.execvpe(command[0], command, environ)
    return 127  # not reached: exec replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
