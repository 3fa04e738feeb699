"""What a submission asks for: a validated, kw-only dataclass built from ``hpctrain.toml`` and the CLI.

Precedence: command-line flags > ``--config FILE`` (or ``./hpctrain.toml``) > defaults. Every check
names the option that is wrong and says what would be right; nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._files import read_regular_file, shorten
from hpctrain._slurm import format_time, parse_time
from hpctrain._validate import check_bool, check_choice, check_int, check_str
from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S, DEFAULT_MAX_REQUEUES
from hpctrain.errors import UsageError
from hpctrain.launch.settings import default_signal_lead

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "SubmitConfig",
    "parse_time",
    "format_time",
    "parse_mem",
    "load_toml",
    "read_toml",
    "toml_kwargs",
    "DEFAULT_CONFIG_FILE",
]

DEFAULT_CONFIG_FILE = "hpctrain.toml"
CLUSTERS = ("auto", "slurm", "local")
# Characters that never belong in a value written into the sbatch script: a newline would end the
# `#SBATCH` comment and start a shell command; '%' is Slurm's filename-pattern escape.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9._\-+,:=@\[\]&|!()]+$")  # partition/account/qos/constraint values
# Upper bound of every integer setting: far above any real cluster, far below what breaks arithmetic
# or int() (Python refuses to convert more than 4300 digits).
MAX_INT = 10_000_000
# The job name also names the default run directory (`<name>-YYYYmmdd-HHMMSS[-N]`), whose last
# component must stay within the 255 bytes a Linux filesystem allows.
MAX_JOB_NAME_BYTES = 200
CONFIG_FILE_LIMIT = 1 << 20  # bytes of TOML read at most
MAX_OWNER_CHARS = 200  # --owner, --team: one line, a name
MAX_NOTES_CHARS = 10_000  # --notes: free text (newlines allowed; never written into the sbatch script)


def parse_mem(text: str) -> str:
    """Validate a Slurm ``--mem`` value (``4000``, ``4000M``, ``16G``, ``1T``); returned as given."""
    text = str(text).strip()
    if not re.fullmatch(r"\d{1,12}[KMGTkmgt]?", text) or int(re.sub(r"\D", "", text)) == 0:
        raise UsageError(f"--mem {shorten(text)!r} is not a Slurm memory size: use e.g. 16G or 4000M")
    return text


@dataclass(kw_only=True, frozen=True)
class SubmitConfig:
    """One submission. Field names are the TOML keys (``[job]`` table, ``[train]`` for entry/args).

    A field (or property) named as a :class:`~hpctrain.launch.settings.RunnerSettings` field reaches the Runner
    under that name (:meth:`RunnerSettings.from_config <hpctrain.launch.settings.RunnerSettings.from_config>`).

    Frozen and checked on construction; an error names the option as its flag (``--nodes 0 must be at
    least 1``), since flags and TOML keys both end up here.
    """

    _option_name = "--{flag}"

    nodes: int = 1
    """Number of nodes (``--nodes``)."""
    gpus_per_node: int = 0
    """GPUs per node; 0 = CPU job over gloo (``--gpus-per-node``)."""
    tasks_per_node: tp.Optional[int] = None
    """Processes per node; default one per GPU, or 1 on a CPU job (``--tasks-per-node``)."""
    cpus_per_task: tp.Optional[int] = None
    """CPU cores per process (data-loader workers need them) (``--cpus-per-task``)."""
    mem: tp.Optional[str] = None
    """Memory per node in Slurm units, e.g. ``64G`` (``--mem``)."""
    time: str = "01:00:00"
    """Time limit in a Slurm format: ``MM``, ``HH:MM:SS``, ``D-HH:MM:SS`` (``--time``)."""
    partition: tp.Optional[str] = None
    """Slurm partition; default = the cluster's default partition (``--partition``)."""
    account: tp.Optional[str] = None
    """Slurm account to charge (``--account``)."""
    qos: tp.Optional[str] = None
    """Slurm quality of service (``--qos``)."""
    constraint: tp.Optional[str] = None
    """Slurm node features, e.g. ``a100&ib`` (``--constraint``)."""
    job_name: str = "hpctrain"
    """Slurm job name; also names the run directory (``--job-name``)."""
    run_dir: tp.Optional[str] = None
    """Run directory; default ``runs/<job-name>-<timestamp>`` under the current directory (``--run-dir``)."""
    signal_lead: tp.Optional[int] = None
    """Seconds before the time limit at which every task gets USR2 to checkpoint; default 120 s,
    or a quarter of the limit for jobs shorter than 8 minutes (``--signal-lead``)."""
    max_requeues: int = DEFAULT_MAX_REQUEUES
    """Requeues after a time limit, preemption or rank/node failure (``--max-requeues``), counted by hpctrain
    against ``SLURM_RESTART_COUNT``; rank 0 requeues with ``scontrol requeue`` (docs/preemption.md)."""
    spare_nodes: int = 0
    """Extra nodes the job allocates (``--spare-nodes``): training runs on ``nodes`` of them, and when a node
    fails or hangs the batch script restarts the step on the others, inside the allocation, up to this many
    times (the job asks for ``--no-kill``; docs/preemption.md, "Node failures and spare nodes")."""
    warm_spares: bool = False
    """With ``spare_nodes``: warm spare processes on the spare nodes and in-job recovery's store served by the
    batch script (``--warm-spares``), so that a rank's process that dies is replaced inside the step with the
    state from a survivor's memory (the Trainer's ``TrainConfig.recovery``; docs/preemption.md, "In-job
    recovery"). Implies ``in_job_recovery``."""
    in_job_recovery: bool = False
    """In-job recovery's store served by the batch script and the training step kept running when one of its
    tasks dies (``--in-job-recovery``), so that the Trainer's ``TrainConfig.recovery`` recovers inside the step:
    from warm spares with ``warm_spares``, else (or once they are used) at a smaller world with
    ``RecoveryConfig(shrink=True)``, else its fallback line and the restart (docs/preemption.md, "In-job
    recovery"). Needs no spare node."""
    cluster: str = "auto"
    """``slurm``, ``local`` (submitit's local executor, same number of processes), or ``auto``:
    Slurm when ``sbatch`` is on PATH (``--cluster``)."""
    dist_timeout: int = DEFAULT_DIST_TIMEOUT_S
    """Seconds a rank waits for the others at rendezvous before failing (``--dist-timeout``)."""
    hang_timeout: tp.Optional[int] = None
    """Seconds without progress on any rank after which the attempt counts as hung: stacks dumped, every rank
    ended, classified ``hang`` and requeued when a new step was committed (``--hang-timeout``); default
    max(10 x the measured step time, 5 min), 4 x longer in start-up, restore, save and evaluation."""
    exclude_stragglers: bool = False
    """Leave the host of a straggler rank (recorded by rank 0 in the ledger) out of the next requeue
    (``--exclude-stragglers``); hosts of hung ranks are left out always."""
    entry: tp.Optional[str] = None
    """Training entry point ``module:function``, called as ``function(ctx)`` on every task (``--entry``)."""
    entry_args: tp.List[str] = field(default_factory=list)
    """The entry's own arguments (after ``--`` on the command line; ``[train] args`` in TOML)."""
    owner: tp.Optional[str] = None
    """Who owns the run (``--owner``, ``[run] owner``); default: the user who submits it."""
    team: tp.Optional[str] = None
    """The owner's team or project (``--team``, ``[run] team``)."""
    notes: tp.Optional[str] = None
    """Purpose of the run, free text (``--notes``, ``[run] notes``); recorded in the identity manifest."""
    require_clean: bool = False
    """Refuse to submit from a git tree with uncommitted or untracked files (``--require-clean``,
    ``[run] require_clean``): the error names the dirty files."""
    secret_patterns: tp.Optional[tp.List[str]] = None
    """More file name patterns whose files are never stored in the code snapshot, added to the built-in ones
    (``[run] secret_patterns = ["*.secret", "mycreds/*"]``): their names and hashes are recorded, their content
    is not (docs/bundle.md, "What is never stored")."""
    code_path: tp.Optional[str] = None
    """A directory the Runner puts first on ``sys.path`` on every task before it imports the entry, so that the
    entry runs from that tree ahead of anything installed (``[job] code_path``; ``python -m hpctrain reproduce``
    sets it to the code it rebuilt from a bundle's snapshot)."""
    stage: tp.Optional[tp.List[str]] = None
    """Input files or directories copied to node-local storage at the start of every attempt, one reader per node,
    verified against the data fingerprint; the loader reads the local copies and a requeue reuses a verified copy
    (``--stage PATH...``, ``[job] stage = [...]``; docs/data.md, "Node-local staging")."""
    stage_dir: tp.Optional[str] = None
    """Node-local directory of the staged copies, expanded on the node (``--stage-dir``); default
    :data:`hpctrain.defaults.DEFAULT_STAGE_DIR` (``$SLURM_TMPDIR``, else ``$TMPDIR``, else ``/tmp``)."""
    container: tp.Optional[str] = None
    """Run every task inside this image (``--container``): an Apptainer ``.sif`` file, a pyxis squashfs file or
    registry reference (``nvcr.io#nvidia/pytorch:24.01-py3``), a podman image name or ``oci-archive:/path``. The
    batch script and Slurm commands stay outside it (docs/submit.md, "Containers")."""
    container_runtime: str = "apptainer"
    """``apptainer``, ``pyxis`` (``srun --container-image``) or ``podman`` (``--container-runtime``)."""
    container_mounts: tp.Optional[tp.List[str]] = None
    """More bind mounts, ``SRC:DST`` (or ``SRC``: the same path) each (``--container-mounts SRC:DST,...``; a TOML
    list or comma-separated string): data paths, a checkpoint directory outside the run directory. The run
    directory and the submitting directory (the entry's code) are mounted at their own paths always."""
    container_python: tp.Optional[str] = None
    """The interpreter inside the image that runs each task (``[job] container_python``, e.g. ``python3`` in an NGC
    image with hpctrain installed); default: the submitting interpreter's path (an image holding the same venv)."""

    def __post_init__(self) -> None:
        for name in ("time", "mem"):  # `time = 30` in TOML means 30 minutes, as in Slurm
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, str(value))
        check_str(self, "time", self.time)
        for name in ("mem", "partition", "account", "qos", "constraint", "run_dir", "entry"):
            check_str(self, name, getattr(self, name), none_ok=True)
        check_str(self, "job_name", self.job_name)
        check_choice(self, "cluster", self.cluster, CLUSTERS)
        check_int(self, "nodes", self.nodes, min=1, max=MAX_INT)
        check_int(self, "gpus_per_node", self.gpus_per_node, min=0, max=MAX_INT, hint="0 = a CPU job over gloo")
        check_int(self, "tasks_per_node", self.tasks_per_node, min=1, max=MAX_INT, none_ok=True)
        check_int(self, "cpus_per_task", self.cpus_per_task, min=1, max=MAX_INT, none_ok=True)
        check_int(self, "max_requeues", self.max_requeues, min=0, max=MAX_INT, hint="0 = never requeue")
        check_int(self, "dist_timeout", self.dist_timeout, min=1, max=MAX_INT, hint="seconds")
        check_int(self, "spare_nodes", self.spare_nodes, min=0, max=MAX_INT, hint="0 = no spare nodes")
        check_int(self, "hang_timeout", self.hang_timeout, min=1, max=MAX_INT, none_ok=True, hint="seconds")
        check_bool(self, "exclude_stragglers", self.exclude_stragglers)
        check_bool(self, "warm_spares", self.warm_spares)
        if self.warm_spares and not self.spare_nodes:
            raise UsageError(
                "--warm-spares needs spare nodes to run the spares on: add --spare-nodes K, or use --in-job-recovery "
                "(no spares: the smaller world)"
            )
        check_bool(self, "in_job_recovery", self.in_job_recovery)
        check_int(self, "signal_lead", self.signal_lead, max=MAX_INT, none_ok=True)
        limit = parse_time(self.time)
        if self.signal_lead is not None and not 0 < self.signal_lead < limit:
            raise UsageError(
                f"--signal-lead {self.signal_lead} must be between 1 and the time limit ({limit} s) minus one"
            )
        if self.mem is not None:
            object.__setattr__(self, "mem", parse_mem(self.mem))
        if not self.job_name or _CONTROL.search(self.job_name) or "%" in self.job_name:
            raise UsageError(f"--job-name {shorten(repr(self.job_name))} must be non-empty, one line, without '%'")
        if len(self.job_name.encode("utf-8", "surrogateescape")) > MAX_JOB_NAME_BYTES:
            raise UsageError(
                f"--job-name {shorten(repr(self.job_name))} is too long: at most {MAX_JOB_NAME_BYTES} bytes "
                "(it also names the run directory)"
            )
        for name in ("partition", "account", "qos", "constraint"):
            value = getattr(self, name)
            if value is not None and not _SLURM_NAME.match(value):
                raise UsageError(
                    f"--{name} {shorten(repr(value))} has characters Slurm does not accept in a {name} name"
                )
        check_str(self, "code_path", self.code_path, none_ok=True)
        if self.code_path is not None and (not Path(self.code_path).is_absolute() or _CONTROL.search(self.code_path)):
            raise UsageError(f"[job] code_path {shorten(repr(self.code_path))} must be an absolute path on one line")
        if self.run_dir is not None and (_CONTROL.search(self.run_dir) or "%" in self.run_dir):
            raise UsageError(
                f"--run-dir {shorten(repr(self.run_dir))} must be one line without '%' (Slurm expands % in log paths)"
            )
        if not _is_str_list(self.entry_args):
            raise UsageError("entry arguments ([train] args) must be a list of strings")
        if any(_CONTROL.search(a) for a in self.entry_args):
            raise UsageError("entry arguments after -- must not contain newlines or control characters")
        for name in ("owner", "team", "notes"):
            check_str(self, name, getattr(self, name), none_ok=True)
        for name in ("owner", "team"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or _CONTROL.search(value) or len(value) > MAX_OWNER_CHARS):
                raise UsageError(
                    f"--{name} {shorten(repr(value))} must be one non-empty line of at most "
                    f"{MAX_OWNER_CHARS} characters"
                )
        if self.notes is not None and (
            len(self.notes) > MAX_NOTES_CHARS or re.search(r"[\x00-\x08\x0b-\x1f\x7f]", self.notes)
        ):
            raise UsageError(
                f"--notes must be text of at most {MAX_NOTES_CHARS} characters (newlines and tabs allowed, "
                "no other control characters)"
            )
        check_bool(self, "require_clean", self.require_clean)
        self._check_container()
        self._check_stage()
        if self.secret_patterns is not None:
            from hpctrain.identity.redact import check_secret_patterns

            object.__setattr__(self, "secret_patterns", list(check_secret_patterns(self.secret_patterns)))

    def _check_stage(self) -> None:
        """Syntax only; whether the paths exist and the directory is writable is checked on the login node
        (:func:`hpctrain.submit.staging.check_stage`)."""
        stage = [self.stage] if isinstance(self.stage, str) else self.stage
        if stage is not None and (not _is_str_list(stage) or not stage):
            raise UsageError("--stage must be one or more input paths (a list of strings in TOML)")
        check_str(self, "stage_dir", self.stage_dir, none_ok=True)
        for value in (stage or []) + ([self.stage_dir] if self.stage_dir is not None else []):
            if not value.strip() or _CONTROL.search(value):
                raise UsageError(f"--stage/--stage-dir {shorten(repr(value))} must be a path on one line")
        if stage is not None:
            object.__setattr__(self, "stage", list(stage))
        if self.stage_dir is not None and self.stage is None:
            raise UsageError("--stage-dir says where --stage copies inputs: add --stage PATH")

    def _check_container(self) -> None:
        """Syntax only; whether the image, the runtime and the mounts' sources exist is checked by the submit
        command on the login node (:func:`hpctrain._container.check_image` and friends)."""
        from hpctrain._container import RUNTIMES, parse_mounts

        check_str(self, "container", self.container, none_ok=True)
        check_choice(self, "container_runtime", self.container_runtime, RUNTIMES)
        check_str(self, "container_python", self.container_python, none_ok=True)
        mounts = self.container_mounts
        if isinstance(mounts, str):
            mounts = [mounts]
        if mounts is not None and not _is_str_list(mounts):
            raise UsageError("--container-mounts must be SRC:DST[,SRC:DST...] (a list of strings in TOML)")
        if mounts is not None:
            object.__setattr__(self, "container_mounts", [m.spec for m in parse_mounts(",".join(mounts))])
        if self.container is None:
            if self.container_mounts or self.container_python is not None:
                raise UsageError(
                    "--container-mounts and [job] container_python apply to a container: add --container IMAGE"
                )
            return
        if not self.container.strip() or _CONTROL.search(self.container) or "%" in self.container:
            raise UsageError(f"--container {shorten(repr(self.container))} must name an image on one line, without '%'")
        if self.container_python is not None and (
            not self.container_python.strip() or _CONTROL.search(self.container_python)
        ):
            raise UsageError(f"[job] container_python {shorten(repr(self.container_python))} must be one line")

    # Derived values -----------------------------------------------------------------------------
    @property
    def time_s(self) -> int:
        return parse_time(self.time)

    @property
    def time_min(self) -> int:
        """Slurm's granularity is one minute: round up, never cut the user's limit."""
        return max(1, math.ceil(self.time_s / 60))

    @property
    def ntasks_per_node(self) -> int:
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def time_limit(self) -> int:
        """Seconds Slurm gives the job: ``--time`` rounded up to the minute (``RunnerSettings.time_limit``)."""
        return self.time_min * 60

    @property
    def signal_lead_s(self) -> int:
        if self.signal_lead is not None:
            return self.signal_lead
        return default_signal_lead(self.time_limit)  # the rule the Runner assumes too (hpctrain.launch.settings)

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        return dataclasses.asdict(self)


# The keys of the TOML's [run] table (who and why, what is never stored); every other field is [job]'s.
RUN_KEYS = frozenset({"owner", "team", "notes", "require_clean", "secret_patterns"})
_JOB_KEYS = {f.name for f in dataclasses.fields(SubmitConfig)} - {"entry", "entry_args"} - RUN_KEYS
_TRAIN_KEYS = {"entry": "entry", "args": "entry_args"}


def load_toml(path: tp.Union[str, Path]) -> tp.Dict[str, tp.Any]:
    """Read an ``hpctrain.toml`` into SubmitConfig keyword arguments; unknown keys are errors.

    Layout::

        [job]                      # any SubmitConfig field: nodes, gpus_per_node, time, partition, ...
        nodes = 2
        time = "02:00:00"
        [train]
        entry = "mypkg.train:main"
        args = ["--lr", "3e-4"]
        [run]                      # ownership, recorded in the identity manifest
        owner = "ada"
        team = "vision"
        notes = "baseline for the ablation"
        require_clean = true       # refuse to submit from a dirty git tree
        secret_patterns = ["*.secret", "mycreds/*"]   # never stored in the code snapshot (names, hashes only)
    """
    return toml_kwargs(read_toml(path), path)


def read_toml(path: tp.Union[str, Path], *, what: str = "--config") -> tp.Dict[str, tp.Any]:
    """The tables of a TOML file (a regular UTF-8 file of at most 1 MiB); any problem is one UsageError line."""
    path = Path(path)
    raw = read_regular_file(path, what=what, limit=CONFIG_FILE_LIMIT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shorten(path)}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{shorten(path)}: not valid TOML ({exc})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits, absurd nesting
        raise UsageError(f"{shorten(path)}: not usable TOML ({type(exc).__name__}: {shorten(exc, 120)})") from None
    return data


def toml_kwargs(
    data: tp.Mapping[str, tp.Any], path: tp.Union[str, Path], *, also: tp.Sequence[str] = ()
) -> tp.Dict[str, tp.Any]:
    """SubmitConfig keyword arguments from the ``[job]``, ``[train]`` and ``[run]`` tables of ``data`` (read from
    ``path``); ``also``: the other tables the file may have (a sweep file's ``[sweep]``), left to the caller."""
    path = Path(path)
    unknown_tables = sorted(set(data) - {"job", "train", "run", *also})
    if unknown_tables:
        valid = ", ".join(f"[{t}]" for t in ("job", "train", "run", *also))
        raise UsageError(f"{shorten(path)}: unknown table(s) {shorten(unknown_tables)}; use {valid}")
    for table in ("job", "train", "run"):
        if not isinstance(data.get(table, {}), dict):
            raise UsageError(f"{shorten(path)}: {table} must be a table ([{table}] followed by key = value lines)")
    kwargs: tp.Dict[str, tp.Any] = {}
    job = data.get("job", {})
    bad = sorted(set(job) - _JOB_KEYS)
    if bad:
        raise UsageError(
            f"{shorten(path)}: unknown key(s) {shorten(bad)} in [job]; valid keys: {', '.join(sorted(_JOB_KEYS))}"
        )
    kwargs.update(job)
    train = data.get("train", {})
    bad = sorted(set(train) - set(_TRAIN_KEYS))
    if bad:
        raise UsageError(f"{shorten(path)}: unknown key(s) {shorten(bad)} in [train]; valid keys: entry, args")
    for key, name in _TRAIN_KEYS.items():
        if key in train:
            kwargs[name] = train[key]
    run = data.get("run", {})
    bad = sorted(set(run) - RUN_KEYS)
    if bad:
        raise UsageError(
            f"{shorten(path)}: unknown key(s) {shorten(bad)} in [run]; valid keys: {', '.join(sorted(RUN_KEYS))}"
        )
    kwargs.update(run)
    if "entry_args" in kwargs and not _is_str_list(kwargs["entry_args"]):
        raise UsageError(f"{shorten(path)}: [train] args must be a list of strings")
    return kwargs


def _is_str_list(value: tp.Any) -> bool:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)
