"""The run directory: every path of a run, and how its records are written and read (stdlib only).

One owner for the layout, in the spirit of submitit's ``JobPaths``: every module that writes or reads
a file of a run asks :class:`RunDir` for its path instead of spelling it. What lies *inside* the
checkpoint directory (``step-N`` names, manifests, shards, the node-local tier) is hpctrain.ckpt's, read
through its public API; what a run directory *says* (its attempts, its checkpoints, its identity) is
:mod:`hpctrain.run`'s, built on these paths.

::

    RUN_DIR/submission.json                     what was submitted (hpctrain.submit, login node)
    RUN_DIR/submissions/<n>.json                earlier submissions of a run continued with --resume
    RUN_DIR/sbatch.sh                           the exact script given to sbatch (Slurm runs)
    RUN_DIR/logs/                               submitit's folder: <job>_<rank>_log.{out,err}, pickles
    RUN_DIR/ranks/<job>-r<restart>/rank-<N>.json       each task when it joins (hpctrain.launch)
    RUN_DIR/ranks/<job>-r<restart>/end-rank-<N>.json   each task's own view of how its attempt ended
    RUN_DIR/ranks/<job>-r<restart>/exit.json    claimed by the one rank that decides (and may requeue)
    RUN_DIR/ranks/<job>-r<restart>/heartbeat-rank-<N>.json  each task's last progress (step, phase, time)
    RUN_DIR/ranks/<job>-r<restart>/stacks-rank-<N>.txt      each task's Python stacks, written on a hang
    RUN_DIR/ranks/<job>-r<restart>/hang.json    the hang's attribution (hung ranks, hosts, stacks, progress)
    RUN_DIR/stage/<job>-r<restart>/<node>.json  what each node staged for that Slurm attempt (submit --stage)
    RUN_DIR/train/ledger.jsonl                  one record per start, end and exit of an attempt
    RUN_DIR/train/metrics.jsonl                 one record per log interval and per evaluation
    RUN_DIR/checkpoints/                        the Trainer's default checkpoint directory
    RUN_DIR/identity/submit.json                the run's identity manifest at submit (login node)
    RUN_DIR/identity/<job>-r<restart>.json      the same, written again by rank 0 at every start
    RUN_DIR/identity/code.tar.gz                the code snapshot taken at submit (git archive + diff + untracked)
    RUN_DIR/identity/data-cache.json            content-tier data fingerprints, keyed by their cheap tier
    RUN_DIR/capacity/allreduce.json             a calibration run's all-reduce timings (hpctrain.capacity)
    RUN_DIR/approvals.jsonl                     the append-only, hash-chained approval log
    RUN_DIR/cache/compile/                      torch.compile's caches (Inductor), shared by every attempt

Records are read through :func:`read_json` and :func:`read_jsonl`, which never block on a FIFO, never
follow a record into ``/dev/zero``, and read at most a bounded number of bytes: the login-node tools
must answer on a damaged run directory, not hang in ``open()``.
"""

from __future__ import annotations

import json
import os
import re
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_text
from hpctrain._files import NotReadable, read_bounded

__all__ = [
    "RunDir",
    "attempt_label",
    "parse_label",
    "LEDGER_SCHEMA",
    "METRICS_SCHEMA",
    "RECORD_LIMIT",
    "JSONL_LIMIT",
    "read_json",
    "read_jsonl",
    "append_jsonl_atomic",
    "dumps_record",
    "STAGE_ENV",
    "STAGE_SCHEMA",
]

METRICS_SCHEMA = "hpctrain.train.metrics/1"
LEDGER_SCHEMA = "hpctrain.train.ledger/1"
PROBE_SCHEMA = "hpctrain.capacity.allreduce/1"
"""The all-reduce probe's record (:attr:`RunDir.capacity_probe`): written by :mod:`hpctrain.launch.probe`, read by
:mod:`hpctrain.capacity.calibration`."""

STAGE_SCHEMA = "hpctrain.data.stage/1"
"""A node's stage record (:meth:`RunDir.stage_record`): written by :mod:`hpctrain.data.stage`, read by it (the
loader's local copies) and by :mod:`hpctrain.capacity.calibration` (copy time per node)."""

STAGE_ENV = "HPCTRAIN_STAGE_RUN_DIR"
"""Exported by the batch script of a job that stages its inputs (``submit --stage``): the run directory, whose
:meth:`RunDir.stage_record` of each node names that node's verified copies (read by ``hpctrain.data.stage``)."""

RECORD_LIMIT = 16 << 20
"""Bytes read of one JSON record file (submission, rank records, manifests): far above any real one."""
JSONL_LIMIT = 64 << 20
"""Bytes read of a whole JSONL file (the ledger); the metrics are read as a tail window instead."""

PathLike = tp.Union[str, "os.PathLike[str]"]


_LABEL = re.compile(r"^(?P<job>.+)-r(?P<restart>\d+|\?)$")


def attempt_label(job_id: tp.Optional[str], restart_count: tp.Optional[int]) -> str:
    """``<job id or local>-r<restart count>`` (``-r?``: not recorded): the one spelling of an attempt's name."""
    return f"{job_id or 'local'}-r{'?' if restart_count is None else restart_count}"


def parse_label(text: str) -> tp.Optional[tp.Tuple[str, tp.Optional[int]]]:
    """``(job id, restart count)`` of an :func:`attempt_label` (``local`` gives the job id ``""``; ``-r?`` None),
    None for text that is not one."""
    m = _LABEL.match(text) if isinstance(text, str) else None
    if m is None:
        return None
    job = m.group("job")
    restart = m.group("restart")
    return ("" if job == "local" else job), (None if restart == "?" else int(restart))


class RunDir:
    """The paths of one run directory. Cheap to build; touches nothing on disk."""

    SUBMISSION = "submission.json"
    SBATCH = "sbatch.sh"
    LOGS = "logs"
    RANKS = "ranks"
    TRAIN = "train"
    LEDGER = "ledger.jsonl"
    METRICS = "metrics.jsonl"
    CHECKPOINTS = "checkpoints"
    IDENTITY = "identity"
    APPROVALS = "approvals.jsonl"

    def __init__(self, root: PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __fspath__(self) -> str:
        return str(self.root)

    # ------------------------------------------------------------------ written on the login node
    @property
    def submission(self) -> Path:
        return self.root / self.SUBMISSION

    def previous_submission(self, n: int) -> Path:
        """The n-th earlier submission of a run continued with ``submit --resume`` (0 is the first)."""
        return self.root / "submissions" / f"{n}.json"

    @property
    def sbatch_script(self) -> Path:
        return self.root / self.SBATCH

    @property
    def logs(self) -> Path:
        return self.root / self.LOGS

    def log_file(self, job_id: str, rank: int = 0, stream: str = "out") -> Path:
        """submitit's per-task log (``%j_%t_log.out``, the job id and the task's rank filled in)."""
        return self.logs / f"{job_id}_{rank}_log.{stream}"

    # ------------------------------------------------------------------ written by each task
    @property
    def ranks(self) -> Path:
        return self.root / self.RANKS

    def attempt_dir(self, job_id: str, restart_count: int) -> Path:
        """One folder per attempt: a local run has no job id (``local``), a requeue a new restart count."""
        return self.ranks / attempt_label(job_id, restart_count)

    def attempt_numbers(self, job_id: str) -> tp.List[int]:
        """The restart counts of the attempts of ``job_id`` that have a folder here, ascending."""
        prefix = attempt_label(job_id, 0)[:-1]  # the label up to its restart count
        try:
            names = [p.name for p in self.ranks.iterdir() if p.name.startswith(prefix)]
        except OSError:
            return []
        return sorted(int(n[len(prefix) :]) for n in names if n[len(prefix) :].isdigit())

    def rank_record(self, job_id: str, restart_count: int, rank: int) -> Path:
        return self.attempt_dir(job_id, restart_count) / f"rank-{rank}.json"

    def rank_end(self, job_id: str, restart_count: int, rank: int) -> Path:
        return self.attempt_dir(job_id, restart_count) / f"end-rank-{rank}.json"

    def attempt_exit(self, job_id: str, restart_count: int) -> Path:
        """Created exclusively by the one rank that decides how the attempt ended (and may requeue)."""
        return self.attempt_dir(job_id, restart_count) / "exit.json"

    def heartbeat(self, job_id: str, restart_count: int, rank: int) -> Path:
        """The task's last progress, rewritten by its watchdog thread (hpctrain.runtime.watchdog)."""
        return self.attempt_dir(job_id, restart_count) / f"heartbeat-rank-{rank}.json"

    def stack_dump(self, job_id: str, restart_count: int, rank: int, tool: str = "faulthandler") -> Path:
        """The task's Python stacks on a hang: ``faulthandler`` (all threads) or ``py-spy`` (when installed)."""
        suffix = "" if tool == "faulthandler" else f".{tool}"
        return self.attempt_dir(job_id, restart_count) / f"stacks-rank-{rank}{suffix}.txt"

    def hang_report(self, job_id: str, restart_count: int) -> Path:
        """Written by the rank that decides a hung attempt's end: which ranks hung, where, their stacks."""
        return self.attempt_dir(job_id, restart_count) / "hang.json"

    def stage_record(self, job_id: str, restart_count: int, node: str) -> Path:
        """What one node's stage step (``python -m hpctrain.data.stage``) copied, reused and verified at the start
        of a Slurm attempt (``restart_count`` is ``SLURM_RESTART_COUNT``: spare-node restarts inside the allocation
        read the same record); the loader reads its node's record to find the local copies."""
        return self.root / "stage" / attempt_label(job_id, restart_count) / f"{node}.json"

    # ------------------------------------------------------------------ written by training
    @property
    def train(self) -> Path:
        return self.root / self.TRAIN

    @property
    def ledger(self) -> Path:
        return self.train / self.LEDGER

    @property
    def metrics(self) -> Path:
        return self.train / self.METRICS

    @property
    def checkpoints(self) -> Path:
        """The default checkpoint directory (``CheckpointPolicy.dir`` may name another one)."""
        return self.root / self.CHECKPOINTS

    # ------------------------------------------------------------------ identity and approvals
    @property
    def identity(self) -> Path:
        return self.root / self.IDENTITY

    @property
    def identity_submit(self) -> Path:
        """Written once by ``hpctrain.submit``; never overwritten (a start writes its own record)."""
        return self.identity / "submit.json"

    def identity_attempt(self, job_id: str, restart_count: int) -> Path:
        return self.identity / f"{attempt_label(job_id, restart_count)}.json"

    @property
    def code_snapshot(self) -> Path:
        return self.identity / "code.tar.gz"

    @property
    def data_cache(self) -> Path:
        return self.identity / "data-cache.json"

    @property
    def capacity_probe(self) -> Path:
        """The all-reduce timings ``hpctrain.launch.probe`` measures in a calibration run."""
        return self.root / "capacity" / "allreduce.json"

    @property
    def approvals(self) -> Path:
        return self.root / self.APPROVALS

    @property
    def report(self) -> Path:
        """``python -m hpctrain report``'s default output: one self-contained HTML page."""
        return self.root / "report.html"

    @property
    def cancel_request(self) -> Path:
        """``RUN_DIR/cancel-request.json``: written by ``python -m hpctrain cancel`` before it signals the job, read
        by the deciding rank: an attempt of that job is not requeued, and its exit record says who cancelled it."""
        return self.root / "cancel-request.json"

    @property
    def tensorboard(self) -> Path:
        """``python -m hpctrain export-tensorboard``'s default output: a TensorBoard log directory."""
        return self.root / "tensorboard"

    @property
    def compile_cache(self) -> Path:
        """``torch.compile``'s on-disk caches (``TORCHINDUCTOR_CACHE_DIR``: Inductor's FX-graph and AOTAutograd
        caches) when ``TrainConfig.parallel.compile``: in the run directory, not torch's node-local default
        (``/tmp/torchinductor_$USER``), so that a requeued attempt on other nodes compiles warm."""
        return self.root / "cache" / "compile"

    @property
    def reproduced_code(self) -> Path:
        """A run made by ``python -m hpctrain reproduce``: the code rebuilt from the bundle's snapshot (one tree
        per repository, the entry runs from it) and the reproduction's record (:mod:`hpctrain.bundle.reproduce_cli`
        names what is inside)."""
        return self.root / "code"


def dumps_record(record: tp.Mapping[str, tp.Any]) -> str:
    """One record as one line of standard JSON: NaN/inf become null (Python's default writes tokens no
    strict parser accepts), and a value JSON cannot hold (a tensor, a Path) becomes its ``float()`` or
    ``str()`` rather than killing the writer."""
    return json.dumps(_plain(record), sort_keys=True, allow_nan=False)


def _plain(value: tp.Any, depth: int = 0) -> tp.Any:
    if depth > 64:
        return str(value)[:200]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, tp.Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)  # a 0-d tensor or numpy scalar (a tensor learning rate)
    if callable(item):
        try:
            return _plain(item(), depth + 1)
        except (TypeError, ValueError, RuntimeError):
            pass
    try:
        return _plain(float(value), depth + 1)
    except (TypeError, ValueError, OverflowError):
        return str(value)[:200]


def append_jsonl_atomic(path: PathLike, record: tp.Mapping[str, tp.Any], *, schema: str) -> None:
    """Append one record to a small JSONL file atomically: the whole file is rewritten through tmp + fsync +
    rename, so a crash leaves the old file or the new one, never a torn line (the ledger: one writer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = read_bounded(path, limit=JSONL_LIMIT)[0].decode("utf-8", errors="replace")
    except FileNotFoundError:
        old = ""
    if old and not old.endswith("\n"):
        old += "\n"
    atomic_write_text(path, old + dumps_record({"schema": schema, **record}) + "\n")


def read_json(
    path: PathLike, problems: tp.List[str], *, limit: int = RECORD_LIMIT
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The JSON object in ``path``, None when it is missing; anything else that is wrong (not a regular
    file, too large, not JSON, nested too deep, not an object) is one line in ``problems`` and None."""
    path = Path(path)
    try:
        data, _ = read_bounded(path, limit=limit)
    except FileNotFoundError:
        return None
    except NotReadable as exc:
        problems.append(f"{path.name}: {exc}; ignored")
        return None
    value, why = _loads(data)
    if why:
        problems.append(f"{path.name}: {why}; ignored")
        return None
    if not isinstance(value, dict):
        problems.append(f"{path.name}: a JSON {type(value).__name__}, not an object; ignored")
        return None
    return value


def _loads(raw: bytes) -> tp.Tuple[tp.Any, str]:
    try:
        return json.loads(raw), ""
    except RecursionError:
        return None, "JSON nested too deep"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON ({str(exc)[:120]})"


def read_jsonl(
    path: PathLike, *, tail_bytes: tp.Optional[int] = None, limit: int = JSONL_LIMIT
) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[str]]:
    """The records of a JSONL file and one message per line that is not a JSON object (or per reason the
    file cannot be read). ``tail_bytes`` reads only the end of the file (a long run's metrics grow without
    bound; the login node wants the last intervals): the first, probably partial, line of that window is
    skipped. A missing file gives ``([], [])``."""
    path = Path(path)
    try:
        data, start = read_bounded(path, limit=limit, tail=tail_bytes)
    except FileNotFoundError:
        return [], []
    except NotReadable as exc:
        return [], [f"{path.name}: {exc}; ignored"]
    lines = data.split(b"\n")
    first_line = 1
    if start > 0:
        lines, first_line = lines[1:], 0  # line numbers are unknown inside a window: count from its start
    records: tp.List[tp.Dict[str, tp.Any]] = []
    problems: tp.List[str] = []
    for n, raw in enumerate(lines, start=first_line):
        if not raw.strip():
            continue
        where = f"{path.name} line {n}" if start == 0 else f"{path.name} (last {tail_bytes} bytes) line {n}"
        rec, why = _loads(raw)
        if why:
            unfinished = n == len(lines) - 1 + first_line and not data.endswith(b"\n")
            why = "unfinished last line (being written, or the writer died)" if unfinished else why
            problems.append(f"{where}: {why}; skipped")
            continue
        if not isinstance(rec, dict):
            problems.append(f"{where}: a JSON {type(rec).__name__}, not an object; skipped")
            continue
        records.append(rec)
    return records, problems
