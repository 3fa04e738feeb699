"""What runs on every task: derive the rank, start the process group, call ``entry(ctx)``, clean up.

:class:`Runner` is the callable that submitit pickles on the login node and calls on each task, so
this module must stay importable without torch (torch is imported inside ``__call__``). The plain
sbatch templates reach the same code through ``python -m hpctrain.launch``.

Stops and requeues (docs/preemption.md): the Runner installs :class:`~hpctrain.runtime.preemption.StopSignals`
on every task before anything slow (replacing submitit's USR2/TERM/CONT handlers, so submitit neither
requeues by itself nor counts a time-out), gives the entry ``ctx.should_stop()`` (all ranks agree on
the step), and when the entry returns or raises, :func:`hpctrain.launch.ending.finish_attempt` classifies
the end and rank 0 requeues the job with ``scontrol requeue`` when the policy says so. Deliberately no
``checkpoint`` method: submitit's requeue path must never run besides hpctrain's.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_json
from hpctrain._entry import load_entry, split_entry
from hpctrain.launch.settings import RunnerSettings, add_arguments
from hpctrain.rundir import RunDir

__all__ = ["Runner", "load_entry"]


def _torch_threads() -> tp.Optional[int]:
    """The intra-op CPU threads of this process (set by ``process_group.set_cpu_threads``)."""
    try:
        import torch

        return int(torch.get_num_threads())
    except Exception:  # noqa: BLE001 - a record field, never a reason to fail
        return None


def _local_address(master_addr: str, port: int) -> str:
    """The address this host uses to reach the master: proves which network a task sits on."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, port))  # UDP connect sends nothing; it only picks the route
            return str(s.getsockname()[0])
    except OSError:
        return ""


# A Runner pickled by an older hpctrain (a job requeued across an upgrade) holds its settings as attributes under
# these names; :meth:`Runner.__setstate__` turns them into its RunnerSettings. The one place that knows them.
_OLD_ATTRIBUTES = {
    "gpus_per_node": "gpus_per_node",
    "dist_timeout_s": "dist_timeout",
    "max_requeues": "max_requeues",
    "signal_lead_s": "signal_lead",
    "time_limit_s": "time_limit",
    "code_path": "code_path",
    "hang_timeout_s": "hang_timeout",
}


def _renumbered(env: tp.Any) -> tp.Any:
    """``env`` as the rank this training process ends as: its own, or its new one when in-job recovery continued
    at a smaller world (RecoveryConfig.shrink: as rank 0 it then records the attempt's end)."""
    from hpctrain.runtime.recovery_config import taken_rank, taken_world_size

    rank, world = taken_rank(), taken_world_size()
    if rank is None or world is None:
        return env
    return dataclasses.replace(env, rank=rank, world_size=world)


class Runner:
    """The job body: ``Runner(entry=..., run_dir=..., settings=RunnerSettings(...))()`` on every task.

    What it runs (entry, its arguments, the run directory) and its :class:`RunnerSettings`: plain strings and
    numbers, so that the pickle submitit writes stays small and loads on the nodes without hpctrain's torch-side
    modules.
    """

    def __init__(
        self,
        *,
        entry: str,
        run_dir: str,
        entry_args: tp.Sequence[str] = (),
        settings: tp.Optional[RunnerSettings] = None,
    ) -> None:
        split_entry(entry)
        self.entry = entry
        self.run_dir = str(run_dir)
        self.entry_args = tuple(entry_args)
        self.settings = settings if settings is not None else RunnerSettings()

    def __setstate__(self, state: tp.Dict[str, tp.Any]) -> None:
        if "settings" not in state:  # pickled by an older hpctrain: its settings were attributes
            state = dict(state)
            old = {new: state.pop(name) for name, new in _OLD_ATTRIBUTES.items() if name in state}
            state["settings"] = RunnerSettings(**old)
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"Runner(entry={self.entry!r}, run_dir={self.run_dir!r}, settings={self.settings!r})"

    def __call__(self) -> tp.Any:
        started = time.time()  # before torch is imported: the records show what start-up costs
        code_path = self.settings.code_path
        if code_path and sys.path[:1] != [code_path]:
            sys.path.insert(0, code_path)
        from hpctrain.runtime import startup
        from hpctrain.runtime.preemption import StopSignals

        startup.mark("interpreter", started)  # the start-up profile's first phase: OS process start -> here
        # First, before the slow imports and the rendezvous: a signal during start-up is recorded, not lost
        # or fatal, and submitit's own handlers (USR2 -> requeue by rank 0 alone) are replaced on every task.
        signals = StopSignals().install()
        # Inside a container without the Slurm client: every Slurm command hpctrain runs from here on (requeue,
        # exclusion, attribution, time left) is answered outside by the batch script's relay (hpctrain._container).
        from hpctrain._container import probe_node, start_orphan_guard

        probe = probe_node()
        if probe is not None:
            print(probe, file=sys.stderr, flush=True)
        start_orphan_guard()  # inside a container: a rank never outlives the Slurm task that started it
        # Before torch loads (c10 reads it once): c10d warns about every peer whose reverse DNS fails
        # (common on clusters, and in the dev cluster's namespaces). The one place hpctrain sets it.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        from hpctrain.launch.context import RunContext
        from hpctrain.runtime import env as dist_env
        from hpctrain.runtime import process_group
        from hpctrain.runtime.preemption import StopAgreement

        env = dist_env.from_environ()
        from hpctrain.runtime.recovery_config import spare_from_environ

        spare = spare_from_environ()
        if spare is not None:  # a warm spare of in-job recovery: no group to join until it takes a rank
            return self._stand_by(env, spare, signals, started)
        watch = self._start_watchdog(env, started)  # before the rendezvous: start-up is watched too
        try:
            threads = process_group.set_cpu_threads(env)
            device = process_group.select_device(env, self.settings.gpus_per_node)
            startup.mark("imports")
            backend = process_group.init_process_group(env, device, timeout_s=self.settings.dist_timeout)
        except BaseException:
            watch.stop()  # the error ends this process's attempt; a watchdog left running would end the caller
            raise
        joined = time.time()
        startup.mark("rendezvous", joined)
        agreement: tp.Optional[StopAgreement] = None
        result: tp.Any = None
        error: tp.Optional[BaseException] = None
        try:
            process_group.check_distinct_gpus(env, device)
            agreement = StopAgreement(signals, timeout_s=self.settings.dist_timeout)
            startup.mark("process_group")
            ctx = RunContext(
                **{f.name: getattr(env, f.name) for f in dataclasses.fields(env)},
                run_dir=Path(self.run_dir),
                device=device,
                backend=backend,
                hostname=socket.gethostname(),
                args=self.entry_args,
                signal_lead_s=self.settings.signal_lead_s,
                stop=agreement,
            )
            self._record_rank(ctx, started, joined)
            if ctx.rank == 0:
                self._release_array(ctx)
                self._capture_identity(ctx)
                self._record_unseen_end(ctx)
            print(
                f"hpctrain: rank {ctx.rank}/{ctx.world_size} on {ctx.hostname} (node {ctx.node_rank}, "
                f"local {ctx.local_rank}, {device}, {backend}, {threads} cpu threads) joined "
                f"{ctx.master_addr}:{ctx.master_port} in {joined - started:.2f}s; calling {self.entry}",
                flush=True,
            )
            fn = load_entry(self.entry)
            watch.set_phase("entry")  # not watched until the entry reports progress (ctx.should_stop, the Trainer)
            result = fn(ctx)
        except BaseException as exc:  # classified below; re-raised unless the job was requeued
            error = exc
        watch.set_phase("finish")
        if error is None and agreement is not None:
            try:
                agreement.settle()  # its last poll's all-reduce: every rank sent it, so this returns at once
            except Exception as exc:  # a peer went away after its entry returned: the end decides below
                error = exc
        if not watch.stop():
            watch.wait_for_end()  # the watchdog fired: its thread ends the attempt and the process
        decision = agreement.decision if agreement is not None else None
        stop = None
        if decision is not None:
            stop = (decision.signum, signals.first[1] if signals.first else time.time())
            print(f"hpctrain: rank {env.rank} stopped at agreed step {decision.step}", flush=True)
        try:
            end = self._finish(_renumbered(env), started, stop, decision.step if decision is not None else None, error)
        except Exception as exc:  # deciding must never hide the entry's own error
            print(f"hpctrain: could not decide how the attempt ended: {type(exc).__name__}: {exc}", flush=True)
            end = None
        process_group.destroy_process_group(synchronize=error is None)
        signals.ignore_from_now()  # a late time-limit warning must not kill a task that is exiting
        if error is not None:
            if end is not None and end.requeued:
                raise SystemExit(0)  # the job runs again; the traceback is in this attempt's log
            from hpctrain.runtime.preemption import is_peer_failure

            if is_peer_failure(error):
                # Another rank or its node went away: this rank's own code is fine, and gloo's/NCCL's
                # traceback names a socket, not the cause. One line; the deciding rank recorded the end.
                print(
                    f"hpctrain: rank {env.rank}: a peer rank failed ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:200] if str(error) else ''}); this rank ends",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(1)
            raise error
        if stop is None:
            return result
        # Stopped early. Exit rather than return, so that submitit writes no result for an unfinished run
        # (the requeued attempt writes it). Rank 0 exits 1 when the run stopped for good after a time limit
        # or preemption (not requeued: the job must not look COMPLETED); scancel ends CANCELLED anyway.
        if end is not None and not end.requeued and end.cause != "cancelled":
            raise SystemExit(1)
        raise SystemExit(0)

    def _stand_by(self, env: tp.Any, spare: int, signals: tp.Any, started: float) -> tp.Any:
        """A warm spare (docs/preemption.md, "In-job recovery"): the entry with a run context of rank -1 in the
        training world (``HPCTRAIN_RECOVERY_WORLD``) and no process group; the Trainer stands by in ``fit`` and
        joins the job's group when it takes a failed rank's place. No rank record, no watchdog (it may wait for
        the whole job). A spare that took a rank ends as that rank (:func:`~hpctrain.launch.ending.finish_attempt`:
        as rank 0 it records the attempt's end); it exits without a result (submitit writes none: the training
        task of its index holds it)."""
        from hpctrain.launch.context import RunContext
        from hpctrain.runtime import process_group
        from hpctrain.runtime.preemption import StopAgreement
        from hpctrain.runtime.recovery_config import WORLD_ENV, taken_rank

        threads = process_group.set_cpu_threads(env)
        device = process_group.select_device(env, self.settings.gpus_per_node)
        world = int(os.environ.get(WORLD_ENV) or env.world_size)
        fields = {f.name: getattr(env, f.name) for f in dataclasses.fields(env)}
        fields.update(rank=-1, world_size=world)
        ctx = RunContext(
            **fields,
            run_dir=Path(self.run_dir),
            device=device,
            backend="nccl" if device.type == "cuda" else "gloo",
            hostname=socket.gethostname(),
            args=self.entry_args,
            signal_lead_s=self.settings.signal_lead_s,
            stop=StopAgreement(signals, timeout_s=self.settings.dist_timeout),  # its group: when it joins
        )
        print(
            f"hpctrain: warm spare {spare} on {ctx.hostname} ({device}, {threads} cpu threads) for a world of "
            f"{world}; calling {self.entry}",
            flush=True,
        )
        error: tp.Optional[BaseException] = None
        try:
            load_entry(self.entry)(ctx)
        except BaseException as exc:  # the end of the rank it took, if any, decides below
            error = exc
        taken = taken_rank()
        if taken is not None:
            decision = ctx.stop.decision
            stop = (decision.signum, signals.first[1] if signals.first else time.time()) if decision else None
            try:
                as_rank = dataclasses.replace(env, rank=taken, world_size=world)
                self._finish(as_rank, started, stop, decision.step if decision else None, error)
            except Exception as exc:  # deciding must never hide the entry's own error
                print(f"hpctrain: could not decide how the attempt ended: {type(exc).__name__}: {exc}", flush=True)
        process_group.destroy_process_group(synchronize=False)
        signals.ignore_from_now()
        if error is not None:
            print(f"hpctrain: warm spare {spare}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1)
        raise SystemExit(0)

    def _finish(
        self,
        env: tp.Any,
        started: float,
        stop: tp.Optional[tp.Tuple[int, float]],
        agreed_step: tp.Optional[int],
        error: tp.Optional[BaseException],
    ) -> tp.Any:
        """:func:`~hpctrain.launch.ending.finish_attempt` for this task: after the entry, or from the watchdog."""
        from hpctrain.launch.ending import finish_attempt

        return finish_attempt(
            run_dir=Path(self.run_dir),
            rank=env.rank,
            world_size=env.world_size,
            job_id=env.job_id,
            restart_count=env.restart_count,
            launcher=env.launcher,
            stop=stop,
            agreed_step=agreed_step,
            error=error,
            started=started,
            time_limit_s=self.settings.time_limit,
            lead_s=self.settings.signal_lead_s,
            max_requeues=self.settings.max_requeues,
        )

    def _start_watchdog(self, env: tp.Any, started: float) -> tp.Any:
        """This rank's no-progress watchdog (:mod:`hpctrain.runtime.watchdog`); on a hang its thread ends the
        attempt through :func:`~hpctrain.launch.ending.finish_attempt` (cause ``hang``) and the process."""
        from hpctrain.runtime import watchdog

        def on_hang(error: BaseException) -> int:
            end = self._finish(env, started, None, None, error)
            return 0 if end is not None and end.requeued else 1

        watch = watchdog.Watchdog(
            run_dir=self.run_dir,
            job_id=env.job_id,
            restart_count=env.restart_count,
            rank=env.rank,
            world_size=env.world_size,
            host=socket.gethostname(),
            hang_timeout=self.settings.hang_timeout,
            on_hang=on_hang,
        )
        watchdog.install(watch)
        return watch.start()

    def _capture_identity(self, ctx: tp.Any) -> None:
        """Rank 0: this attempt's identity manifest (hpctrain.identity). A failure is one warning line: the
        run goes on without it."""
        try:
            from hpctrain.identity import capture_start

            manifest = capture_start(
                self.run_dir,
                job_id=ctx.job_id,
                restart_count=ctx.restart_count,
                entry=self.entry,
                entry_args=self.entry_args,
                world_size=ctx.world_size,
                gpus_per_node=self.settings.gpus_per_node,
                hostnames=ctx.hostnames,
                launcher=ctx.launcher,
                backend=ctx.backend,
                device=str(ctx.device),
                cpu_threads=_torch_threads(),
            )
        except Exception as exc:
            print(f"hpctrain: warning: run identity not captured: {type(exc).__name__}: {exc}", flush=True)
            return
        changed = manifest["previous"]["changed"]
        moved = (
            ""
            if (manifest["code"].get("vs_submit") or {}).get("same", True)
            else "; code differs from the submitted code"
        )
        print(
            f"hpctrain: identity {manifest['identity'][:12]} captured in {manifest['capture_s']:.2f}s"
            + (f"; changed since attempt {manifest['previous']['attempt']}: {', '.join(changed)}" if changed else "")
            + moved,
            flush=True,
        )

    def _release_array(self, ctx: tp.Any) -> None:
        """Rank 0 of a restarted job-array task: the array's tasks its requeue held come back
        (:func:`hpctrain.launch.array.release_array`)."""
        if ctx.launcher != "slurm" or ctx.restart_count == 0:
            return
        try:
            from hpctrain._slurm import SlurmCommands
            from hpctrain.launch.array import release_array

            if release_array(SlurmCommands()):
                print("hpctrain: this requeued array task started first; the array's held tasks released", flush=True)
        except Exception as exc:  # noqa: BLE001 - scheduling order only: never a reason for this attempt to fail
            print(f"hpctrain: warning: the array's held tasks not released: {type(exc).__name__}: {exc}", flush=True)

    def _record_unseen_end(self, ctx: tp.Any) -> None:
        """Rank 0 of a restart: the end of a previous attempt whose ranks all died unrecorded (a node failure
        without survivors), from Slurm's view (:func:`hpctrain.launch.exclusion.record_unseen_end`)."""
        if ctx.launcher != "slurm" or ctx.restart_count == 0:
            return
        try:
            from hpctrain._slurm import SlurmCommands
            from hpctrain.launch.exclusion import record_unseen_end

            found = record_unseen_end(
                Path(self.run_dir), ctx.job_id, ctx.restart_count, ctx.world_size, slurm=SlurmCommands()
            )
        except Exception as exc:  # noqa: BLE001 - a record of the past: never a reason for this attempt to fail
            print(f"hpctrain: warning: the previous attempt's end not recorded: {type(exc).__name__}: {exc}")
            return
        if found is not None:
            print(f"hpctrain: attempt {found['restart_count']} ended unrecorded: {found['cause']}", flush=True)

    def _record_rank(self, ctx: tp.Any, started: float, joined: float) -> None:
        """:meth:`RunDir.rank_record`: what the login-node tools read about each task."""
        from hpctrain.runtime import startup

        path = RunDir(self.run_dir).rank_record(ctx.job_id, ctx.restart_count, ctx.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            path,
            {
                "rank": ctx.rank,
                "local_rank": ctx.local_rank,
                "node_rank": ctx.node_rank,
                "world_size": ctx.world_size,
                "hostname": ctx.hostname,
                "address": _local_address(ctx.master_addr, ctx.master_port),
                "pid": os.getpid(),
                "device": str(ctx.device),
                "backend": ctx.backend,
                "job_id": ctx.job_id,
                "restart_count": ctx.restart_count,
                "started_at": started,
                "joined_at": joined,
                # the Runner's start-up phases (hpctrain.runtime.startup): what an entry without the Trainer records
                "startup": startup.phases(),
                "python": sys.executable,
            },
        )


def build_parser() -> tp.Any:
    """``python -m hpctrain.launch``'s command line: what to run, and one flag per :class:`RunnerSettings` field
    (:func:`hpctrain.launch.settings.add_arguments`)."""
    from hpctrain._cli import ArgumentParser

    # The one CLI convention (hpctrain._cli): a bad flag is a one-line UsageError, exit 2.
    parser = ArgumentParser(
        prog="python -m hpctrain.launch", description="Run an hpctrain entry on this task (use under srun)."
    )
    parser.add_argument("--entry", required=True, help="module:function taking a RunContext")
    parser.add_argument("--run-dir", required=True, help="run directory shared by all nodes")
    add_arguments(parser)
    return parser


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    """``srun python -m hpctrain.launch --entry mod:fn --run-dir DIR [--SETTING VALUE ...] -- ARGS``."""
    args, rest = build_parser().parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    Runner(entry=args.entry, run_dir=args.run_dir, entry_args=rest, settings=RunnerSettings.from_args(args))()
    return 0
