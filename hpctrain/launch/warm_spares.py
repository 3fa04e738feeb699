"""Warm spares of in-job recovery on Slurm: the batch host's side (docs/preemption.md, "In-job recovery").

With ``--warm-spares`` the spare-node loop (:mod:`hpctrain.launch.spares`), which runs in the batch script's
process on the batch host for the whole job, does three more things around each training step:

* it **serves the recovery store**, a TCPStore that outlives every rank (a new one per step, so no key of a
  broken step is read again): the ranks and spares get ``HPCTRAIN_RECOVERY_STORE=<batch host>:<port>``;
* it **starts the warm spares**: a second ``srun`` step on the spare nodes, ``tasks-per-node`` processes each,
  running the same command with ``HPCTRAIN_RECOVERY_SPARE=task`` (the spare index is the task's
  ``SLURM_PROCID``) and ``HPCTRAIN_RECOVERY_WORLD`` (the training world size); the Runner gives each the run
  context of a spare (:meth:`hpctrain.launch.runner.Runner._stand_by`) and the Trainer stands by;
* when the training step has ended, it **releases** the spares still standing by (the same key a finishing
  rank writes) and waits for the spare step: a spare that took a rank is part of the training and ends with
  it; one that does not end in ``wait_s`` is terminated, so a restart on the spare node finds it free.

The training is started as one step per node (:mod:`hpctrain.launch.node_step`), each with
``--kill-on-bad-exit=0``: a task that dies must not take the survivors with it, nor a failed node the other
nodes' tasks. With ``--in-job-recovery`` (no spare nodes), or once the spare nodes are used, there are no hosts:
only the store is served, and a dead rank is dropped by the survivors (the smaller world, ``RecoveryConfig.shrink``) or
ends the step through the Trainer's fallback line. torch is imported here only to serve the store (the loop
itself stays stdlib-only).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import typing as tp

from hpctrain.runtime.recovery_config import SPARE_ENV, SPARES_ENV, STORE_ENV, WORLD_ENV

__all__ = ["WarmSpares", "KEEP_STEP_ALIVE"]

KEEP_STEP_ALIVE = "--kill-on-bad-exit=0"
"""The training srun's option: a dead task leaves its step running (the survivors recover in the job)."""

_ASSIGN = "hpctrain/recovery/spare/{}/assign"  # hpctrain.runtime.recovery's key: what a spare waits on


class WarmSpares:
    """One training step's recovery store and spare step; :meth:`start` before the step, :meth:`end` after."""

    def __init__(self, *, hosts: tp.Sequence[str], tasks_per_node: int, world_size: int, wait_s: float = 60.0) -> None:
        self.hosts, self.tasks_per_node, self.world_size = list(hosts), tasks_per_node, world_size
        self.count = len(self.hosts) * tasks_per_node
        self.wait_s = wait_s
        self.store: tp.Any = None
        self.proc: tp.Optional[subprocess.Popen] = None

    def start(
        self, srun: tp.Sequence[str], env: tp.Dict[str, str], step_argv: tp.Callable[..., tp.List[str]]
    ) -> tp.Dict[str, str]:
        """Serve the store, start the spares; the environment of the training step."""
        import datetime

        import torch.distributed as dist

        self.store = dist.TCPStore(
            "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
        )
        # the name Slurm gives the batch host (the ranks resolve it, as they do MASTER_ADDR); the OS's otherwise
        host = env.get("SLURMD_NODENAME") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        address = f"{host}:{self.store.port}"
        env = dict(env, **{STORE_ENV: address, SPARES_ENV: str(self.count)})
        # their own log files: submitit's --output DIR/%j_%t_log.out would put spare 0 into rank 0's
        if not self.hosts:
            _log(f"no warm spares; recovery store {address}")
            return env
        mine = [a.replace("%t", "spare%t") for a in srun]
        argv = step_argv(mine, nodes=len(self.hosts), tasks_per_node=self.tasks_per_node, hosts=self.hosts)
        spare_env = dict(env, **{SPARE_ENV: "task", WORLD_ENV: str(self.world_size)})
        self.proc = subprocess.Popen(argv, env=spare_env)
        _log(f"{self.count} warm spare(s) on {','.join(self.hosts)}; recovery store {address}")
        return env

    def end(self) -> tp.Optional[int]:
        """Release the spares still standing by, wait for their step (terminate it after ``wait_s``), close the
        store. The spare step's exit code (None when terminated)."""
        if self.store is not None:
            for i in range(self.count):  # an assigned spare keeps its assignment: compare_set only fills an empty key
                try:
                    self.store.compare_set(_ASSIGN.format(i), "", json.dumps({"finish": True}))
                except Exception as exc:  # noqa: BLE001 - the store is ours; a failure here ends nothing
                    _log(f"could not release spare {i}: {type(exc).__name__}: {exc}")
        rc: tp.Optional[int] = None
        if self.proc is not None:
            deadline = time.monotonic() + self.wait_s
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.proc.poll() is None:
                _log(f"the spare step did not end within {self.wait_s:g} s: terminating it")
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            else:
                rc = self.proc.returncode
        self.store = None  # the server goes with the object
        return rc


def _log(text: str) -> None:
    print(f"hpctrain spares: {text}", file=sys.stderr, flush=True)
