"""From calibration points to a prediction per node count: :func:`fit`, then :func:`predict` (stdlib only).

:func:`fit` turns the points (:class:`~hpctrain.capacity.calibration.Calibration`) and what the user gave
(:class:`Targets`) into the model's parameters, each with where it came from (``measured``, ``fitted``,
``given``, ``assumed``). :func:`predict` evaluates the formulas of :mod:`hpctrain.capacity.model` at each
node count and says which resource bounds the run and what would change the answer. The formulas and the
choices made here are in docs/capacity.md.
"""

from __future__ import annotations

import math
import statistics
import typing as tp
from dataclasses import asdict, dataclass

from hpctrain._validate import check_int, check_number, usage_error
from hpctrain.capacity import model as m
from hpctrain.capacity.calibration import Calibration
from hpctrain.errors import UsageError

__all__ = [
    "Targets",
    "Param",
    "Fitted",
    "fit",
    "predict",
    "capacity_report",
    "interconnect_from_probe",
    "DEFAULT_NODES",
    "SCHEMA",
]

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LOADER_BOUND = 0.10
"""A calibration step that waited this share of its time for data was loader-bound: its rate is measured."""
BOUND_SHARE = 0.10
"""A loss above this share of the wall time is named as what bounds the run (else: compute)."""


@dataclass(kw_only=True)
class Targets:
    """What to predict for. Rates are bytes or FLOP per second; the CLI takes GB/s and converts."""

    nodes: tp.Tuple[int, ...] = DEFAULT_NODES
    """Node counts to predict (one table row each)."""
    gpus_per_node: tp.Optional[int] = None
    """Ranks (GPUs) per node; None = the calibration's ranks per node."""
    samples: tp.Optional[float] = None
    """Samples to train on; None = ``epochs`` x the dataset, else the calibration run's own length."""
    epochs: tp.Optional[float] = None
    """Passes over the dataset (its size from the loader's checkpoint record or the data fingerprint)."""
    global_batch: tp.Optional[float] = None
    """Samples per optimizer step over all ranks, kept at every node count (strong scaling); None = the
    calibration's global batch, unless ``local_batch`` is given."""
    local_batch: tp.Optional[float] = None
    """Samples per rank per step, kept at every node count (weak scaling: the global batch grows)."""
    peak_flops: tp.Optional[float] = None
    """Peak FLOP/s of one GPU, for MFU (None: no MFU)."""
    busbw: tp.Optional[float] = None
    """All-reduce bus bandwidth between nodes in bytes/s (nccl-tests' busbw); None = measured."""
    latency_s: tp.Optional[float] = None
    """All-reduce latency per message round in seconds; None = measured (probe) or 0."""
    read_bw: tp.Optional[float] = None
    """The filesystem's aggregate read bandwidth in bytes/s (None: no filesystem bound)."""
    write_bw: tp.Optional[float] = None
    """The filesystem's aggregate write bandwidth in bytes/s (None: saves as fast as measured)."""
    mtbf_node_hours: tp.Optional[float] = None
    """Hours between unplanned failures of one node; None = ``failure_rate``, else the default."""
    failure_rate: tp.Optional[float] = None
    """Unplanned failures per 1000 node-days (Kokolis et al.'s r_f); the default is RSC-1's 6.50."""
    time_limit_s: tp.Optional[float] = None
    """The partition's time limit per job; None = no limit (a calibration's own ``--time`` is not used)."""
    queue_wait_s: tp.Optional[float] = None
    """Queue wait per job and per requeue; None = measured down time between attempts, else 0."""

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, (tuple, list)) or not self.nodes:
            raise usage_error(self, "nodes", self.nodes, "must be a non-empty tuple of node counts")
        for n in self.nodes:
            check_int(self, "nodes", n, min=1, max=10_000_000)
        self.nodes = tuple(self.nodes)
        check_int(self, "gpus_per_node", self.gpus_per_node, min=1, max=1024, none_ok=True)
        for name in ("samples", "epochs", "global_batch", "local_batch", "peak_flops", "busbw"):
            check_number(self, name, getattr(self, name), above=0, none_ok=True)
        for name in ("read_bw", "write_bw", "mtbf_node_hours", "failure_rate", "time_limit_s"):
            check_number(self, name, getattr(self, name), above=0, none_ok=True)
        check_number(self, "latency_s", self.latency_s, min=0, none_ok=True)
        check_number(self, "queue_wait_s", self.queue_wait_s, min=0, none_ok=True)
        for a, b in (("samples", "epochs"), ("global_batch", "local_batch"), ("mtbf_node_hours", "failure_rate")):
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise UsageError(f"Targets: give {a} or {b}, not both")


@dataclass
class Param:
    value: tp.Optional[float]
    source: str
    """``measured`` (read from a record), ``fitted`` (over several points), ``given`` (a target) or ``assumed``."""
    note: str = ""


@dataclass
class Fitted:
    """The model's parameters (seconds, bytes, bytes/s)."""

    ranks_per_node: Param
    global_batch: Param
    local_batch: Param
    compute_per_sample_s: Param
    compute_per_step_s: Param
    optimizer_s: Param
    optimizer_multi_s: Param
    other_s: Param
    """Per step beyond the timed parts on one rank."""
    other_multi_s: Param
    """The same on several ranks: the Trainer's per-step stop agreement (a small collective) lands here."""
    comm_base_s: Param
    """What a one-rank all-reduce call costs (DDP at world 1)."""
    comm_latency_s: Param
    """Per message round, times the exposed share."""
    comm_inv_busbw: Param
    """Exposed share / bus bandwidth (s per byte)."""
    overlap: Param
    grad_bytes: Param
    data_floor_s: Param
    loader_samples_per_s: Param
    bytes_per_sample: Param
    read_bw: Param
    save_stall_s: Param
    save_commit_s: Param
    save_per_node_s: Param
    """The part of a save that shrinks as 1/nodes (fitted over node counts; else 0)."""
    write_bw: Param
    checkpoint_bytes: Param
    startup_s: Param
    restore_s: Param
    queue_wait_s: Param
    mtbf_node_hours: Param
    flops_per_sample: Param
    peak_flops: Param
    samples: Param
    time_limit_s: Param
    notes: tp.List[str]

    def as_dict(self) -> tp.Dict[str, tp.Any]:
        return {k: (asdict(v) if isinstance(v, Param) else v) for k, v in self.__dict__.items()}


def _lstsq2(xs: tp.Sequence[float], zs: tp.Sequence[float], ys: tp.Sequence[float]) -> tp.Tuple[float, float]:
    """Non-negative least squares of ``y = a x + b z`` (two unknowns): the unconstrained solution when both
    are >= 0, else the better of the two one-variable fits."""

    def one(us: tp.Sequence[float]) -> tp.Tuple[float, float]:
        den = sum(u * u for u in us)
        k = max(0.0, sum(u * y for u, y in zip(us, ys)) / den) if den else 0.0
        return k, sum((y - k * u) ** 2 for u, y in zip(us, ys))

    sxx, szz, sxz = sum(x * x for x in xs), sum(z * z for z in zs), sum(x * z for x, z in zip(xs, zs))
    sxy, szy = sum(x * y for x, y in zip(xs, ys)), sum(z * y for z, y in zip(zs, ys))
    det = sxx * szz - sxz * sxz
    if abs(det) > 1e-12 * max(sxx * szz, 1e-300):
        a, b = (sxy * szz - szy * sxz) / det, (szy * sxx - sxy * sxz) / det
        if a >= 0 and b >= 0:
            return a, b
    (a, ea), (b, eb) = one(xs), one(zs)
    return (a, 0.0) if ea <= eb else (0.0, b)


def _line(xs: tp.Sequence[float], ys: tp.Sequence[float]) -> tp.Tuple[float, float]:
    """``y = c0 + c1 x`` by least squares with c0, c1 >= 0 (one distinct x: through the origin)."""
    if len(set(xs)) < 2:
        return 0.0, statistics.mean(y / x for x, y in zip(xs, ys) if x) if any(xs) else 0.0
    c1, c0 = _lstsq2(xs, [1.0] * len(xs), ys)
    return c0, c1


def _mean(values: tp.Iterable[tp.Optional[float]]) -> tp.Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.mean(vals) if vals else None


def _median(values: tp.Iterable[tp.Optional[float]]) -> tp.Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def interconnect_from_probe(probe: tp.Mapping[str, tp.Any], base_s: float = 0.0) -> tp.Tuple[float, tp.Optional[float]]:
    """``(latency per message round in s, bus bandwidth in bytes/s or None)`` fitted to an all-reduce probe
    (``Calibration.probe``: times of several message sizes on ``world_size`` ranks): the intercept over the
    rounds ``2 ceil(log2 n)`` and the slope over ``2(n-1)/n`` bytes, what nccl-tests' busbw measures."""
    n = int(probe["world_size"])
    if n < 2:
        raise UsageError("interconnect_from_probe: a probe of one rank measures no interconnect")
    xs = [float(m.allreduce_latency_steps(n))] * len(probe["sizes"])
    zs = [m.busbw_factor(n) * size for size, _ in probe["sizes"]]
    a, b = _lstsq2(xs, zs, [max(0.0, secs - base_s) for _, secs in probe["sizes"]])
    return a, (1.0 / b if b > 0 else None)


def _comm(points: tp.Sequence[Calibration], targets: Targets, grad: float, notes: tp.List[str]) -> tp.Dict[str, Param]:
    """Exposed communication ``x(n) = base + latency * 2 ceil(log2 n) + inv_busbw * 2(n-1)/n * S``, the latency
    and bandwidth terms carrying the exposed share measured at calibration."""
    base_vals = [p.comm_s for p in points if p.world_size == 1]
    base = Param(_median(base_vals) or 0.0, "measured" if base_vals else "assumed")
    multi = [p for p in points if p.world_size > 1]
    inter = [p for p in multi if p.nodes > 1]
    use = inter or multi
    if multi and not inter:
        notes.append("no calibration spanned nodes: communication between nodes is modelled on the one-node points")
    probes = [p.probe for p in points if p.probe]
    lat, inv, overlap = Param(None, "assumed"), Param(None, "assumed"), Param(None, "assumed")
    probe_lat = probe_bw = None
    probes = [pr for pr in probes if pr["world_size"] > 1]
    if probes:  # the probe's all-reduce times over message sizes: intercept = rounds x latency, slope = factor / busbw
        largest = max(probes, key=lambda pr: pr["world_size"])
        probe_lat, probe_bw = interconnect_from_probe(largest, base.value or 0.0)
    given_lat = targets.latency_s if targets.latency_s is not None else probe_lat
    given_bw = targets.busbw or probe_bw
    src_lat = "given" if targets.latency_s is not None else "measured"
    src_bw = "given" if targets.busbw else "measured"
    if given_lat is not None or given_bw:
        # the interconnect is known: the calibration points say which share of the all-reduce is exposed
        lat_v, bw_v = given_lat or 0.0, given_bw
        shares = []
        for p in use:
            full = m.allreduce_seconds(grad, p.world_size, busbw=bw_v, latency=lat_v)
            if full > 0:
                shares.append(max(0.0, p.comm_s - base.value) / full)
        share = _mean(shares)
        if share is None:
            share = 1.0
            notes.append("no multi-rank calibration: the all-reduce is assumed not to overlap compute")
        what = f"x the exposed share {share:.2f}"
        lat = Param(lat_v * share, src_lat if given_lat is not None else "assumed", f"{lat_v * 1e6:.3g} us {what}")
        bw_note = f"busbw {(bw_v or 0) / 1e9:.3g} GB/s {what}"
        inv = Param(share / bw_v if bw_v else 0.0, src_bw if bw_v else "assumed", bw_note)
        overlap = Param(max(0.0, 1.0 - share), "measured" if shares else "assumed")
        if share > 1.2:
            notes.append(
                f"the measured exposed communication is {share:.1f}x the all-reduce itself at the calibration sizes "
                "(DDP bookkeeping, stragglers or contention): kept as measured"
            )
        return {"comm_base_s": base, "comm_latency_s": lat, "comm_inv_busbw": inv, "overlap": overlap}
    sizes = sorted({p.world_size for p in use})
    if len(sizes) >= 2:
        a, b = _lstsq2(
            [float(m.allreduce_latency_steps(p.world_size)) for p in use],
            [m.busbw_factor(p.world_size) * grad for p in use],
            [max(0.0, p.comm_s - base.value) for p in use],
        )
        return {
            "comm_base_s": base,
            "comm_latency_s": Param(a, "fitted", f"over world sizes {sizes}"),
            "comm_inv_busbw": Param(b, "fitted", f"over world sizes {sizes}"),
            "overlap": Param(None, "assumed", "not separable from the bandwidth without a probe"),
        }
    if len(sizes) == 1 and not grad:
        p = next(q for q in use if q.world_size == sizes[0])
        lat_v = max(0.0, p.comm_s - base.value) / m.allreduce_latency_steps(p.world_size)
        return {
            "comm_base_s": base,
            "comm_latency_s": Param(lat_v, "measured", "gradient bytes unknown: all of it taken as latency"),
            "comm_inv_busbw": Param(0.0, "assumed"),
            "overlap": Param(None, "assumed"),
        }
    if len(sizes) == 1:
        p = next(q for q in use if q.world_size == sizes[0])
        notes.append(
            f"one multi-rank world size ({sizes[0]}) and no all-reduce probe: its exposed communication is taken as "
            "bandwidth-bound (2(n-1)/n S / busbw); give --busbw/--latency-us, another world size, or calibrate with "
            "--calibrate (it probes the all-reduce) to split latency from bandwidth"
        )
        inv_v = max(0.0, p.comm_s - base.value) / (m.busbw_factor(p.world_size) * grad) if grad else 0.0
        return {
            "comm_base_s": base,
            "comm_latency_s": Param(0.0, "assumed"),
            "comm_inv_busbw": Param(inv_v, "measured", f"effective busbw {1 / inv_v / 1e9:.3g} GB/s" if inv_v else ""),
            "overlap": Param(None, "assumed"),
        }
    notes.append("no multi-rank calibration and no --busbw: gradient communication is not modelled (0)")
    return {
        "comm_base_s": base,
        "comm_latency_s": Param(0.0, "assumed"),
        "comm_inv_busbw": Param(0.0, "assumed"),
        "overlap": overlap,
    }


def _per_regime(points: tp.Sequence[Calibration], name: str) -> tp.Dict[str, Param]:
    """``name`` on one rank and on several (the mean of those points; the other regime's when one is missing)."""
    single = _mean(getattr(p, name) for p in points if p.world_size == 1)
    multi = _mean(getattr(p, name) for p in points if p.world_size > 1)
    key = name[: -len("_s")]
    return {
        name: Param(single if single is not None else multi, "measured" if single is not None else "assumed"),
        f"{key}_multi_s": Param(multi if multi is not None else single, "measured" if multi is not None else "assumed"),
    }


def fit(points: tp.Sequence[Calibration], targets: Targets) -> Fitted:
    """The model's parameters from the calibration points and the targets."""
    if not points:
        raise UsageError("capacity: no calibration point (give at least one run directory that trained)")
    notes: tp.List[str] = []
    rpn = targets.gpus_per_node or max(p.ranks_per_node for p in points)
    ranks_per_node = Param(rpn, "given" if targets.gpus_per_node else "measured")
    cal_global = _median([p.global_batch for p in points]) or 1.0
    if targets.local_batch:
        global_batch, local_batch = (
            Param(None, "given", "grows with the node count"),
            Param(targets.local_batch, "given"),
        )
    else:
        gb = targets.global_batch or cal_global
        global_batch, local_batch = Param(gb, "given" if targets.global_batch else "measured"), Param(None, "measured")

    # compute: per step + per sample x local batch, over the points' local batches
    c0, c1 = _line([p.local_batch for p in points], [p.compute_s for p in points])
    distinct = len({p.local_batch for p in points}) > 1
    compute_step = Param(c0, "fitted" if distinct else "assumed", "" if distinct else "one local batch measured")
    compute_sample = Param(c1, "fitted" if distinct else "measured")

    grad = _median([p.grad_bytes for p in points])
    grad_p = Param(grad, "measured" if grad else "assumed")
    if not grad:
        notes.append("no committed checkpoint: gradient bytes unknown, communication scales by latency only")
    comm = _comm(points, targets, float(grad or 0.0), notes)

    # data: a loader-bound point measures the loader's rate; the others the hand-over floor
    bound = [p for p in points if p.step_s and p.data_wait_s > LOADER_BOUND * p.step_s]
    free = [p for p in points if p not in bound]
    rate = _median(
        [p.local_batch / (p.data_wait_s + p.compute_s + p.comm_s + p.optimizer_s + p.other_s) for p in bound]
    )
    loader = Param(rate, "measured" if rate else "assumed", "" if rate else "never loader-bound at calibration")
    floor = Param(_median([p.data_wait_s for p in free]) or 0.0, "measured" if free else "assumed")
    bps = _median([p.bytes_per_sample for p in points])

    # saves: constant, or f + g/nodes when measured on several node counts
    stall = _median([p.save_stall_s for p in points])
    commit = _median([p.save_commit_s for p in points])
    async_save = any(p.async_save for p in points)
    by_nodes = {p.nodes: p.save_commit_s for p in points if p.save_commit_s}
    per_node = Param(0.0, "assumed", "one node count measured")
    if len(by_nodes) >= 2:
        g, f = _lstsq2([1.0 / n for n in by_nodes], [1.0] * len(by_nodes), list(by_nodes.values()))
        commit, per_node = f, Param(g, "fitted", f"over node counts {sorted(by_nodes)}")
    if stall is None and commit is None:
        notes.append("no save was measured: checkpoint cost assumed 0 (the interval then is 0: checkpointing is free)")
    if not async_save:
        stall = None  # a blocking save stalls the step for all of it: the commit time

    startup = _median([p.startup_s for p in points])
    restore = _median([p.restore_s for p in points])
    ck_bytes = _median([p.checkpoint_bytes for p in points])
    restore_p = Param(restore, "measured")
    if restore is None:
        if targets.read_bw and ck_bytes:
            restore_p = Param(ck_bytes / targets.read_bw, "assumed", "checkpoint bytes / read bandwidth")
        else:
            restore_p = Param(commit or 0.0, "assumed", "no restart measured: restore taken as long as a save")
    if targets.queue_wait_s is not None:
        queue = Param(targets.queue_wait_s, "given")
    else:
        down = _median([p.down_s for p in points])
        queue = Param(max(0.0, down), "measured") if down is not None else Param(0.0, "assumed", "no requeue measured")
    if targets.mtbf_node_hours:
        mtbf = Param(targets.mtbf_node_hours, "given")
    elif targets.failure_rate:
        mtbf = Param(
            m.mtbf_node_hours_from_rate(targets.failure_rate), "given", f"{targets.failure_rate} per 1000 node-days"
        )
    else:
        mtbf = Param(m.DEFAULT_MTBF_NODE_HOURS, "assumed", "RSC-1's 6.50 failures per 1000 node-days (Kokolis et al.)")

    dataset = _median([p.dataset_samples for p in points])
    if targets.samples:
        samples = Param(targets.samples, "given")
    elif targets.epochs:
        if not dataset:
            raise UsageError(
                "capacity: --epochs needs the dataset size, which no calibration run recorded; give --samples"
            )
        samples = Param(targets.epochs * dataset, "given", f"{targets.epochs} epochs of {dataset:.0f} samples")
    else:
        longest = max(points, key=lambda p: (p.total_steps or 0) * p.global_batch)
        samples = Param((longest.total_steps or 0) * longest.global_batch, "measured", "the calibration run's length")
    limit = targets.time_limit_s  # a calibration's own --time is short by design: not the partition's
    return Fitted(
        ranks_per_node=ranks_per_node,
        global_batch=global_batch,
        local_batch=local_batch,
        compute_per_sample_s=compute_sample,
        compute_per_step_s=compute_step,
        **_per_regime(points, "optimizer_s"),
        **_per_regime(points, "other_s"),
        grad_bytes=grad_p,
        data_floor_s=floor,
        loader_samples_per_s=loader,
        bytes_per_sample=Param(bps, "measured" if bps else "assumed"),
        read_bw=Param(targets.read_bw, "given" if targets.read_bw else "assumed"),
        save_stall_s=Param(
            stall, "measured" if stall is not None else "assumed", "" if stall is not None else "= commit"
        ),
        save_commit_s=Param(commit or 0.0, "measured" if commit else "assumed"),
        save_per_node_s=per_node,
        write_bw=Param(targets.write_bw, "given" if targets.write_bw else "assumed"),
        checkpoint_bytes=Param(ck_bytes, "measured" if ck_bytes else "assumed"),
        startup_s=Param(startup or 0.0, "measured" if startup is not None else "assumed"),
        restore_s=restore_p,
        queue_wait_s=queue,
        mtbf_node_hours=mtbf,
        flops_per_sample=Param(_median([p.flops_per_sample for p in points]), "measured"),
        peak_flops=Param(targets.peak_flops, "given" if targets.peak_flops else "assumed"),
        samples=samples,
        time_limit_s=Param(limit, "given" if limit else "assumed", "" if limit else "no time limit"),
        notes=notes,
        **comm,
    )


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB/s"


def _dur(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} days"


def step_parts(f: Fitted, ranks: int, nodes: int, local_batch: float) -> tp.Dict[str, float]:
    """The predicted step of one rank, split into its parts (seconds)."""
    compute = m.compute_seconds(local_batch, f.compute_per_sample_s.value or 0.0, f.compute_per_step_s.value or 0.0)
    comm = f.comm_base_s.value or 0.0
    if ranks > 1:
        comm += (f.comm_latency_s.value or 0.0) * m.allreduce_latency_steps(ranks)
        comm += (f.comm_inv_busbw.value or 0.0) * m.busbw_factor(ranks) * (f.grad_bytes.value or 0.0)
    if ranks > 1:
        optimizer, other = f.optimizer_multi_s.value or 0.0, f.other_multi_s.value or 0.0
    else:
        optimizer, other = f.optimizer_s.value or 0.0, f.other_s.value or 0.0
    read = m.read_seconds(
        local_batch,
        ranks=ranks,
        bytes_per_sample=f.bytes_per_sample.value,
        loader_samples_per_s=f.loader_samples_per_s.value,
        fs_read_bw=f.read_bw.value,
    )
    data = m.data_wait_seconds(read, compute + comm + optimizer + other, f.data_floor_s.value or 0.0)
    return {"data_wait_s": data, "compute_s": compute, "comm_s": comm, "optimizer_s": optimizer, "other_s": other}


def _row(f: Fitted, nodes: int, thr_1: tp.Optional[float]) -> tp.Dict[str, tp.Any]:
    rpn = int(round(f.ranks_per_node.value or 1))
    ranks = nodes * rpn
    if f.local_batch.value:
        local = f.local_batch.value
        global_batch = local * ranks
    else:
        global_batch = f.global_batch.value or 1.0
        local = global_batch / ranks
    row: tp.Dict[str, tp.Any] = {"nodes": nodes, "gpus": ranks, "local_batch": local, "global_batch": global_batch}
    if local < 1:
        row.update(
            feasible=False,
            bound="infeasible",
            advice=f"global batch {global_batch:g} < {ranks} ranks: give --local-batch",
        )
        return row
    parts = step_parts(f, ranks, nodes, local)
    step = sum(parts.values())
    thr = m.throughput(local, ranks, step)
    samples = f.samples.value or 0.0
    steps = math.ceil(samples / global_batch) if samples else 0
    work = steps * step
    # checkpoints and failures
    commit = (f.save_commit_s.value or 0.0) + (f.save_per_node_s.value or 0.0) / nodes
    if f.write_bw.value and f.checkpoint_bytes.value:
        commit = max(commit, f.checkpoint_bytes.value / f.write_bw.value)
    delta = f.save_stall_s.value if f.save_stall_s.value is not None else commit
    pending = max(0.0, commit - delta)  # an async save is not durable until written
    mtbf = m.job_mtbf_seconds(nodes, f.mtbf_node_hours.value or m.DEFAULT_MTBF_NODE_HOURS)
    startup, restore, queue = f.startup_s.value or 0.0, f.restore_s.value or 0.0, f.queue_wait_s.value or 0.0
    restart = queue + startup + restore
    young = m.young_interval(delta, mtbf) if delta else None
    daly = m.daly_interval(delta, mtbf) if delta else None
    tau = daly if daly else None
    if tau:
        ettr = m.ettr(tau, delta, mtbf, restart + pending)
    else:  # no save cost measured: Young/Daly has no optimum; count failures as losing half the run's progress
        ettr = max(0.0, 1.0 - restart / mtbf)
    run = work / ettr if ettr > 0 else math.inf
    limit = f.time_limit_s.value
    segments: tp.Optional[int] = 1
    if limit and math.isfinite(run):
        segments = m.time_limit_segments(run, limit, startup + restore + commit)
    if segments is None or not math.isfinite(run):
        wall = math.inf
    else:
        wall = queue + startup + run + (segments - 1) * (queue + startup + restore + commit)
    charged = wall - segments * queue if segments and math.isfinite(wall) else math.inf
    ckpt_loss = work * delta / tau if tau else 0.0
    fail_loss = max(0.0, run - work - ckpt_loss) if math.isfinite(run) else math.inf
    eff = m.scaling_efficiency(thr, nodes, thr_1) if thr_1 else None
    mfu = None
    if f.peak_flops.value and f.flops_per_sample.value:
        mfu = thr * f.flops_per_sample.value / (ranks * f.peak_flops.value)
    needed = rpn * local * (f.bytes_per_sample.value or 0.0) / step if f.bytes_per_sample.value else None
    row.update(
        feasible=True,
        step_s=step,
        parts=parts,
        samples_per_s=thr,
        efficiency=eff,
        mfu=mfu,
        read_bw_per_node=needed,
        steps=steps,
        train_s=work,
        checkpoint={
            "save_stall_s": delta,
            "save_commit_s": commit,
            "young_s": young,
            "daly_s": daly,
            "interval_steps": max(1, round(tau / step)) if tau else None,
        },
        failures={
            "job_mtbf_s": mtbf,
            "restart_s": restart,
            "expected": run / mtbf if math.isfinite(run) else None,
            "lost_s": fail_loss,
        },
        ettr=ettr,
        segments=segments,
        wall_s=wall,
        gpu_hours=m.gpu_hours(charged, ranks) if math.isfinite(charged) else None,
        ettr_overall=work / wall if wall and math.isfinite(wall) else 0.0,
    )
    row["bound"], row["advice"] = _bound(row, f, ckpt_loss)
    return row


def _bound(row: tp.Dict[str, tp.Any], f: Fitted, ckpt_loss: float) -> tp.Tuple[str, str]:
    """Which resource bounds this row, in plain words, and what would change the answer."""
    wall, work, step, parts = row["wall_s"], row["train_s"], row["step_s"], row["parts"]
    n = row["nodes"]
    if not math.isfinite(wall):
        return "failures", (
            f"the job fails every {_dur(row['failures']['job_mtbf_s'])} at {_nodes(n)}, faster than it can restart "
            f"and save ({_dur(row['failures']['restart_s'])}): it would never finish; use fewer nodes or shorten the "
            "restart"
        )
    share = {
        "network": parts["comm_s"] / step * work / wall,
        "storage": parts["data_wait_s"] / step * work / wall,
        "checkpointing": ckpt_loss / wall,
        "failures": row["failures"]["lost_s"] / wall,
        "start-up and time limits": (wall - work / row["ettr"]) / wall if row["ettr"] else 0.0,
    }
    name, worst = max(share.items(), key=lambda kv: kv[1])
    if worst < BOUND_SHARE:
        compute = (parts["compute_s"] + parts["optimizer_s"]) / step
        eff = row["efficiency"]
        tail = f"; scaling efficiency E(N) = {eff:.0%}" if eff is not None else ""
        return "compute", (
            f"compute-bound: forward/backward and optimizer are {compute:.0%} of the step{tail}; "
            f"a faster GPU or a cheaper step would change this, more nodes help while E(N) holds"
        )
    if name == "network" and row["gpus"] == 1:
        return "network", (
            f"DDP's gradient all-reduce call on one rank is {parts['comm_s'] / step:.0%} of the step: a larger local "
            "batch, or no DDP wrapper on one rank, would change this"
        )
    if name == "network":
        grad = f.grad_bytes.value
        what = f" ({grad / 1e6:.3g} MB of gradients per step)" if grad else ""
        return "network", (
            f"exposed gradient communication is {parts['comm_s'] / step:.0%} of the step at {_nodes(n)}{what}: "
            "a larger local batch, more overlap (smaller DDP buckets) or a faster interconnect (--busbw) would change "
            "this"
        )
    if name == "storage":
        need = row["read_bw_per_node"]
        what = f" (needs {_gb(need)} per node)" if need else ""
        return "storage", (
            f"data wait reaches {parts['data_wait_s'] / step:.0%} of the step at {_nodes(n)}{what}: stage to "
            "node-local storage, add loader workers or raise the read bandwidth"
        )
    if name == "checkpointing":
        ck = row["checkpoint"]
        return "checkpointing", (
            f"checkpoints cost {worst:.0%} (a save stalls {_dur(ck['save_stall_s'])} every {_dur(ck['daly_s'] or 0)}): "
            "async saves or faster storage (--write-bw) would change this"
        )
    if name == "failures":
        fl = row["failures"]
        return "failures", (
            f"failures and restarts cost {worst:.0%} (job MTBF {_dur(fl['job_mtbf_s'])} at {_nodes(n)}, restart "
            f"{_dur(fl['restart_s'])}): a shorter restart, fewer nodes or more reliable nodes would change this"
        )
    if (row["segments"] or 1) > 1:
        return "time limits", (
            f"{row['segments']} time-limit segments cost {worst:.0%} in queue waits, start-ups and restores: a longer "
            "time limit (--time-limit) or a shorter queue wait would change this"
        )
    return "start-up", (
        f"start-up and queue wait are {worst:.0%} of a run this short ({_dur(wall)}): train longer per job, or "
        "start faster (imports, rendezvous, restore)"
    )


def predict(f: Fitted, nodes: tp.Sequence[int]) -> tp.List[tp.Dict[str, tp.Any]]:
    """One row per node count (see docs/capacity.md for the fields)."""
    base = _row(f, 1, None)
    thr_1 = base.get("samples_per_s") if base.get("feasible") else None
    return [_row(f, n, thr_1) for n in nodes]


SCHEMA = "hpctrain.capacity/1"


def _points(
    points: tp.Sequence[Calibration], f: Fitted, rows: tp.Sequence[tp.Dict[str, tp.Any]]
) -> tp.List[tp.Dict[str, tp.Any]]:
    """The calibration runs as they would sit on the prediction's curves: measured throughput and the time to
    train the target samples at it (comparable when the ranks per node and the batch policy match)."""
    thr_1 = next((r.get("samples_per_s") for r in rows if r["nodes"] == 1 and r.get("feasible")), None)
    if thr_1 is None:
        base = _row(f, 1, None)
        thr_1 = base.get("samples_per_s") if base.get("feasible") else None
    samples = f.samples.value or 0.0
    out = []
    for p in points:
        thr = p.local_batch * p.world_size / p.step_s if p.step_s else p.samples_per_s
        same_batch = (
            abs(p.local_batch - f.local_batch.value) < 1e-9
            if f.local_batch.value
            else abs(p.global_batch - (f.global_batch.value or 0.0)) < 1e-9
        )
        out.append(
            {
                "run_dir": p.run_dir,
                "nodes": p.nodes,
                "world_size": p.world_size,
                "step_s": p.step_s,
                "samples_per_s": thr,
                "train_s": samples / thr if thr else None,
                "efficiency": m.scaling_efficiency(thr, p.nodes, thr_1) if thr_1 else None,
                "comparable": same_batch and abs(p.ranks_per_node - (f.ranks_per_node.value or 1)) < 1e-9,
            }
        )
    return out


def capacity_report(
    run_dirs: tp.Union[str, "tp.Any", tp.Sequence[tp.Any]], targets: tp.Optional[Targets] = None
) -> tp.Dict[str, tp.Any]:
    """The capacity report of one or more calibration run directories as a JSON-able dict (the ``--json``
    schema ``hpctrain.capacity/1``, docs/capacity.md). Torch-free; raises UsageError for a directory that is
    not a calibration run."""
    import os

    from hpctrain.capacity.calibration import read_calibrations

    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    targets = targets or Targets()
    points = [c for d in run_dirs for c in read_calibrations(d)]
    f = fit(points, targets)
    rows = predict(f, targets.nodes)
    notes = list(dict.fromkeys([*f.notes, *(n for p in points for n in p.notes)]))
    feasible = [r for r in rows if r.get("feasible") and math.isfinite(r["wall_s"])]
    summary: tp.Dict[str, tp.Any] = {}
    if feasible:
        summary["fastest"] = min(feasible, key=lambda r: r["wall_s"])["nodes"]
        summary["cheapest"] = min(feasible, key=lambda r: r["gpu_hours"] or math.inf)["nodes"]
        half = [r["nodes"] for r in feasible if r["efficiency"] is not None and r["efficiency"] < 0.5]
        summary["efficiency_below_half_from"] = min(half) if half else None
    return {
        "schema": SCHEMA,
        "run_dirs": [os.fspath(d) for d in run_dirs],
        "calibration": [p.as_dict() for p in points],
        "targets": asdict(targets),
        "model": f.as_dict(),
        "rows": rows,
        "points": _points(points, f, rows),
        "summary": summary,
        "notes": notes,
    }
