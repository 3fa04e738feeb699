"""What bounds a predicted row, in plain words, and what would change the answer: :func:`_bound` (stdlib only).

Also the node counts those words use, and :func:`_dur` (the CLI's too): the house's duration format
(:func:`hpctrain._human.fmt_duration`), with ``never`` for a run that cannot end.
"""

from __future__ import annotations

import math
import typing as tp

from hpctrain._human import fmt_duration
from hpctrain.capacity.fit import Fitted

BOUND_SHARE = 0.10
"""A loss above this share of the wall time is named as what bounds the run (else: compute)."""


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB/s"


def _dur(seconds: tp.Optional[float]) -> str:
    """:func:`hpctrain._human.fmt_duration`; ``never`` for an infinite time (a run that cannot finish)."""
    if isinstance(seconds, float) and math.isinf(seconds) and seconds > 0:
        return "never"
    return fmt_duration(seconds)


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
    if not wall > 0:  # nothing to train and nothing to start: no resource bounds it
        return "nothing to train", (
            "the target is 0 samples and the run costs no start-up: give --samples or --epochs to predict a run"
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
    if name == "storage" and row["input"]["storage_bound"]:
        inp = row["input"]
        return "storage", (
            f"data wait reaches {parts['data_wait_s'] / step:.0%} of the step at {_nodes(n)}: the file system's share "
            f"of a node ({_gb(inp['storage_share'])}) is below the {_gb(inp['node_read_need'])} it needs to hide "
            f"its reads; {row['staging']['verdict']}; or raise the read bandwidth"
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
