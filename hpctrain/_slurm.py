"""The one seam between hpctrain and the Slurm client commands (sinfo, squeue, sacct, scancel, scontrol).

:class:`SlurmCommands` runs the real commands; tests (and users testing their own entries) pass
:class:`hpctrain.testing.FakeSlurm`, which has the same ``run`` method, instead of patching
``subprocess``. Submission itself goes through submitit, which calls ``sbatch``. Slurm's time format
(``--time``, squeue's ``%l``) is parsed here too, so that every side of the house reads it one way.
Stdlib only: the login-node tools, the launcher and ``status`` all sit above it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import typing as tp

from hpctrain._files import shorten
from hpctrain.errors import HpctrainError, UsageError

__all__ = [
    "SlurmCommands",
    "SlurmCommandError",
    "TERMINAL_STATES",
    "JobState",
    "SlurmRun",
    "RUN_FIELDS",
    "parse_time",
    "format_time",
]

# sacct/squeue states after which the job will not run again by itself.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
    }
)


class SlurmCommandError(HpctrainError):
    """A Slurm client command failed or is missing."""


class JobState(tp.NamedTuple):
    state: str
    """Slurm state name (PENDING, RUNNING, COMPLETED, ...; UNKNOWN when neither squeue nor sacct knows it)."""
    nodes: str
    """Node list ('' while pending)."""
    elapsed: str
    """Run time as Slurm prints it."""
    source: str
    """'squeue' (still in the queue) or 'sacct' (finished) or ''."""
    reason: str = ""
    """squeue's reason while pending (Priority, Resources, PartitionConfig, ...)."""

    @property
    def terminal(self) -> bool:
        return self.source == "sacct" and self.state in TERMINAL_STATES


class SlurmRun(tp.NamedTuple):
    """One run of a job as Slurm's accounting recorded it (one row of ``sacct -D -X``). A job requeued N times
    has N + 1 runs, oldest first; each ended run's state says why it ended: ``NODE_FAIL`` (a node failed),
    ``PREEMPTED``, ``TIMEOUT``, ``CANCELLED`` (scancel), ``REQUEUED`` (``scontrol requeue``), ``FAILED``,
    ``COMPLETED``, ...; the newest is ``PENDING`` or ``RUNNING`` while the job is in the queue."""

    job_id: str
    """sacct's JobIDRaw."""
    state: str
    """The first word of sacct's State (``CANCELLED by 0`` -> ``CANCELLED``)."""
    start: tp.Optional[float]
    """Unix time the run started (None: it has not, ``Unknown``)."""
    end: tp.Optional[float]
    """Unix time it ended (None: still running, or never started)."""
    elapsed: str
    nodes: str
    """Its node list (``None assigned`` while pending)."""
    exit_code: str
    """``EXIT:SIGNAL`` of the batch script, as sacct prints it."""


RUN_FIELDS = ("JobIDRaw", "JobID", "State", "Start", "End", "Elapsed", "NodeList", "ExitCode")
"""The sacct columns :meth:`SlurmCommands.job_runs` asks for, in this order."""


def _sacct_time(text: str) -> tp.Optional[float]:
    """sacct's ``2026-12-03T08:09:26`` (local time, whole seconds) -> Unix time; ``Unknown``/``None`` -> None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


class SlurmCommands:
    """Run Slurm client commands; override :meth:`run` (or pass a fake) in tests."""

    def run(self, argv: tp.Sequence[str], timeout: float = 30.0) -> str:
        """Run ``argv`` and return its stdout; a missing command or non-zero exit raises SlurmCommandError."""
        if shutil.which(argv[0]) is None:
            raise SlurmCommandError(f"{argv[0]} is not on PATH: run on a Slurm login node, or use --cluster local")
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"{' '.join(argv)} did not answer in {timeout:.0f}s: is slurmctld up?") from None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmCommandError(f"{' '.join(argv)} failed: {detail[-1] if detail else f'exit {proc.returncode}'}")
        return proc.stdout

    @staticmethod
    def available() -> bool:
        return shutil.which("sbatch") is not None

    def partitions(self) -> tp.Tuple[tp.List[str], tp.Optional[str]]:
        """All partition names and the default one (``sinfo`` marks it with ``*``)."""
        names: tp.List[str] = []
        default = None
        for line in self.run(["sinfo", "-h", "-o", "%P"]).split():
            name = line.strip()
            if name.endswith("*"):
                name = name[:-1]
                default = name
            if name and name not in names:
                names.append(name)
        return names, default

    def job_state(self, job_id: str, runs: tp.Optional[tp.Sequence[SlurmRun]] = None) -> JobState:
        """Where the job is: squeue while queued or running, else sacct's final state. ``runs``: the job's
        :meth:`job_runs`, when the caller asked for them already (``status``: one sacct call in all); the
        newest is its final state, and sacct is not asked again."""
        try:
            out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T|%N|%M|%r"]).strip()
        except SlurmCommandError as exc:
            # squeue exits 1 with "Invalid job id specified" once a job has left slurmctld's memory
            # (MinJobAge): not an error, the job is finished and sacct knows how it ended.
            if "Invalid job id" not in str(exc):
                raise
            out = ""
        if out:
            state, nodes, elapsed, reason = (out.splitlines()[0].split("|") + ["", "", ""])[:4]
            return JobState(state, nodes, elapsed, "squeue", "" if reason == "None" else reason)
        if runs is not None:
            mine = [r for r in runs if r.job_id == job_id]
            if not mine:
                return JobState("UNKNOWN", "", "", "")
            return JobState(mine[-1].state, mine[-1].nodes, mine[-1].elapsed, "sacct")
        try:
            out = self.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,NodeList,Elapsed"]).strip()
        except SlurmCommandError:
            out = ""  # accounting disabled: the job left the queue, state unknown
        if out:
            state, nodes, elapsed = (out.splitlines()[-1].split("|") + ["", ""])[:3]
            # "CANCELLED by 0" -> CANCELLED
            return JobState(state.split()[0], nodes, elapsed, "sacct")
        return JobState("UNKNOWN", "", "", "")

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def signal(self, job_id: str, signal_name: str = "USR2") -> None:
        """``scancel --signal=NAME JOB``: the signal to every task of the job's steps (not the batch shell), the
        job left running. ``python -m hpctrain cancel --save`` sends USR2: the stop the Runner agrees on."""
        self.run(["scancel", f"--signal={signal_name}", job_id])

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue JOB``: the job goes back to PENDING with the same id, ``SLURM_RESTART_COUNT``
        one higher; Slurm ends the running tasks (SIGTERM, SIGKILL after KillWait). Called by rank 0 of
        the job itself once the checkpoint of the agreed step is committed."""
        import signal

        # scontrol runs inside the job step, so the SIGTERM that the requeue itself sends to every process of
        # the step (and a late USR2) would kill it before it exits ("failed: exit -15" although slurmctld
        # requeued the job). Blocked signals stay blocked across exec: scontrol finishes and exits first;
        # this process gets them (recorded by its handlers) when the mask is restored.
        shield = {signal.SIGTERM, signal.SIGUSR2}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, shield)
        try:
            self.run(["scontrol", "requeue", job_id], timeout=60.0)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def hold(self, job_id: str) -> None:
        """``scontrol hold JOB``: its pending tasks (of an array: every pending task) are not started until
        :meth:`release`; a running one goes on. Shielded from the step's SIGTERM and USR2 as :meth:`requeue` is."""
        self._shielded(["scontrol", "hold", job_id])

    def release(self, job_id: str) -> None:
        """``scontrol release JOB``: undo :meth:`hold` (Slurm says "Job has already finished" / "not held" when
        there is nothing to release: a SlurmCommandError)."""
        self._shielded(["scontrol", "release", job_id])

    def _shielded(self, argv: tp.Sequence[str]) -> str:
        import signal

        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR2})
        try:
            return self.run(argv, timeout=60.0)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def job_info(self, job_id: str) -> tp.Dict[str, str]:
        """``scontrol show job -o JOB`` as a dict (JobState, Restarts, NodeList, ExcNodeList, NumNodes,
        Partition, Reason, ...); {} when slurmctld does not know the job. scontrol, not sacct: it answers
        from the compute nodes too (slurmdbd is often unreachable from them, as on the dev cluster)."""
        try:
            out = self.run(["scontrol", "show", "job", "-o", job_id], timeout=15.0)
        except SlurmCommandError:
            return {}
        line = out.strip().splitlines()[0] if out.strip() else ""
        # Values have no spaces except in a few fields (Command=, WorkDir= paths, Comment=): keep the first word.
        return dict(w.split("=", 1) for w in line.split() if "=" in w)

    def node_states(self, nodes: tp.Sequence[str]) -> tp.Dict[str, str]:
        """``{node: state}`` as ``sinfo -N -o %T`` prints it in lower case (``idle``, ``mixed``, ``down*``,
        ``drained``, ``not_responding``...), one entry per node whatever partitions it is in."""
        if not nodes:
            return {}
        out = self.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T"], timeout=15.0)
        states: tp.Dict[str, str] = {}
        for line in out.splitlines():
            node, _, state = line.strip().partition("|")
            if node:
                states.setdefault(node, state.strip().lower())
        return states

    def partition_nodes(self, partition: str, features: str = "") -> tp.List[str]:
        """Every node of ``partition`` (``sinfo -N -p``), in sinfo's order; with ``features`` (a job's
        ``--constraint``) only the nodes that have them: ``a&b`` (or one feature) is matched, a constraint
        with ``|``, brackets, counts or ``!`` is not interpreted (every node of the partition counts)."""
        out = self.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%f"], timeout=15.0)
        wanted = [] if not features or re.search(r"[|\[\]*!()]", features) else features.split("&")
        nodes: tp.List[str] = []
        for line in out.split():
            node, _, have = line.partition("|")
            if node and node not in nodes and set(wanted) <= set(have.split(",")):
                nodes.append(node)
        return nodes

    def exclude_nodes(self, job_id: str, nodes: tp.Sequence[str]) -> None:
        """``scontrol update JobId=JOB ExcNodeList=...``: the job's next start avoids ``nodes`` (the whole list,
        replacing the old one). slurmctld refuses it while the job runs ("Job is no longer pending
        execution"): call it once the job is requeued (COMPLETING or PENDING)."""
        self.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"], timeout=30.0)

    def job_runs(self, job_ids: tp.Sequence[str]) -> tp.List[SlurmRun]:
        """Every run of the jobs ``job_ids`` as accounting recorded it: one ``sacct -D -X`` call for all of them,
        each job's runs oldest first (``-D``: requeued runs too; ``-X``: allocations, not steps). Raises
        SlurmCommandError when sacct is missing or fails (``Slurm accounting storage is disabled``).

        Slurm 22.05 has no restart count in sacct: the n-th run (from 0) of a job is the one that ran with
        ``SLURM_RESTART_COUNT`` n; the Start and End times place a run in time."""
        ids = [str(j) for j in job_ids if j]
        if not ids:
            return []
        out = self.run(["sacct", "-D", "-X", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(RUN_FIELDS)], timeout=15.0)
        runs = []
        for line in out.splitlines():
            cols = line.split("|")
            if len(cols) < len(RUN_FIELDS):
                continue
            raw, job, state, start, end, elapsed, nodes, code = cols[: len(RUN_FIELDS)]
            # an array task's or het job's raw id is its own number: keep the id the caller asked for
            owner = raw if raw in ids else job if job in ids else raw
            runs.append(
                SlurmRun(
                    job_id=owner,
                    state=(state.split() or [""])[0],
                    start=_sacct_time(start),
                    end=_sacct_time(end),
                    elapsed=elapsed,
                    nodes=nodes,
                    exit_code=code,
                )
            )
        return runs

    def past_runs(self, job_id: str) -> tp.List[tp.Tuple[str, str]]:
        """``[(state, node list)]`` of every run of a (requeued) job, oldest first (:meth:`job_runs`): the first
        run of a job Slurm requeued after a node failure shows ``NODE_FAIL``. [] without accounting."""
        try:
            return [(r.state, r.nodes) for r in self.job_runs([job_id])]
        except SlurmCommandError:
            return []

    def config_value(self, name: str) -> tp.Optional[str]:
        """One value of ``scontrol show config`` (``MaxArraySize``, ``PriorityType``, ...); None when scontrol does
        not print it."""
        out = self.run(["scontrol", "show", "config"], timeout=15.0)
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == name:
                return value.strip()
        return None

    def max_array_size(self) -> tp.Optional[int]:
        """The cluster's ``MaxArraySize`` (an array's indices run 0 .. MaxArraySize - 1), None when unknown."""
        value = self.config_value("MaxArraySize")
        return int(value) if value and value.isdigit() else None

    def queue_states(self, job_ids: tp.Sequence[str]) -> tp.Dict[str, JobState]:
        """``{job id: JobState}`` of every job of ``job_ids`` still in the queue, with ONE ``squeue`` call (array
        tasks as ``A_T``, each task of a pending array on its own line: ``squeue -r``). A job squeue does not list
        is absent (it ended: ask the run's own records, or :meth:`job_runs`)."""
        ids = [str(j) for j in job_ids if j]
        if not ids:
            return {}
        try:
            out = self.run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%N|%M|%r"], timeout=15.0)
        except SlurmCommandError as exc:
            if "Invalid job id" not in str(exc):
                raise
            out = ""
        states: tp.Dict[str, JobState] = {}
        for line in out.splitlines():
            job, state, nodes, elapsed, reason = (line.strip().split("|") + ["", "", "", ""])[:5]
            if job:
                states[job] = JobState(state, nodes, elapsed, "squeue", "" if reason == "None" else reason)
        return states

    def running_job(self, job_id: str) -> tp.Tuple[str, tp.Optional[int]]:
        """``(state, time limit in seconds or None)`` of a job from squeue, ``("", None)`` when squeue does
        not know it. A job being cancelled shows CANCELLED or COMPLETING while its tasks still run."""
        try:
            out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T|%l"], timeout=15.0).strip()
        except SlurmCommandError:
            return "", None
        if not out:
            return "", None
        state, _, limit = out.splitlines()[0].partition("|")
        try:
            seconds: tp.Optional[int] = parse_time(limit.strip(), "time limit")
        except HpctrainError:  # UNLIMITED, INVALID, NOT_SET
            seconds = None
        return state.strip(), seconds


def parse_time(text: str, option: str = "--time") -> int:
    """Slurm time limit -> seconds. Accepts ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS`` (as ``sbatch --time`` does); minutes and seconds after the first field must be < 60."""
    text = str(text).strip()
    # Bounded digit counts: no int() of a 5000-digit field, and no limit beyond what Slurm stores.
    m = re.fullmatch(r"(?:(\d{1,5})-)?(\d{1,8})(?::(\d{1,8}))?(?::(\d{1,8}))?", text)
    if not m:
        raise UsageError(f"{option} {shorten(text)!r} is not a Slurm time: use MM, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    fields = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (fields + [0, 0])[:3]
        if hours > 23 or minutes > 59 or seconds > 59:
            raise UsageError(f"{option} {text!r}: in D-HH:MM:SS hours must be < 24 and minutes/seconds < 60")
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif len(fields) == 1:  # MM
        total = fields[0] * 60
    elif len(fields) == 2:  # MM:SS
        if fields[1] > 59:
            raise UsageError(f"{option} {text!r}: seconds must be < 60 (MM:SS)")
        total = fields[0] * 60 + fields[1]
    else:  # HH:MM:SS
        if fields[1] > 59 or fields[2] > 59:
            raise UsageError(f"{option} {text!r}: minutes and seconds must be < 60 (HH:MM:SS)")
        total = (fields[0] * 60 + fields[1]) * 60 + fields[2]
    if total <= 0:
        raise UsageError(f"{option} {text!r} must be more than zero")
    return total


def format_time(seconds: int) -> str:
    """Seconds -> ``D-HH:MM:SS`` / ``HH:MM:SS`` (what squeue shows)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms
