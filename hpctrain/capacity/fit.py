"""From calibration points to the model's parameters: :func:`fit` (stdlib only).

:func:`fit` turns the points (:class:`~hpctrain.capacity.calibration.Calibration`) and what the user gave
(:class:`~hpctrain.capacity.targets.Targets`) into :class:`Fitted`, each :class:`Param` with where it came
from (``measured``, ``fitted``, ``given``, ``assumed``). :func:`interconnect_from_probe` reads latency and bus
bandwidth from an all-reduce probe. The choices made here are in docs/capacity.md.
"""

from __future__ import annotations

import statistics
import typing as tp
from dataclasses import asdict, dataclass

from hpctrain.capacity import model as m
from hpctrain.capacity.calibration import Calibration
from hpctrain.capacity.targets import Targets
from hpctrain.defaults import DEFAULT_MTBF_NODE_HOURS
from hpctrain.errors import UsageError
from hpctrain.reliability import mtbf_node_hours_from_rate

__all__ = ["Param", "Fitted", "fit", "interconnect_from_probe"]

LOADER_BOUND = 0.10
"""A calibration step that waited this share of its time for data was loader-bound: its rate is measured."""


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
    """Forward and backward on one rank: ``per step + per sample x local batch``."""
    compute_multi_per_sample_s: Param
    compute_multi_per_step_s: Param
    """The same on several ranks, where the all-reduce of the first buckets runs beside the backward (on a CPU it
    shares the rank's cores; on a GPU its kernels share the SMs): a regime of its own, like optimizer and other."""
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
    comm_extra_s: Param
    """Per multi-rank step beyond the whole all-reduce, when the calibration showed none of it hidden (exposed share
    >= 1): DDP's bucket bookkeeping and the wait for the slowest rank, which do not grow with the bytes."""
    overlap: Param
    grad_bytes: Param
    data_floor_s: Param
    loader_samples_per_s: Param
    bytes_per_sample: Param
    """Bytes the loader reads per sample (measured reads; else the dataset's arrays)."""
    node_read_rate: Param
    """Bytes/s a node's loaders read at when storage does not limit them."""
    read_bw: Param
    """The file system's aggregate read bandwidth (given)."""
    local_read_bw: Param
    """Bytes/s a node reads from node-local storage (staged)."""
    dataset_bytes: Param
    """What a stage copies to each node."""
    stage_copy_rate: Param
    """A node's copy rate when staging (measured in the stage records)."""
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
        extra = Param(0.0, "assumed", "some of the all-reduce was hidden: scaled by the exposed share instead")
        if share >= 1.0 and shares:
            # none of it hidden: the whole all-reduce shows, plus a per-step excess that does not scale with the bytes
            # (scaling the excess with the all-reduce over-predicts larger worlds: docs/capacity.md "Validation")
            excess = []
            for p in use:
                full = m.allreduce_seconds(grad, p.world_size, busbw=bw_v, latency=lat_v)
                if full > 0:
                    excess.append(max(0.0, p.comm_s - base.value - full))
            extra = Param(_mean(excess) or 0.0, "measured", "exposed comm - the whole all-reduce, at calibration")
            share = 1.0
        what = f"x the exposed share {share:.2f}"
        lat = Param(lat_v * share, src_lat if given_lat is not None else "assumed", f"{lat_v * 1e6:.3g} us {what}")
        bw_note = f"busbw {(bw_v or 0) / 1e9:.3g} GB/s {what}"
        inv = Param(share / bw_v if bw_v else 0.0, src_bw if bw_v else "assumed", bw_note)
        # share: exposed seconds per second of all-reduce
        overlap = Param(m.overlap_fraction(share, 1.0), "measured" if shares else "assumed")
        return {
            "comm_base_s": base,
            "comm_latency_s": lat,
            "comm_inv_busbw": inv,
            "comm_extra_s": extra,
            "overlap": overlap,
        }
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
            "comm_extra_s": Param(0.0, "assumed"),
            "overlap": Param(None, "assumed", "not separable from the bandwidth without a probe"),
        }
    if len(sizes) == 1 and not grad:
        p = next(q for q in use if q.world_size == sizes[0])
        lat_v = max(0.0, p.comm_s - base.value) / m.allreduce_latency_steps(p.world_size)
        return {
            "comm_base_s": base,
            "comm_latency_s": Param(lat_v, "measured", "gradient bytes unknown: all of it taken as latency"),
            "comm_inv_busbw": Param(0.0, "assumed"),
            "comm_extra_s": Param(0.0, "assumed"),
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
            "comm_extra_s": Param(0.0, "assumed"),
            "overlap": Param(None, "assumed"),
        }
    notes.append("no multi-rank calibration and no --busbw: gradient communication is not modelled (0)")
    return {
        "comm_base_s": base,
        "comm_latency_s": Param(0.0, "assumed"),
        "comm_inv_busbw": Param(0.0, "assumed"),
        "comm_extra_s": Param(0.0, "assumed"),
        "overlap": overlap,
    }


def _compute_line(points: tp.Sequence[Calibration]) -> tp.Tuple[Param, Param]:
    """``(per step, per sample)`` of one regime's points: a line over two or more local batches, else proportional
    to the batch (the per-step part cannot be told apart from one batch: assumed 0)."""
    c0, c1 = _line([p.local_batch for p in points], [p.compute_s for p in points])
    if len({p.local_batch for p in points}) > 1:
        return Param(c0, "fitted"), Param(c1, "fitted")
    return Param(0.0, "assumed", "one local batch measured"), Param(c1, "measured")


def _compute(points: tp.Sequence[Calibration], notes: tp.List[str]) -> tp.Dict[str, Param]:
    """Compute per regime (one rank; several ranks, whose backward shares its cores or SMs with the all-reduce of
    the first buckets): each fitted on its own points, the other regime's when it has none."""
    single = [p for p in points if p.world_size == 1]
    multi = [p for p in points if p.world_size > 1]
    one = _compute_line(single) if single else None
    many = _compute_line(multi) if multi else None
    if one is None:
        assert many is not None
        one = tuple(Param(q.value, "assumed", "no one-rank calibration: as on several ranks") for q in many)
    if many is None:
        many = tuple(Param(q.value, "assumed", "no multi-rank calibration: as on one rank") for q in one)
    elif single and len({p.local_batch for p in multi}) == 1 and len({p.local_batch for p in single}) == 1:
        notes.append(
            "compute is fitted per regime (one rank, several ranks), each at one local batch: taken proportional to "
            "the batch (calibrate two multi-rank sizes, e.g. 2 and 2x2, to fit its per-step part)"
        )
    return {
        "compute_per_step_s": one[0],
        "compute_per_sample_s": one[1],
        "compute_multi_per_step_s": many[0],
        "compute_multi_per_sample_s": many[1],
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


def _input_path(
    points: tp.Sequence[Calibration], targets: Targets, loader_rate: tp.Optional[float], notes: tp.List[str]
) -> tp.Tuple[Param, Param, Param]:
    """Bytes per sample, a node's read rate (shared storage) and a node's local read rate (docs/capacity.md "The
    input path"): measured from the loader's reads where the interval records carry them (``input``)."""
    read_bps = _median([p.read_bytes_per_sample for p in points])
    array_bps = _median([p.bytes_per_sample for p in points])
    if read_bps:
        amp = f", {read_bps / array_bps:.2f}x the dataset's arrays" if array_bps else ""
        bps = Param(read_bps, "measured", f"the loader's bytes read / samples{amp}")
    elif array_bps:
        bps = Param(array_bps, "measured", "the dataset's arrays (no loader reads recorded: read amplification 1)")
    else:
        bps = Param(None, "assumed", "unknown: no storage bound can be predicted")
    rpn = targets.gpus_per_node or max(p.ranks_per_node for p in points)
    shared = [p for p in points if not p.staged]
    staged = [p for p in points if p.staged]
    unit = bps.value or 1.0  # bytes per sample, or samples when bytes are unknown (then no aggregate bound)
    if loader_rate:
        rate = Param(loader_rate * rpn * unit, "measured", "a loader-bound calibration's delivered rate x ranks/node")
    else:
        per_rank = _median([p.rank_read_rate for p in shared])
        rate = Param(
            per_rank * rpn if per_rank else None,
            "measured" if per_rank else "assumed",
            "reader bytes / reader seconds x readers x ranks per node" if per_rank else "unknown: no node-side bound",
        )
    if targets.local_read_bw:
        local = Param(targets.local_read_bw, "given")
    elif _median([p.rank_read_rate for p in staged]):
        local = Param(_median([p.rank_read_rate for p in staged]) * rpn, "measured", "a staged calibration's reads")
    else:
        local = Param(rate.value, "assumed", "as fast as the node's measured reads (no staged calibration)")
    if targets.read_bw and not bps.value:
        notes.append("--read-bw given but no bytes per sample recorded: the storage bound is not modelled")
    return bps, rate, local


def _staging(points: tp.Sequence[Calibration], bps: tp.Optional[float]) -> tp.Dict[str, Param]:
    """What a stage copies per node and how fast a node copied (the stage records; else the input's size)."""
    staged = _median([p.stage_bytes for p in points])
    files = _median([p.dataset_bytes for p in points])
    dataset = _median([p.dataset_samples for p in points])
    if staged:
        size = Param(staged, "measured", "the stage records")
    elif files:
        size = Param(files, "measured", "the input files' size (data fingerprint)")
    elif dataset and bps:
        size = Param(dataset * bps, "assumed", "dataset samples x bytes per sample")
    else:
        size = Param(None, "assumed", "unknown")
    copy = _median([p.stage_copy_rate for p in points])
    return {
        "dataset_bytes": size,
        "stage_copy_rate": Param(
            copy, "measured" if copy else "assumed", "" if copy else "no stage record: bytes / the read rate"
        ),
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

    compute = _compute(points, notes)

    grad = _median([p.grad_bytes for p in points])
    grad_p = Param(grad, "measured" if grad else "assumed")
    if not grad:
        notes.append("no committed checkpoint: gradient bytes unknown, communication scales by latency only")
    comm = _comm(points, targets, float(grad or 0.0), notes)

    # data: a loader-bound point measures the loader's rate; the others the hand-over floor
    # the step's wait (the late rank's, per step) says whether it waited for data; the median rank may not have
    bound = [p for p in points if p.step_s and (p.data_wait_slowest_s or p.data_wait_s) > LOADER_BOUND * p.step_s]
    free = [p for p in points if p not in bound]
    rate = _median(
        [p.local_batch / (p.data_wait_s + p.compute_s + p.comm_s + p.optimizer_s + p.other_s) for p in bound]
    )
    loader = Param(rate, "measured" if rate else "assumed", "" if rate else "never loader-bound at calibration")
    floor = Param(_median([p.data_wait_s for p in free]) or 0.0, "measured" if free else "assumed")
    bps_p, rate_p, local_p = _input_path(points, targets, rate, notes)

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
            mtbf_node_hours_from_rate(targets.failure_rate), "given", f"{targets.failure_rate} per 1000 node-days"
        )
    else:
        mtbf = Param(DEFAULT_MTBF_NODE_HOURS, "assumed", "RSC-1's 6.50 failures per 1000 node-days (Kokolis et al.)")

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
        **compute,
        **_per_regime(points, "optimizer_s"),
        **_per_regime(points, "other_s"),
        grad_bytes=grad_p,
        data_floor_s=floor,
        loader_samples_per_s=loader,
        bytes_per_sample=bps_p,
        node_read_rate=rate_p,
        read_bw=Param(targets.read_bw, "given" if targets.read_bw else "assumed", "" if targets.read_bw else "unknown"),
        local_read_bw=local_p,
        **_staging(points, bps_p.value),
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
