"""A rank's start-up profile: where the time from its OS process start to its first finished step went.

One clock per process, stdlib only: the Runner marks its phases before torch is imported, and the login-side
``status`` and ``report`` read and format the records it feeds without torch. Whoever finishes a phase calls
:func:`mark` with its name; the phase lasts from the previous mark (the OS process start, for the first) to this
one. The phases, in the order a Trainer attempt passes them, are :data:`PHASES`; an entry that does not use the
Trainer has the Runner's (its rank records carry them).

The records (written by :mod:`hpctrain.train.ledger_records`): rank 0's ledger ``start`` record carries
``startup``, every rank's phases up to that point (:func:`gather`); after the first step, a ``startup`` ledger
record carries the whole profile (the wait for the slowest rank and the first step added). :func:`recorded`
reads an attempt's profile back from those records, :func:`line` says it in one line.
"""

from __future__ import annotations

import math
import os
import time
import typing as tp

__all__ = ["PHASES", "gather", "line", "mark", "phases", "process_start_time", "recorded", "reset"]

PHASES: tp.Tuple[tp.Tuple[str, str], ...] = (
    ("interpreter", "interpreter"),  # OS process start -> the Runner called (Python, site, unpickling the Runner)
    ("imports", "imports"),  # hpctrain's launch modules, torch, the device choice, until the rendezvous begins
    ("rendezvous", "rendezvous"),  # init_process_group: the TCP store and the default group (waits for the last rank)
    ("process_group", "process group"),  # the stop agreement's own gloo group
    ("entry", "entry"),  # rank 0's identity and records, importing the entry, its code until Trainer.fit
    ("build", "build"),  # seed, model, its parallel wrap, optimizer, scheduler
    ("loader", "loader"),  # this rank's loader opened
    ("identity", "identity"),  # the training identity: rank 0 fingerprints the inputs, the others wait in its vote
    ("restore", "restore"),  # open the checkpointer, read + verify + exchange the newest commit (one ckpt call)
    ("metrics", "metrics"),  # the metrics recorder and its TensorBoard writer
    ("wait", "wait for ranks"),  # the start record's gather: the time this rank waited for the slowest one
    ("first_step", "first step"),  # the stop poll, the DDP bucket warm-up and the first training step
)
"""``(name, label)`` of each phase, in the order they are passed."""
_NAMES = tuple(name for name, _ in PHASES)
_LABELS = dict(PHASES)
PER_RANK_KEPT = 64
"""Ranks whose own phases a record keeps (the slowest, beyond that): the ledger is rewritten at each append and read
by every ``status``, so a record stays a few tens of KiB at any world size; ``phases`` is the max over all ranks."""


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: /proc), so that the ledger can say how long the
    start-up took (interpreter, imports, rendezvous, restore) before the first step. Falls back to now."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); the split starts at field 3
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class _Clock:
    def __init__(self) -> None:
        self.origin = self.last = process_start_time()
        self.spent: tp.Dict[str, float] = {}
        self.done = False

    def mark(self, phase: str, at: float) -> None:
        if self.done:  # a second fit() in this process: a new profile, from the end of the previous first step
            self.spent, self.done = {}, False
        self.spent[phase] = self.spent.get(phase, 0.0) + max(0.0, at - self.last)
        self.last = max(self.last, at)
        self.done = phase == "first_step"


_CLOCK: tp.Optional[_Clock] = None


def _clock() -> _Clock:
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = _Clock()
    return _CLOCK


def mark(phase: str, at: tp.Optional[float] = None) -> None:
    """``phase`` (a name of :data:`PHASES`) ended ``at`` (default now, Unix seconds); marked twice, it adds up."""
    if phase not in _LABELS:
        raise ValueError(f"unknown start-up phase {phase!r}; one of {', '.join(_NAMES)}")
    _clock().mark(phase, time.time() if at is None else at)


def phases() -> tp.Dict[str, float]:
    """This process's phases so far, in :data:`PHASES` order, in seconds."""
    spent = _clock().spent
    return {name: round(spent[name], 4) for name in _NAMES if name in spent}


def reset() -> None:
    """Forget the clock (tests; a process that starts a new profile from its start)."""
    global _CLOCK
    _CLOCK = None


def gather(host: str) -> tp.Dict[str, tp.Any]:
    """Every rank's phases so far, as the profile rank 0 records; a collective on every rank of the default group.

    One ``all_gather_object`` of a few hundred bytes per rank over the group that exists already: cheaper than
    rank 0 reading every rank's record file (one shared-filesystem round trip per rank, and a barrier anyway,
    since the ranks finish their phases at different times), and done once per attempt, at a point where the
    ranks meet regardless (the first step's all-reduce). Without a process group: this rank's alone."""
    clock = _clock()
    own = phases()
    mine = {"host": host, "phases": own, "started_at": round(clock.origin, 4)}
    got: tp.List[tp.Any] = [mine]
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - the ranks always have torch
        dist = None  # type: ignore[assignment]
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, mine)
    return _summary(got)


def _summary(got: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """``got``: per rank (in rank order, or each with its ``rank``) ``host``, ``started_at`` (its OS process start)
    and ``phases``."""
    per_rank = [{"rank": r, **g, "total_s": round(sum(g["phases"].values()), 4)} for r, g in enumerate(got)]

    def ready(g: tp.Mapping[str, tp.Any]) -> float:  # when it reached the start record: what the others waited for
        return float(g["started_at"]) + sum(v for n, v in g["phases"].items() if n not in ("wait", "first_step"))

    # the slowest rank is the last one ready, not the one whose process started first (whose total is the longest)
    slowest = max(per_rank, key=ready)
    kept = sorted(per_rank, key=ready, reverse=True)[:PER_RANK_KEPT]
    return {
        "phases": {
            n: max(g["phases"].get(n, 0.0) for g in per_rank) for n in _NAMES if any(n in g["phases"] for g in per_rank)
        },
        # the attempt's start-up: the longest of the ranks' own, from its process start to the end of its last phase
        "total_s": round(max(g["total_s"] for g in per_rank), 4),
        "slowest_rank": slowest["rank"],
        "slowest_host": slowest["host"],
        "ranks": len(per_rank),
        "per_rank": sorted(kept, key=lambda g: g["rank"]),
    }


# ------------------------------------------------------------------------------------------ the login-side reading
def _seconds(value: tp.Any) -> tp.Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def recorded(
    start: tp.Optional[tp.Mapping[str, tp.Any]], later: tp.Optional[tp.Mapping[str, tp.Any]] = None
) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """An attempt's profile from its ledger records: the ``startup`` record's (``later``: the whole start-up, the
    first step included) else the ``start`` record's (up to the start record); None when neither holds one.
    ``{"phases", "total_s", "slowest_rank", "slowest_host", "ranks", "until"}`` (``until``: ``first_step``, or
    ``start`` for the start record's); a damaged field is left out, never an exception (the records come from disk)."""
    for rec, until in ((later, "first_step"), (start, "start")):
        prof = rec.get("startup") if isinstance(rec, tp.Mapping) else None
        if not isinstance(prof, tp.Mapping) or not isinstance(prof.get("phases"), tp.Mapping):
            continue
        got = {n: _seconds(prof["phases"].get(n)) for n in _NAMES}
        found = {n: v for n, v in got.items() if v is not None}
        if not found:
            continue
        rank, host, ranks = prof.get("slowest_rank"), prof.get("slowest_host"), prof.get("ranks")
        return {
            "phases": found,
            "total_s": _seconds(prof.get("total_s")),
            "slowest_rank": rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            "slowest_host": host[:200] if isinstance(host, str) else None,
            "ranks": ranks if isinstance(ranks, int) and not isinstance(ranks, bool) else None,
            "until": until,
        }
    return None


def from_rank_records(records: tp.Iterable[tp.Mapping[str, tp.Any]]) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The Runner's phases of an attempt whose entry wrote no start record (it does not use the Trainer), from its
    ranks' records (:meth:`hpctrain.rundir.RunDir.rank_record`, read from disk): :func:`recorded`'s shape with
    ``until`` ``entry``; None when no record holds them."""
    got = []
    for rec in records:
        ph, runner_at, rank = rec.get("startup"), _seconds(rec.get("started_at")), rec.get("rank")
        if not isinstance(ph, tp.Mapping) or runner_at is None or not isinstance(rank, int):
            continue
        phases_ = {n: v for n in _NAMES if (v := _seconds(ph.get(n))) is not None}
        if phases_:  # started_at is the Runner's: the OS process start is the interpreter phase before it
            host = rec.get("hostname")
            origin = runner_at - phases_.get("interpreter", 0.0)
            got.append({"host": host if isinstance(host, str) else "", "started_at": origin, "phases": phases_})
            got[-1]["rank"] = rank
    if not got:
        return None
    summary = _summary(got)
    summary["ranks"] = len(got)
    found = recorded({"startup": summary})
    return {**found, "until": "entry"} if found is not None else None


def line(profile: tp.Mapping[str, tp.Any]) -> str:
    """``14.2 s: interpreter 300 ms, imports 6.1 s, ... (max over 4 ranks; slowest rank 3 on node2)``."""
    from hpctrain._human import fmt_duration

    phases_ = profile.get("phases") or {}
    parts = [f"{_LABELS[n]} {fmt_duration(phases_[n])}" for n in _NAMES if n in phases_]
    text = f"{fmt_duration(profile.get('total_s'))}: {', '.join(parts)}"
    notes = []
    if (profile.get("ranks") or 0) > 1:
        notes.append(f"max over {profile['ranks']} ranks")
    if profile.get("slowest_rank") is not None:
        on = f" on {profile['slowest_host']}" if profile.get("slowest_host") else ""
        notes.append(f"slowest rank {profile['slowest_rank']}{on}")
    until = profile.get("until")
    if until == "start":
        notes.append("until the start record: no first step recorded")
    elif until == "entry":
        notes.append("the Runner's phases: the entry records no start")
    return text + (f" ({'; '.join(notes)})" if notes else "")
