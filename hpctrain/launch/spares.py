"""Spare nodes: restart the training step inside the allocation when a node fails or hangs (stdlib only).

A job submitted with ``--spare-nodes K`` allocates ``nodes + K`` nodes with ``--no-kill`` (so that Slurm keeps
the allocation when one of its nodes fails) and its batch script runs the training ``srun`` through this loop::

    python -m hpctrain.launch.spares --nodes N --tasks-per-node T --spares K --run-dir DIR -- srun ARGS... CMD...

The loop starts the step on ``N`` of the job's healthy nodes (``srun --nodes N --ntasks N*T --nodelist ...``).
When the step fails because a node failed (Slurm took it out of the allocation: ``scontrol show job`` lists
fewer nodes; Slurm 22.05 kills the step's tasks at once, srun says "Node failure on nodeX") or hung (the
deciding rank's exit record says ``in_job_restart`` and names the suspect hosts), it starts a new step
without those hosts, up to ``K`` times, and appends an ``in_job_restart`` record to the ledger. Any other
failure, success, or a job that is being requeued ends the loop with the step's exit code. With no spare
left, a node failure goes back to the queue: ``scontrol requeue`` and the exclusion of the failed hosts.

Warm spares (``--warm-spares``, :mod:`hpctrain.launch.warm_spares`): the loop also serves in-job recovery's store
for each step and runs warm spare processes on the spare nodes beside it, so that a rank's process that dies is
replaced inside the step (the Trainer's ``TrainConfig.recovery``); the training step then runs with
``--kill-on-bad-exit=0``, as **one step per training node** (:mod:`hpctrain.launch.node_step`): Slurm SIGKILLs
every task of a step that uses a failed node, so a failed node then takes only its own step, and the other nodes'
tasks recover in the job; the loop waits until every node's step has ended (the one of a failed node ends at once,
the others go on). A step whose tasks did not all exit 0 but whose deciding rank recorded a finished run
(one task was replaced in the job) ends the loop with 0. ``--in-job-recovery`` (``--spares 0`` allowed): the
same store and ``--kill-on-bad-exit=0`` with no warm spares, so the survivors of a dead rank go on at a smaller
world inside the step (``RecoveryConfig(shrink=True)``).

Attempt numbers: every step the loop starts gets one (:data:`hpctrain.runtime.env.ATTEMPT_ENV`), one more
than the highest attempt of this job in the run directory and never below ``SLURM_RESTART_COUNT``, so that
in-job restarts and requeues never share a per-attempt folder. The ranks read it in
:func:`hpctrain.runtime.env.from_environ`; nothing else numbers attempts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain.launch.exclusion import SPARES_LEFT_ENV, exclude_hosts
from hpctrain.launch.records import committed_progress
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from hpctrain.runtime.env import (
    ATTEMPT_ENV,
    NODE_INDEX_ENV,
    TRAINING_NODES_ENV,
    expand_hostlist,
    node_ranks,
    slurm_job_id,
)

__all__ = ["next_attempt", "step_argv", "SpareLoop", "main"]


def next_attempt(run_dir: Path, job_id: str, environ: tp.Mapping[str, str] = os.environ) -> int:
    """The attempt number of the next step of ``job_id``: above every attempt folder it has, at least Slurm's
    restart count."""
    done = RunDir(run_dir).attempt_numbers(job_id)
    slurm = int(environ.get("SLURM_RESTART_COUNT") or 0)
    return max([slurm] + [n + 1 for n in done])


def step_argv(srun: tp.Sequence[str], *, nodes: int, tasks_per_node: int, hosts: tp.Sequence[str]) -> tp.List[str]:
    """``srun`` with the step's size and node list first (the job's own size counts its spares)."""
    return [
        srun[0],
        f"--nodes={nodes}",
        f"--ntasks={nodes * tasks_per_node}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--nodelist={','.join(hosts)}",
        *srun[1:],
    ]


def _exit_record(run_dir: Path, job_id: str, attempt: int, wait_s: float) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """The ledger's exit record of one attempt, waiting up to ``wait_s`` for a deciding rank still writing it."""
    deadline = time.monotonic() + wait_s
    ledger = Ledger(run_dir)
    while True:
        mine = [
            r
            for r in ledger.records("exit")
            if str(r.get("job_id")) == str(job_id) and r.get("restart_count") == attempt
        ]
        if mine or time.monotonic() >= deadline:
            return mine[-1] if mine else None
        time.sleep(0.2)


class SpareLoop:
    """One batch script's loop over training steps (see the module docstring)."""

    def __init__(
        self,
        *,
        run_dir: Path,
        nodes: int,
        tasks_per_node: int,
        spares: int,
        srun: tp.Sequence[str],
        slurm: tp.Any = None,
        environ: tp.Optional[tp.Mapping[str, str]] = None,
        run_step: tp.Optional[tp.Callable[[tp.List[str], tp.Dict[str, str]], int]] = None,
        exit_wait_s: float = 15.0,
        warm_spares: bool = False,
        in_job_recovery: bool = False,
        make_spares: tp.Optional[tp.Callable[..., tp.Any]] = None,
    ) -> None:
        from hpctrain._slurm import SlurmCommands

        self.run_dir, self.nodes, self.tasks_per_node, self.spares = Path(run_dir), nodes, tasks_per_node, spares
        self.srun = list(srun)
        self.slurm = slurm if slurm is not None else SlurmCommands()
        self.environ = dict(os.environ if environ is None else environ)
        self.job_id = slurm_job_id(self.environ)  # ARRAYJOB_TASK in a job array: requeue and exclude this task only
        self.run_step = run_step or (lambda argv, env: subprocess.call(argv, env=env))
        self.exit_wait_s = exit_wait_s
        self.bad: tp.List[str] = []
        self.used = 0
        self.warm_spares = warm_spares
        self.in_job_recovery = in_job_recovery or warm_spares  # the store served, the step kept past a dead task
        self.make_spares = make_spares  # a test's fake WarmSpares; None: hpctrain.launch.warm_spares

    def job_nodes(self) -> tp.List[str]:
        """The allocation's nodes now: Slurm drops a failed node from a ``--no-kill`` job's NodeList."""
        nodelist = self.slurm.job_info(self.job_id).get("NodeList") or self.environ.get("SLURM_JOB_NODELIST", "")
        return expand_hostlist(nodelist) if nodelist not in ("", "(null)") else []

    def _log(self, text: str) -> None:
        print(f"hpctrain spares: {text}", file=sys.stderr, flush=True)

    def run(self) -> int:
        while True:
            usable = [h for h in self.job_nodes() if h not in self.bad]
            if len(usable) < self.nodes:
                self._log(f"only {len(usable)} healthy node(s) left of the {self.nodes} the step needs: giving up")
                return 1
            hosts = usable[: self.nodes]
            attempt = next_attempt(self.run_dir, self.job_id, self.environ)
            left = min(self.spares - self.used, len(usable) - self.nodes)
            env = dict(self.environ, **{ATTEMPT_ENV: str(attempt), SPARES_LEFT_ENV: str(left)})
            spare_hosts = usable[self.nodes :] if self.warm_spares else []
            warm = self._warm(spare_hosts)
            if warm is not None:
                env = warm.start(self.srun, env, step_argv)
                steps = self._node_steps(hosts, env)
            else:
                steps = [(step_argv(self.srun, nodes=self.nodes, tasks_per_node=self.tasks_per_node, hosts=hosts), env)]
            self._log(f"attempt {attempt} on {','.join(hosts)} ({left} spare restart(s) left)")
            try:
                rc, failed_at = self._run_steps(steps, attempt, hosts)
            finally:
                if warm is not None:
                    warm.end()  # spares released, their step ended: a restart may use their nodes
            if rc == 0:
                return 0
            if warm is not None and self._finished(attempt):
                self._log(f"step of attempt {attempt} exited {rc}, but its run finished (a rank replaced in the job)")
                return 0
            suspects = self._suspects(attempt, hosts, left, failed_at)
            if suspects is None:
                return rc
            self.bad += [h for h in suspects if h not in self.bad]
            self.used += 1
            Ledger(self.run_dir).append(
                {
                    "event": "in_job_restart",
                    "time": time.time(),
                    "job_id": self.job_id,
                    "restart_count": attempt,
                    "next_restart_count": next_attempt(self.run_dir, self.job_id, self.environ),
                    "failed_at": failed_at,
                    "failed_nodes": suspects,
                    "excluded_nodes": list(self.bad),
                    "spares_used": self.used,
                    "spares": self.spares,
                }
            )
            self._log(f"step of attempt {attempt} failed on {','.join(suspects)}: restarting without it")

    def _node_steps(
        self, hosts: tp.Sequence[str], env: tp.Dict[str, str]
    ) -> tp.List[tp.Tuple[tp.List[str], tp.Dict[str, str]]]:
        """One step per training node (:mod:`hpctrain.launch.node_step`): a failed node ends its own step only, the
        other nodes' tasks live on and recover in the job. Each is kept past a dead task (``KEEP_STEP_ALIVE``)."""
        from hpctrain.launch.node_step import node_step_argv
        from hpctrain.launch.warm_spares import KEEP_STEP_ALIVE

        srun = [self.srun[0], KEEP_STEP_ALIVE, *self.srun[1:]]
        nodes = ",".join(hosts)
        return [
            (
                node_step_argv(srun, python=sys.executable, index=i, host=h, tasks_per_node=self.tasks_per_node),
                dict(env, **{NODE_INDEX_ENV: str(i), TRAINING_NODES_ENV: nodes}),
            )
            for i, h in enumerate(hosts)
        ]

    def _run_steps(
        self, steps: tp.Sequence[tp.Tuple[tp.List[str], tp.Dict[str, str]]], attempt: int, hosts: tp.Sequence[str]
    ) -> tp.Tuple[int, float]:
        """Run the steps side by side until every one has ended: ``(exit code, when the first ended)``; the code is
        0 when all exited 0, else the first non-zero one. A node's step that ends before the others (its node
        failed: srun then exits 0, measured on Slurm 22.05) does not end them: their ranks recover in the job."""
        if len(steps) == 1:
            rc = self.run_step(*steps[0])
            return rc, time.time()
        import threading

        rcs: tp.List[tp.Optional[int]] = [None] * len(steps)
        ended: tp.List[float] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            try:
                rcs[i] = self.run_step(*steps[i])
            except Exception as exc:  # noqa: BLE001 - an srun that could not start is a failed step
                self._log(f"the step of {hosts[i]} could not run: {type(exc).__name__}: {exc}")
                rcs[i] = 1
            with lock:
                ended.append(time.time())
                first = len(ended) == 1 and len(steps) > 1
            if first:
                self._node_step_ended(attempt, hosts[i], i, int(rcs[i] or 0), ended[0])

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(steps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bad = [rc for rc in rcs if rc]
        return (int(bad[0]) if bad else 0), min(ended)

    def _node_step_ended(self, attempt: int, host: str, index: int, rc: int, at: float) -> None:
        """The first node's step to end while the others run: a failed node (Slurm took it out of the allocation)
        or its ranks' own end (a finished run's steps end within a second of each other). A failed node gets a
        ``node_lost`` ledger record (what status shows: the in-job recovery record names ranks, not nodes)."""
        try:
            failed = host not in self.job_nodes()
        except Exception as exc:  # noqa: BLE001 - Slurm not answering: say so, the steps go on all the same
            self._log(f"the step of {host} ended ({rc}); the allocation could not be read: {exc}")
            return
        if not failed:
            return
        self._log(f"{host} failed: its step ended ({rc}); the other nodes' steps go on (in-job recovery)")
        Ledger(self.run_dir).append(
            {
                "event": "node_lost",
                "time": at,
                "job_id": self.job_id,
                "restart_count": attempt,
                "node": host,
                "node_index": index,
                "exit_code": rc,
                "tasks": self.tasks_per_node,
                "ranks": node_ranks(index, self.tasks_per_node),
            }
        )

    def _warm(self, hosts: tp.Sequence[str]) -> tp.Any:
        if not self.in_job_recovery:
            return None
        if self.warm_spares and not hosts:
            self._log("no spare node left for warm spares: in-job recovery without spares (RecoveryConfig.shrink)")
        from hpctrain.launch.warm_spares import WarmSpares

        make = self.make_spares or WarmSpares
        return make(hosts=hosts, tasks_per_node=self.tasks_per_node, world_size=self.nodes * self.tasks_per_node)

    def _finished(self, attempt: int) -> bool:
        """The deciding rank recorded this attempt as finished (its entry returned: the run is complete)."""
        record = _exit_record(self.run_dir, self.job_id, attempt, self.exit_wait_s)
        return record is not None and record.get("cause") == "finished"

    def _suspects(
        self, attempt: int, hosts: tp.Sequence[str], left: int, failed_at: float
    ) -> tp.Optional[tp.List[str]]:
        """The hosts to restart without, or None when the loop should end (not a node failure or hang, the job
        requeued, no spare left)."""
        lost = [h for h in hosts if h not in self.job_nodes()]
        # The deciding rank (a hang, a node failure some rank survived) writes its record in seconds; when Slurm
        # took a node away it SIGKILLed every task of the step at once and nobody writes one.
        record = _exit_record(self.run_dir, self.job_id, attempt, 0.0 if lost else self.exit_wait_s)
        if record is not None and record.get("requeued"):
            return None
        if record is not None and record.get("in_job_restart"):
            return list(dict.fromkeys(lost + list(record.get("suspect_nodes") or [])))
        if not lost:
            return None
        if left > 0:
            if record is None:
                self._record_exit(attempt, lost, failed_at, requeued=False, reason="restarting inside the allocation")
            return lost
        self._requeue(attempt, lost, failed_at)
        return None

    def _record_exit(
        self, attempt: int, lost: tp.Sequence[str], failed_at: float, *, requeued: bool, reason: str, **extra: tp.Any
    ) -> None:
        """The exit record of an attempt whose ranks all died with the step: decided here, by the batch script."""
        resumed, committed = committed_progress(self.run_dir, self.job_id, attempt)
        Ledger(self.run_dir).append(
            {
                "event": "exit",
                "time": failed_at,
                "job_id": self.job_id,
                "restart_count": attempt,
                "cause": "node_failure",
                "requeued": requeued,
                "reason": reason,
                "resumed_from_step": resumed,
                "committed_step": committed,
                "failed_nodes": list(lost),
                "suspect_nodes": list(lost),
                "in_job_restart": not requeued,
                "decided_by_rank": None,
                **extra,
            }
        )

    def _requeue(self, attempt: int, lost: tp.Sequence[str], failed_at: float) -> None:
        """No spare left: back to the queue without the failed hosts (within --max-requeues' bound is the ranks'
        policy; here the allocation is short of nodes, so the only way on is a new one)."""
        from hpctrain._slurm import SlurmCommandError

        try:
            self.slurm.requeue(self.job_id)
        except SlurmCommandError as exc:
            self._record_exit(attempt, lost, failed_at, requeued=False, reason=f"not requeued: {exc}")
            return
        excl = exclude_hosts(self.slurm, self.run_dir, self.job_id, lost, nodes_needed=self.nodes + self.spares)
        self._record_exit(
            attempt, lost, failed_at, requeued=True, reason="requeued: no spare node left", **excl.record()
        )


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    from hpctrain._cli import ArgumentParser
    from hpctrain.errors import UsageError

    parser = ArgumentParser(
        prog="python -m hpctrain.launch.spares",
        description="Run the training srun of a --spare-nodes job; restart it on spare nodes after a node failure.",
    )
    parser.add_argument("--nodes", type=int, required=True, help="nodes of one training step")
    parser.add_argument("--tasks-per-node", type=int, required=True)
    parser.add_argument("--spares", type=int, required=True, help="in-job restarts at most (the spare nodes)")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument(
        "--warm-spares",
        action="store_true",
        help="run warm spares on the spare nodes and serve in-job recovery's store (TrainConfig.recovery)",
    )
    parser.add_argument(
        "--in-job-recovery",
        action="store_true",
        help="serve in-job recovery's store and keep the step past a dead task, with no warm spares",
    )
    args, rest = parser.parse_known_args(argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if not rest:
        raise UsageError("give the srun command line after --")
    if args.nodes < 1 or args.tasks_per_node < 1 or args.spares < 0:
        raise UsageError("--nodes and --tasks-per-node must be at least 1, --spares at least 0")
    if not os.environ.get("SLURM_JOB_ID"):
        raise UsageError("not inside a Slurm job (SLURM_JOB_ID is not set): run it from the batch script")
    loop = SpareLoop(
        run_dir=Path(args.run_dir),
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        spares=args.spares,
        srun=rest,
        warm_spares=args.warm_spares,
        in_job_recovery=args.in_job_recovery,
    )
    return loop.run()


if __name__ == "__main__":
    from hpctrain._cli import console_entry

    console_entry(main, "launch.spares")
