"""One benchmark suite: every benchmark, each against its ceiling and its peer in the same run, set against its goal.

    python benchmarks/run.py [--quick] [--repeat N] [--json PATH] [--only NAME,...] [--list] [--goals]

Runs each benchmark of BENCHMARKS (loader, checkpoint on disk and tmpfs, submit, train, identity; the GPU
checks when this machine has a GPU) one after the other, each as a subprocess with ``--json`` (the GPU checks:
``--out DIR``), its own defaults (the reference settings) or, with ``--quick``, its smallest meaningful ones.
The ratios the benchmarks print (each measured against its ceiling and its peer in the same run) are collected
into rows and compared with GOALS, the one table of goals.

``--repeat N`` (default 3; with ``--quick`` 1): N rounds per benchmark, each measuring hpctrain, its ceiling
and its peer once, interleaved (A B C, A B C, ...), the ratio taken per round; a row's ``measured`` is the
median of the per-round figures (a goal is met when the median meets it) and its ``spread`` their min-max.
How a benchmark gets its rounds is its ``rounds`` field: ``suite`` (the script run N times with
``round_args``, and its ``round_flag`` with the round's number where it has one: the checkpoint benchmark
alternates with it which side leads its A B B A order; the load average read around each run), ``script``
(``--repeat N`` passed on; the script interleaves and reports its rounds itself) or ``once``. The logic
(medians, spreads, the load mark: a round whose 1-min load average moved by more than one core) is
``benchmarks/_rounds.py``. Writes, next to each other:

* ``PATH`` (default ``bench_out/benchmarks.json``): the JSON below;
* ``PATH`` with ``.md``: a markdown table of the rows (benchmark, ratio, against, goal, measured, met);
* ``PATH`` with ``.svg``: a bar chart of measured / goal for every row with a goal (no dependency);
* ``PATH`` without its suffix + ``.d/``: each benchmark's own JSON, stdout and stderr (``NAME.json``,
  ``NAME.stdout``, ``NAME.stderr``; a GPU check's ``--out`` folder ``NAME/``).

A benchmark that exits non-zero, times out or writes no JSON is reported (status ``failed`` and its last
stderr line) and the others still run; the suite then exits 1. Goals that are not met do not change the exit
status (the figures are measurements on whatever machine ran them). Exit 2: bad arguments.

JSON (schema ``hpctrain.benchmarks/1``)::

    {"schema": "hpctrain.benchmarks/1", "quick": bool, "repeat": int, "argv": [...], "started_at": ISO-8601 UTC,
     "finished_at": ..., "seconds": float,
     "host": {"hostname", "platform", "python", "cpus", "load_average_1min": [at start, at end],
              "gpu": {"present": bool, "how": str, "gpus": [str]}},
     "benchmarks": {NAME: {"status": "ok" | "failed" | "skipped", "script": "benchmarks/...",
                           "argv": [...] | null, "exit_code": int | null, "seconds": float | null,
                           "error": str | null (failed/skipped: the last stderr line, or why),
                           "files": {"json", "stdout", "stderr"} | [one per round] | null,
                           "result": {...} (rounds: each number the median over the rounds) | null,
                           "rounds": [{"round", "load_1min": [before, after], "load_changed", "seconds",
                                       "figures": {DOTTED KEY: number}}] | null,
                           "spread": {DOTTED KEY: {"median", "min", "max", "values", "rounds"}} | null}},
     "rows": [{"benchmark", "metric" (dotted key into the result; null for a failed/skipped benchmark),
               "against", "unit" ("x", "%", "s", "steps/s", "bool"), "goal": {"op", "target", "source"} | null,
               "measured": number | bool | null,
               "met": true | false | null,
               "status": "met" | "not met" | "reported" | "not measured" | "failed" | "skipped" | "ok",
               "note": str | null,
               "spread": {"min", "max", "rounds", "values", "load_changed_rounds"} | null (measured once)}],
     "summary": {"benchmarks", "ok", "failed": [NAME], "skipped": [NAME], "goals", "met", "not_met": [str]}}

``measured`` is the median over the rounds, else the benchmark's own figure (a list there: its median);
``met`` compares it with the goal (``>=``, ``<=`` or ``==``); rows without a goal are ``reported``, a figure
the benchmark did not print (e.g. the Slurm start-up without a cluster) ``not measured``. A benchmark that
failed or was skipped has one row (``metric`` null, ``note`` why); so has one that ran but has no rows in
GOALS (status ``ok``).

Test seam: ``HPCTRAIN_BENCH_EXTRA="NAME=SCRIPT[;NAME=SCRIPT...]"`` registers extra benchmarks, run after the
others (and selectable with ``--only``) as ``python SCRIPT --json PATH``, without goals: one row each, ``ok``
or ``failed``. tests/test_benchmark_suite.py registers one that exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _rounds  # noqa: E402
from _common import ENV, ROOT  # noqa: E402

SCHEMA = "hpctrain.benchmarks/1"
EXTRA_ENV = "HPCTRAIN_BENCH_EXTRA"


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark script and how the suite runs it."""

    name: str
    script: str  # under benchmarks/, or any path for an extra
    what: str  # one line: what it measures
    quick: tp.Tuple[str, ...] = ()  # arguments with --quick (without: the script's defaults, the reference)
    timeout_s: tp.Tuple[float, float] = (3600.0, 900.0)  # (reference, quick)
    gpu: bool = False  # runs only where a GPU is present
    out_dir: bool = False  # takes --out DIR and writes DIR/<script stem>.json (the GPU checks) instead of --json
    # how --repeat N is honoured: "suite" (run.py runs the script N times, each run one round of every side,
    # with ``round_args``), "script" (the script is passed ``--repeat N`` and interleaves the rounds itself,
    # reporting them in _rounds' format), "once" (run once: its own repeats inside, or a pass/fail check)
    rounds: str = "once"
    round_args: tp.Tuple[str, ...] = ()
    round_flag: str = ""  # "suite" rounds: the flag that passes each run its round's number (1, 2, ...), if any


BENCHMARKS: tp.Tuple[Benchmark, ...] = (
    Benchmark(
        "loader",
        "bench_loader.py",
        "H5Loader samples/s vs the raw read ceiling and a DataLoader over h5py; RSS at 10x the data; data wait",
        quick=("--size-mb", "32", "--budget-s", "3"),
        rounds="script",
    ),
    Benchmark(
        "checkpoint",
        "bench_checkpoint.py",
        "sync / async save and restore vs raw I/O, DCP and torch.save, on disk (./bench_out) and tmpfs (/dev/shm)",
        quick=("--size-mb", "16", "--world", "2", "--repeat", "1"),
        rounds="suite",
        round_args=(
            "--repeat",
            "1",
        ),  # one round per run: each run measures every side (save/restore ones twice, A B B A)
        round_flag="--round",  # odd rounds lead with each ceiling (A B B A), even rounds with hpctrain
    ),
    Benchmark(
        "submit",
        "bench_submit.py",
        "--dry-run latency vs python / import torch; sbatch -> all ranks joined vs hand-written sbatch (with Slurm)",
        quick=("--repeats", "1"),
    ),
    Benchmark(
        "train",
        "bench_train.py",
        "metrics overhead (in process and end to end), the demo's steps/s, status latency",
        quick=("--steps", "150", "--rounds", "1", "--ab-blocks", "6", "--status-repeats", "5"),
    ),
    Benchmark(
        "identity",
        "bench_identity.py",
        "run identity capture at submit and at a start (uncached / cached) vs git and sha256sum",
        quick=("--files", "1000", "--data-gb", "0.25", "--repeats", "2"),
    ),
    Benchmark(
        "compile",
        "bench_compile.py",
        "a restart with torch.compile: warm (the run directory's cache) vs cold (a new node) vs eager",
        quick=("--hidden", "64", "--layers", "1"),
        timeout_s=(1800.0, 900.0),
        rounds="script",
    ),
    Benchmark(
        "recovery",
        "bench_recovery.py",
        "a rank SIGKILLed mid-step: in-job recovery (warm spare, state from memory) vs a restart from the last commit",
        quick=("--world", "2", "--hidden", "256", "--steps", "20", "--kill-at", "12", "--ckpt-every", "5"),
        timeout_s=(900.0, 600.0),
    ),
    Benchmark(
        "gpu_ckpt",
        "gpu_check_ckpt.py",
        "GPU: an async save of GPU state changed around it restores bit for bit; pinned arena size",
        quick=("--size-mb", "64", "--rounds", "2"),
        timeout_s=(300.0, 300.0),
        gpu=True,
        out_dir=True,
    ),
    Benchmark(
        "gpu_loader",
        "gpu_check_loader.py",
        "GPU: every GPU batch equals the CPU reference under a slow consumer; no pinned memory left",
        quick=("--samples", "2048"),
        timeout_s=(300.0, 300.0),
        gpu=True,
        out_dir=True,
    ),
    Benchmark(
        "gpu_sharded",
        "gpu_check_sharded.py",
        "GPU: FSDP2 checkpoint on NCCL, reshard restores exact, digests agree",
        quick=("--hidden", "256"),
        timeout_s=(300.0, 300.0),
        gpu=True,
        out_dir=True,
    ),
    Benchmark(
        "gpu_ddp",
        "gpu_check_ddp.py",
        "GPU: NCCL probe, one GPU per rank, the demo with checkpoints and a resume",
        timeout_s=(600.0, 600.0),
        gpu=True,
        out_dir=True,
    ),
)


@dataclasses.dataclass(frozen=True)
class Goal:
    """One row of the table: a figure a benchmark prints, what it is measured against, and its goal (if any)."""

    bench: str
    key: str  # dotted path into the benchmark's JSON; a list there is reduced to its median
    against: str  # what the figure compares hpctrain with (ceiling, peer, floor) or what it is
    op: tp.Optional[str] = None  # ">=", "<=", "==", or None: reported, no goal set
    target: tp.Union[float, bool, None] = None
    unit: str = "x"  # "x" (a ratio), "%" (a fraction), "s", "steps/s", "bool"
    source: str = ""  # where the goal was set

    def met(self, value: tp.Any) -> tp.Optional[bool]:
        if self.op is None or value is None:
            return None
        if self.op == "==":
            return bool(value == self.target)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        return value >= self.target if self.op == ">=" else value <= self.target  # type: ignore[operator]


_LOADER = "issue 4 · [data.md](data.md#measured)"
_CKPT = "issue 3 · [checkpoint.md](checkpoint.md#measured)"
_SUBMIT = "issue 2 · [submit.md](submit.md#measured)"
_TRAIN = "issue 9 · [train.md](train.md#measured)"
_IDENTITY = "issue 19 · [bundle.md](bundle.md#measured)"
_COMPILE = "issue 32 · [preemption.md](preemption.md#a-warm-compile-on-restart)"
_RECOVERY = "issue 32 · [preemption.md](preemption.md#in-job-recovery)"
_REPEATED = "issue 34 · [checkpoint.md](checkpoint.md#bandwidth-as-a-fraction-of-the-ceiling)"
_AMPLIFICATION = "issue 11 · [checkpoint.md](checkpoint.md#measured)"
_GPU = {
    "gpu_ckpt": "issue 12 · [checkpoint.md](checkpoint.md#gpu-notes)",
    "gpu_loader": "issue 12 · [data.md](data.md#gpu-batches)",
    "gpu_sharded": "issue 11 · [checkpoint.md](checkpoint.md#restore-read-once-verify-together)",
    "gpu_ddp": "issue 12 · [submit.md](submit.md#how-it-works)",
}


def _ckpt_rows(fs: str) -> tp.Tuple[Goal, ...]:
    """The checkpoint benchmark's rows for one filesystem (``disk`` or ``tmpfs``): ratios > 1 mean hpctrain is
    faster, except ``async_block_*`` (hpctrain's time over the other's: lower is better) and the amplification."""
    return (
        Goal("checkpoint", f"{fs}.save_vs_raw", "raw write+fsync of the same bytes (ceiling)", ">=", 0.8, "x", _CKPT),
        Goal("checkpoint", f"{fs}.save_vs_dcp", "DCP save (peer)", ">=", 4.0, "x", _CKPT),
        Goal("checkpoint", f"{fs}.save_vs_torch_save", "torch.save on rank 0 + fsync (peer)", ">=", 1.5, "x", _CKPT),
        Goal(
            "checkpoint",
            f"{fs}.async_block_vs_copy",
            "one in-memory copy of the state (floor; hpctrain's blocking time / it)",
            "<=",
            1.5,
            "x",
            _CKPT,
        ),
        Goal("checkpoint", f"{fs}.async_block_vs_dcp", "DCP async_save blocking time (peer)", "<=", 0.5, "x", _CKPT),
        Goal(
            "checkpoint",
            f"{fs}.restore_vs_raw",
            "raw read-once: 1/world of the bytes read into the node's /dev/shm, the whole mapped, the model's "
            "bytes copied into its tensors (ceiling)",
            ">=",
            0.9,
            "x",
            _REPEATED,
        ),
        Goal("checkpoint", f"{fs}.restore_vs_dcp", "DCP load, cold (peer)", ">=", 5.0, "x", _CKPT),
        Goal(
            "checkpoint",
            f"{fs}.restore_read_amplification",
            "bytes read by all ranks / checkpoint size",
            "<=",
            1.05,
            "x",
            _AMPLIFICATION,
        ),
        Goal("checkpoint", f"{fs}.restore_read_all_vs_raw_all", "every rank reading every shard (read_all's ceiling)"),
    )


GOALS: tp.Tuple[Goal, ...] = (
    Goal("loader", "uncompressed_vs_ceiling", "one process preading the same bytes (ceiling)", ">=", 0.8, "x", _LOADER),
    Goal("loader", "uncompressed_vs_peer", "DataLoader over per-sample h5py (peer)", ">=", 10.0, "x", _LOADER),
    Goal("loader", "gzip_vs_ceiling", "one h5py read_direct with decompression (ceiling)", ">=", 1.5, "x", _LOADER),
    Goal("loader", "gzip_vs_peer", "DataLoader over per-sample h5py (peer)", ">=", 20.0, "x", _LOADER),
    Goal(
        "loader",
        "rss_growth_10x",
        "loader PSS with 1x the data ('flat' read as at most 1.2)",
        "<=",
        1.2,
        "x",
        _LOADER,
    ),
    Goal("loader", "data_wait_frac", "wall time of a loop with a 20 ms step (gzip)", unit="%"),
    *_ckpt_rows("disk"),
    *_ckpt_rows("tmpfs"),
    Goal("submit", "dry_run_s", "`--dry-run` wall time ('well under a second')", "<=", 1.0, "s", _SUBMIT),
    Goal("submit", "dry_run_vs_python_startup", "`python -c pass` (floor)"),
    Goal("submit", "dry_run_vs_torch_import", "`python -c 'import torch'` (a login tool that imports torch)"),
    Goal("submit", "startup_vs_raw_sbatch", "hand-written sbatch + srun + init_process_group (peer; Slurm only)"),
    Goal(
        "train",
        "metrics_overhead_in_process",
        "the demo's step on 2 ranks, metrics off (what metrics add per step / it)",
        "<=",
        0.01,
        "%",
        _TRAIN,
    ),
    Goal("train", "metrics_overhead_median", "end to end: the demo with --no-metrics, same run", unit="%"),
    Goal("train", "steps_per_s_metrics_on", "end-to-end demo throughput (2 ranks, gloo; median)", unit="steps/s"),
    Goal("train", "status_vs_python_pass", "`python -c pass` (floor)"),
    Goal("identity", "submit.ratio_vs_ceiling", "git status + diff + archive | gzip -1 (ceiling)"),
    Goal("identity", "start.ratio_uncached_vs_ceiling", "git status + sha256sum of the sampled bytes, cold (ceiling)"),
    Goal("identity", "start.ratio_cached_vs_ceiling", "git status (ceiling)"),
    Goal("identity", "start.cached_s", "a restart's capture, content tier cached", unit="s"),
    Goal("identity", "full_hash.cold.ratio", "sha256sum of the whole file, cold (peer)"),
    Goal(
        "compile",
        "warm_vs_cold",
        "the same restart compiling cold (a new node's empty cache)",
        "<=",
        0.8,
        "x",
        _COMPILE,
    ),  # fmt: skip
    Goal("compile", "warm_vs_eager", "the same restart without compile (ceiling)"),
    Goal(
        "recovery",
        "ratio",
        "restart from the last commit: new processes, import, rendezvous, restore (no Slurm step, no queue)",
        ">=",
        2.0,
        "x",
        _RECOVERY,
    ),
    Goal("recovery", "in_job_failure_to_first_step_s", "in-job: the kill -> the first new step", unit="s"),
    Goal(
        "recovery",
        "bit_exact",
        "the in-job run's final parameters equal an uninterrupted run's",
        "==",
        True,
        "bool",
        _RECOVERY,
    ),
    *(Goal(b, "ok", "every assertion of the check held", "==", True, "bool", source) for b, source in _GPU.items()),
)


ROUNDS_HELP = {
    "suite": "rounds: the script run N times, one interleaved round each",
    "script": "rounds: passed to the script, which interleaves them",
    "once": "run once (its own repeats inside)",
}


def goal(bench: str, key: str) -> tp.Any:
    """The target of GOALS' row ``bench``/``key`` (for a benchmark that prints its own goal)."""
    return next(g.target for g in GOALS if g.bench == bench and g.key == key)


# ------------------------------------------------------------------------------------------------ running


def extras(spec: tp.Optional[str]) -> tp.List[Benchmark]:
    """The benchmarks ``HPCTRAIN_BENCH_EXTRA`` registers: ``NAME=SCRIPT`` entries separated by ``;``."""
    out = []
    for entry in filter(None, (e.strip() for e in (spec or "").split(";"))):
        name, sep, script = entry.partition("=")
        if not sep or not name.strip() or not script.strip():
            raise ValueError(f"{EXTRA_ENV}: {entry!r} is not NAME=SCRIPT")
        out.append(Benchmark(name.strip(), str(Path(script.strip()).resolve()), f"extra ({EXTRA_ENV})"))
    return out


def detect_gpu() -> tp.Dict[str, tp.Any]:
    """Whether this machine has a GPU, without importing torch here: ``nvidia-smi -L``, else torch in a child."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
            gpus = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
        except (OSError, subprocess.TimeoutExpired):
            gpus = []
        return {"present": bool(gpus), "how": "nvidia-smi -L", "gpus": gpus}
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=ENV)
        n = int(r.stdout.split()[-1]) if r.returncode == 0 and r.stdout.split() else 0
    except (OSError, subprocess.TimeoutExpired, ValueError):
        n = 0
    return {
        "present": n > 0,
        "how": "no nvidia-smi; torch.cuda in a child process",
        "gpus": [f"cuda:{i}" for i in range(n)],
    }


def last_line(*texts: str) -> str:
    """The last non-empty line of the first text that has one (stderr, then stdout)."""
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1][:300]
    return ""


def run_one(b: Benchmark, quick: bool, work: Path, repeat: int = 1) -> tp.Dict[str, tp.Any]:
    """Run one benchmark, honouring ``repeat`` as ``b.rounds`` says; the record gets ``rounds`` (each round's
    load average before / after and figures) and ``spread`` (each figure's median and min-max over the rounds;
    None for a benchmark run once)."""
    if b.rounds == "suite":
        recs, rounds = [], []
        for i in range(1, repeat + 1):
            before = _rounds.load_1min()
            args = [*b.round_args, *((b.round_flag, str(i)) if b.round_flag else ())]
            rec = run_proc(b, quick, work, args, f"{b.name}.round{i}")
            rounds.append(_rounds.Round(i, before, _rounds.load_1min(), _rounds.flatten(rec["result"]), rec["seconds"]))
            recs.append(rec)
            if rec["status"] != "ok":
                break
        out = dict(recs[-1])
        out["seconds"] = round(sum(r["seconds"] or 0 for r in recs), 1)
        out["argv"] = recs[0]["argv"]
        out["files"] = [r["files"] for r in recs]
        if out["status"] == "ok":
            out["result"] = _rounds.medians([r["result"] for r in recs])
        rep = _rounds.report(rounds)
        out["rounds"], out["spread"] = rep["rounds"], rep["spread"]
        return out
    extra = ["--repeat", str(repeat)] if b.rounds == "script" else list(b.round_args if b.rounds == "suite" else ())
    rec = run_proc(b, quick, work, extra, b.name)
    result = rec["result"] if isinstance(rec["result"], dict) else {}
    rec["rounds"] = result.get("rounds") if b.rounds == "script" else None
    rec["spread"] = result.get("spread") if b.rounds == "script" else None
    return rec


def run_proc(b: Benchmark, quick: bool, work: Path, extra: tp.Sequence[str], tag: str) -> tp.Dict[str, tp.Any]:
    """Run one benchmark's script once as a subprocess (its own session, so a timeout kills its children too)."""
    script = Path(b.script) if os.path.isabs(b.script) else ROOT / "benchmarks" / b.script
    files = {"json": work / f"{tag}.json", "stdout": work / f"{tag}.stdout", "stderr": work / f"{tag}.stderr"}
    args = [*(b.quick if quick else ()), *extra]
    if b.out_dir:
        out = work / tag
        args += ["--out", str(out)]
        files["json"] = out / f"{script.stem}.json"
    else:
        args += ["--json", str(files["json"])]
    argv = [sys.executable, str(script), *args]
    rec: tp.Dict[str, tp.Any] = {
        "status": "failed",
        "script": str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script),
        "argv": [str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script), *args],
        "exit_code": None,
        "seconds": None,
        "error": None,
        "files": {k: str(v) for k, v in files.items()},
        "result": None,
    }
    files["json"].unlink(missing_ok=True)
    timeout = b.timeout_s[1 if quick else 0]
    t0 = time.monotonic()
    with open(files["stdout"], "w") as so, open(files["stderr"], "w") as se:
        proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=so, stderr=se, start_new_session=True)
        try:
            rc: tp.Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:  # Ctrl-C: take the benchmark and its children down with us
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers (a timed-out run, orphaned workers)
            except ProcessLookupError:
                pass
            proc.wait()
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["exit_code"] = rc
    err = last_line(files["stderr"].read_text(errors="replace"), files["stdout"].read_text(errors="replace"))
    try:
        rec["result"] = json.loads(files["json"].read_text()) if files["json"].exists() else None
    except ValueError as e:
        err = err or f"its JSON does not parse: {e}"
    if rc is None:
        rec["error"] = f"timed out after {timeout:.0f} s" + (f" (last stderr line: {err})" if err else "")
    elif b.gpu and rc == 2:
        rec["status"], rec["error"] = "skipped", err or "exit 2: CUDA not available"
    elif rc != 0:
        failures = (rec["result"] or {}).get("failures") if isinstance(rec["result"], dict) else None
        rec["error"] = err or (f"{failures[0]}" if failures else f"exit {rc}")
    elif rec["result"] is None:
        rec["error"] = err or f"exit 0 but no JSON at {files['json']}"
    else:
        rec["status"] = "ok"
    return rec


# ------------------------------------------------------------------------------------------------ rows


def lookup(result: tp.Any, key: str) -> tp.Any:
    """``a.b.c`` in a nested dict; a list of numbers becomes its median; None when absent."""
    value = result
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, list):
        nums = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return statistics.median(nums) if nums else None
    return value if isinstance(value, (int, float, bool)) else None


def make_rows(benchmarks: tp.Sequence[Benchmark], records: tp.Mapping[str, tp.Any]) -> tp.List[tp.Dict[str, tp.Any]]:
    rows = []
    for b in benchmarks:
        rec = records[b.name]
        goals = [g for g in GOALS if g.bench == b.name]
        if rec["status"] != "ok" or not goals:
            rows.append(
                {
                    "benchmark": b.name,
                    "metric": None,
                    "against": None,
                    "unit": None,
                    "goal": None,
                    "measured": None,
                    "met": None,
                    "status": rec["status"],  # ok (ran; no figures to collect), failed or skipped
                    "note": rec["error"] if rec["status"] != "ok" else "ran; no figures collected",
                    "spread": None,
                }
            )
            continue
        for g in goals:
            spread = (rec.get("spread") or {}).get(g.key)
            value = spread["median"] if spread else lookup(rec["result"], g.key)
            met = g.met(value)
            status = "not measured" if value is None else "reported" if g.op is None else "met" if met else "not met"
            rows.append(
                {
                    "benchmark": b.name,
                    "metric": g.key,
                    "against": g.against,
                    "unit": g.unit,
                    "goal": None if g.op is None else {"op": g.op, "target": g.target, "source": g.source},
                    "measured": value,
                    "met": met,
                    "status": status,
                    "note": None,
                    "spread": None
                    if not spread
                    else {k: spread[k] for k in ("min", "max", "rounds", "values")}
                    | {"load_changed_rounds": _marked(rec, g.key)},
                }
            )
    return rows


def _marked(rec: tp.Mapping[str, tp.Any], key: str) -> tp.List[int]:
    """The rounds that measured ``key`` while the load changed by more than a core."""
    return [r["round"] for r in rec.get("rounds") or () if r["load_changed"] and key in r["figures"]]


def fmt_value(value: tp.Any, unit: tp.Optional[str]) -> str:
    if value is None:
        return "—"
    if unit == "bool" or isinstance(value, bool):
        return "pass" if value else "fail"
    if unit == "%":
        return f"{value * 100:.3g} %"
    if unit == "s":
        return f"{value:.3g} s"
    if unit == "steps/s":
        return f"{value:.4g} steps/s"
    return f"{value:.3g}"


def fmt_spread(spread: tp.Optional[tp.Mapping[str, tp.Any]], unit: tp.Optional[str]) -> str:
    """``min–max`` of a row's per-round figures; ``—`` for a figure measured once (no rounds)."""
    if not spread:
        return "—"
    return _rounds.fmt_spread({**spread, "median": None}, lambda v: fmt_value(v, unit))


def fmt_rounds(spread: tp.Optional[tp.Mapping[str, tp.Any]]) -> str:
    """How many rounds measured a figure, and how many of them are marked (load changed by more than a core)."""
    if not spread:
        return "1"
    marked = spread.get("load_changed_rounds") or []
    return f"{spread['rounds']}" + (f" ({len(marked)} marked: {', '.join(map(str, marked))})" if marked else "")


def fmt_goal(g: tp.Optional[tp.Mapping[str, tp.Any]], unit: tp.Optional[str]) -> str:
    if not g:
        return "—"
    if g["op"] == "==":
        return "pass" if g["target"] is True else f"= {g['target']}"
    return f"{'≥' if g['op'] == '>=' else '≤'} {fmt_value(g['target'], unit)}"


def _cell(text: tp.Any) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def markdown(report: tp.Mapping[str, tp.Any]) -> str:
    host, s = report["host"], report["summary"]
    gpu = "GPU: " + ", ".join(host["gpu"]["gpus"]) if host["gpu"]["present"] else f"no GPU ({host['gpu']['how']})"
    load = host["load_average_1min"]
    lines = [
        f"`{' '.join(report['argv'])}` · {report['started_at'][:16].replace('T', ' ')} UTC · "
        f"{'quick settings' if report['quick'] else 'reference settings'} · {host['cpus']} CPUs, load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end · {gpu} · {report['seconds'] / 60:.1f} min",
        "",
        "| benchmark | ratio | against | goal | median | spread (min–max) | rounds | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        met = {"met": "yes", "not met": "**no**", "reported": "—", "not measured": "not measured", "ok": "ran"}.get(
            r["status"]
        )
        if met is None:  # failed / skipped benchmark
            met = f"{r['status']}: {r['note']}" if r["note"] else r["status"]
        lines.append(
            "| "
            + " | ".join(
                _cell(c)
                for c in (
                    r["benchmark"],
                    f"`{r['metric']}`" if r["metric"] else "—",
                    r["against"] or "—",
                    fmt_goal(r["goal"], r["unit"]),
                    fmt_value(r["measured"], r["unit"]),
                    fmt_spread(r.get("spread"), r["unit"]),
                    fmt_rounds(r.get("spread")),
                    met,
                )
            )
            + " |"
        )
    loads = [
        f"{name}: "
        + ", ".join(
            f"{r['round']}: {r['load_1min'][0]:.1f}→{r['load_1min'][1]:.1f}"
            + (" (marked)" if r["load_changed"] else "")
            for r in rec["rounds"]
        )
        for name, rec in (report.get("benchmarks") or {}).items()
        if rec.get("rounds")
    ]
    if loads:
        lines += [
            "",
            "median: of the per-round figures (each round measures hpctrain, its ceiling and its peer interleaved, "
            "the checkpoint's saves and restores and their ceilings twice, A B B A; the ratio is taken per round); "
            "spread: their min–max; a goal is met when the median "
            f"meets it. 1-min load average before→after each round (marked: it moved by more than "
            f"{_rounds.LOAD_CHANGE_CORES:g} core) — " + "; ".join(loads) + ".",
        ]
    lines += [
        "",
        f"{s['ok']} of {s['benchmarks']} benchmarks ran"
        + (f"; failed: {', '.join(s['failed'])}" if s["failed"] else "")
        + (f"; skipped: {', '.join(s['skipped'])}" if s["skipped"] else "")
        + f". Goals met: {s['met']} of {s['goals']}.",
    ]
    return "\n".join(lines) + "\n"


def goals_markdown() -> str:
    """GOALS as a markdown table (docs/benchmarks.md holds exactly this; ``--goals`` prints it)."""
    lines = ["| benchmark | ratio | against | goal | set in |", "| --- | --- | --- | --- | --- |"]
    for g in GOALS:
        if g.op is not None:
            cells = (g.bench, f"`{g.key}`", g.against, fmt_goal({"op": g.op, "target": g.target}, g.unit), g.source)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ picture


def _esc(text: tp.Any) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg(report: tp.Mapping[str, tp.Any]) -> str:
    """A horizontal bar per row with a goal: measured / goal (goal / measured for a ``<=`` goal), log scale, so a
    bar that reaches the goal line meets it; failed and skipped benchmarks as grey rows. Drawn by hpctrain's
    one chart engine (:mod:`hpctrain.charts`, its ratio bars)."""
    from hpctrain.charts.bars import Bar, ratio_bars

    lo, hi = 0.1, 10.0
    bars = []
    for r in report["rows"]:
        if r["goal"] is None and r["status"] not in ("failed", "skipped"):
            continue
        label = f"{r['benchmark']} · {r['metric']}" if r["metric"] else r["benchmark"]
        if r["status"] in ("failed", "skipped"):
            fill = "#9e9e9e" if r["status"] == "failed" else "#e0e0e0"
            bars.append(Bar(label, None, fill, note=f"{r['status']}: {r['note'] or ''}"))
            continue
        g, m = r["goal"], r["measured"]
        if g["op"] == "==" or isinstance(m, bool):
            ratio = 1.0 if r["met"] else lo
        elif m is None:
            ratio = lo
        elif g["op"] == ">=":
            ratio = m / g["target"] if g["target"] else hi
        else:
            ratio = g["target"] / m if m > 0 else hi
        colour = "#2e7d32" if r["met"] else ("#bdbdbd" if m is None else "#c62828")
        text = f"{fmt_value(m, r['unit'])} (goal {fmt_goal(g, r['unit'])})" if m is not None else "not measured"
        bars.append(Bar(label, ratio, colour, text=text))
    settings = "quick settings" if report["quick"] else "reference settings"
    return (
        ratio_bars(
            bars,
            title=f"hpctrain benchmarks: measured against goal ({settings}, {report['started_at'][:10]})",
            subtitle="bar: measured / goal (goal / measured where lower is better), log scale; "
            "a bar that reaches the goal line meets its goal",
            lo=lo,
            hi=hi,
        )
        + "\n"
    )


# ------------------------------------------------------------------------------------------------ main


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=f"Names: {', '.join(b.name for b in BENCHMARKS)}."
    )
    ap.add_argument("--quick", action="store_true", help="each benchmark's smallest meaningful settings")
    ap.add_argument(
        "--json",
        type=Path,
        default=ROOT / "bench_out" / "benchmarks.json",
        help="where the JSON goes; the .md and .svg go next to it (default: bench_out/benchmarks.json)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        help="rounds per benchmark: hpctrain, ceiling and peer measured once per round, interleaved; the median and "
        "min-max of the per-round ratios are reported (default: 3, with --quick 1)",
    )
    ap.add_argument("--only", help="comma-separated names of the benchmarks to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and their quick settings, run nothing")
    ap.add_argument("--goals", action="store_true", help="print the goals as a markdown table, run nothing")
    args = ap.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    try:
        registry = [*BENCHMARKS, *extras(os.environ.get(EXTRA_ENV))]
    except ValueError as e:
        ap.error(str(e))
    if args.goals:
        print(goals_markdown(), end="")
        return 0
    if args.list:
        for b in registry:
            print(
                f"{b.name:12} {b.script:22} {'[GPU] ' if b.gpu else ''}{b.what}\n{'':35}--quick: {' '.join(b.quick)}"
                f"\n{'':35}--repeat: {ROUNDS_HELP[b.rounds]}"
            )
        return 0
    names = [b.name for b in registry]
    if len(set(names)) != len(names):
        ap.error(f"a benchmark name is registered twice: {names}")
    selected = registry
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown or not wanted:
            ap.error(f"--only: unknown benchmark {', '.join(unknown) or '(none given)'}; names: {', '.join(names)}")
        selected = [b for b in registry if b.name in wanted]

    json_path = args.json.resolve()
    work = json_path.with_suffix("").with_name(json_path.stem + ".d")
    work.mkdir(parents=True, exist_ok=True)
    started, t0, load0 = _now(), time.monotonic(), os.getloadavg()[0]
    gpu = detect_gpu() if any(b.gpu for b in selected) else {"present": False, "how": "not asked", "gpus": []}
    records: tp.Dict[str, tp.Any] = {}
    for i, b in enumerate(selected, 1):
        print(f"[{i}/{len(selected)}] {b.name}: {b.what}", file=sys.stderr, flush=True)
        if b.gpu and not gpu["present"]:
            records[b.name] = {
                "status": "skipped",
                "script": f"benchmarks/{b.script}",
                "argv": None,
                "exit_code": None,
                "seconds": None,
                "error": f"no GPU ({gpu['how']})",
                "files": None,
                "result": None,
                "rounds": None,
                "spread": None,
            }
        else:
            records[b.name] = run_one(b, args.quick, work, repeat)
        rec = records[b.name]
        took = f" ({rec['seconds']:.0f} s)" if rec["seconds"] is not None else ""
        print(f"    {rec['status']}{took}{': ' + rec['error'] if rec['error'] else ''}", file=sys.stderr, flush=True)

    rows = make_rows(selected, records)
    with_goal = [r for r in rows if r["goal"] is not None]
    report = {
        "schema": SCHEMA,
        "quick": args.quick,
        "repeat": repeat,
        "argv": ["python", "benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])],
        "started_at": started,
        "finished_at": _now(),
        "seconds": round(time.monotonic() - t0, 1),
        "host": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "gpu": gpu,
        },
        "benchmarks": records,
        "rows": rows,
        "summary": {
            "benchmarks": len(selected),
            "ok": sum(r["status"] == "ok" for r in records.values()),
            "failed": [n for n, r in records.items() if r["status"] == "failed"],
            "skipped": [n for n, r in records.items() if r["status"] == "skipped"],
            "goals": len(with_goal),
            "met": sum(r["met"] is True for r in with_goal),
            "not_met": [f"{r['benchmark']}.{r['metric']}" for r in with_goal if r["met"] is False],
        },
    }
    md = markdown(report)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    json_path.with_suffix(".md").write_text(md)
    json_path.with_suffix(".svg").write_text(svg(report))
    print(md)
    print(f"wrote {json_path}, {json_path.with_suffix('.md')}, {json_path.with_suffix('.svg')}", file=sys.stderr)
    return 1 if report["summary"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
