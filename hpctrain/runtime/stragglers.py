"""Stragglers: a rank whose own work per step stays above the others' for several log intervals (stdlib only).

Rank 0 already receives every rank's phase times at each log interval (one ``all_gather`` in
:meth:`MetricsRecorder.flush <hpctrain.train.metrics.MetricsRecorder.flush>`); the detector reads the record it
builds, so detection costs no collective and no I/O until a straggler is found. In a synchronous job every
rank's *step* time is the same (the fast ranks wait for the slow one inside the gradient all-reduce), so the
measure is a rank's **busy** time per step: the step minus its exposed gradient communication (the waiting).
A rank whose busy time is above the reference by ``threshold`` (the median of all ranks; at world size 2 the
other rank) for ``intervals`` consecutive intervals is a straggler; its slow phase is the one where it holds
the largest excess over the median: ``data wait`` (the loader, the file system), ``compute`` (forward,
backward, optimizer: a slow or throttled device) or ``communication``. Recorded once per rank and attempt as
a ``straggler`` event in the ledger and one line on stderr; ``status`` shows it, and with
``--exclude-stragglers`` :func:`hpctrain.runtime.watchdog.suspect_hosts` hands its host to the requeue.
"""

from __future__ import annotations

import sys
import time
import typing as tp
from pathlib import Path

from hpctrain.rundir import RunDir, read_json

__all__ = ["StragglerDetector", "find_straggler", "THRESHOLD", "INTERVALS"]

THRESHOLD = 0.5
"""A straggler's busy time is at least 1.5 x the reference (the median busy time)."""
INTERVALS = 3
"""... for this many consecutive log intervals (one slow interval is noise: a GC pause, a page-cache miss)."""
MIN_EXCESS_S = 0.002
"""... and at least 2 ms a step above it (relative noise on micro-second steps is no straggler)."""

# the per-step phases of a metrics record (hpctrain.train.metrics) and the name status shows for each
_PHASES = (
    ("data_wait_s", "data wait"),
    ("forward_backward_s", "compute"),
    ("optimizer_s", "compute"),
    ("grad_comm_exposed_s", "communication"),
)


def find_straggler(
    record: tp.Mapping[str, tp.Any], *, threshold: float = THRESHOLD
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The slowest rank of one interval record when it is slow enough to count, else None:
    ``{rank, phase, busy_s, reference_s, ratio}``."""
    per_step = record.get("per_step")
    if not isinstance(per_step, dict) or int(record.get("world_size") or 1) < 2:
        return None
    busy = per_step.get("busy_s")
    if not isinstance(busy, dict):
        return None
    try:
        rank, worst = int(busy["max_rank"]), float(busy["max"])
        # at world size 2 the median is the mean of both: compare with the other rank instead
        key_ref = "min" if int(record["world_size"]) == 2 else "median"
        ref = float(busy[key_ref])
    except (KeyError, TypeError, ValueError):
        return None
    if worst < ref * (1.0 + threshold) or worst - ref < MIN_EXCESS_S:
        return None
    phase, excess = "compute", 0.0
    for key, name in _PHASES:
        spread = per_step.get(key)
        if isinstance(spread, dict) and spread.get("max_rank") == rank:
            gap = float(spread.get("max") or 0.0) - float(spread.get(key_ref) or 0.0)
            if gap > excess:
                phase, excess = name, gap
    return {"rank": rank, "phase": phase, "busy_s": worst, "reference_s": ref, "ratio": worst / max(ref, 1e-12)}


class StragglerDetector:
    """Rank 0: ``observe(record)`` at every log interval; records each straggler once per attempt."""

    def __init__(
        self,
        run_dir: tp.Union[str, Path],
        *,
        job_id: str,
        restart_count: int,
        threshold: float = THRESHOLD,
        intervals: int = INTERVALS,
    ) -> None:
        self.paths = RunDir(run_dir)
        self.job_id, self.restart_count = job_id, restart_count
        self.threshold, self.intervals = threshold, intervals
        self._streak: tp.Tuple[tp.Optional[int], int] = (None, 0)
        self.recorded: tp.Dict[int, tp.Dict[str, tp.Any]] = {}

    def observe(self, record: tp.Mapping[str, tp.Any]) -> tp.Optional[tp.Dict[str, tp.Any]]:
        """The straggler record written at this interval, if one was."""
        found = find_straggler(record, threshold=self.threshold)
        if found is None:
            self._streak = (None, 0)
            return None
        rank = found["rank"]
        count = self._streak[1] + 1 if self._streak[0] == rank else 1
        self._streak = (rank, count)
        if count < self.intervals or rank in self.recorded:
            return None
        host = (read_json(self.paths.rank_record(self.job_id, self.restart_count, rank), []) or {}).get("hostname")
        out = {
            "event": "straggler",
            "time": time.time(),
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "step": record.get("step"),
            "rank": rank,
            "host": host if isinstance(host, str) else None,
            "phase": found["phase"],
            "busy_s": found["busy_s"],
            "reference_s": found["reference_s"],
            "ratio": found["ratio"],
            "intervals": count,
        }
        self.recorded[rank] = out
        from hpctrain.ledger import Ledger

        try:
            Ledger(self.paths).append(out)
        except OSError as exc:
            print(f"hpctrain: could not record a straggler in the ledger: {exc}", file=sys.stderr, flush=True)
        print(
            f"hpctrain: straggler: rank {rank} on {out['host']}: {found['ratio']:.1f}x the others' busy time per "
            f"step for {count} intervals (slow phase: {found['phase']})",
            file=sys.stderr,
            flush=True,
        )
        return out
