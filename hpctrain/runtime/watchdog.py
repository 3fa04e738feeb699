"""A no-progress watchdog on every rank: heartbeats, hang detection, stack dumps, a bounded end (stdlib only).

How a rank reports progress: the training thread only assigns a tuple in memory (``beat(step)`` from
:meth:`~hpctrain.launch.context.RunContext.should_stop`, ``mark(phase)`` from the
Trainer's step timer, ``during(phase, fn)`` around restore, save and evaluation): about a microsecond, no
I/O, no collective. A daemon thread per rank wakes every ``poll_s`` and

* rewrites :meth:`RunDir.heartbeat <hpctrain.rundir.RunDir.heartbeat>` when the progress changed
  (``{step, marks, phase, progress_time, host}``). Files rather than keys in the rendezvous TCPStore: they
  outlive the process (the rank that decides after a hang, and ``status`` on the login node, read the last
  progress of a rank that is dead or stuck), need no connection to rank 0's store (which a hang on rank 0's
  host takes down with it), and their cost is bounded by ``poll_s``, not by the step rate;
* re-arms :func:`faulthandler.dump_traceback_later` (``exit=True``) a bound past the deadline: a rank whose
  main thread holds the GIL in C code (so this thread never runs) still dumps its stacks and ends;
* compares the time since the last progress with :func:`hang_timeout` and, past it, **fires**: the rank's
  stacks (all threads, :mod:`faulthandler`, plus ``py-spy dump`` when installed) go to
  :meth:`RunDir.stack_dump <hpctrain.rundir.RunDir.stack_dump>`, its heartbeat is marked hung, and the
  Runner's ``on_hang`` ends the attempt (:func:`hpctrain.launch.ending.finish_attempt` with
  :class:`~hpctrain.runtime.preemption.HangDetected`: cause ``hang``, requeued when a new step was
  committed); then ``os._exit`` (a thread cannot unwind a main thread blocked in a gloo/NCCL collective).

Which rank decides and how the others learn: nobody has to tell them. A hung rank stops making progress, and
so does every rank waiting for it in a collective, so every rank's own watchdog fires within about
``poll_s`` of the others (the timeouts agree: the floor dominates, or they derive from the same synchronous
step time). Rank 0 (or the lowest rank left alive) decides as for any end; it waits a few seconds for the
others' end records, then :func:`attribute_hang` reads every heartbeat: the rank(s) furthest behind
(fewest steps, then fewest phase marks in that step) are the hung ones, named with their host in one line
and in :meth:`RunDir.hang_report <hpctrain.rundir.RunDir.hang_report>` and the ledger's exit record.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import sys
import threading
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_json, tmp_path
from hpctrain.rundir import RunDir, dumps_record, read_json

__all__ = [
    "Watchdog",
    "hang_timeout",
    "attribute_hang",
    "suspect_hosts",
    "beat",
    "mark",
    "during",
    "leave",
    "follow_timer",
    "interval",
    "current",
    "MIN_TIMEOUT_S",
    "SLOW_PHASES",
]

MIN_TIMEOUT_S = 300.0
"""The floor of the derived hang timeout: max(STEP_FACTOR x the measured step time, 5 minutes)."""
STEP_FACTOR = 10.0
SLOW_FACTOR = 4.0
"""Start-up, restore, save, evaluation and the first step get this many times the timeout ..."""
SLOW_FLOOR_S = 120.0
"""... and at least this (an explicit short ``--hang-timeout`` must not end a slow import or rendezvous)."""
SLOW_PHASES = frozenset({"startup", "restore", "save", "eval", "finish"})
UNWATCHED = "entry"
"""The phase of an entry that reported no progress yet: not watched (an entry that never reports would be
ended after the timeout otherwise). The Runner sets it when it calls the entry."""
END_BOUND_S = 60.0
"""After firing, the process ends within this many seconds whatever happens (a stuck ``scontrol``, py-spy)."""
PYSPY_TIMEOUT_S = 20.0
PEER_WAIT_S = 10.0
"""After ending its attempt, a fired rank waits this long at most for the others to fire too (or end)."""


def hang_timeout(phase: str, step_s: tp.Optional[float], hang_timeout: tp.Optional[float] = None) -> tp.Optional[float]:
    """Seconds without progress after which a rank in ``phase`` counts as hung; None: not watched.

    ``hang_timeout`` is the setting of that name (``--hang-timeout``, ``RunnerSettings.hang_timeout``); otherwise
    max(10 x ``step_s``, 5 min). Slow phases, and training before a step time was measured (the first step: lazy
    CUDA init, compilation), get max(4 x that, 2 min)."""
    if phase == UNWATCHED:
        return None
    base = float(hang_timeout) if hang_timeout else max(STEP_FACTOR * (step_s or 0.0), MIN_TIMEOUT_S)
    if phase in SLOW_PHASES or not step_s:
        return max(SLOW_FACTOR * base, SLOW_FLOOR_S)
    return base


# The progress is one plain tuple, replaced (never mutated) by the training thread and read by the watchdog
# thread: (step done, marks since, phase, part, monotonic time). A tuple because it is built up to five times a
# step: a dataclass cost 3x as much per report.
#   marks: progress reports since the step began (timer marks, evaluation polls): all ranks make the same ones;
#   phase: train, startup, restore, save, eval, finish, or entry (not watched);
#   part:  what the rank was doing within it, the last timer mark's successor (data_wait -> forward_backward ...).
_Progress = tp.Tuple[int, int, str, str, float]
STEP, MARKS, PHASE, PART, TIME = range(5)


# the part of a step a rank is in once it passed each timer mark (its hang is in the next one)
_AFTER_MARK = {
    "data_wait": "forward_backward",
    "grad_comm": "grad_comm",
    "forward_backward": "optimizer",
    "optimizer": "step end",
    "checkpoint": "step end",
}


class Watchdog:
    """One per rank (the Runner's). ``check()`` is the pure decision; ``start()`` runs it on a daemon thread."""

    def __init__(
        self,
        *,
        run_dir: tp.Union[str, Path],
        job_id: str,
        restart_count: int,
        rank: int,
        world_size: int,
        host: str,
        hang_timeout: tp.Optional[float] = None,
        poll_s: tp.Optional[float] = None,
        on_hang: tp.Optional[tp.Callable[[BaseException], int]] = None,
        clock: tp.Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = RunDir(run_dir)
        self.job_id, self.restart_count = job_id, int(restart_count)
        self.rank, self.world_size, self.host = int(rank), int(world_size), host
        self.hang_timeout = float(hang_timeout) if hang_timeout else None
        """The ``hang_timeout`` setting (``RunnerSettings.hang_timeout``); None: derived from the step time."""
        # a tenth of the shortest training timeout: detection is late by at most 10 %, the heartbeat costs
        # one small file write every few seconds
        self.poll_s = poll_s if poll_s else min(5.0, (self.hang_timeout or MIN_TIMEOUT_S) / 10.0)
        self.on_hang = on_hang
        self.clock = clock
        now = clock()
        self._p: _Progress = (-1, 0, "startup", "", now)
        self._step_t: tp.Optional[tp.Tuple[int, float]] = None  # (step, time) of the last step beat in training
        self.step_s: tp.Optional[float] = None
        """Moving average of the measured step time (training phases only)."""
        self._written: tp.Optional[tp.Tuple[tp.Any, ...]] = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.fired: tp.Optional[str] = None
        self._thread: tp.Optional[threading.Thread] = None
        self.stragglers: tp.Any = None  # rank 0: a StragglerDetector (hpctrain.runtime.stragglers)

    # ------------------------------------------------------------------ called by the training thread
    def beat(self, step: int) -> None:
        """Progress: ``step`` done (a new step ends a slow phase and measures the step time), or, at the same
        step, one more poll (an evaluation batch)."""
        now = self.clock()
        done, marks, phase, part, _ = self._p
        if step > done:
            last = self._step_t
            if phase == "train" and last is not None and step > last[0]:
                dt = (now - last[1]) / (step - last[0])
                self.step_s = dt if self.step_s is None else 0.8 * self.step_s + 0.2 * dt
            self._step_t = (step, now)
            self._p = (step, 0, "train" if phase in ("train", "startup", UNWATCHED) else phase, "data_wait", now)
        else:
            self._p = (done, marks + 1, "train" if phase == UNWATCHED else phase, part, now)

    def mark(self, name: str) -> None:
        """A timer mark (the Trainer's StepTimer calls it): progress within the step."""
        done, marks, phase, _, _ = self._p
        self._p = (done, marks + 1, "train" if phase == UNWATCHED else phase, _AFTER_MARK.get(name, name), self.clock())

    def set_phase(self, phase: str) -> str:
        """Enter ``phase`` (counts as progress); returns the previous one."""
        done, marks, previous, _, _ = self._p
        self._p = (done, marks + 1, phase, phase, self.clock())
        self._step_t = None  # the step that holds a save or an evaluation is not a measure of the step time
        return previous

    # ------------------------------------------------------------------ the decision
    def timeout(self) -> tp.Optional[float]:
        return hang_timeout(self._p[PHASE], self.step_s, self.hang_timeout)

    def check(self, now: tp.Optional[float] = None) -> tp.Optional[str]:
        """The reason this rank counts as hung (one line), or None."""
        (done, _, phase, part, at), limit = self._p, self.timeout()
        idle = (self.clock() if now is None else now) - at
        if limit is None or idle < limit:
            return None
        where = f"step {done + 1}" if done >= 0 else "before the first step"
        return (
            f"rank {self.rank} on {self.host}: no progress for {idle:.0f}s (hang timeout {limit:.0f}s) "
            f"in phase {phase}{f' ({part})' if part and part != phase else ''}, {where}"
        )

    def state(self) -> tp.Dict[str, tp.Any]:
        done, marks, phase, part, at = self._p
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": os.getpid(),
            "step": done,
            "marks": marks,
            "phase": phase,
            "part": part,
            "progress_time": time.time() - (self.clock() - at),  # wall-clock time of the last progress
            "time": time.time(),
            "timeout_s": self.timeout(),
            "step_s": self.step_s,
        }

    # ------------------------------------------------------------------ the thread
    def start(self) -> "Watchdog":
        self._write(force=True)
        self._thread = threading.Thread(target=self._run, name="hpctrain-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop watching (the entry returned). False when the watchdog fired already: the caller must not end
        the attempt itself (the watchdog thread is doing it), and should :meth:`wait_for_end`."""
        with self._lock:
            if self.fired:
                return False
            self._stopped.set()
        _backstop(None)
        return True

    def wait_for_end(self) -> None:
        """Block the calling thread until the firing watchdog thread ends the process (bounded by its backstop)."""
        while True:
            time.sleep(3600)

    def _run(self) -> None:
        while not self._stopped.wait(self.poll_s):
            try:
                self._write()
            except (OSError, ValueError):
                pass  # a heartbeat is help for attribution; a full disk must not end training
            limit = self.timeout()
            # the backstop: dump and exit even if this thread never runs again (GIL held by C code)
            _backstop(None if limit is None else limit - (self.clock() - self._p[TIME]) + END_BOUND_S)
            reason = self.check()
            if reason is None:
                continue
            with self._lock:
                if self._stopped.is_set():
                    return
                self.fired = reason
            self._fire(reason)
            return

    def _fire(self, reason: str) -> None:
        _backstop(END_BOUND_S)  # the end is bounded, whatever happens below
        code, dumps = 1, []
        try:
            dumps = self.dump_stacks()
            self._write(force=True, hung=reason, stacks=dumps)
            print(f"hpctrain: hang: {reason}; stacks in {dumps[0]}", file=sys.stderr, flush=True)
            if self.on_hang is not None:
                from hpctrain.runtime.preemption import HangDetected

                code = int(self.on_hang(HangDetected(reason)))
            self.wait_for_peers(PEER_WAIT_S)
            self._write(force=True, hung=reason, stacks=dumps, exited=time.time())  # the end, for the figures
        except BaseException as exc:  # noqa: BLE001 - the process ends below whatever happened
            print(f"hpctrain: hang: ending the attempt failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def wait_for_peers(self, wait_s: float) -> None:
        """Wait (up to ``wait_s``) until every rank marked its heartbeat hung or recorded its end. Exiting closes
        this rank's connections, and a peer whose watchdog has not fired yet would then leave its collective
        with a peer failure instead of dumping the stacks of the place it was blocked in."""
        deadline = time.monotonic() + wait_s
        if self.world_size > 64:  # thousands of ranks each reading thousands of files: just give them the time
            time.sleep(wait_s)
            return
        waiting = set(range(self.world_size)) - {self.rank}
        while waiting and time.monotonic() < deadline:
            for r in list(waiting):
                beat = read_json(self.paths.heartbeat(self.job_id, self.restart_count, r), []) or {}
                if beat.get("hung") or self.paths.rank_end(self.job_id, self.restart_count, r).exists():
                    waiting.discard(r)
            if waiting:
                time.sleep(0.2)

    def dump_stacks(self) -> tp.List[str]:
        """Every thread's Python stack to :meth:`RunDir.stack_dump` (and py-spy's, native frames too, when it is
        installed and may attach); the paths written."""
        path = self.paths.stack_dump(self.job_id, self.restart_count, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# rank {self.rank} on {self.host}, pid {os.getpid()}, {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            f.write(f"# progress: {dumps_record(self.state())}\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        written = [str(path)]
        spy = shutil.which("py-spy")
        if spy:
            out = self.paths.stack_dump(self.job_id, self.restart_count, self.rank, tool="py-spy")
            try:
                got = subprocess.run(
                    [spy, "dump", "--pid", str(os.getpid())],
                    capture_output=True,
                    text=True,
                    timeout=PYSPY_TIMEOUT_S,
                )
                out.write_text(got.stdout + got.stderr, encoding="utf-8")
                written.append(str(out))
            except (OSError, subprocess.SubprocessError) as exc:
                out.write_text(f"py-spy dump failed: {type(exc).__name__}: {exc}\n", encoding="utf-8")
        return written

    def _write(self, *, force: bool = False, **extra: tp.Any) -> None:
        key = self._p[:TIME]
        if not force and key == self._written:
            return
        path = self.paths.heartbeat(self.job_id, self.restart_count, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        if extra:  # the hung state: durable, it is evidence
            atomic_write_json(path, {**self.state(), **extra})
        else:
            # tmp + rename without fsync: a heartbeat is rewritten every few seconds; a crash keeps an older one
            tmp = tmp_path(path)
            tmp.write_text(dumps_record(self.state()) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        self._written = key


def _backstop(after_s: tp.Optional[float]) -> None:
    """Arm faulthandler to dump every stack and ``_exit(1)`` in ``after_s`` (None: disarm). To fd 2, the rank's
    log: ``sys.stderr`` may be a Python object without a file descriptor (a capture), which faulthandler refuses."""
    try:
        if after_s is None:
            faulthandler.cancel_dump_traceback_later()
        else:
            faulthandler.dump_traceback_later(max(after_s, 1.0), exit=True, file=2)
    except (ValueError, OSError, RuntimeError):
        pass  # no backstop: the watchdog thread itself still fires


# ---------------------------------------------------------------------- the process's watchdog
_CURRENT: tp.Optional[Watchdog] = None


def current() -> tp.Optional[Watchdog]:
    return _CURRENT


def install(watchdog: tp.Optional[Watchdog]) -> None:
    """Make ``watchdog`` the one the module functions report to (the Runner's; None: none)."""
    global _CURRENT
    _CURRENT = watchdog


def beat(step: int) -> None:
    """``step`` done (no-op without a watchdog). :meth:`~hpctrain.launch.context.RunContext.should_stop` calls it."""
    if _CURRENT is not None:
        _CURRENT.beat(step)


def mark(name: str) -> None:
    if _CURRENT is not None:
        _CURRENT.mark(name)


def during(phase: str, fn: tp.Callable[..., tp.Any], *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
    """``fn(*args, **kwargs)`` watched as ``phase`` (restore, save, eval: the longer timeout); the phase before
    it is put back after."""
    wd = _CURRENT
    if wd is None:
        return fn(*args, **kwargs)
    previous = wd.set_phase(phase)
    try:
        return fn(*args, **kwargs)
    finally:
        wd.set_phase(previous)


def leave() -> None:
    """The Trainer's ``fit`` returned: what the entry does next reports no progress, so it is not watched."""
    if _CURRENT is not None:
        _CURRENT.set_phase(UNWATCHED)


def follow_timer(timer: tp.Any) -> None:
    """Report the marks of a :class:`~hpctrain.train.metrics.StepTimer` (its ``on_mark`` hook) as progress."""
    if _CURRENT is not None:
        timer.on_mark = _CURRENT.mark


def interval(record: tp.Mapping[str, tp.Any]) -> None:
    """A metrics interval record (rank 0's straggler detector reads it; a no-op elsewhere)."""
    wd = _CURRENT
    if wd is None or wd.rank != 0:
        return
    if wd.stragglers is None:
        from hpctrain.runtime.stragglers import StragglerDetector

        wd.stragglers = StragglerDetector(wd.paths.root, job_id=wd.job_id, restart_count=wd.restart_count)
    wd.stragglers.observe(record)


# ---------------------------------------------------------------------- after a hang
def attribute_hang(
    run_dir: tp.Union[str, Path], job_id: str, restart_count: int, world_size: int, *, wait_s: float = 0.0
) -> tp.Dict[str, tp.Any]:
    """Which ranks hung, from every rank's last heartbeat: the ones furthest behind (fewest steps, then fewest
    progress marks in that step). Written to :meth:`RunDir.hang_report`, returned for the ledger's exit record,
    and named in one line on stderr. ``wait_s``: how long to wait for ranks that have not marked themselves hung.

    ``attributed`` is False when every rank stopped at the same point (a collective that no rank left, or a
    single cause no heartbeat can tell apart): then no host is blamed and the stacks tell."""
    paths = RunDir(run_dir)
    deadline = time.monotonic() + wait_s
    while True:
        beats = {r: read_json(paths.heartbeat(job_id, restart_count, r), []) for r in range(world_size)}
        if time.monotonic() >= deadline or all(b and b.get("hung") for b in beats.values()):
            break
        time.sleep(0.2)
    ranks = []
    for r, b in sorted(beats.items()):
        b = b or {}
        stacks = [p for p in (b.get("stacks") or []) if isinstance(p, str)]
        if not stacks and paths.stack_dump(job_id, restart_count, r).exists():
            stacks = [str(paths.stack_dump(job_id, restart_count, r))]
        ranks.append(
            {
                "rank": r,
                "host": b.get("host") or _host_of(paths, job_id, restart_count, r),
                "step": b.get("step") if isinstance(b.get("step"), int) else -1,
                "marks": b.get("marks") if isinstance(b.get("marks"), int) else -1,
                "phase": b.get("phase"),
                "part": b.get("part"),
                "progress_time": b.get("progress_time"),
                "detected": bool(b.get("hung")),
                "stacks": stacks,
            }
        )
    behind = min((r["step"], r["marks"]) for r in ranks) if ranks else (-1, -1)
    hung = [r for r in ranks if (r["step"], r["marks"]) == behind]
    attributed = bool(hung) and (len(hung) < len(ranks) or len(ranks) == 1)
    hosts = sorted({str(r["host"]) for r in hung if r["host"]}) if attributed else []
    report = {
        "job_id": job_id,
        "restart_count": restart_count,
        "time": time.time(),
        "attributed": attributed,
        "hung_ranks": [r["rank"] for r in hung] if attributed else [],
        "hosts": hosts,
        "ranks": ranks,
        "stacks_dir": str(paths.attempt_dir(job_id, restart_count)),
    }
    try:
        atomic_write_json(paths.hang_report(job_id, restart_count), report)
    except OSError:
        pass
    print(f"hpctrain: {hang_line(report)}", file=sys.stderr, flush=True)
    return report


def hang_line(report: tp.Mapping[str, tp.Any]) -> str:
    """The one line naming the hung rank(s), their host(s), where they stopped and the stacks."""
    ranks = {r.get("rank"): r for r in report.get("ranks") or [] if isinstance(r, dict)}
    if report.get("attributed"):
        parts = []
        for n in report.get("hung_ranks") or []:
            r = ranks.get(n, {})
            step = r.get("step")
            where = f"step {step + 1}" if isinstance(step, int) and step >= 0 else "start-up"
            parts.append(f"rank {n} on {r.get('host')} ({r.get('phase')}/{r.get('part')}, {where})")
        who = "hung: " + ", ".join(parts)
    else:
        who = f"hung: all {len(ranks)} ranks stopped at the same point (no rank behind the others)"
    return f"{who}; stacks in {report.get('stacks_dir')}"


def _host_of(paths: RunDir, job_id: str, restart_count: int, rank: int) -> tp.Optional[str]:
    record = read_json(paths.rank_record(job_id, restart_count, rank), []) or {}
    host = record.get("hostname")
    return host if isinstance(host, str) else None


def suspect_hosts(run_dir: tp.Union[str, Path], job_id: str, restart_count: int) -> tp.List[tp.Dict[str, tp.Any]]:
    """The hosts one attempt blames, for the next attempt to leave out (engineer C's exclusion reads this).

    ``[{"host": "node2", "reason": "hang" | "straggler", "ranks": [1]}, ...]``, one entry per host and reason:

    * ``hang``: always, for the host(s) of the ranks :func:`attribute_hang` named (never when no rank was
      behind the others: that blames no host);
    * ``straggler``: only when the run was submitted with ``--exclude-stragglers`` (``submission.json``; an
      sbatch-template job sets ``HPCTRAIN_EXCLUDE_STRAGGLERS=1`` in its environment instead), for
      the hosts of the stragglers rank 0 recorded in the ledger during this attempt.

    Stdlib only; reads the ledger's exit record of the attempt (its ``hang`` field) or, when the exit record is
    not written yet, :meth:`RunDir.hang_report`. Never raises on a damaged run directory: missing is empty."""
    from hpctrain.ledger import Ledger

    paths = RunDir(run_dir)
    out: tp.List[tp.Dict[str, tp.Any]] = []
    try:
        records = Ledger(paths).records()
    except OSError:
        records = []
    mine = [r for r in records if str(r.get("job_id")) == str(job_id) and r.get("restart_count") == restart_count]
    hang = next((r.get("hang") for r in reversed(mine) if r.get("event") == "exit" and r.get("hang")), None)
    if not isinstance(hang, dict):
        hang = read_json(paths.hang_report(job_id, restart_count), []) or {}
    if hang.get("attributed"):
        by_host: tp.Dict[str, tp.List[int]] = {}
        for r in hang.get("ranks") or []:
            if isinstance(r, dict) and r.get("rank") in (hang.get("hung_ranks") or []) and r.get("host"):
                by_host.setdefault(str(r["host"]), []).append(int(r["rank"]))
        out += [{"host": h, "reason": "hang", "ranks": sorted(rs)} for h, rs in sorted(by_host.items())]
    config = ((read_json(paths.submission, []) or {}).get("config")) or {}
    # the sbatch templates write no submission.json: their jobs ask with HPCTRAIN_EXCLUDE_STRAGGLERS=1
    if config.get("exclude_stragglers") or os.environ.get("HPCTRAIN_EXCLUDE_STRAGGLERS") == "1":
        by_host = {}
        for r in mine:
            if r.get("event") == "straggler" and r.get("host") and isinstance(r.get("rank"), int):
                by_host.setdefault(str(r["host"]), []).append(int(r["rank"]))
        out += [
            {"host": h, "reason": "straggler", "ranks": sorted(set(rs))}
            for h, rs in sorted(by_host.items())
            if not any(o["host"] == h for o in out)
        ]
    return out
