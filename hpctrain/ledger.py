"""The run's ledger: one record per start, end and exit of an attempt (stdlib only).

Three writers, one file (``RunDir.ledger``): the Trainer appends ``start`` when its first step is near and
``end`` when ``fit()`` returns or raises (:mod:`hpctrain.train`); the Runner's lowest surviving rank appends
``exit``, how the attempt ended and whether it was requeued (:mod:`hpctrain.launch.ending`). The login-node
tools read it (``status``, ``report``, ``bundle``) through :func:`hpctrain.run.attempts`, the one rule of
which records make an attempt and how each is labelled. The schemas are in docs/train.md. Every append
rewrites the small file atomically (tmp + fsync + rename), so a crash leaves the old ledger or the new
one, never a torn line.
"""

from __future__ import annotations

import math
import os
import threading
import typing as tp

from hpctrain.rundir import LEDGER_SCHEMA, RunDir, append_jsonl_atomic, read_jsonl

__all__ = ["Ledger"]

# Two threads of one rank may append at once (the Trainer's end record while the hang watchdog's thread writes
# the exit record); each append rewrites the file, so without the lock one of the two records is lost.
_APPEND_LOCK = threading.Lock()


def _number(value: tp.Any) -> tp.Optional[float]:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


class Ledger:
    """``Ledger(run_dir)``: append and read the records of one run."""

    def __init__(self, run_dir: tp.Union[str, "os.PathLike[str]", RunDir]) -> None:
        self.run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.path = self.run_dir.ledger

    def append(self, record: tp.Mapping[str, tp.Any]) -> None:
        with _APPEND_LOCK:
            append_jsonl_atomic(self.path, record, schema=LEDGER_SCHEMA)

    def read(self) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[str]]:
        """``(records, problems)``: one problem line per record that could not be read."""
        return read_jsonl(self.path)

    def records(self, event: tp.Optional[str] = None) -> tp.List[tp.Dict[str, tp.Any]]:
        records = self.read()[0]
        return records if event is None else [r for r in records if r.get("event") == event]

    def attempt_start(self, job_id: str, restart_count: int) -> tp.Optional[tp.Dict[str, tp.Any]]:
        """The Trainer's start record of one attempt (None for an entry that does not use the Trainer)."""
        mine = [
            r
            for r in self.records("start")
            if str(r.get("job_id")) == str(job_id) and r.get("restart_count") == restart_count
        ]
        return mine[-1] if mine else None

    def previous_attempt(
        self, restart_count: int
    ) -> tp.Tuple[tp.Optional[str], tp.Optional[float], tp.Optional[float]]:
        """``(how the previous attempt ended, its last measured save in s, its step time in s)``, for the
        start record of a restart: the cause from its exit record, or "killed" when it left none."""
        records = self.read()[0]
        exits = [r for r in records if r.get("event") == "exit"]
        ends = [r for r in records if r.get("event") == "end" and _number(r.get("last_save_s")) is not None]
        after = None
        if exits:
            last = exits[-1]
            after = f"{last.get('cause')} ({'requeued' if last.get('requeued') else last.get('reason')})"
        elif restart_count > 0:
            after = "unknown (the previous attempt left no exit record: killed)"
        if not ends:
            return after, None, None
        return after, _number(ends[-1]["last_save_s"]), _number(ends[-1].get("step_s")) or 0.0
