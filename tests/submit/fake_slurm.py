"""A fake of the Slurm client commands behind :class:`hpctrain._slurm.SlurmCommands`.

For fast unit tests of the logic around Slurm (partition checks, state polling, --follow). Slurm
behaviour itself is tested on the real dev cluster (tests/cluster).
"""

from __future__ import annotations

import typing as tp

from hpctrain._slurm import SlurmCommandError, SlurmCommands


class FakeSlurm(SlurmCommands):
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

    def run(self, argv: tp.Sequence[str], timeout: float = 30.0) -> str:
        argv = list(argv)
        self.calls.append(argv)
        program = argv[0]
        if program == "sinfo":
            return "\n".join(self.partition_lines) + "\n"
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
            return f"{self.final[job]}|node[1-2]|00:00:09\n" if job in self.final else ""
        if program == "scancel":
            self.final[argv[1]] = "CANCELLED by 0"
            self.queue[argv[1]] = []
            return ""
        if program == "scontrol" and argv[1] == "requeue":
            if self.requeue_error:
                raise SlurmCommandError(f"scontrol requeue {argv[2]} failed: {self.requeue_error}")
            self.requeued.append(argv[2])
            return ""
        raise SlurmCommandError(f"{program} is not faked")
