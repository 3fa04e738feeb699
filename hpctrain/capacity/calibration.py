"""What a calibration run measured, read from its run directory (standard library only, never torch).

One :class:`Calibration` per world size a run directory trained at (a run resumed on another number of
ranks gives two). Everything comes from the records hpctrain already writes (docs/train.md):

* ``train/metrics.jsonl`` interval records: per-step data wait, compute (``forward_backward``), exposed
  gradient communication, optimizer and checkpoint time (the median over ranks, then over intervals; the
  first interval of each attempt is left out: it holds the FLOP count and warm-up), samples per step,
  samples/s, FLOPs per sample, and the stall of each periodic save;
* ``train/ledger.jsonl``: start-up (``startup_s`` of fresh starts), restore (the extra start-up of resumed
  starts), down time (``down_s``), the blocking save (``last_save_s`` of end records), the hosts (the
  node count), the checkpoint policy;
* the newest committed checkpoint: its size (manifests), its model's gradient bytes (shard headers), the
  dataset size the loader recorded (``data_state.loader.num_samples``);
* ``identity/``: the data fingerprint's HDF5 structure (samples and bytes per sample);
* ``submission.json``: GPUs per node and the time limit;
* ``capacity/allreduce.json``: the all-reduce probe of ``hpctrain.launch.probe`` when the run had one;
* the interval records' ``input`` (rank 0's loader: bytes read, reader seconds, readers, samples): bytes read
  per sample and the rate a rank's readers read at; ``stage/<attempt>/<node>.json`` (``submit --stage``): what
  each node copied and how long it took.

Each field says where it came from; a missing record is a ``None`` field and one line in ``notes``.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import typing as tp
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.errors import UsageError
from hpctrain.run import checkpoint_dir as run_checkpoint_dir
from hpctrain.rundir import PROBE_SCHEMA, STAGE_SCHEMA, RunDir, read_json, read_jsonl
from hpctrain.status.schema import SCHEMAS, sanitize

__all__ = ["Calibration", "PROBE_SCHEMA", "probe_path", "read_calibrations"]

METRICS_TAIL_BYTES = 16 << 20
"""A calibration run is short; a long run's metrics are read as their last 16 MiB."""
PARTS = ("data_wait_s", "forward_backward_s", "grad_comm_exposed_s", "optimizer_s", "checkpoint_s")
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def probe_path(run_dir: tp.Union[str, "os.PathLike[str]"]) -> Path:
    """Where :mod:`hpctrain.launch.probe` (the node-side entry) writes its all-reduce timings in a run directory."""
    return RunDir(run_dir).capacity_probe


@dataclass
class Calibration:
    """One world size's measurements. Times are seconds per step unless named otherwise."""

    run_dir: str
    world_size: int
    nodes: int
    """Distinct hosts of the starts at this world size (a local run: 1)."""
    ranks_per_node: float
    gpus_per_node: int
    """From the submission (0: a CPU job over gloo)."""
    global_batch: float
    """Samples of all ranks per optimizer step."""
    local_batch: float
    intervals: int
    """Interval records used (the first of each attempt left out)."""
    step_s: float
    """The median step without its checkpoint stall."""
    data_wait_s: float
    """The median rank's data wait (the median over ranks, then over intervals)."""
    compute_s: float
    """``forward_backward``: the backward's communication wait is carved out of it."""
    comm_s: float
    """Exposed gradient communication."""
    optimizer_s: float
    other_s: float
    """The step less its parts (medians over ranks do not add up exactly)."""
    samples_per_s: float
    data_wait_slowest_s: tp.Optional[float] = None
    """What a synchronous step waited for input: each step's maximum over ranks, meaned over the interval
    (``data_wait_step_max_s``), then the median over intervals; records without it: the slowest rank's per-step
    mean (a lower bound: the late rank changes from step to step). With storage the bound, every step waits for
    the last rank's batch: that rank's wait is the step's, the others spend the same time in the gradient
    all-reduce (exposed communication), so the median rank's ``data_wait_s`` shows only part of it
    (docs/capacity.md)."""
    flops_per_sample: tp.Optional[float] = None
    save_stall_s: tp.Optional[float] = None
    """What a periodic save blocked the step for (async: the copy to host memory)."""
    save_commit_s: tp.Optional[float] = None
    """A blocking save, start to commit (the ledger's ``last_save_s``)."""
    async_save: tp.Optional[bool] = None
    startup_s: tp.Optional[float] = None
    restore_s: tp.Optional[float] = None
    down_s: tp.Optional[float] = None
    """Down time between attempts beyond start-up (queue wait, requeue), from resumed starts."""
    checkpoint_bytes: tp.Optional[int] = None
    grad_bytes: tp.Optional[int] = None
    dataset_samples: tp.Optional[int] = None
    bytes_per_sample: tp.Optional[float] = None
    """Bytes per sample of the dataset's arrays (the HDF5 structure in ``identity/``)."""
    dataset_bytes: tp.Optional[int] = None
    """The input files' size (the data fingerprint): what a stage copies."""
    read_bytes_per_sample: tp.Optional[float] = None
    """The loader's bytes read per sample delivered (``input``: read amplification included; decoded size)."""
    rank_read_rate: tp.Optional[float] = None
    """Bytes/s one rank's readers read at together: bytes read / reader seconds x readers (``input``)."""
    staged: bool = False
    """The run read node-local copies (it has stage records): its read rate is the node-local one."""
    stage_nodes: int = 0
    stage_bytes: tp.Optional[float] = None
    """Bytes a node staged (copied or reused; the median over nodes and attempts)."""
    stage_copy_s: tp.Optional[float] = None
    """Seconds a node took to copy, over the records that copied (the median)."""
    stage_copy_rate: tp.Optional[float] = None
    """Bytes copied / copy seconds of a node (the median)."""
    total_steps: tp.Optional[int] = None
    time_limit_s: tp.Optional[float] = None
    probe: tp.Optional[tp.Dict[str, tp.Any]] = None
    """``{"world_size", "nodes", "sizes": [[bytes, seconds], ...]}``."""
    notes: tp.List[str] = field(default_factory=list)

    def as_dict(self) -> tp.Dict[str, tp.Any]:
        return asdict(self)


def _median(values: tp.Sequence[float]) -> tp.Optional[float]:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _part(rec: tp.Mapping[str, tp.Any], name: str, stat: str = "median") -> tp.Optional[float]:
    got = ((rec.get("per_step") or {}).get(name) or {}).get(stat)
    return float(got) if isinstance(got, (int, float)) else None


def _slowest_wait(recs: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Optional[float]:
    """``Calibration.data_wait_slowest_s``: the step's wait (per-step max over ranks) where the records carry it."""
    step_max = [r.get("data_wait_step_max_s") for r in recs]
    if any(isinstance(v, (int, float)) for v in step_max):
        return _median([float(v) for v in step_max if isinstance(v, (int, float))])
    return _median([_part(r, "data_wait_s", "max") for r in recs])


def _intervals(records: tp.List[tp.Dict[str, tp.Any]], notes: tp.List[str]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The measured interval records, the first of each attempt left out (warm-up, FLOP counting)."""
    out, attempt, last_step = [], None, -1
    problems: tp.List[str] = []
    for n, raw in enumerate(records):
        if raw.get("kind") != "interval":
            continue
        rec = sanitize(raw, SCHEMAS["metrics.interval"], f"metrics.jsonl record {n}", problems)
        key = (rec.get("job_id"), rec.get("restart_count"))
        first = key != attempt or rec["step"] is None or rec["step"] <= last_step
        attempt, last_step = key, rec["step"] if rec["step"] is not None else last_step
        rec["_first"] = first
        if rec.get("measured") is False:
            continue
        if None in (rec.get("world_size"), rec.get("steps"), rec.get("samples"), _part(rec, "step_s")):
            continue
        out.append(rec)
    notes += problems[:5]
    steady = [r for r in out if not r["_first"]]
    if out and not steady:
        notes.append("only the first interval of each attempt was measured (it includes warm-up): used anyway")
        return out
    return steady


def _stall_per_save(recs: tp.List[tp.Dict[str, tp.Any]], every_steps: tp.Optional[int]) -> tp.Optional[float]:
    """The slowest rank's checkpoint stall per save, over the intervals that saved."""
    stalls = []
    for r in recs:
        ck = _part(r, "checkpoint_s", "max")
        if not ck or not r.get("steps"):
            continue
        saves = 1
        if every_steps:
            first = r["step"] - r["steps"] + 1
            saves = max(1, r["step"] // every_steps - (first - 1) // every_steps)
        stalls.append(ck * r["steps"] / saves)
    return _median(stalls)


def _ledger(
    paths: RunDir, notes: tp.List[str]
) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[tp.Dict[str, tp.Any]]]:
    records, bad = read_jsonl(paths.ledger)
    notes += bad[:3]
    problems: tp.List[str] = []
    starts, ends = [], []
    for n, r in enumerate(records):
        event = r.get("event")
        if event in ("start", "end"):
            clean = sanitize(r, SCHEMAS[f"ledger.{event}"], f"ledger.jsonl record {n}", problems)
            (starts if event == "start" else ends).append(clean)
    notes += problems[:5]
    return starts, ends


def _checkpoint(ckpt_dir: tp.Optional[str], notes: tp.List[str]) -> tp.Dict[str, tp.Any]:
    """Size, gradient bytes and the loader's sample count of the newest committed checkpoint."""
    if not ckpt_dir or not os.path.isdir(ckpt_dir):
        return {}
    from hpctrain.ckpt import read_index, scan
    from hpctrain.errors import HpctrainError

    try:
        committed = [e for e in scan(ckpt_dir) if e.status == "committed"]
    except (OSError, ValueError) as exc:
        notes.append(f"checkpoints {shorten(ckpt_dir)}: {exc}; sizes unknown")
        return {}
    if not committed:
        return {}
    newest = committed[-1]
    out: tp.Dict[str, tp.Any] = {"checkpoint_bytes": newest.bytes}
    loader = ((newest.manifest or {}).get("data_state") or {}).get("loader") or {}
    if isinstance(loader.get("num_samples"), int) and loader["num_samples"] > 0:
        out["dataset_samples"] = loader["num_samples"]
    try:
        index = read_index(newest.path)
        grads = [
            math.prod(t.shape) * _ITEMSIZE[t.dtype]
            for key, t in index.tensors.items()
            if key.startswith("model/") and t.dtype in _ITEMSIZE
        ]
        out["grad_bytes"] = int(sum(grads)) if grads else None
    except (HpctrainError, OSError, ValueError, KeyError) as exc:
        notes.append(f"checkpoint {newest.name}: {shorten(str(exc), 160)}; gradient bytes unknown")
    return out


_DTYPE = re.compile(r"[<>|=]?[a-zA-Z](\d{1,2})")


def _identity_data(paths: RunDir, notes: tp.List[str]) -> tp.Dict[str, tp.Any]:
    """Samples and bytes per sample from the newest identity record's HDF5 structure: the datasets that share
    the most common leading dimension are the sample arrays."""
    try:
        records = sorted(p for p in paths.identity.glob("*-r*.json") if p.name != "submit.json")
    except OSError:
        return {}
    for path in reversed(records):
        problems: tp.List[str] = []
        manifest = read_json(path, problems) or {}
        files = (manifest.get("data") or {}).get("files") or []
        samples, per_sample = 0, None
        sizes = [((f or {}).get("cheap") or {}).get("size") for f in files]
        total = sum(int(x) for x in sizes if isinstance(x, int) and not isinstance(x, bool) and x > 0) or None
        for f in files:
            structure = ((f or {}).get("cheap") or {}).get("structure") or {}
            shapes = [
                (d["shape"], d.get("dtype") or "")
                for d in structure.values()
                if isinstance(d, dict)
                and d.get("type") == "dataset"
                and isinstance(d.get("shape"), list)
                and d["shape"]
            ]
            if not shapes:
                continue
            lead = statistics.mode(s[0] for s, _ in shapes)
            samples += int(lead)
            size = 0.0
            for shape, dtype in shapes:
                m = _DTYPE.fullmatch(str(dtype))
                if shape[0] == lead and m:
                    size += math.prod(int(x) for x in shape[1:]) * int(m.group(1))
            per_sample = size or per_sample
        if samples:
            return {"dataset_samples": samples, "bytes_per_sample": per_sample, "dataset_bytes": total}
    return {}


def _input(recs: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """Bytes read per sample and one rank's read rate from the interval records' ``input`` (rank 0's loader), over
    all the intervals used: total bytes read / total samples (an interval's reads need not end on its batches: the
    readers read ahead), total bytes read / total reader seconds x readers."""
    read = secs = samples = 0.0
    readers: tp.List[float] = []
    for r in recs:
        got = r.get("input")
        if not isinstance(got, dict):
            continue
        vals = [got.get(k) for k in ("bytes_read", "read_s", "samples", "readers")]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vals):
            continue
        if vals[0] < 0 or vals[1] < 0 or vals[2] < 0 or vals[3] < 1:
            continue
        read, secs, samples = read + vals[0], secs + vals[1], samples + vals[2]
        readers.append(vals[3])
    return {
        "read_bytes_per_sample": read / samples if read > 0 and samples > 0 else None,
        "rank_read_rate": read / secs * max(readers) if read > 0 and secs > 0 else None,
    }


def _stage(paths: RunDir, notes: tp.List[str]) -> tp.Dict[str, tp.Any]:
    """What ``submit --stage`` did on each node (``RUN_DIR/stage/<attempt>/<node>.json``): bytes, copy seconds."""
    try:
        records = sorted((paths.root / "stage").glob("*/*.json"))
    except OSError:
        return {}
    got, problems = [], []
    for path in records:
        rec = read_json(path, problems)
        if isinstance(rec, dict) and rec.get("schema") == STAGE_SCHEMA:
            got.append(rec)
    notes += problems[:3]
    if not got:
        return {}

    def num(rec: tp.Mapping[str, tp.Any], key: str) -> float:
        v = rec.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0

    copied = [r for r in got if num(r, "bytes_copied") > 0 and num(r, "copy_seconds") > 0]
    return {
        "staged": True,
        "stage_nodes": len({r.get("node") for r in got}),
        "stage_bytes": _median([num(r, "bytes_copied") + num(r, "bytes_reused") for r in got]),
        "stage_copy_s": _median([num(r, "copy_seconds") for r in copied]),
        "stage_copy_rate": _median([num(r, "bytes_copied") / num(r, "copy_seconds") for r in copied]),
    }


def _probe(paths: RunDir, notes: tp.List[str]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    problems: tp.List[str] = []
    got = read_json(probe_path(paths.root), problems)
    notes += problems
    if not got:
        return None
    sizes = [
        [float(s["bytes"]), float(s["seconds"])]
        for s in got.get("sizes") or []
        if isinstance(s, dict)
        and all(isinstance(s.get(k), (int, float)) and math.isfinite(s[k]) and s[k] > 0 for k in ("bytes", "seconds"))
    ]
    world, nodes = got.get("world_size"), got.get("nodes")
    if got.get("schema") != PROBE_SCHEMA or not sizes or not isinstance(world, int) or not isinstance(nodes, int):
        notes.append(f"{probe_path(paths.root).name}: not an all-reduce probe record; ignored")
        return None
    return {"world_size": world, "nodes": nodes, "backend": got.get("backend"), "sizes": sizes}


def _check_run_dir(run_dir: tp.Union[str, "os.PathLike[str]"]) -> RunDir:
    shown = shorten(os.fspath(run_dir), 300)
    try:
        if not os.path.isdir(run_dir):
            raise UsageError(f"RUN_DIR {shown}: no such directory")
    except (OSError, ValueError):
        raise UsageError(f"RUN_DIR {shown}: not a readable directory") from None
    paths = RunDir(run_dir)
    if not paths.metrics.exists():
        raise UsageError(f"RUN_DIR {shown}: no train/metrics.jsonl (not a training run directory, or it never stepped)")
    return paths


MAX_STEP_S = 1e6
"""A step time (or part of one) beyond this (11.6 days) is not a measurement: a damaged or hand-made record."""
MAX_BATCH = 1e15
"""Samples per step beyond this are not a measurement either."""


def _check_measured(
    run_dir: tp.Union[str, "os.PathLike[str]"],
    world: int,
    intervals: int,
    step: float,
    global_batch: float,
    parts: tp.Mapping[str, float],
) -> None:
    """Refuse, in one line, the measurements no prediction can be made from: a step time that is zero, negative,
    not a number or absurdly long, no samples per step, or a part of the step beyond any real one."""
    where = f"RUN_DIR {shorten(os.fspath(run_dir), 300)}: world size {world} ({intervals} interval record(s))"
    fix = "its train/metrics.jsonl interval records are not usable measurements; calibrate again, or leave it out"
    if not (math.isfinite(step) and step > 0):
        raise UsageError(
            f"{where}: the measured step time (per_step.step_s less the checkpoint stall, median) is "
            f"{step:.3g} s, not a positive time; {fix}"
        )
    if step > MAX_STEP_S or any(v > MAX_STEP_S for v in parts.values()):
        raise UsageError(f"{where}: a measured step time or part of one is over {MAX_STEP_S:g} s; {fix}")
    if not (math.isfinite(global_batch) and 0 < global_batch <= MAX_BATCH):
        raise UsageError(
            f"{where}: {global_batch:.3g} samples per step (samples / steps, median), not a usable batch; {fix}"
        )


def read_calibrations(run_dir: tp.Union[str, "os.PathLike[str]"]) -> tp.List[Calibration]:
    """The calibration points of one run directory (one per world size it trained at). A directory without
    usable interval records is a :class:`~hpctrain.errors.UsageError` (one line)."""
    paths = _check_run_dir(run_dir)
    notes: tp.List[str] = []
    records, bad = read_jsonl(paths.metrics, tail_bytes=METRICS_TAIL_BYTES)
    notes += bad[:3]
    intervals = _intervals(records, notes)
    if not intervals:
        seen = sum(1 for r in records if r.get("kind") == "interval")
        why = (
            f" ({seen} interval record(s), none with a usable world size, step count, samples and step time"
            + (f": {notes[-1]}" if notes else "")
            + ")"
            if seen
            else ""
        )
        raise UsageError(
            f"RUN_DIR {shorten(os.fspath(run_dir), 300)}: no measured interval record in train/metrics.jsonl{why}"
        )
    starts, ends = _ledger(paths, notes)
    problems: tp.List[str] = []
    submission = read_json(paths.submission, problems) or {}
    notes += problems
    sub_cfg = submission.get("config") if isinstance(submission.get("config"), dict) else {}
    gpus_per_node = sub_cfg.get("gpus_per_node") if isinstance(sub_cfg.get("gpus_per_node"), int) else 0
    time_limit = None
    if isinstance(sub_cfg.get("time"), str):
        from hpctrain._slurm import parse_time

        try:
            time_limit = float(parse_time(sub_cfg["time"]))
        except UsageError:
            pass
    policy = ((starts[-1].get("config") or {}).get("checkpoint") or {}) if starts else {}
    every_steps = policy.get("every_steps") if isinstance(policy.get("every_steps"), int) else None
    ckpt_dir = str(run_checkpoint_dir(paths, starts))  # the run's (hpctrain.run.checkpoint_dir)
    shared: tp.Dict[str, tp.Any] = {**_identity_data(paths, notes), **_checkpoint(ckpt_dir, notes)}
    shared.update(_stage(paths, notes))
    fresh = [s["startup_s"] for s in starts if not s.get("resumed_from_step") and s.get("startup_s") is not None]
    resumed = [s for s in starts if s.get("resumed_from_step") and s.get("startup_s") is not None]
    startup = _median(fresh)
    restore = _median([s["startup_s"] - startup for s in resumed]) if resumed and startup is not None else None
    down = _median([s["down_s"] - s["startup_s"] for s in resumed if s.get("down_s") is not None])
    probe = _probe(paths, notes)

    out = []
    for world in sorted({r["world_size"] for r in intervals}):
        recs = [r for r in intervals if r["world_size"] == world]
        hosts = {h for s in starts if s.get("world_size") == world for h in (s.get("hosts") or [])}
        nodes = max(1, len(hosts)) if hosts else 1
        parts = {p: _median([_part(r, p) for r in recs]) or 0.0 for p in PARTS}
        step = _median([(_part(r, "step_s") or 0.0) - (_part(r, "checkpoint_s") or 0.0) for r in recs]) or 0.0
        global_batch = _median([r["samples"] / r["steps"] for r in recs if r["steps"]]) or 0.0
        flops = _median(
            [r["flops_per_s"] / r["samples_per_s"] for r in recs if r.get("flops_per_s") and r.get("samples_per_s")]
        )
        _check_measured(run_dir, world, len(recs), step, global_batch, parts)
        known = sum(parts[p] for p in PARTS if p != "checkpoint_s")
        cal = Calibration(
            run_dir=os.fspath(run_dir),
            world_size=world,
            nodes=nodes,
            ranks_per_node=world / nodes,
            gpus_per_node=gpus_per_node,
            global_batch=global_batch,
            local_batch=global_batch / world,
            intervals=len(recs),
            step_s=step,
            data_wait_s=parts["data_wait_s"],
            compute_s=parts["forward_backward_s"],
            comm_s=parts["grad_comm_exposed_s"],
            optimizer_s=parts["optimizer_s"],
            other_s=max(0.0, step - known),
            samples_per_s=_median([r.get("samples_per_s") for r in recs]) or 0.0,
            data_wait_slowest_s=_slowest_wait(recs),
            flops_per_sample=flops,
            save_stall_s=_stall_per_save(recs, every_steps),
            save_commit_s=_median([e.get("last_save_s") for e in ends if e.get("last_save_s")]),
            async_save=policy.get("async_save") if isinstance(policy.get("async_save"), bool) else None,
            startup_s=startup,
            restore_s=restore,
            down_s=down,
            total_steps=next((r.get("total_steps") for r in reversed(recs) if r.get("total_steps")), None),
            time_limit_s=time_limit,
            probe=probe,
            **_input(recs),
            notes=list(notes),
            **shared,
        )
        out.append(cal)
    return out
