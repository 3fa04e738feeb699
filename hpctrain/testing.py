"""Fakes of the external tools hpctrain talks to, shipped with the library (as httpx ships MockTransport).

Each one subclasses the real seam and overrides only what reaches the outside world, so code under test
runs its real logic against it:

- :class:`FakeSlurm` for :class:`hpctrain._slurm.SlurmCommands` (sinfo, squeue, sacct, scancel, scontrol);
- :class:`FakeLustre` for :class:`hpctrain._lustre.LustreCommands` (``lfs setstripe`` / ``getstripe``);
- :class:`FakeCuda` for :class:`hpctrain._cuda.CudaRuntime` (device counts, pinning, streams, events) on CPU.

For fast unit tests of the logic around those tools: Slurm behaviour itself is tested on a real cluster
(the project's dev cluster, tests/cluster), GPU paths on a real GPU (benchmarks/gpu_checks.sh). Stdlib only
to import; FakeCuda's copies use torch when called.
"""

from __future__ import annotations

import contextlib
import os
import time
import typing as tp

from hpctrain._cuda import CudaRuntime
from hpctrain._lustre import LustreCommandError, LustreCommands
from hpctrain._slurm import SlurmCommandError, SlurmCommands

__all__ = ["FakeSlurm", "FakeLustre", "FakeCuda", "FakeStream", "FakeEvent"]


class FakeSlurm(SlurmCommands):
    """Answers the Slurm client commands from in-memory state; every call is kept in :attr:`calls`."""

    def __init__(self, partitions: tp.Sequence[str] = ("debug*", "low", "high")) -> None:
        self.partition_lines = list(partitions)
        # job id -> what squeue reports, one entry consumed per call: "STATE" or "STATE:REASON"
        # (a bare PENDING has reason Priority; "PENDING:None" is squeue before the scheduler's first pass)
        self.queue: tp.Dict[str, tp.List[str]] = {}
        self.final: tp.Dict[str, str] = {}  # job id -> sacct state once out of the queue
        self.calls: tp.List[tp.List[str]] = []
        self.accounting = True
        self.limits: tp.Dict[str, str] = {}  # job id -> time limit as squeue prints it (%l)
        self.requeued: tp.List[str] = []  # job ids given to `scontrol requeue`
        self.requeue_error: tp.Optional[str] = None  # scontrol's error line, to make requeue fail
        self.forgotten: tp.Set[str] = set()  # jobs slurmctld no longer remembers: squeue errors, sacct knows
        # `scontrol show job`: job id -> its fields (JobState, Restarts, NodeList, ExcNodeList, NumNodes, Partition)
        self.jobs: tp.Dict[str, tp.Dict[str, str]] = {}
        self.node_state: tp.Dict[str, str] = {}  # node -> sinfo %T (idle, mixed, down*, drained, ...)
        self.members: tp.Dict[str, tp.List[str]] = {}  # partition -> its nodes (default: every node known)
        self.features: tp.Dict[str, tp.List[str]] = {}  # node -> its features (sinfo %f)
        # job id -> its runs for `sacct -D`, oldest first: "STATE|NODELIST", or {sacct column: value} (Start and
        # End as sacct prints them or as Unix times); none: one run from `final` when the job has a final state
        self.history: tp.Dict[str, tp.List[tp.Union[str, tp.Dict[str, tp.Any]]]] = {}
        self.missing: tp.Set[str] = set()  # commands not on PATH (e.g. {"sacct"} on a login node without it)
        self.signalled: tp.List[tp.Tuple[str, str]] = []  # (job id, signal name) given to `scancel --signal`
        # `scontrol show config`: name -> value (MaxArraySize bounds a sweep's job array)
        self.config: tp.Dict[str, str] = {"MaxArraySize": "1001"}
        self.held: tp.List[tp.Tuple[str, str]] = []  # ("hold" | "release", job id) given to scontrol, in order

    def run(self, argv: tp.Sequence[str], timeout: float = 30.0) -> str:
        argv = list(argv)
        self.calls.append(argv)
        program = argv[0]
        if program in self.missing:
            raise SlurmCommandError(f"{program} is not on PATH: run on a Slurm login node, or use --cluster local")
        if program == "sinfo" and "-N" in argv:
            if "-p" in argv:
                part = argv[argv.index("-p") + 1]
                nodes = self.members.get(part, list(self.node_state))
                return "".join(f"{n}|{','.join(self.features.get(n, []))}\n" for n in nodes)
            wanted = argv[argv.index("-n") + 1].split(",")
            return "".join(f"{n}|{self.node_state[n]}\n" for n in wanted if n in self.node_state)
        if program == "sinfo":
            return "\n".join(self.partition_lines) + "\n"
        many = program == "squeue" and "-o" in argv and argv[argv.index("-o") + 1].startswith("%i|")
        if many:  # queue_states: many jobs, one call
            lines = []
            for job in argv[argv.index("-j") + 1].split(","):
                states = self.queue.get(job, [])
                if states and job not in self.forgotten:
                    state, _, reason = states.pop(0).partition(":")
                    reason = reason or ("Priority" if state == "PENDING" else "None")
                    lines.append(f"{job}|{state}|{'' if state == 'PENDING' else 'node1'}|0:05|{reason}\n")
            return "".join(lines)
        if program == "scontrol" and argv[1] in ("hold", "release"):
            self.held.append((argv[1], argv[2]))
            return ""
        if program == "scontrol" and argv[1:3] == ["show", "config"]:
            return "".join(f"{k:<23} = {v}\n" for k, v in self.config.items())
        if program == "squeue":
            job = argv[argv.index("-j") + 1]
            if job in self.forgotten:
                raise SlurmCommandError(f"squeue -j {job} failed: slurm_load_jobs error: Invalid job id specified")
            states = self.queue.get(job, [])
            if not states:
                return ""
            state, _, reason = states.pop(0).partition(":")
            if argv[argv.index("-o") + 1] == "%T|%l":
                return f"{state}|{self.limits.get(job, '10:00')}\n"
            reason = reason or ("Priority" if state == "PENDING" else "None")
            return f"{state}|node[1-2]|0:05|{reason}\n"
        if program == "sacct":
            if not self.accounting:
                raise SlurmCommandError("sacct failed: Slurm accounting storage is disabled")
            job = argv[argv.index("-j") + 1]
            if "-D" in argv:
                return self._sacct_runs(job.split(","), argv[argv.index("-o") + 1].split(","))
            return f"{self.final[job]}|node[1-2]|00:00:09\n" if job in self.final else ""
        if program == "scancel" and argv[1].startswith("--signal="):
            self.signalled.append((argv[2], argv[1].partition("=")[2]))
            return ""
        if program == "scancel":
            self.final[argv[1]] = "CANCELLED by 0"
            self.queue[argv[1]] = []
            return ""
        if program == "scontrol" and argv[1] == "requeue":
            if self.requeue_error:
                raise SlurmCommandError(f"scontrol requeue {argv[2]} failed: {self.requeue_error}")
            self.requeued.append(argv[2])
            job = self.jobs.get(argv[2])
            if job is not None:  # as slurmctld: the job completes its tasks, then pends again, Restarts + 1
                job.update(JobState="COMPLETING", Restarts=str(int(job.get("Restarts", "0")) + 1))
            return ""
        if program == "scontrol" and argv[1:3] == ["show", "job"]:
            job = self.jobs.get(argv[-1])
            return "" if job is None else " ".join(f"{k}={v}" for k, v in {"JobId": argv[-1], **job}.items()) + "\n"
        if program == "scontrol" and argv[1] == "update" and argv[3].startswith("ExcNodeList="):
            job_id = argv[2].partition("=")[2]
            job = self.jobs.setdefault(job_id, {"JobState": "PENDING"})
            if job.get("JobState") in ("RUNNING", "SUSPENDED"):  # what slurmctld answers for a running job
                raise SlurmCommandError(f"scontrol update failed: Job is no longer pending execution for job {job_id}")
            job["ExcNodeList"] = argv[3].partition("=")[2] or "(null)"
            return ""
        raise SlurmCommandError(f"{program} is not faked")

    def count(self, program: tp.Optional[str] = None) -> int:
        """How many commands were run (only ``program``'s: ``"squeue"``, ``"sacct"``, ... when given): what a test
        of the scheduler's load counts (``runs`` lists every run with one squeue and at most one sacct)."""
        return sum(1 for argv in self.calls if program is None or argv[0] == program)

    def _sacct_runs(self, jobs: tp.Sequence[str], columns: tp.Sequence[str]) -> str:
        """``sacct -D -X -P -n -j JOBS -o COLUMNS`` from :attr:`history` (else :attr:`final`)."""
        lines = []
        for job in jobs:
            runs = self.history.get(job) or ([f"{self.final[job]}|node[1-2]"] if job in self.final else [])
            for run in runs:
                if isinstance(run, str):
                    state, _, nodes = run.partition("|")
                    run = {"State": state, "NodeList": nodes}
                row = {"JobIDRaw": job, "JobID": job, "Start": "Unknown", "End": "Unknown", "Elapsed": "00:00:09"}
                row.update({"ExitCode": "0:0", **run})
                for key in ("Start", "End"):
                    if isinstance(row[key], (int, float)):
                        row[key] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(row[key]))
                lines.append("|".join(str(row.get(c, "")) for c in columns) + "\n")
        return "".join(lines)


class FakeLustre(LustreCommands):
    """``lfs`` in memory: records calls, keeps each file's stripe; ``fail=True`` makes every call fail."""

    def __init__(self, *, fail: bool = False, default: tp.Tuple[int, int] = (1, 1 << 20)) -> None:
        self.calls: tp.List[tp.List[str]] = []
        self.stripes: tp.Dict[str, tp.Tuple[int, int]] = {}
        self.fail = fail
        self.default = default

    def available(self) -> bool:
        return True

    def run(self, argv: tp.Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if self.fail:
            raise LustreCommandError(f"lfs {' '.join(argv)} failed: Operation not supported")
        path = argv[-1]
        if argv[0] == "setstripe":
            opts = dict(zip(argv[1:-1:2], argv[2:-1:2]))
            size = opts.get("-S", "1M")
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
            self.stripes[os.path.realpath(path)] = (int(opts.get("-c", 1)), int(size.rstrip("KMGkmg")) * mult)
            open(path, "xb").close()  # lfs setstripe creates the empty file
            return ""
        if argv[0] == "getstripe":
            count, size = self.stripes.get(os.path.realpath(path), self.default)
            return f"{count}\n{size}\n"
        raise LustreCommandError(f"lfs {argv[0]} is not faked")


class FakeStream:
    """A CUDA stream that logs what is asked of it."""

    def __init__(self, log: tp.List[tp.Any], name: str) -> None:
        self.log, self.name = log, name

    def wait_event(self, ev: "FakeEvent") -> None:
        self.log.append(("wait", self.name, ev.n))

    def synchronize(self) -> None:
        self.log.append(("sync stream", self.name))


class FakeEvent:
    """A CUDA event, numbered in creation order across all fakes."""

    count = 0

    def __init__(self, log: tp.List[tp.Any]) -> None:
        FakeEvent.count += 1
        self.log, self.n = log, FakeEvent.count

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record", stream.name, self.n))

    def synchronize(self) -> None:
        self.log.append(("sync", self.n))


class FakeCuda(CudaRuntime):
    """A CPU stand-in for the CUDA runtime: ``count`` GPUs with ``uuids``; pinning succeeds unless
    ``pin_ok=False``; 'device' copies are clones made on the copy stream; every call is logged in :attr:`log`."""

    def __init__(
        self, count: int = 1, uuids: tp.Optional[tp.Sequence[str]] = None, available: bool = True, pin_ok: bool = True
    ) -> None:
        self._count, self._available, self.pin_ok = count, available, pin_ok
        self.uuids = list(uuids or [f"GPU-{i}" for i in range(count)])
        self.current: tp.Any = None  # set_device's index; current_stream's stream once streams are asked for
        self.log: tp.List[tp.Any] = []
        self.in_use: tp.Optional[str] = None

    def is_available(self) -> bool:
        return self._available

    def count(self) -> int:
        return self._count

    def set_device(self, index: int) -> None:
        self.current = index

    def uuid(self, index: int) -> str:
        return self.uuids[index]

    def synchronize(self, device: int) -> None:
        self.log.append(("sync", device))

    def pin(self, ptr: int, nbytes: int) -> bool:
        self.log.append(("pin", ptr, nbytes))
        return self.pin_ok

    def unpin(self, ptr: int) -> None:
        self.log.append(("unpin", ptr))

    def stream(self, device: tp.Any) -> FakeStream:
        self.log.append(("new stream",))
        return FakeStream(self.log, "copy")

    def current_stream(self, device: tp.Any) -> FakeStream:
        if not isinstance(self.current, FakeStream):
            self.current = FakeStream(self.log, "current")
        return self.current

    @contextlib.contextmanager
    def use(self, stream: FakeStream) -> tp.Iterator[None]:
        self.in_use = stream.name
        try:
            yield
        finally:
            self.in_use = None

    def event(self) -> FakeEvent:
        return FakeEvent(self.log)

    def pinned(self, shape: tp.Tuple[int, ...], dtype: tp.Any) -> tp.Any:
        import torch

        self.log.append(("pin",))
        return torch.empty(shape, dtype=dtype)

    def to_device(self, t: tp.Any, device: tp.Any) -> tp.Any:
        assert self.in_use == "copy", "the host-to-device copy must run on the copy stream"
        return t.clone()

    def record_stream(self, t: tp.Any, stream: FakeStream) -> None:
        self.log.append(("record_stream", stream.name))

    def empty_host_cache(self) -> None:
        self.log.append(("empty_host_cache",))
