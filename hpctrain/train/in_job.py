"""In-job recovery in the Trainer (``TrainConfig.recovery``): the loop of :mod:`hpctrain.runtime.recovery`, wired.

What the Trainer does with it, on every rank (docs/preemption.md, "In-job recovery"):

* **start**: the Runner's process group (its rendezvous store lives in rank 0, which may be the rank that dies)
  is left and generation 0 is formed on the recovery store (``HPCTRAIN_RECOVERY_STORE=host:port``, served by
  something that outlives every rank: the batch script's process); the stop agreement's gloo group is formed
  anew on it (``StopAgreement.rejoin``), so its sockets are half-closed with the generation's on a failure;
* **every step**: ``check()`` between the backward and the optimizer step (NCCL reports a dead peer there),
  ``completed(step)`` after it (the boundary snapshot of loader position, RNG and buffers: small, in memory);
* **a peer failure** anywhere in the step loop (the step, the stop poll, a periodic save, the interval's
  collective, an evaluation): ``recover()``; then DDP is wrapped anew on the new generation's group, the
  Checkpointer is opened anew (its agreement group belonged to the broken generation; an in-flight async save
  of it is dropped in the background, uncommitted unless it was past its agreement), the loader iterates
  again from the received position and the loop continues at the agreed step + 1;
* **a warm spare** (``HPCTRAIN_RECOVERY_SPARE=<i>``): the same entry and Trainer; ``fit()`` builds the model,
  optimizer, scheduler and scaler, then stands by; given a rank it opens that rank's loader shard, joins the new
  generation, receives the state, and goes on as that rank. Never needed: ``fit()`` returns without a step.

* **no spare left** and ``RecoveryConfig.shrink``: the survivors go on at the smaller world (renumbered; the
  plan's author first asks :meth:`InJob._can_shrink`: H5 data whose global batch the smaller world divides). Each
  rebuilds its loader shard at its new rank and world size (the loader's own split, as a resume on that many
  ranks does) before the state comes; then the loop's recorder, ledger writer and evaluator are told the new
  rank and world (:meth:`InJob.resized`). The global batch, its sample order and the gradient stay the full
  world's (up to the float sums' order: :mod:`hpctrain.runtime.shrink`).

Anything the path cannot handle falls back with one line (:class:`~hpctrain.errors.InJobRecoveryFallback`, a peer
failure to the Runner): no spare left (without shrink, or a smaller world that cannot take the run), a second
failure, a failure outside the step loop (restore, the final save).

* **sharded state** (``parallel.mode`` fsdp/hsdp, checkpointing on): no survivor holds the dead rank's shards, so
  the state comes from storage, not memory (:class:`~hpctrain.runtime.state_transfer.StoredState`): on the new
  generation's group every rank builds the sharded model anew (a new mesh; the optimizer, scheduler, scaler with
  it) and restores the newest commit through the Checkpointer (the node-local tier, the dead rank's shards from
  their partner copies, else the global tier), the loader's position with it; the steps since that commit are
  redone. A warm spare of such a run builds its model only then (it has no group to shard it over before). No
  smaller world: the restore would need the run's own sharding at that size (the next attempt is full size).
"""

from __future__ import annotations

import os
import sys
import threading
import typing as tp

import torch

from hpctrain.errors import UsageError
from hpctrain.runtime.recovery import InJobRecovery, Recovered
from hpctrain.runtime.recovery_config import SPARE_ENV, SPARES_ENV, STORE_ENV, spare_from_environ, took_rank
from hpctrain.runtime.state_transfer import ReplicatedState, StoredState

__all__ = ["InJob", "STORE_ENV", "SPARE_ENV", "SPARES_ENV", "spare_index", "SHARDED_MODES"]

SHARDED_MODES = ("fsdp", "hsdp")
"""``TrainConfig.parallel.mode`` values whose state no survivor holds whole: recovered from storage."""


def _line(text: str) -> None:
    print(f"hpctrain.train: in-job recovery {text}", file=sys.stderr, flush=True)


def spare_index(ctx: tp.Any = None) -> tp.Optional[int]:
    """This process's warm-spare index (``ctx.recovery_spare``, else ``HPCTRAIN_RECOVERY_SPARE``); None on a rank."""
    value = getattr(ctx, "recovery_spare", None)
    return int(value) if value is not None else spare_from_environ()


def _store_address() -> tp.Optional[tp.Tuple[str, int]]:
    value = os.environ.get(STORE_ENV, "").strip()
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"{STORE_ENV}={value!r} must be host:port")
    return host.strip("[]"), int(port)


class InJob:
    """The Trainer's side of in-job recovery for one ``fit``; :meth:`open` decides whether there is one."""

    def __init__(self, trainer: tp.Any, config: tp.Any, host: str, port: int, spare: tp.Optional[int]) -> None:
        ctx = trainer.ctx
        self.ctx, self.spare, self.device, self.trainer = ctx, spare, trainer.device, trainer
        self.sharded = trainer.config.parallel.mode in SHARDED_MODES
        """The state comes back from storage on every rank (StoredState), not from a survivor's memory."""
        self._tier = "none"
        """Where the last reload of sharded state came from (``hpctrain.ckpt.RESTORE_TIERS``, or none)."""
        self._built: tp.Any = None
        backend = getattr(ctx, "backend", None) or ("nccl" if trainer.device.type == "cuda" else "gloo")
        who = {"spare": spare} if spare is not None else {"rank": trainer.rank}
        self.rec = InJobRecovery(
            config,
            host=host,
            port=port,
            world_size=trainer.world_size,
            state=None,
            backend=backend,
            device=trainer.device,
            run_dir=trainer.run_dir,
            job_id=getattr(ctx, "job_id", None),
            restart_count=int(getattr(ctx, "restart_count", 0) or 0),
            on_group=self._on_group,
            can_shrink=self._can_shrink,
            on_world=self._on_world,
            **who,
        )

    @classmethod
    def open(cls, trainer: tp.Any) -> tp.Optional["InJob"]:
        """None when recovery is off or cannot work here (one line says why, on rank 0 or a spare). On a rank,
        generation 0 is formed before returning (the build wraps DDP on it)."""
        cfg, spare = trainer.config.recovery, spare_index(trainer.ctx)
        speaks = spare is not None or trainer.rank == 0
        if cfg is None or not cfg.enabled:
            if spare is not None:
                _line(f"off (TrainConfig.recovery is {'None' if cfg is None else 'disabled'}): spare {spare} idle")
            return None
        mode = trainer.config.parallel.mode
        if mode in SHARDED_MODES and not trainer.config.checkpoint.enabled:
            if speaks:
                _line(
                    f"off: TrainConfig.parallel.mode={mode!r} shards the state, which no survivor holds whole, and "
                    "checkpointing is off: there is no commit to recover it from"
                )
            return None
        if mode not in ("ddp", *SHARDED_MODES):
            if speaks:
                _line(f"off: TrainConfig.parallel.mode={mode!r} has no recovery in the job")
            return None
        if trainer.world_size < 2:
            if speaks:
                _line(f"off: a world of {trainer.world_size} rank has no survivor to recover from")
            return None
        address = _store_address()
        if address is None:
            if speaks:
                _line(f"off: no recovery store ({STORE_ENV} unset; the launcher serves it); a failure restarts "
                      "from the last commit")  # fmt: skip
            return None
        if os.environ.get(SPARES_ENV, "").strip():
            import dataclasses

            cfg = dataclasses.replace(cfg, spares=int(os.environ[SPARES_ENV]))
        job = cls(trainer, cfg, address[0], address[1], spare)
        if spare is None:
            import torch.distributed as dist

            from hpctrain.runtime import process_group

            if dist.is_available() and dist.is_initialized():
                process_group.destroy_process_group(synchronize=True)  # the Runner's: its store is rank 0's
            job.rec.connect()
        return job

    def _on_group(self, generation: int) -> None:
        stop = getattr(self.ctx, "stop", None)
        if stop is not None and hasattr(stop, "rejoin"):
            stop.rejoin()  # the stop agreement's group on this generation (half-closed with it on a failure)

    def _can_shrink(self, world_size: int) -> tp.Optional[str]:
        """Why this run cannot go on at ``world_size`` ranks (RecoveryConfig.shrink), or None."""
        t = self.trainer
        if self.sharded:
            return (f"TrainConfig.parallel.mode={t.config.parallel.mode!r}: the sharded state is recovered at the "
                    "run's own world size only")  # fmt: skip
        if callable(t.data):
            return "Trainer(data=...) is a data factory, which cannot be split over fewer ranks (H5DataConfig can)"
        for name, cfg in (("data", t.data), ("eval_data", getattr(t, "eval_data", None))):
            batch = getattr(cfg, "global_batch_size", None)
            if isinstance(batch, int) and batch % world_size:
                return f"the {name}'s H5DataConfig.global_batch_size={batch} is not divisible by {world_size}"
        return None

    def _on_world(self, rank: int, world_size: int) -> None:
        """Before joining the smaller world: this process's new rank, and its loader shard at that size."""
        t, b = self.trainer, self._built
        t.rank, t.world_size = rank, world_size
        took_rank(rank, world_size)  # the Runner ends this process as its new rank
        if b is not None and b.loader is not None and not callable(t.data):
            old, b.loader = b.loader, t._build_loader(t.data)  # the position comes with the state
            self.rec.state.loader = b.loader  # type: ignore[union-attr]
            threading.Thread(target=old.close, name="hpctrain-close-loader", daemon=True).start()

    def resized(self, rec: tp.Any, records: tp.Any, evaluator: tp.Any, step: int) -> None:
        """After a recovery at a smaller world (continuing after ``step``), in the loop: the metrics recorder, the
        ledger writer, the display, the live TensorBoard writer and the evaluator at this process's new rank and
        world size (rank 0 writes the metrics from here on)."""
        from hpctrain.rundir import RunDir
        from hpctrain.train.tensorboard import LiveWriter

        t = self.trainer
        rec.rank, rec.world_size = t.rank, t.world_size
        if t.rank == 0 and rec.path is None:  # old rank 1, now rank 0: it takes over what the dead rank 0 wrote
            rec.path = RunDir(t.run_dir).metrics
            records.became_rank_0()  # the attempt's end is this process's to write now
            t.display.enabled = t.config.metrics.display
            tb_dir = t.config.tensorboard_dir(t.run_dir)
            if tb_dir is not None and rec.tensorboard is None:
                rec.tensorboard = LiveWriter(tb_dir, start_step=step)  # the same run; steps after `step` purged
        if evaluator is not None:
            evaluator.close()  # its loader is rebuilt at the new rank and size on the next evaluation
            evaluator.world_size = t.world_size

    # ------------------------------------------------------------------------------------ the rank's loop
    def attach(self, b: tp.Any) -> None:
        """What a survivor sends and a replacement receives: the built objects of this ``fit``."""
        self._built = b
        if self.sharded:
            self.rec.state = StoredState(self._reload)
            return
        self.rec.state = ReplicatedState(
            module=b.module,
            optimizer=b.optimizer,
            scheduler=b.scheduler,
            scaler=b.scaler,
            loader=b.loader,
            device=self.device,
        )

    def start(self, step: int) -> None:
        self.rec.start(step)

    def check(self) -> None:
        self.rec.check()

    def completed(self, step: int) -> None:
        self.rec.completed(step)

    def recover(self, error: BaseException, trainer: tp.Any, b: tp.Any) -> int:
        """A survivor after ``error``: the agreed step to continue after (raises what it cannot recover from)."""
        got = self.rec.recover(error)
        self._rejoin(trainer, b, got)
        return got.step

    # ------------------------------------------------------------------------------------ the warm spare
    def stand_by(self, trainer: tp.Any, b: tp.Any) -> tp.Optional[Recovered]:
        """Wait for a rank; None when the job ended without needing this spare."""

        def take(rank: int) -> None:
            took_rank(rank)  # the Runner ends this process as that rank (rank 0 records the attempt's end)
            trainer.rank = rank
            if not callable(trainer.data):
                b.loader = trainer._build_loader(trainer.data)  # this rank's shard, the position comes with the state
            self.attach(b)

        _line(f"spare {self.spare}: standing by")
        got = self.rec.stand_by(on_rank=take)
        if got is None:
            _line(f"spare {self.spare}: released, not needed")
            return None
        self._rejoin(trainer, b, got)
        return got

    # ------------------------------------------------------------------------------------ both
    def _reload(self) -> tp.Tuple[int, str]:
        """Sharded state, on every rank of the new generation in the same order (collectives): the model built and
        sharded anew on this generation's group, the newest commit restored into it; ``(step, tier)``."""
        t, b = self.trainer, self._built
        if t.rank == 0 and t.identity is None:  # a spare in rank 0's place: the tiers are keyed by rank 0's identity
            from hpctrain.run import run_identity

            value = run_identity(t.run_dir)[0]
            t.identity = {"identity": value} if value else None
        fresh = t._build(with_loader=False)  # seeded as at a start: a restore then makes it the commit's state
        b.model, b.module, b.optimizer, b.scheduler = fresh.model, fresh.module, fresh.optimizer, fresh.scheduler
        b.scaler, b.autocast, b.mesh = fresh.scaler, fresh.autocast, fresh.mesh
        self._drop_checkpointer(b)
        got = t._restore(b)  # opens the Checkpointer on this generation's group; the loader's position with it
        if got is None:  # nothing committed yet: the run starts over, from the seeded build
            if b.loader is not None:
                b.loader.load_state_dict({})
            self._tier = "none"
            return 0, self._tier
        self._tier = str(getattr(got, "tier", "global"))
        return int(got.step), self._tier

    def rewound(self, rec: tp.Any, step: int) -> None:
        """After a recovery from storage went back to ``step`` (before the last interval's start): the metrics
        interval restarts there, and rank 0's live TensorBoard run drops the steps after it (they are redone)."""
        from hpctrain.train.tensorboard import LiveWriter

        rec.start_interval(step)
        if rec.tensorboard is not None:
            rec.tensorboard.close()
            rec.tensorboard = LiveWriter(self.trainer.config.tensorboard_dir(self.trainer.run_dir), start_step=step)

    @staticmethod
    def _drop_checkpointer(b: tp.Any) -> None:
        old, b.ckpt = b.ckpt, None
        if old is not None:
            threading.Thread(target=_drop, args=(old,), name="hpctrain-drop-checkpointer", daemon=True).start()

    def _rejoin(self, trainer: tp.Any, b: tp.Any, got: Recovered) -> None:
        """On every rank of the new generation, in the same order (collectives): DDP anew, the Checkpointer anew
        (sharded state: both done by :meth:`_reload`)."""
        if not self.sharded:
            from hpctrain.runtime.process_group import wrap_ddp

            b.model = wrap_ddp(b.module, self.device)
            self._drop_checkpointer(b)
            trainer._open_checkpointer(b)
        plan = got.plan
        if self.sharded:
            if trainer.rank == 0 or self.spare is not None:
                where = f"the {self._tier} tier" if self._tier != "none" else "no commit (from the start)"
                _line(f"generation {got.generation}: failed rank(s) {plan['failed_ranks']} replaced; the sharded "
                      f"state reloaded from {where}: continuing after step {got.step}")  # fmt: skip
            return
        source = int(plan["source_rank"])
        elastic = plan.get("elastic")
        if elastic and trainer.rank == source:
            batch = getattr(trainer.data, "global_batch_size", None)
            split = f", the global batch of {batch} split {batch // got.world_size} a rank" if batch else ""
            _line(f"generation {got.generation}: failed rank(s) {elastic['dropped']} dropped, no spare left: "
                  f"continuing at a world of {got.world_size} (was {elastic['world_size_was']}) after step "
                  f"{got.step}{split}")  # fmt: skip
        elif self.spare is not None:
            _line(f"generation {got.generation}: spare {self.spare} took rank {got.rank}, continuing after step "
                  f"{got.step} with the state of rank {source}")  # fmt: skip
        elif trainer.rank == source:
            took = ", ".join(f"rank {x['rank']} by spare {x['spare']}" for x in plan["replaced"])
            _line(f"generation {got.generation}: failed rank(s) {plan['failed_ranks']} replaced ({took}), "
                  f"continuing after step {got.step} with this rank's state")  # fmt: skip

    def finish(self) -> None:
        """End of ``fit`` on every rank: the stop agreement's last poll settled, idle spares released, the group
        left. Never raises (the run's own end is what counts)."""
        stop = getattr(self.ctx, "stop", None)
        try:
            if stop is not None and hasattr(stop, "settle") and torch.distributed.is_initialized():
                stop.settle()  # it forgets the poll before waiting: a failure leaves nothing pending
        except Exception:  # noqa: BLE001 - a peer already gone: nothing pending is worth waiting for
            pass
        try:
            self.rec.finish()
        except Exception as exc:  # noqa: BLE001
            _line(f"finish: {type(exc).__name__}: {exc}")


def _drop(ckpt: tp.Any) -> None:
    """A broken generation's Checkpointer: its in-flight save abandoned and its threads stopped, off the loop's
    path (its agreement may wait on the dead rank until ``agreement_timeout_s``)."""
    try:
        ckpt.abandon()
        ckpt.close()
    except Exception:  # noqa: BLE001 - its save fails with the generation: uncommitted, as abandoned
        pass
