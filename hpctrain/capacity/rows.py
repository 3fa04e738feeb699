"""The prediction at each node count: :func:`predict`, one row per node count (stdlib only).

:func:`step_parts` is the predicted step of one rank; each row adds throughput, the checkpoint interval
(Young/Daly), failures, time-limit segments, wall time, GPU-hours and ETTR from the formulas of
:mod:`hpctrain.capacity.model` and :mod:`hpctrain.reliability`, and names what bounds it
(:mod:`hpctrain.capacity.advice`). The fields are in docs/capacity.md.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain import reliability as rel
from hpctrain._human import fmt_duration
from hpctrain.capacity import model as m
from hpctrain.capacity.advice import _bound
from hpctrain.capacity.fit import Fitted
from hpctrain.defaults import DEFAULT_MTBF_NODE_HOURS

__all__ = ["step_parts", "input_path", "staging", "storage_bound_from", "predict"]


def input_path(f: Fitted, nodes: int, node_batch: float, rest_s: float) -> tp.Dict[str, tp.Any]:
    """The input path of one node at ``nodes`` nodes (docs/capacity.md "The input path"): bytes it reads per step
    (``node_batch`` samples), the rate it gets from shared storage, the rate it needs to hide its reads behind the
    rest of the step (``rest_s``), whether storage is the bound, and the data wait per step."""
    unit = f.bytes_per_sample.value or 1.0  # samples stand for bytes when the bytes are unknown (no storage bound)
    node_bytes = m.node_bytes_per_step(node_batch, 1.0, unit)
    aggregate = f.read_bw.value if f.bytes_per_sample.value else None
    rate = m.node_read_rate(nodes, node_rate=f.node_read_rate.value, aggregate_bw=aggregate)
    wait = m.data_wait_seconds(m.node_read_seconds(node_bytes, rate), rest_s, f.data_floor_s.value or 0.0)
    need = m.node_read_need(node_bytes, rest_s)
    known = bool(f.bytes_per_sample.value)
    return {
        "node_bytes_per_step": node_bytes if known else None,
        "node_read_rate": rate if known and math.isfinite(rate) else None,
        "node_read_need": need if known and math.isfinite(need) else None,
        "storage_share": aggregate / nodes if aggregate else None,
        "read_demand": m.read_demand(nodes, node_bytes, rest_s + wait) if known else None,
        "storage_bound": m.storage_bound(nodes, aggregate, need),
        "data_wait_s": wait,
    }


def staging(f: Fitted, nodes: int, node_batch: float, rest_s: float, wait_s: float, steps: int) -> tp.Dict[str, tp.Any]:
    """When staging pays off at ``nodes`` nodes: each node's copy (:func:`model.staging_seconds`) against the data
    wait it removes per step (``wait_s`` on shared storage less the wait at the node-local read rate) over the
    run's ``steps``."""
    out: tp.Dict[str, tp.Any] = {"copy_s": None, "local_wait_s": None, "saved_per_step_s": None, "pays_off_after": None}
    size = f.dataset_bytes.value
    aggregate = f.read_bw.value
    copy_rate = f.stage_copy_rate.value or (None if aggregate else f.node_read_rate.value)
    copy = m.staging_seconds(size, nodes, copy_rate=copy_rate, aggregate_bw=aggregate) if size else None
    unit = f.bytes_per_sample.value or 1.0
    node_bytes = m.node_bytes_per_step(node_batch, 1.0, unit)
    local = f.local_read_bw.value
    local_rate = local if local and f.bytes_per_sample.value else math.inf
    local_wait = m.data_wait_seconds(m.node_read_seconds(node_bytes, local_rate), rest_s, f.data_floor_s.value or 0.0)
    saved = max(0.0, wait_s - local_wait)
    k = m.staging_payoff_steps(copy, saved) if copy is not None else None
    out.update(copy_s=copy, local_wait_s=local_wait, saved_per_step_s=saved, pays_off_after=k, steps=steps)
    if copy is None:
        out["verdict"] = "staging cannot be costed: the input's size or a read rate is unknown (give --read-bw)"
    elif k is None:
        floor = f.data_floor_s.value or 0.0
        why = "the wait is the loader's own, not the storage's" if wait_s > floor else "there is no data wait"
        out["verdict"] = f"staging does not pay off: it removes no data wait at {nodes} node(s) ({why})"
    elif k > steps:
        out["verdict"] = (
            f"staging does not pay off: its copy ({fmt_duration(copy)} per node) is longer than the data wait it "
            f"removes over the run's {steps} steps ({fmt_duration(saved * steps)})"
        )
    else:
        out["verdict"] = (
            f"staging pays off after {k} steps (a {fmt_duration(copy)} copy per node against {fmt_duration(saved)} "
            f"of data wait removed per step; the run has {steps} steps)"
        )
    return out


def step_parts(f: Fitted, ranks: int, nodes: int, local_batch: float) -> tp.Dict[str, float]:
    """The predicted step of one rank, split into its parts (seconds)."""
    per_sample, per_step = (
        (f.compute_multi_per_sample_s, f.compute_multi_per_step_s)
        if ranks > 1
        else (f.compute_per_sample_s, f.compute_per_step_s)
    )
    compute = m.compute_seconds(local_batch, per_sample.value or 0.0, per_step.value or 0.0)
    comm = f.comm_base_s.value or 0.0
    if ranks > 1:
        comm += (f.comm_latency_s.value or 0.0) * m.allreduce_latency_steps(ranks)
        comm += (f.comm_inv_busbw.value or 0.0) * m.busbw_factor(ranks) * (f.grad_bytes.value or 0.0)
    extra = (f.comm_extra_s.value or 0.0) if ranks > 1 else 0.0
    if ranks > 1:
        optimizer, other = f.optimizer_multi_s.value or 0.0, f.other_multi_s.value or 0.0
    else:
        optimizer, other = f.optimizer_s.value or 0.0, f.other_s.value or 0.0
    # the node that is late for its batch waits for nobody else: its own step is the read, then its work with the
    # bare all-reduce; the excess measured at calibration (waiting for the slowest rank) is the others' and shows
    # in their communication only while no node waits for data
    data = input_path(f, nodes, local_batch * ranks / nodes, compute + comm + optimizer + other)["data_wait_s"]
    if data <= (f.data_floor_s.value or 0.0):
        comm += extra
    return {"data_wait_s": data, "compute_s": compute, "comm_s": comm, "optimizer_s": optimizer, "other_s": other}


def _batch(f: Fitted, nodes: int) -> tp.Tuple[int, int, float, float]:
    """Ranks per node, ranks, local batch and global batch at ``nodes`` nodes (the batch policy)."""
    rpn = int(round(f.ranks_per_node.value or 1))
    ranks = nodes * rpn
    if f.local_batch.value:
        return rpn, ranks, f.local_batch.value, f.local_batch.value * ranks
    global_batch = f.global_batch.value or 1.0
    return rpn, ranks, global_batch / ranks, global_batch


SCAN_NODES = 1 << 16
""":func:`storage_bound_from` tries every node count up to this (beyond it: the requested ones)."""


def storage_bound_from(f: Fitted, nodes: tp.Sequence[int]) -> tp.Optional[int]:
    """The first node count where storage becomes the bound (:func:`model.storage_bound`: aggregate bandwidth / N
    below what a node needs), trying every N up to the largest requested (up to :data:`SCAN_NODES`, then the
    requested counts); None when it is not within them (or no aggregate bandwidth is known)."""
    if not (f.read_bw.value and f.bytes_per_sample.value):
        return None
    top = max(nodes)
    tries = list(range(1, min(top, SCAN_NODES) + 1)) + sorted(n for n in set(nodes) if n > SCAN_NODES)
    for n in tries:
        rpn, ranks, local, _ = _batch(f, n)
        if local < 1:
            continue
        parts = step_parts(f, ranks, n, local)
        rest = sum(parts.values()) - parts["data_wait_s"]
        if input_path(f, n, local * rpn, rest)["storage_bound"]:
            return n
    return None


def _row(f: Fitted, nodes: int, thr_1: tp.Optional[float]) -> tp.Dict[str, tp.Any]:
    rpn, ranks, local, global_batch = _batch(f, nodes)
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
    thr = m.throughput(local, ranks, step) if step > 0 else math.inf
    if not (math.isfinite(step) and step > 0 and math.isfinite(thr) and thr > 0):
        row.update(
            feasible=False,
            bound="not measurable",
            advice=(
                f"the calibration's measurements give a predicted step of {step:.3g} s at {nodes} node(s): no "
                "prediction can be made from them (see the notes); calibrate again"
            ),
        )
        return row
    samples = f.samples.value or 0.0
    steps = math.ceil(samples / global_batch) if samples else 0
    work = steps * step
    # checkpoints and failures
    commit = (f.save_commit_s.value or 0.0) + (f.save_per_node_s.value or 0.0) / nodes
    if f.write_bw.value and f.checkpoint_bytes.value:
        commit = max(commit, f.checkpoint_bytes.value / f.write_bw.value)
    delta = f.save_stall_s.value if f.save_stall_s.value is not None else commit
    pending = max(0.0, commit - delta)  # an async save is not durable until written
    mtbf = rel.job_mtbf_seconds(nodes, f.mtbf_node_hours.value or DEFAULT_MTBF_NODE_HOURS)
    startup, restore, queue = f.startup_s.value or 0.0, f.restore_s.value or 0.0, f.queue_wait_s.value or 0.0
    restart = queue + startup + restore
    young = rel.young_interval(delta, mtbf) if delta else None
    daly = rel.daly_interval(delta, mtbf) if delta else None
    tau = daly if daly else None
    if tau:
        per_failure = rel.failure_loss_seconds(tau, restart + pending)
        ettr = rel.ettr(tau, delta, mtbf, restart + pending)
    else:  # no save cost measured: checkpointing is free, the interval tends to 0 and a failure costs its restart
        per_failure = rel.failure_loss_seconds(0.0, restart)
        ettr = max(0.0, 1.0 - per_failure / mtbf)
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
    expected = run / mtbf if math.isfinite(run) else None
    # the failures expected over the run, each costing its half interval redone and its restart (docs/capacity.md)
    fail_loss = expected * per_failure if expected is not None else math.inf
    eff = m.scaling_efficiency(thr, nodes, thr_1) if thr_1 else None
    mfu = None
    if f.peak_flops.value and f.flops_per_sample.value:
        mfu = thr * f.flops_per_sample.value / (ranks * f.peak_flops.value)
        mfu = mfu if math.isfinite(mfu) else None
    rest = step - parts["data_wait_s"]
    inp = input_path(f, nodes, local * rpn, rest)
    needed = m.read_demand(1, inp["node_bytes_per_step"], step) if inp["node_bytes_per_step"] else None
    row.update(
        feasible=True,
        step_s=step,
        parts=parts,
        samples_per_s=thr,
        efficiency=eff,
        mfu=mfu,
        read_bw_per_node=needed,
        input={k: v for k, v in inp.items() if k != "data_wait_s"},
        staging=staging(f, nodes, local * rpn, rest, parts["data_wait_s"], steps),
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
            "expected": expected,
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


def predict(f: Fitted, nodes: tp.Sequence[int]) -> tp.List[tp.Dict[str, tp.Any]]:
    """One row per node count (see docs/capacity.md for the fields)."""
    base = _row(f, 1, None)
    thr_1 = base.get("samples_per_s") if base.get("feasible") else None
    return [_row(f, n, thr_1) for n in nodes]
