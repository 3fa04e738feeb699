"""``submit --stage``, the login-node side (stdlib only): check the inputs and the stage directory before anything is
written, and the batch-script step that stages on every node (:mod:`hpctrain.data.stage` is the node side).

The step is a setup line of the batch script, before the training srun, so it runs at the start of every attempt
(a requeue runs the script again) in submitit's jobs and in a template's alike, one task per node on every node of
the allocation (spares included), outside any container: it needs the host's view of the inputs, as the Slurm relay
does. A failed stage step ends the batch script with its exit code: training never starts on unverified data.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
import typing as tp
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.defaults import DEFAULT_STAGE_DIR
from hpctrain.errors import UsageError
from hpctrain.rundir import STAGE_ENV

__all__ = ["check_stage", "stage_setup", "stage_mount"]


def check_stage(cfg: tp.Any, *, cwd: tp.Optional[str] = None) -> tp.Any:
    """``cfg`` with its ``--stage`` paths made absolute, after checking them on this node: each exists and is a
    regular file or a directory of them, and ``--stage-dir`` (when it names no variable the node expands) is an
    absolute path whose nearest existing folder this user may write. One UsageError line each."""
    if not cfg.stage:
        return cfg
    cwd = cwd or os.getcwd()
    paths: tp.List[str] = []
    for given in cfg.stage:
        path = os.path.abspath(os.path.join(cwd, os.path.expanduser(given)))
        try:
            st = os.stat(path)
        except OSError as exc:
            raise UsageError(
                f"--stage {shorten(given)}: {exc.strerror or exc}; give an input file or directory that exists"
            ) from None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise UsageError(f"--stage {shorten(given)}: not a regular file or a directory; stage input files only")
        if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
            raise UsageError(f"--stage {shorten(given)}: not readable by this user; fix its permissions")
        paths.append(path)
    if len(set(paths)) != len(paths):
        raise UsageError("--stage names one path twice; give each input once")
    stage_dir = cfg.stage_dir
    if stage_dir is not None and "$" not in stage_dir:
        if not os.path.isabs(stage_dir):
            raise UsageError(f"--stage-dir {shorten(stage_dir)}: must be absolute (it is resolved on every node)")
        here = Path(stage_dir)
        while not here.exists() and here != here.parent:
            here = here.parent
        # os.access says yes to root everywhere: a read-only mount is what stops root
        if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK) or os.statvfs(here).f_flag & os.ST_RDONLY:
            raise UsageError(
                f"--stage-dir {shorten(stage_dir)}: {here} is not a writable directory; give a node-local directory "
                "this user can write (default $SLURM_TMPDIR, $TMPDIR or /tmp on the node)"
            )
    if cfg.container and (stage_dir is None or "$" in stage_dir):
        raise UsageError(
            "--stage with --container needs --stage-dir as an absolute path without variables: it is mounted into "
            "the image at its own path"
        )
    return dataclasses.replace(cfg, stage=paths)


def stage_mount(cfg: tp.Any) -> tp.List[str]:
    """The stage directory, mounted at its own path into a container job (the loader inside reads the copies)."""
    return [cfg.stage_dir] if cfg.stage and cfg.container and cfg.stage_dir else []


def stage_setup(cfg: tp.Any, python: str, run_dir: tp.Union[str, Path]) -> tp.List[str]:
    """The batch script's lines that stage ``cfg.stage`` on every node before the training step (none without)."""
    if not cfg.stage:
        return []
    run = shlex.quote(str(run_dir))
    step = " ".join(
        [
            # --ntasks too: srun reads the job's SLURM_NTASKS and would ignore --ntasks-per-node=1 against it
            'srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --nodes="$SLURM_JOB_NUM_NODES"',
            "--kill-on-bad-exit=1",
            shlex.quote(python),
            "-m hpctrain.data.stage --run-dir",
            run,
            "--stage-dir",
            shlex.quote(cfg.stage_dir or DEFAULT_STAGE_DIR),  # quoted: expanded by each node, not by this shell
            "--",
            *map(shlex.quote, cfg.stage),
        ]
    )
    return [
        "# node-local staging: one task per node copies (or reuses) the verified inputs (docs/data.md)",
        f"export {STAGE_ENV}={run}",
        f"{step} || exit $?",
    ]
