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
from hpctrain.capacity import model as m
from hpctrain.capacity.advice import _bound
from hpctrain.capacity.fit import Fitted
from hpctrain.defaults import DEFAULT_MTBF_NODE_HOURS

__all__ = ["step_parts", "predict"]


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
