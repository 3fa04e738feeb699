"""In-job recovery: the living ranks keep their processes, a warm spare takes the failed rank's place.

When a rank's process dies in a step, the collective the others are in fails (gloo at once when the dead
process's sockets close; a node that vanished without closing them, after the generation's
``collective_timeout_s``). Each survivor then, without exiting:

1. **abort**: leaves the broken process group, bounded by ``abort_timeout_s``;
2. **agree**: writes the last step it completed under the generation's key of a TCPStore that outlives every
   rank, and waits until every rank of the generation either did the same or is silent (its heartbeat, a key
   a thread of each process rewrites every ``heartbeat_s``, has not changed for ``dead_after_s``). The first
   survivor to see that writes the plan with ``compare_set`` (so there is exactly one): the dead ranks, a warm
   spare for each, the **agreed step** (the newest step a survivor completed: a ring all-reduce can end on one
   rank and fail on another, and a DDP rank that completed a step holds that step's exact state) and the
   **source** (the lowest rank at it);
3. **re-forms** the group (generation ``g+1``, the same world size; its rendezvous under its own
   ``PrefixStore``, so no key of a broken generation is read again);
4. **transfers** the source's model, optimizer, loader position and RNG streams to every other rank
   (:mod:`hpctrain.runtime.state_transfer`); only the interrupted step is run again. **Sharded state**
   (FSDP/HSDP, a :class:`~hpctrain.runtime.state_transfer.StoredState`): no survivor holds the dead rank's
   shards, so every rank of the new generation reloads the newest commit instead (the node-local tier, the dead
   rank's shards from their partner copies, else the global tier); the steps since it are run again, still
   without a new process. The record's ``state_from`` says which (``memory``, ``local``, ``partner``,
   ``global``).

A **warm spare** is a process started with the job that imported torch and built the model and optimizer, and
waits on its assignment key (:meth:`InJobRecovery.stand_by`); the plan's author writes it, the spare takes the
rank number, builds that rank's loader shard (``on_rank``) and joins step 3 like a survivor.

**No spare left** and ``RecoveryConfig.shrink``: the dead ranks are dropped and the survivors continue at the
smaller world, renumbered (:mod:`hpctrain.runtime.shrink`); ``can_shrink(n)`` (the caller's: can the run go on
at ``n`` ranks?) is asked by the plan's author, ``on_world(rank, world_size)`` on every member before it joins
(the caller re-splits its data there), and the record carries ``elastic``.

What it does not handle falls back, with one line saying why, to the existing path: the rank raises
:class:`~hpctrain.errors.InJobRecoveryFallback` from the peer failure, so it ends as any rank whose peer died
(the Runner's end, the spare-node loop or the requeue, restart from the last commit). That is: no ready spare
left (without ``shrink``, or ``can_shrink`` said no), a failure during the recovery itself, ``max_recoveries``
used, a rank that was declared dead but lives.

GPU (NCCL): leaving the group aborts the communicators first (``_abort_process_group``: a NCCL kernel waiting
for a dead peer would otherwise never return, and a destroy would wait for it); the CUDA context, the model on
the device and the caching allocator stay; the state goes device to device. No GPU is lent to this project:
``benchmarks/gpu_checks.sh`` runs it when one is.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import stat
import sys
import threading
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.errors import InJobRecoveryFallback
from hpctrain.ledger import Ledger
from hpctrain.runtime import gloo_teardown
from hpctrain.runtime.preemption import is_peer_failure
from hpctrain.runtime.recovery_config import RecoveryConfig
from hpctrain.runtime.shrink import renumbered, smaller_world
from hpctrain.runtime.state_transfer import ReplicatedState, StoredState, broadcast_state

__all__ = ["RecoveryConfig", "InJobRecovery", "Recovered", "RECORD_EVENT"]

RECORD_EVENT = "in_job_recovery"
"""The ledger event of a recovery (or of its fallback): the schema is in docs/preemption.md."""

_KEY = "hpctrain/recovery"
_POLL_S = 0.01  # the agreement's poll of the store: a few keys per rank, so 10 ms costs nothing and adds little


@dataclass
class Recovered:
    """What :meth:`InJobRecovery.recover` (a survivor) or :meth:`InJobRecovery.stand_by` (a spare) returns."""

    step: int
    """The agreed step: training continues with step ``step + 1``."""
    rank: int
    """This process's rank in the new generation (a survivor keeps its own, unless the world shrank)."""
    generation: int
    world_size: int
    plan: tp.Dict[str, tp.Any] = field(repr=False)


class _Heartbeat:
    """A daemon thread that rewrites ``hb/<uid>`` with the time every ``period`` s, on its own store client
    (a client is one connection, and the main thread may block on it for seconds in a ``wait``)."""

    def __init__(self, host: str, port: int, uid: str, period: float) -> None:
        self.store = _client(host, port, 30.0)
        self.key, self.period = f"{_KEY}/hb/{uid}", period
        self._stop = threading.Event()
        self.store.set(self.key, repr(time.time()))
        self._thread = threading.Thread(target=self._run, name=f"hpctrain-heartbeat-{uid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.store.set(self.key, repr(time.time()))
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending; the main thread will see it
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.period + 1.0)


def _sockets() -> tp.Dict[int, int]:
    """This process's open sockets: fd -> inode (an inode is one socket for its life, a number is reused)."""
    out: tp.Dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[int(name)] = st.st_ino
    return out


def _close_for_peers(pairs: tp.Mapping[int, int]) -> None:
    """Half-close (SHUT_WR) a broken gloo generation's sockets, so each peer still blocked in a collective with
    this rank reads EOF and fails at once instead of at collective_timeout_s. Why by hand: gloo has no abort,
    and destroy_process_group does not close them (the failed work and DDP's reducer keep the context alive);
    a full close (SHUT_RDWR) makes gloo's loop thread throw and terminate the process. The inode check skips an
    fd that gloo closed and the process reused."""
    for fd, inode in pairs.items():
        try:
            if os.fstat(fd).st_ino != inode:
                continue
            dup = socket.socket(fileno=os.dup(fd))
            try:
                dup.shutdown(socket.SHUT_WR)
            finally:
                dup.close()  # the duplicate only: gloo's fd stays open until gloo closes it
        except OSError:  # closed by gloo already (the dead peer's pair), or its listening socket: nothing to do
            continue


def _client(host: str, port: int, timeout_s: float) -> tp.Any:
    return dist.TCPStore(
        host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


class InJobRecovery:
    """One process's side of in-job recovery: a rank (``rank=``) or a warm spare (``spare=``).

    ``host``/``port``: a TCPStore server that outlives every rank (not rank 0's: rank 0 may be the one that
    dies). ``state``: what is sent and loaded (:class:`~hpctrain.runtime.state_transfer.ReplicatedState`), or,
    for sharded state, reloaded from storage by every rank (:class:`~hpctrain.runtime.state_transfer.StoredState`).
    ``run_dir``: where the ``in_job_recovery`` record goes (the source rank writes it; None: only
    :attr:`records`). A rank calls :meth:`start`, :meth:`check` between the backward and the optimizer step,
    :meth:`completed` after every step, :meth:`recover` with the exception a step raised, and :meth:`finish`;
    a spare calls :meth:`stand_by`, then does the same.

    ``on_group(generation)``: called right after each generation's default group is formed, before its gloo
    sockets are recorded: the caller's own subgroups of that generation (the stop agreement's) made there are
    half-closed with it when a survivor leaves. ``can_shrink``/``on_world``: the smaller world's two hooks (see
    the module docstring; without ``can_shrink`` any world of at least one rank may go on). A caller that must
    build on the group before the state exists (the Trainer wraps DDP on it) calls :meth:`connect` first and
    sets :attr:`state` before :meth:`start`."""

    def __init__(
        self,
        config: RecoveryConfig,
        *,
        host: str,
        port: int,
        world_size: int,
        state: tp.Optional[tp.Union[ReplicatedState, StoredState]],
        rank: tp.Optional[int] = None,
        spare: tp.Optional[int] = None,
        backend: str = "gloo",
        device: tp.Union[str, torch.device] = "cpu",
        run_dir: tp.Optional[tp.Union[str, Path]] = None,
        job_id: tp.Optional[str] = None,
        restart_count: int = 0,
        on_group: tp.Optional[tp.Callable[[int], None]] = None,
        can_shrink: tp.Optional[tp.Callable[[int], tp.Optional[str]]] = None,
        on_world: tp.Optional[tp.Callable[[int, int], None]] = None,
    ) -> None:
        if (rank is None) == (spare is None):
            raise ValueError("InJobRecovery: give exactly one of rank= (a training rank) and spare= (a warm spare)")
        self.config, self.host, self.port, self.world_size, self.state = config, host, port, world_size, state
        self.rank, self.spare, self.backend, self.device = rank, spare, backend, torch.device(device)
        self.uid = f"r{rank}" if rank is not None else f"s{spare}"
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.job_id, self.restart_count = job_id, restart_count
        self.store = _client(host, port, config.collective_timeout_s)
        self.generation = 0
        self.members: tp.Dict[int, str] = {r: f"r{r}" for r in range(world_size)}
        self.spares_used: tp.List[int] = []
        self.step = 0
        """The last step this process completed (or received)."""
        self.records: tp.List[tp.Dict[str, tp.Any]] = []
        """This process's recoveries, each the ledger record (every rank keeps it; the source writes it)."""
        self._pending: tp.Optional[tp.Dict[str, tp.Any]] = None
        self._pairs: tp.Dict[int, int] = {}
        self._left_groups: tp.List[tp.Any] = []
        """Broken generations' gloo groups, held until :meth:`close` (see :mod:`~hpctrain.runtime.gloo_teardown`)."""
        self._on_group, self._connected = on_group, False
        self._can_shrink, self._on_world = can_shrink, on_world
        self._heartbeat = _Heartbeat(host, port, self.uid, config.heartbeat_s)

    # ---------------------------------------------------------------------------------- training ranks
    def connect(self) -> None:
        """Form generation 0 (the default process group) on the recovery store; :meth:`start` does it when not
        done yet."""
        assert self.rank is not None
        self._form_group(0)
        self._connected = True

    def start(self, step: int = 0) -> None:
        """Form generation 0 (unless :meth:`connect` did) at ``step`` (the restored step, else 0)."""
        if not self._connected:
            self.connect()
        assert self.state is not None, "InJobRecovery.start: set .state (a ReplicatedState or StoredState) first"
        self.step = step
        self.state.boundary()

    def check(self) -> None:
        """Between the backward and the optimizer step: raise the peer failure of this generation, if any.

        gloo raises in the collective itself, so this is a no-op there. NCCL runs the all-reduce on a stream and
        reports a dead peer later (its watchdog aborts the communicator at collective_timeout_s): without this,
        a survivor would step its optimizer on half-reduced gradients and call the step completed. Costs a
        device synchronisation per step on GPU."""
        if self.backend != "nccl":
            return
        torch.cuda.synchronize(self.device)  # the step's all-reduce finished, or NCCL's watchdog aborted it
        error = dist.group.WORLD._get_backend(self.device).get_error()
        name = getattr(error, "name", str(error))
        if name != "SUCCESS":
            # the text is_peer_failure() knows: recover() takes it as the peer failure it is
            raise RuntimeError(f"NCCL communicator was aborted: {name} in generation {self.generation}")

    def completed(self, step: int) -> None:
        """After every completed optimizer step: the boundary snapshot; the first step after a recovery also
        completes its record (``failure_to_first_step_s``) and the source writes it to the ledger."""
        self.step = step
        assert self.state is not None
        self.state.boundary()
        if self._pending is not None:
            record, self._pending = self._pending, None
            now = time.time()
            record["phases_s"]["first_step"] = now - record.pop("_t_transferred")
            failed_at = record.get("failed_at")
            record["failure_to_first_step_s"] = now - failed_at if failed_at is not None else None
            record["first_step_at"] = now
            self.records.append(record)
            if self.rank == record["source_rank"]:
                self._append(record)

    def recover(self, error: BaseException) -> Recovered:
        """After a step raised ``error``: recover in the job and return where to continue, or raise.

        Not a peer failure (the user's own error): ``error`` itself. Anything this path cannot handle:
        :class:`InJobRecoveryFallback` from ``error`` (one line on stderr says why)."""
        detected = time.time()
        if not is_peer_failure(error):
            raise error
        if not self.config.enabled:
            raise self._fallback(error, "RecoveryConfig.enabled is False")
        if len(self.records) >= self.config.max_recoveries:
            raise self._fallback(error, f"RecoveryConfig.max_recoveries={self.config.max_recoveries} used")
        g = self.generation
        left = self._leave_group()
        aborted = time.time()
        if left is not None:
            raise self._fallback(error, left)
        why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        arrival = {"step": self.step, "detected_at": detected, "error": why}
        self.store.set(f"{_KEY}/g{g}/arrived/{self.rank}", json.dumps(arrival))
        plan = self._agree(g)
        agreed = time.time()
        if plan.get("fallback"):
            raise self._fallback(error, plan["fallback"], plan=plan)
        if self.uid not in plan["members"].values():
            raise self._fallback(error, f"this rank ({self.rank}) was declared dead by the agreement")
        times = {"detected_at": detected, "aborted_at": aborted, "agreed_at": agreed}
        return self._join(plan, error, times)

    def finish(self) -> None:
        """At the end of training, on every rank: release the spares still standing by, stop the heartbeat and
        leave the group."""
        if self.rank == min(int(r) for r in self.members):
            for i in range(self.config.spares):
                if i not in self.spares_used:
                    self.store.compare_set(f"{_KEY}/spare/{i}/assign", "", json.dumps({"finish": True}))
        self.close()

    def close(self) -> None:
        self._heartbeat.stop()
        groups, self._left_groups = self._left_groups + gloo_teardown.hold_groups(), []
        if dist.is_initialized():
            dist.destroy_process_group()
        # a broken generation's collective may still be timing out (a frozen peer): freed once its workers rest
        gloo_teardown.release_when_idle(groups, 2 * self.config.collective_timeout_s)

    # ---------------------------------------------------------------------------------- warm spares
    def stand_by(self, on_rank: tp.Optional[tp.Callable[[int], None]] = None) -> tp.Optional[Recovered]:
        """A warm spare: wait for an assignment; None when the job ended without needing this spare. Else take
        the rank (``on_rank(rank)`` first: build that rank's loader shard), join the new group, receive the state
        and return where to continue (raises :class:`InJobRecoveryFallback` when the recovery fails)."""
        assert self.spare is not None
        key = f"{_KEY}/spare/{self.spare}/assign"
        self.store.set(f"{_KEY}/spare/{self.spare}/ready", "1")
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=30))
                break
            except Exception:  # noqa: BLE001 - the wait's timeout: keep standing by (the store's own errors repeat)
                if not self.store.check([key]):
                    continue
                break
        got = json.loads(self.store.get(key))
        if got.get("finish"):
            self._heartbeat.stop()
            return None
        plan = got["plan"]
        self.rank = int(got["rank"])
        if on_rank is not None:
            on_rank(self.rank)
        now = time.time()
        return self._join(plan, None, {"detected_at": now, "aborted_at": now, "agreed_at": now})

    # ---------------------------------------------------------------------------------- the phases
    def _form_group(self, generation: int) -> None:
        # The store's timeout bounds the rendezvous (init_process_group leaves a given store's as it is): the
        # job's first one waits for the slowest start-up, a re-forming only for processes that are already up,
        # so a replacement that never comes fails it within collective_timeout_s (a second failure).
        wait_s = self.config.agree_timeout_s if generation == 0 else self.config.collective_timeout_s
        self.store.set_timeout(datetime.timedelta(seconds=wait_s))
        prefix = dist.PrefixStore(f"{_KEY}/g{generation}/pg", self.store)
        timeout = datetime.timedelta(seconds=self.config.collective_timeout_s)
        kwargs: tp.Dict[str, tp.Any] = {}
        if self.backend == "nccl":
            # torch's default (3, and 1) tears the process down when a collective fails: the survivor would die
            # with its peer. 2 aborts the communicators and lets the failed wait raise, which recover() catches.
            # Read when the group is made, so it is set before every generation's.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        if self.device.type == "cuda":
            kwargs["device_id"] = self.device  # eager NCCL init on the device this process already holds
        before = _sockets() if self.backend == "gloo" else {}
        dist.init_process_group(
            self.backend, store=prefix, rank=self.rank, world_size=self.world_size, timeout=timeout, **kwargs
        )
        if self._on_group is not None:
            self._on_group(generation)  # its subgroups' sockets are this generation's too
        # gloo connects the full mesh here: the sockets new since `before` are this generation's pairs
        self._pairs = {fd: ino for fd, ino in _sockets().items() if before.get(fd) != ino}
        self.generation = generation

    def _leave_group(self) -> tp.Optional[str]:
        """Leave the broken group within ``abort_timeout_s``; None when done, else why not."""
        done = threading.Event()
        failure: tp.List[str] = []

        def leave() -> None:
            try:
                if dist.is_initialized():
                    if self.backend == "nccl":
                        # NCCL: abort the communicators first. A kernel waiting for the dead peer never returns
                        # and a destroy would wait for it; abort frees them (the CUDA context stays).
                        dist.distributed_c10d._abort_process_group()
                    else:
                        _close_for_peers(self._pairs)
                        # held: the caller's old DDP wrapper is freed on the main thread while this group's
                        # workers may still finish a failed collective (the teardown deadlock)
                        self._left_groups.extend(gloo_teardown.hold_groups())
                        dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001 - reported as the fallback's reason
                failure.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            finally:
                done.set()

        thread = threading.Thread(target=leave, name="hpctrain-leave-group", daemon=True)
        thread.start()
        if not done.wait(self.config.abort_timeout_s):
            return f"leaving the broken process group took over {self.config.abort_timeout_s:g} s (abort_timeout_s)"
        return f"leaving the broken process group failed: {failure[0]}" if failure else None

    def _agree(self, g: int) -> tp.Dict[str, tp.Any]:
        """The plan of generation ``g``'s recovery: this survivor's or the one another survivor wrote first."""
        cfg, prefix = self.config, f"{_KEY}/g{g}"
        plan_key = f"{prefix}/plan"
        watched = {f"r{r}": None for r in range(self.world_size)}
        watched.update({uid: None for uid in self.members.values()})
        watched.update({f"s{i}": None for i in range(cfg.spares)})
        seen: tp.Dict[str, tp.Tuple[tp.Optional[bytes], float]] = {}  # uid -> (heartbeat value, when it changed)
        deadline = time.monotonic() + cfg.agree_timeout_s
        while True:
            if self.store.check([plan_key]):
                return json.loads(self.store.get(plan_key))
            now = time.monotonic()
            for uid in watched:
                key = f"{_KEY}/hb/{uid}"
                value = self.store.get(key) if self.store.check([key]) else None
                if uid not in seen or seen[uid][0] != value:
                    seen[uid] = (value, now)
            silent = {uid for uid, (_, since) in seen.items() if now - since >= cfg.dead_after_s}
            arrived: tp.Dict[int, tp.Dict[str, tp.Any]] = {}
            for r in self.members:
                key = f"{prefix}/arrived/{r}"
                if self.store.check([key]):
                    arrived[r] = json.loads(self.store.get(key))
            dead = [r for r in self.members if r not in arrived and self.members[r] in silent]
            if len(arrived) + len(dead) == self.world_size:
                plan = self._plan(g, arrived, dead, silent, seen)
            elif now >= deadline:
                missing = sorted(set(self.members) - set(arrived) - set(dead))
                plan = {"generation": g + 1, "fallback": f"rank(s) {missing} neither reached the agreement nor "
                        f"went silent within agree_timeout_s={cfg.agree_timeout_s:g}"}  # fmt: skip
            else:
                time.sleep(_POLL_S)
                continue
            plan, won = self._publish(plan_key, plan)
            if won:
                self._assign(plan)
            return plan

    def _publish(self, plan_key: str, plan: tp.Mapping[str, tp.Any]) -> tp.Tuple[tp.Dict[str, tp.Any], bool]:
        """The plan under ``plan_key`` (the first survivor's to write it) and whether this survivor is its one
        author (it writes the fallback record or hands the spares their ranks). Two survivors that poll the same
        store compute the same plan, byte for byte: compare_set then answers both with their own text, so the
        text alone cannot tell the author; the first to count itself on the author key is it."""
        mine = json.dumps(plan, sort_keys=True)
        stored = self.store.compare_set(plan_key, "", mine).decode()
        won = stored == mine and self.store.add(f"{plan_key}/authors", 1) == 1
        return json.loads(stored), won

    def _plan(
        self,
        g: int,
        arrived: tp.Mapping[int, tp.Mapping[str, tp.Any]],
        dead: tp.Sequence[int],
        silent: tp.Set[str],
        seen: tp.Mapping[str, tp.Tuple[tp.Optional[bytes], float]],
    ) -> tp.Dict[str, tp.Any]:
        agreed = max(int(a["step"]) for a in arrived.values())
        source = min(r for r, a in arrived.items() if int(a["step"]) == agreed)
        ready = [
            i
            for i in range(self.config.spares)
            if i not in self.spares_used and f"s{i}" not in silent and self.store.check([f"{_KEY}/spare/{i}/ready"])
        ]
        members = {str(r): uid for r, uid in self.members.items() if r not in dead}
        replaced = []
        for r, i in zip(dead, ready):
            members[str(r)] = f"s{i}"
            replaced.append({"rank": r, "was": self.members[r], "by": f"s{i}", "spare": i})
        beats = [float(seen[self.members[r]][0] or 0) for r in dead if seen.get(self.members[r], (None,))[0]]
        plan: tp.Dict[str, tp.Any] = {
            "generation": g + 1,
            "failed_ranks": sorted(dead),
            "agreed_step": agreed,
            "source_rank": source,
            "survivor_steps": {str(r): int(a["step"]) for r, a in sorted(arrived.items())},
            # what each survivor's collective said: a closed connection, or the collective's timeout
            "survivor_errors": {str(r): a.get("error") for r, a in sorted(arrived.items())},
            "replaced": replaced,
            "members": members,
            "spares_used": self.spares_used + [x["spare"] for x in replaced],
            # the dead ranks' last heartbeat: their failure was at most heartbeat_s after it
            "failed_at": max(beats) if beats else min(float(a["detected_at"]) for a in arrived.values()),
            "fallback": None,
        }
        if len(dead) > len(ready):
            left = sorted(dead)[len(ready) :]
            plan["fallback"] = (
                f"no warm spare left for rank(s) {left} ({self.config.spares} configured, {len(self.spares_used)} used)"
            )
            if self.config.shrink:
                self._shrink(plan, {int(r): uid for r, uid in members.items()}, left)
        return plan

    def _shrink(self, plan: tp.Dict[str, tp.Any], members: tp.Mapping[int, str], dropped: tp.List[int]) -> None:
        """The plan at the smaller world (RecoveryConfig.shrink): renumbered members, source and spares' ranks; or
        its fallback saying why the run cannot go on at that size."""
        elastic = smaller_world(members, dropped)
        n = elastic["world_size"]
        why = self._can_shrink(n) if self._can_shrink is not None else None
        if why:
            plan["fallback"] += f"; the smaller world of {n} rank(s) cannot take the run: {why}"
            return
        plan["members"] = {str(renumbered(elastic, r)): uid for r, uid in members.items()}
        plan["source_rank"] = renumbered(elastic, plan["source_rank"])
        plan["replaced"] = [{**x, "rank": renumbered(elastic, x["rank"])} for x in plan["replaced"]]
        plan["elastic"], plan["fallback"] = elastic, None

    def _assign(self, plan: tp.Mapping[str, tp.Any]) -> None:
        """The plan's author hands each replaced rank to its spare (the spare waits on this key)."""
        if plan.get("fallback"):
            self._append({"event": RECORD_EVENT, "time": time.time(), **self._ids(), **plan})
            return
        for x in plan["replaced"]:
            self.store.set(f"{_KEY}/spare/{x['spare']}/assign", json.dumps({"rank": x["rank"], "plan": plan}))

    def _join(
        self, plan: tp.Mapping[str, tp.Any], error: tp.Optional[BaseException], times: tp.Dict[str, float]
    ) -> Recovered:
        """Steps 3 and 4: the new generation's group, then the source's state."""
        g = int(plan["generation"])
        self.members = {int(r): uid for r, uid in plan["members"].items()}
        self.spares_used = list(plan["spares_used"])
        elastic = plan.get("elastic")
        try:
            if elastic:  # the smaller world: this process's new rank, and the caller's data split over it
                self.rank = next(r for r, uid in self.members.items() if uid == self.uid)
                self.world_size = len(self.members)
                if self._on_world is not None:
                    self._on_world(self.rank, self.world_size)
            self._form_group(g)
            formed = time.time()
            source = int(plan["source_rank"])
            assert self.rank is not None and self.state is not None
            if isinstance(self.state, StoredState):  # sharded: the newest commit, on every rank
                resumed, state_from = self.state.reload()
            else:  # replicated: the agreed step's state from the source's memory
                mine = self.state.payload() if self.rank == source else None
                got = broadcast_state(mine, src=source, rank=self.rank, device=self.device)
                self.state.load(got, own=self.rank == source)
                resumed, state_from = int(plan["agreed_step"]), "memory"
            transferred = time.time()
        except Exception as exc:  # noqa: BLE001 - any failure here is a second failure: fall back
            if dist.is_initialized():
                self._leave_group()
            first = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            during = "the recovery at the smaller world" if elastic else "the recovery"
            reason = f"a second failure during {during} ({first})"
            if self.rank == min(self.members):
                self._append({"event": RECORD_EVENT, "time": time.time(), **self._ids(), **plan, "fallback": reason})
            # not `from exc`: the cause stays the first peer failure, which is how the Runner's end classifies it
            raise self._fallback(error or exc, reason)  # noqa: B904
        self.step = int(resumed)
        failed_at = plan.get("failed_at")
        self._pending = {
            "event": RECORD_EVENT,
            "time": transferred,
            **self._ids(),
            "generation": g,
            "failed_ranks": plan["failed_ranks"],
            "agreed_step": plan["agreed_step"],
            "interrupted_step": plan["agreed_step"] + 1,
            # from memory: the interrupted step only (begun by the survivors, completed by none, run again); from
            # storage: every step since the commit restored
            "steps_redone": plan["agreed_step"] + 1 - self.step,
            "resumed_step": self.step,
            "state_from": state_from,
            "survivor_steps": plan["survivor_steps"],
            "survivor_errors": plan.get("survivor_errors"),
            "source_rank": plan["source_rank"],
            "replaced": plan["replaced"],
            "world_size": self.world_size,
            "elastic": elastic,
            "spares_left": self.config.spares - len(self.spares_used),
            "failed_at": failed_at,
            "fallback": None,
            "phases_s": {
                "detect": times["detected_at"] - failed_at if failed_at is not None and error is not None else None,
                "abort": times["aborted_at"] - times["detected_at"],
                "agree": times["agreed_at"] - times["aborted_at"],
                "reform": formed - times["agreed_at"],
                "transfer": transferred - formed,
            },
            "_t_transferred": transferred,
        }
        return Recovered(step=self.step, rank=self.rank, generation=g, world_size=self.world_size, plan=dict(plan))

    # ---------------------------------------------------------------------------------- records
    def _ids(self) -> tp.Dict[str, tp.Any]:
        return {"job_id": self.job_id, "restart_count": self.restart_count, "rank": self.rank}

    def _append(self, record: tp.Mapping[str, tp.Any]) -> None:
        if self.run_dir is not None:
            Ledger(self.run_dir).append(record)

    def _fallback(
        self, error: BaseException, reason: str, *, plan: tp.Optional[tp.Mapping[str, tp.Any]] = None
    ) -> InJobRecoveryFallback:
        """The fallback error (raise it ``from error``: done here through ``__cause__``), its line printed once."""
        line = (
            f"hpctrain: in-job recovery: rank {self.rank}: falling back to the restart from the last commit: {reason}"
        )
        print(line, file=sys.stderr, flush=True)
        self._heartbeat.stop()
        exc = InJobRecoveryFallback(line.split(": ", 2)[-1])
        exc.__cause__ = error
        return exc
