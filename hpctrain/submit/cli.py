"""``python -m hpctrain.submit``: submit a multi-node DDP training job from a login node.

Runs on the login node: imports no torch (the entry is checked statically, then imported in a
child interpreter before a real submission), and ``--help``/``--dry-run`` return in a fraction of a
second. Bad input exits 2 with one line naming the flag, and nothing is submitted or written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._cli import ArgumentParser, add_json_flag, console_entry, print_json
from hpctrain._files import check_path_limits, shorten
from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S, DEFAULT_MAX_REQUEUES
from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from hpctrain.submit.config import DEFAULT_CONFIG_FILE, SubmitConfig, format_time, load_toml

__all__ = ["main", "build_parser", "resolve_config", "local_process_limit", "wait_for_reason", "SCHEMA"]

SCHEMA = "hpctrain.submit/1"
"""The shape of ``submit --json``'s object: the job, where it runs, its state (and, followed, how it ended)."""

# squeue reasons meaning the request exceeds what the partition/cluster can ever give.
NEVER_STARTS = frozenset(
    {
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "AssocMaxNodesPerJobLimit",
        "QOSMaxNodePerJobLimit",
    }
)

EPILOG = """\
examples:
  python -m hpctrain.submit --nodes 8 --gpus-per-node 4 --time 12:00:00 --entry mypkg.train:main -- --lr 3e-4
  python -m hpctrain.submit --nodes 2 --dry-run            # print the sbatch script, submit nothing
  python -m hpctrain.submit --cluster local --entry hpctrain.examples.demo:main --follow

An ./hpctrain.toml ([job] keys = these flags with underscores, [train] entry/args, [run]
owner/team/notes/require_clean) is read when present; flags given here override it.
"""


def _integer(text: str) -> int:
    """argparse type for counts: a short error for junk and for absurdly long numbers (int() refuses
    more than 4300 digits with a message that quotes them all)."""
    text = text.strip()
    if len(text) > 12 or not text.lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"{shorten(repr(text))} is not a whole number (at most 12 digits)")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    # One parser for `python -m hpctrain submit` and `python -m hpctrain.submit`: errors raise UsageError.
    p = ArgumentParser(
        prog="python -m hpctrain.submit",
        description="Submit a multi-node PyTorch DDP training job to Slurm (through submitit), or run it locally.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only flags actually given override the TOML
    )
    r = p.add_argument_group("resources")
    r.add_argument("--nodes", type=_integer, metavar="N", help="number of nodes (default 1)")
    r.add_argument(
        "--gpus-per-node", type=_integer, metavar="G", help="GPUs per node; 0 = CPU job with gloo (default 0)"
    )
    r.add_argument(
        "--tasks-per-node", type=_integer, metavar="T", help="processes per node (default: one per GPU, 1 on CPU)"
    )
    r.add_argument("--cpus-per-task", type=_integer, metavar="C", help="CPU cores per process")
    r.add_argument("--mem", metavar="SIZE", help="memory per node, Slurm units (16G, 4000M)")
    r.add_argument("--time", metavar="LIMIT", help="time limit: MM, HH:MM:SS or D-HH:MM:SS (default 01:00:00)")
    s = p.add_argument_group("scheduling")
    s.add_argument("--partition", metavar="NAME", help="Slurm partition (default: the cluster's default)")
    s.add_argument("--account", metavar="NAME", help="Slurm account")
    s.add_argument("--qos", metavar="NAME", help="Slurm QOS")
    s.add_argument("--constraint", metavar="FEATURES", help="Slurm node features")
    s.add_argument("--job-name", metavar="NAME", help="job name (default hpctrain)")
    s.add_argument(
        "--signal-lead",
        type=_integer,
        metavar="SECONDS",
        help="warn tasks (USR2) this long before the limit (default 120)",
    )
    s.add_argument(
        "--max-requeues",
        type=_integer,
        metavar="N",
        help=f"requeues after a time limit, preemption or rank/node failure (default {DEFAULT_MAX_REQUEUES}), "
        "counted by hpctrain with SLURM_RESTART_COUNT; a time limit or failure whose attempt committed no new "
        "checkpoint step is not requeued (docs/preemption.md)",
    )
    s.add_argument(
        "--spare-nodes",
        type=_integer,
        metavar="K",
        help="allocate K extra nodes; when a node fails or hangs, restart inside the allocation on a spare instead "
        "of requeueing, up to K times (default 0; docs/preemption.md)",
    )
    s.add_argument(
        "--warm-spares",
        action="store_true",
        help="with --spare-nodes: run warm spare processes on the spare nodes and serve in-job recovery's store, "
        "so that a dead rank's process is replaced inside the step (TrainConfig.recovery; docs/preemption.md)",
    )
    s.add_argument(
        "--in-job-recovery",
        action="store_true",
        help="serve in-job recovery's store and keep the step running when a task dies, without spare nodes: the "
        "survivors go on at a smaller world (RecoveryConfig(shrink=True)) or fall back to the restart",
    )
    s.add_argument("--cluster", choices=("auto", "slurm", "local"), help="auto: Slurm when sbatch is on PATH (default)")
    c = p.add_argument_group("container (docs/submit.md, Containers)")
    c.add_argument(
        "--container",
        metavar="IMAGE",
        help="run every task inside IMAGE (.sif file, pyxis squashfs/reference, podman image); Slurm commands stay "
        "outside it",
    )
    c.add_argument(
        "--container-runtime", choices=("apptainer", "pyxis", "podman"), help="how to run IMAGE (default apptainer)"
    )
    c.add_argument(
        "--container-mounts",
        metavar="SRC:DST[,...]",
        help="more bind mounts (data, an outside checkpoint directory); the run directory and this directory are "
        "mounted at their own paths always",
    )
    s.add_argument(
        "--dist-timeout",
        type=_integer,
        metavar="SECONDS",
        help=f"rendezvous timeout per rank (default {DEFAULT_DIST_TIMEOUT_S})",
    )
    s.add_argument(
        "--hang-timeout",
        type=_integer,
        metavar="SECONDS",
        help="no progress on a rank this long ends the attempt as a hang: stacks dumped, hung rank and host "
        "named, requeued when a new step was committed (default max(10 x step time, 5 min))",
    )
    s.add_argument(
        "--exclude-stragglers",
        action="store_true",
        help="leave the host of a straggler rank out of the next requeue (hung ranks' hosts are left out always)",
    )
    d = p.add_argument_group("node-local staging (docs/data.md)")
    d.add_argument(
        "--stage",
        nargs="+",
        metavar="PATH",
        help="copy these input files/directories to node-local storage at the start of every attempt (one reader per "
        "node, verified against the data fingerprint; a requeue reuses a verified copy); the loader reads the copies",
    )
    d.add_argument("--stage-dir", metavar="DIR", help="node-local directory, expanded on the node (default "
                   "$SLURM_TMPDIR, else $TMPDIR, else /tmp)")  # fmt: skip
    t = p.add_argument_group("training")
    t.add_argument("--entry", metavar="MODULE:FUNCTION", help="function called as FUNCTION(ctx) on every task")
    t.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<job-name>-<timestamp>)")
    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run that ended and was not requeued (a local run, Ctrl-C, --max-requeues used up) in "
        "its own run directory, with its submitted settings (flags given here override them)",
    )
    t.add_argument("--config", metavar="FILE", help=f"TOML file (default ./{DEFAULT_CONFIG_FILE} if present)")
    t.add_argument(
        "--sweep",
        metavar="FILE",
        help="submit a sweep: one Slurm job array, a task per combination of the file's [sweep.grid] (and per "
        "[[sweep.tasks]] table), each in its own run directory under --run-dir (docs/sweeps.md)",
    )
    t.add_argument(
        "--max-parallel",
        type=_integer,
        metavar="K",
        help="with --sweep: at most K tasks running at once (the array's %%K; default [sweep] max_parallel, else all)",
    )
    w = p.add_argument_group("ownership and identity (recorded in RUN_DIR/identity/, docs/bundle.md)")
    w.add_argument("--owner", metavar="NAME", help="who owns the run (default: the user submitting it)")
    w.add_argument("--team", metavar="NAME", help="the owner's team or project")
    w.add_argument("--notes", metavar="TEXT", help="what the run is for, free text")
    w.add_argument(
        "--require-clean",
        action="store_true",
        help="refuse to submit from a git tree with uncommitted or untracked files (names them)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--dry-run", action="store_true", help="print the sbatch script and exit without submitting")
    o.add_argument("--follow", action="store_true", help="stream the rank-0 log with a live status until the job ends")
    add_json_flag(o)
    return p


def _split_entry_args(argv: tp.Sequence[str]) -> tp.Tuple[tp.List[str], tp.Optional[tp.List[str]]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, None


def resolve_config(argv: tp.Sequence[str], cwd: tp.Optional[Path] = None) -> tp.Tuple[SubmitConfig, argparse.Namespace]:
    """Defaults < TOML (``--config`` or ``./hpctrain.toml``) < flags; returns the config and the flags."""
    own, entry_args = _split_entry_args(argv)
    parser = build_parser()
    ns = parser.parse_args(own)
    cwd = cwd or Path.cwd()
    config_file = getattr(ns, "config", None)
    kwargs: tp.Dict[str, tp.Any] = {}
    resume = getattr(ns, "resume", None)
    if resume is not None and getattr(ns, "sweep", None) is not None:
        raise UsageError("--sweep submits a new sweep; --resume continues one run: give one of them")
    if resume is not None:
        if getattr(ns, "run_dir", None) is not None:
            raise UsageError("--resume RUN_DIR names the run directory; drop --run-dir")
        kwargs.update(_submitted_config(Path(resume)))  # what was submitted (TOML and flags then) < flags now
    elif config_file is not None:
        kwargs.update(load_toml(Path(config_file)))
    elif (cwd / DEFAULT_CONFIG_FILE).exists():
        kwargs.update(load_toml(cwd / DEFAULT_CONFIG_FILE))
    if getattr(ns, "sweep", None) is not None:
        from hpctrain.submit.config import toml_kwargs
        from hpctrain.sweep.plan import load_sweep

        ns.sweep_plan = load_sweep(Path(ns.sweep), config=toml_kwargs)
        kwargs.update(ns.sweep_plan.config)  # its [job]/[train]/[run] over the config file, under the flags
    elif getattr(ns, "max_parallel", None) is not None:
        raise UsageError("--max-parallel applies to a sweep: add --sweep FILE")
    fields = {f.name for f in dataclasses.fields(SubmitConfig)}
    for key, value in vars(ns).items():
        if key in fields:
            kwargs[key] = value
    if entry_args is not None:
        kwargs["entry_args"] = entry_args
    return SubmitConfig(**kwargs), ns


def _submitted_config(run_dir: Path) -> tp.Dict[str, tp.Any]:
    """The SubmitConfig fields of the run's newest submission, to resubmit it as it was."""
    from hpctrain.rundir import read_json

    problems: tp.List[str] = []
    record = read_json(RunDir(run_dir).submission, problems)
    if record is None or not isinstance(record.get("config"), dict):
        why = problems[0] if problems else f"no {RunDir.SUBMISSION}"
        raise UsageError(f"--resume {shorten(str(run_dir))}: {why}; name a run directory hpctrain.submit created")
    fields = {f.name for f in dataclasses.fields(SubmitConfig)}
    kwargs = {k: v for k, v in record["config"].items() if k in fields}
    kwargs["run_dir"] = str(run_dir)
    return kwargs


def _check_container(cfg: SubmitConfig, run_dir: Path, cluster: str, *, dry_run: bool) -> None:
    """What the login node can check of a container job, before anything is written (one UsageError line each)."""
    from hpctrain._container import check_image, check_mounts, check_runtime, parse_mounts

    assert cfg.container is not None
    if cluster == "local":
        raise UsageError("--container runs Slurm tasks in an image; --cluster local runs here, outside one: drop one")
    check_mounts(parse_mounts(cfg.container_mounts), run_dir)
    try:
        check_image(cfg.container_runtime, cfg.container)
        check_runtime(cfg.container_runtime)
    except UsageError as exc:
        if not dry_run:
            raise
        # --dry-run shows the script for a runtime this machine lacks (writing it for another cluster)
        print(f"hpctrain submit: note: {exc} (a real submission stops here)", file=sys.stderr)


def _check_stage(cfg: SubmitConfig, ns: argparse.Namespace) -> SubmitConfig:
    from hpctrain.submit.staging import check_stage

    if cfg.stage and getattr(ns, "sweep", None) is not None:
        raise UsageError("--stage stages the inputs of one run; a --sweep's tasks cannot share it yet: drop one")
    return check_stage(cfg)


def _resolve_cluster(cfg: SubmitConfig) -> str:
    from hpctrain._slurm import SlurmCommands

    if cfg.cluster != "auto":
        return cfg.cluster
    return "slurm" if SlurmCommands.available() else "local"


def local_process_limit() -> int:
    """Most processes a ``--cluster local`` job may start: a few per core of this machine (the local
    executor starts every rank here; a typo such as ``--nodes 100000`` must not fork-bomb the login node)."""
    return max(16, 4 * (os.cpu_count() or 1))


def _check_local_size(cfg: SubmitConfig) -> None:
    limit = local_process_limit()
    if cfg.world_size > limit:
        raise UsageError(
            f"--nodes {cfg.nodes} x --tasks-per-node {cfg.ntasks_per_node} = {cfg.world_size} processes is too many "
            f"for --cluster local on this machine (at most {limit}, 4 per CPU core); lower --nodes/--tasks-per-node "
            "or submit to Slurm"
        )


def _run_dir(cfg: SubmitConfig) -> Path:
    from hpctrain.submit import backend

    try:
        run_dir = Path(cfg.run_dir).expanduser().resolve() if cfg.run_dir else backend.default_run_dir(cfg)
    except (OSError, RuntimeError, ValueError) as exc:  # symlink loops, unreadable parents, ~nosuchuser
        raise UsageError(f"--run-dir {shorten(repr(cfg.run_dir))}: cannot resolve it ({exc})") from None
    check_path_limits(run_dir, what="--run-dir" if cfg.run_dir else "the default run directory (--job-name)")
    return run_dir


def main(argv: tp.Optional[tp.Sequence[str]] = None, *, slurm: tp.Any = None, console: tp.Any = None) -> int:
    """The CLI. ``slurm`` is the Slurm-command seam (a fake in tests)."""
    from hpctrain.submit.entry import check_entry_imports, check_entry_static

    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, ns = resolve_config(argv)
    if not cfg.entry:
        raise UsageError(
            f"no training entry: pass --entry module:function, or set [train] entry in ./{DEFAULT_CONFIG_FILE}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the job imports the entry from this directory too
    check_entry_static(cfg.entry)
    cfg = _check_stage(cfg, ns)
    cluster = _resolve_cluster(cfg)
    if cluster == "local":
        _check_local_size(cfg)
        if cfg.spare_nodes:
            print("hpctrain submit: note: --spare-nodes applies to Slurm jobs; a local run has none", file=sys.stderr)
        if cfg.stage:
            print("hpctrain submit: note: --stage applies to Slurm jobs; a local run reads the inputs in place",
                  file=sys.stderr)  # fmt: skip
    run_dir = _run_dir(cfg)
    if cfg.container:
        _check_container(cfg, run_dir, cluster, dry_run=bool(getattr(ns, "dry_run", False)))
    as_json = bool(getattr(ns, "json", False))
    if getattr(ns, "sweep_plan", None) is not None:
        from hpctrain.submit.sweep import submit_sweep_cli

        return submit_sweep_cli(cfg, ns, argv, sweep_dir=run_dir, cluster=cluster, slurm=slurm, console=console)
    if getattr(ns, "dry_run", False):
        from hpctrain.submit.sbatch import render_sbatch

        script = render_sbatch(cfg, folder=RunDir(run_dir).logs, python=sys.executable, run_dir=run_dir)
        if as_json:
            summary = {"dry_run": True, "cluster": cluster, "world_size": cfg.world_size, "run_dir": str(run_dir)}
            print_json({**summary, "sbatch": script}, schema=SCHEMA)
            return 0
        sys.stdout.write(script)
        print(
            f"# dry run: nothing submitted; cluster={cluster}, world size {cfg.world_size}, run dir {run_dir}",
            file=sys.stderr,
        )
        return 0

    from hpctrain._slurm import SlurmCommands
    from hpctrain.submit import backend

    slurm = slurm or SlurmCommands()
    if cluster == "slurm":
        names, _ = slurm.partitions()
        if cfg.partition is not None and cfg.partition not in names:
            raise UsageError(
                f"--partition {cfg.partition!r} does not exist on this cluster; sinfo lists: {', '.join(names)}"
            )
    check_entry_imports(cfg.entry)
    if cfg.require_clean:  # before the run directory exists: a refusal writes nothing
        backend.check_clean(cfg)
    backend.prepare_run_dir(run_dir, resume=getattr(ns, "resume", None) is not None, slurm=slurm)
    sub = backend.submit(cfg, run_dir=run_dir, cluster=cluster, argv=["-m", "hpctrain.submit", *argv])
    if not as_json:
        return _report(cfg, sub, slurm, follow_job=getattr(ns, "follow", False), console=console)
    # --json: the object alone on stdout; what the console would say (and a followed log) goes to stderr
    from rich.console import Console

    summary: tp.Dict[str, tp.Any] = {}
    console = console or Console(file=sys.stderr, highlight=False, soft_wrap=True)
    try:
        code = _report(cfg, sub, slurm, follow_job=getattr(ns, "follow", False), console=console, summary=summary)
    except KeyboardInterrupt:
        summary["final_state"] = summary.get("final_state") or "INTERRUPTED"
        print_json(summary, schema=SCHEMA)
        raise
    print_json({**summary, "exit_code": code}, schema=SCHEMA)
    return code


def wait_for_reason(
    slurm: tp.Any,
    job_id: str,
    *,
    timeout_s: float = 3.0,
    poll_s: float = 1.0,
    sleep: tp.Callable[[float], None] = time.sleep,
    clock: tp.Callable[[], float] = time.monotonic,
) -> tp.Any:
    """The job's state, polled for at most ``timeout_s`` while it is pending without a reason.

    Right after a submission squeue says reason ``None`` until the scheduler's next pass (on a cold
    or busy controller that can take seconds): a short bounded wait usually gets the real reason. The
    defaults ask squeue at most four times (one look, then once a second for 3 s): a submit must not be
    the tight loop that loads a shared controller (the follow loop's rule, :mod:`hpctrain.submit.follow`).
    """
    deadline = clock() + timeout_s
    state = slurm.job_state(job_id)
    while state.state == "PENDING" and not state.reason and clock() < deadline:
        sleep(poll_s)
        state = slurm.job_state(job_id)
    return state


def _report(
    cfg: SubmitConfig,
    sub: tp.Any,
    slurm: tp.Any,
    *,
    follow_job: bool,
    console: tp.Any,
    summary: tp.Optional[tp.Dict[str, tp.Any]] = None,
) -> int:
    """Say what was submitted (and follow it); ``summary`` (``--json``) is filled with the same facts."""
    from rich.console import Console
    from rich.markup import escape

    from hpctrain.submit.follow import follow

    console = console or Console(highlight=False, soft_wrap=True)
    facts: tp.Dict[str, tp.Any] = summary if summary is not None else {}
    facts.update(
        job_id=str(sub.job_id),
        job_name=cfg.job_name,
        cluster=sub.cluster,
        nodes=cfg.nodes,
        tasks_per_node=cfg.ntasks_per_node,
        gpus_per_node=cfg.gpus_per_node,
        world_size=cfg.world_size,
        run_dir=str(sub.run_dir),
        log=str(sub.log_path(0)),
        state=None,
        reason=None,
        final_state=None,
    )
    name = escape(cfg.job_name)  # user text: "[x]" in a name or path is not rich markup
    what = f"{cfg.nodes} node(s) × {cfg.ntasks_per_node} task(s)" + (
        f", {cfg.gpus_per_node} GPU(s)/node (nccl)" if cfg.gpus_per_node else ", CPU (gloo)"
    )
    if sub.cluster == "slurm":
        state = wait_for_reason(slurm, sub.job_id)
        facts.update(state=state.state, reason=state.reason or None, time_limit_min=cfg.time_min)
        console.print(
            f"[bold green]Submitted job {sub.job_id}[/] ({name}) to Slurm: {what}, "
            f"limit {format_time(cfg.time_min * 60)}"
        )
        why = f", reason {state.reason}" if state.reason else ""
        if state.state == "PENDING" and not state.reason:
            why = ", reason not yet assigned"
        console.print(f"  state   : {state.state} ({state.source or 'not yet visible'}{why})")
        if state.reason in NEVER_STARTS:
            console.print(
                f"  [bold yellow]warning[/]: Slurm says {state.reason}: this job cannot start as requested "
                "(check --nodes/--partition/--time against sinfo)"
            )
    else:
        console.print(f"[bold green]Running job {sub.job_id}[/] ({name}) locally: {cfg.world_size} process(es), {what}")
    console.print(f"  run dir : {escape(str(sub.run_dir))}")
    console.print(
        f"  logs    : {escape(str(sub.log_path(0)))} (rank 0); "
        f"{escape(str(RunDir(sub.run_dir).logs))}/{sub.job_id}_<rank>_log.{{out,err}}"
    )
    if sub.cluster == "slurm":
        console.print(f"  follow  : tail -f {escape(shlex.quote(str(sub.log_path(0))))}   ·   squeue -j {sub.job_id}")
        console.print(f"  cancel  : scancel {sub.job_id}")
    interrupts: tp.List[float] = []
    if sub.cluster == "local":
        # A local job is a child of this process: stay with it until it ends, through a Ctrl-C too (the
        # ranks got it as well: they stop at an agreed step and save; a second one ends them at once).
        with _counting_interrupts(interrupts, console):
            final = follow(sub.job_id, sub.log_path(0), lambda: _local_state(sub.job), poll_s=0.5, console=console)
    elif follow_job:
        final = follow(sub.job_id, sub.log_path(0), lambda: slurm.job_state(sub.job_id), console=console)
    else:
        return 0
    ok = final.state == "COMPLETED"
    facts["final_state"] = final.state
    if interrupts:
        from hpctrain.ledger import Ledger

        exits = Ledger(sub.run_dir).records("exit")
        reason = exits[-1].get("reason") if exits else "no exit record (the ranks were ended at once)"
        facts.update(final_state="INTERRUPTED", reason=str(reason))
        console.print(f"job {sub.job_id} interrupted: {escape(str(reason))}")
        return 130
    console.print(
        f"job {sub.job_id} ended {final.state}" + ("" if ok else f"; see {escape(str(sub.log_path(0, 'err')))}")
    )
    return 0 if ok else 1


@contextlib.contextmanager
def _counting_interrupts(presses: tp.List[float], console: tp.Any) -> tp.Iterator[None]:
    """SIGINT while following a local job: note it and keep following (the ranks are stopping); a third
    press gives up following (KeyboardInterrupt) for a user whose ranks do not stop."""
    import signal

    def on_interrupt(signum: int, frame: tp.Any) -> None:  # noqa: ARG001 - signal handler signature
        presses.append(time.time())
        if len(presses) == 1:
            console.print("Ctrl-C: the ranks stop at an agreed step and save; Ctrl-C again ends them at once")
        elif len(presses) >= 3:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _local_state(job: tp.Any) -> tp.Any:
    from hpctrain._slurm import JobState

    if not job.done():
        return JobState("RUNNING", "localhost", "", "squeue")
    state = "COMPLETED" if job.exception() is None else "FAILED"
    return JobState(state, "localhost", "", "sacct")


def run() -> None:
    console_entry(main, "submit")
