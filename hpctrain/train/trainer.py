"""``Trainer``: the wiring every DDP job repeats, as a library.

Restore from the newest committed checkpoint (model, optimizer, scheduler, grad scaler, RNG, loader
position) -> train with gradient accumulation, clipping and AMP -> evaluate -> checkpoint -> close the
loader and the checkpointer, with every step measured (:mod:`hpctrain.train.metrics`) and each start
and end recorded in the run's ledger.

This module holds the build, the restore and the loop. The policies the loop consults live beside it:
:mod:`hpctrain.train.stopping` (which stop hook is polled where; an in-flight save at a stop),
:mod:`hpctrain.train.saving` (periodic and final saves), :mod:`hpctrain.train.evaluation` (the eval pass and
its record), :mod:`hpctrain.train.ledger_records` (the attempt's ``start`` and ``end`` records),
:mod:`hpctrain.train.ddp_warmup` (the pass that keeps a resumed run bit-exact),
:mod:`hpctrain.train.in_job` (in-job recovery, ``TrainConfig.recovery``: a survivor's and a warm spare's side) and
:mod:`hpctrain.train.arguments` (what ``Trainer(...)`` refuses, with one line naming the argument).
"""

from __future__ import annotations

import contextlib
import random
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

import torch

from hpctrain.errors import UsageError
from hpctrain.rundir import RunDir
from hpctrain.runtime import startup, watchdog
from hpctrain.train.arguments import check_arguments
from hpctrain.train.config import TrainConfig
from hpctrain.train.ddp_warmup import warm_up_buckets
from hpctrain.train.display import IntervalDisplay
from hpctrain.train.evaluation import EvalResult, Evaluator
from hpctrain.train.in_job import InJob, spare_index
from hpctrain.train.ledger_records import AttemptProgress, AttemptRecords
from hpctrain.train.memory import state_bytes
from hpctrain.train.metrics import MetricsRecorder, count_flops
from hpctrain.train.parallel import build_model, compile_cache_dir, grad_sync, local_world_size, use_compile_cache
from hpctrain.train.provenance import record_training_identity
from hpctrain.train.saving import Saver
from hpctrain.train.stopping import Stopping, StopSignal
from hpctrain.train.tensorboard import LiveWriter

__all__ = ["Trainer", "FitResult", "StopSignal"]  # StopSignal: defined in stopping, importable from here too

Batch = tp.Any


@dataclass
class FitResult:
    step: int
    """The step training ended at."""
    start_step: int
    """The step it started from (the restored checkpoint's, else 0)."""
    resumed: tp.Optional[tp.Dict[str, tp.Any]]
    """``{"step", "saved_world_size", "path"}`` of the restored checkpoint, or None on a fresh start."""
    total_steps: int
    final_loss: tp.Optional[float]
    """This rank's loss on the last step (None when no step ran)."""
    eval_loss: tp.Optional[float]
    """The last evaluation's mean loss over all ranks (None without eval data)."""
    stopped: bool
    """True when a stop request ended training before ``total_steps``."""
    seconds: float
    """Wall time of ``fit`` on this rank."""
    model: tp.Any
    """The trained module (not the DDP wrapper)."""


def _batch_len(batch: Batch) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
        return _batch_len(batch)
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    return 1


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy ships with h5py
        pass


@dataclass
class _Built:
    """What one ``fit`` builds, shared by the loop, its saves and the evaluation."""

    model: torch.nn.Module
    """What the steps run: the DDP wrapper under ddp with a process group, else :attr:`module`."""
    module: torch.nn.Module
    """The module (FSDP2-sharded under fsdp/hsdp): what is saved, restored and evaluated."""
    optimizer: torch.optim.Optimizer
    scheduler: tp.Any
    scaler: tp.Any
    loader: tp.Any
    """This rank's H5Loader; None with a data factory."""
    autocast: tp.Any
    ckpt: tp.Any = None
    """The Checkpointer, when checkpointing is on."""
    ckpt_dir: tp.Optional[Path] = None
    mesh: tp.Any = None
    """The DeviceMesh of fsdp/hsdp or given to ``parallelize`` (None otherwise)."""


class Trainer:
    """Train ``model`` on ``data`` as ``config`` says; call :meth:`fit` on every rank.

    ``model``: a factory ``() -> nn.Module`` (called after seeding, so every rank builds the same weights).
    ``optimizer``: ``(parameters) -> Optimizer``. ``scheduler``: optional ``(optimizer) -> LR scheduler``,
    stepped after every optimizer step. ``loss_fn``: ``(model, batch) -> scalar loss tensor``.
    ``data``: an :class:`~hpctrain.data.H5DataConfig` (read with :class:`~hpctrain.data.H5Loader`, its
    position checkpointed) or a factory ``(start_step) -> iterable of batches`` that resumes by itself.
    ``eval_data``: an H5DataConfig evaluated with ``loss_fn`` under ``torch.no_grad`` (``tail="exact"``
    and ``shuffle=False`` evaluate the same samples each time).
    ``should_stop``: ``(step) -> bool`` or ``() -> bool``; default ``ctx.should_stop`` when the context has
    one. The context's hook is collective: it is polled after every step, before the first step and at
    every evaluation batch, and all ranks stop at the same step, which is then saved (finishing or
    abandoning an in-flight async save by the time left) before ``fit`` returns with ``stopped=True``.
    Another hook is polled at each log interval and agreed in that interval's collective.
    """

    def __init__(
        self,
        ctx: tp.Any,
        *,
        config: TrainConfig,
        model: tp.Callable[[], torch.nn.Module],
        optimizer: tp.Callable[[tp.Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
        loss_fn: tp.Callable[[torch.nn.Module, Batch], torch.Tensor],
        data: tp.Any,
        scheduler: tp.Optional[tp.Callable[[torch.optim.Optimizer], tp.Any]] = None,
        eval_data: tp.Any = None,
        should_stop: tp.Optional[tp.Callable[[], bool]] = None,
    ) -> None:
        device = torch.device(ctx.device)
        check_arguments(
            config=config,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            loss_fn=loss_fn,
            data=data,
            eval_data=eval_data,
            device=device,
        )
        self.ctx, self.config, self.device = ctx, config, device
        self.model_factory, self.optimizer_factory, self.scheduler_factory = model, optimizer, scheduler
        self.loss_fn, self.data, self.eval_data = loss_fn, data, eval_data
        self.stopping = Stopping(ctx, should_stop)
        self.run_dir = Path(ctx.run_dir)
        self.rank, self.world_size = int(ctx.rank), int(ctx.world_size)
        self.display = IntervalDisplay(enabled=config.metrics.display and self.rank == 0)
        self.identity: tp.Optional[tp.Dict[str, tp.Any]] = None
        """This attempt's identity fields (rank 0, once ``fit`` recorded them; docs/bundle.md)."""
        self.in_job: tp.Optional[InJob] = None
        """In-job recovery of this ``fit`` (``TrainConfig.recovery``), None when off."""

    # ------------------------------------------------------------------------------------ fit
    def fit(self) -> FitResult:
        t_fit = time.perf_counter()
        startup.mark("entry")  # the start-up profile (hpctrain.runtime.startup): the entry's own code ends here
        progress = AttemptProgress()
        self.in_job = InJob.open(self)  # a rank: generation 0 formed on the recovery store (DDP wraps it)
        spare = self.in_job is not None and self.in_job.spare is not None
        if spare_index(self.ctx) is not None and not spare:  # a warm spare of a run that cannot use it
            return FitResult(0, 0, None, 0, None, None, False, time.perf_counter() - t_fit, None)
        records = AttemptRecords(self.ctx, self.run_dir, rank=self.rank, world_size=self.world_size, config=self.config)
        # a warm spare of sharded state has no group to shard its model over yet: built when it joins (in_job)
        deferred = spare and self.in_job is not None and self.in_job.sharded
        built = watchdog.during("startup", self._build, not spare, not deferred)
        joined = self.in_job.stand_by(self, built) if self.in_job is not None and spare else None
        if spare and joined is None:  # released at the end of a run that did not need this spare
            self.in_job.finish()  # type: ignore[union-attr]
            return FitResult(0, 0, None, 0, None, None, False, time.perf_counter() - t_fit, built.module)
        if joined is not None and self.rank == 0:  # a spare in rank 0's place (its loop opens metrics, TensorBoard)
            records.became_rank_0()  # the attempt's end is its to write
            self.display.enabled = self.config.metrics.display
        evaluator = (
            Evaluator(
                self.eval_data,
                loss_fn=self.loss_fn,
                limit=self.config.eval_batches,
                stopping=self.stopping,
                build_loader=self._build_loader,
                world_size=self.world_size,
                device=self.device,
            )
            if self.eval_data is not None
            else None
        )
        status, error = "failed", ""
        got: tp.Any = None
        try:
            total = self._total_steps(built.loader)
            if joined is not None:  # a warm spare that took a rank: the state came from a survivor's memory
                start, committed_at = joined.step, None
                progress.step = start
            else:
                self.identity = record_training_identity(
                    self.ctx, self.run_dir, self.config, self.data, self.eval_data, rank=self.rank
                )
                startup.mark("identity")
                got = watchdog.during("restore", self._restore, built)
                startup.mark("restore")
                start = got.step if got is not None else 0
                progress.step, progress.committed_step = start, (start or None)
                if got is not None and "local" in built.ckpt.tiers:  # the ledger names the tier it came from
                    progress.restored_tier = got.tier
                    progress.restored_global_step = got.global_step
                committed_at = got.committed_at if got is not None else None
                if self.in_job is not None:
                    self.in_job.attach(built)
                    self.in_job.start(start)
            result = self._train(
                built, start, total, committed_at, progress, records, evaluator, joined=joined is not None
            )
            status = "stopped" if result.stopped else "completed"
            result.seconds = time.perf_counter() - t_fit
            if got is not None:
                result.resumed = {"step": got.step, "saved_world_size": got.saved_world_size, "path": str(got.path)}
            return result
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.display.close()
            if built.loader is not None:
                built.loader.close()
            if evaluator is not None:
                evaluator.close()
            if built.ckpt is not None:
                if status == "failed":
                    built.ckpt.abandon()  # an in-flight save of a failing run must not block the exit
                built.ckpt.close()
            records.end(status=status, progress=progress, error=error)
            if self.in_job is not None:
                self.in_job.finish()  # idle spares released, the recovery's group left
            watchdog.leave()  # what the entry does after fit() reports no progress: not watched as a hang

    def _build(self, with_loader: bool = True, with_model: bool = True) -> _Built:
        """Seed, then build the model (the same weights on every rank) and spread it over the ranks as
        ``TrainConfig.parallel`` says (:mod:`hpctrain.train.parallel`), the optimizer over this rank's
        parameters (its shards under fsdp), scheduler and (fp16) grad scaler, and this rank's loader.
        ``with_model=False``: none of these yet (a warm spare of sharded state; its fields are None)."""
        cfg = self.config
        if not with_model:
            return _Built(None, None, None, None, None, None, contextlib.nullcontext())  # type: ignore[arg-type]
        _seed_everything(cfg.seed)
        cache = use_compile_cache(compile_cache_dir(cfg.parallel, self.run_dir))
        if cache is not None and self.rank == 0:  # a requeue on other nodes finds what the last attempt compiled
            held = f"warm: {cache[1]}{'+' if cache[1] >= 1000 else ''} files" if cache[1] else "cold: empty"
            print(f"hpctrain: torch.compile cache {cache[0]} ({held})", flush=True)
        model, module, mesh = build_model(
            self.model_factory,
            cfg.parallel,
            device=self.device,
            world_size=self.world_size,
            per_node=local_world_size(self.ctx, self.world_size),
        )
        optimizer = self.optimizer_factory(module.parameters())
        scheduler = self.scheduler_factory(optimizer) if self.scheduler_factory else None
        scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16)
            if cfg.amp != "off"
            else contextlib.nullcontext()
        )
        startup.mark("build")
        # a warm spare opens its loader when it learns its rank (hpctrain.train.in_job)
        loader = self._build_loader(self.data) if with_loader and not callable(self.data) else None
        startup.mark("loader")
        return _Built(model, module, optimizer, scheduler, scaler, loader, autocast, mesh=mesh)

    def _build_loader(self, data_cfg: tp.Any) -> tp.Any:
        from hpctrain.data import H5Loader

        return H5Loader(data_cfg, rank=self.rank, world_size=self.world_size, device=self.device)

    def _total_steps(self, loader: tp.Any) -> int:
        cfg = self.config
        if cfg.steps is not None:
            return cfg.steps
        total = cfg.epochs * len(loader) // cfg.grad_accum
        if total < 1:
            raise UsageError(
                f"TrainConfig.epochs={cfg.epochs} gives no optimizer step: {len(loader)} batches per epoch "
                f"and grad_accum={cfg.grad_accum}"
            )
        return total

    def _restore(self, b: _Built) -> tp.Any:
        """Open the checkpointer (when checkpointing is on) and restore the newest committed step into the
        built objects and the loader; the RestoreResult, or None on a fresh start."""
        pol = self.config.checkpoint
        if not pol.enabled:
            return None
        ck_config = self._open_checkpointer(b)
        if not pol.resume:
            return None
        got = b.ckpt.restore(
            model=b.module, optimizer=b.optimizer, scheduler=b.scheduler, scaler=b.scaler, map_location=self.device
        )
        if got is not None:
            if b.loader is not None:
                self._restore_loader(b.loader, (got.data_state or {}).get("loader", {}))
            tier = getattr(got, "tier", "global")
            newer = got.step - (got.global_step or 0)
            saved = f", {newer} steps newer than the newest global commit" if tier != "global" else ""
            where = f" from the {tier} tier{saved}" if ck_config.local_every_steps else ""
            self.display.note(
                f"hpctrain.train: resumed from step {got.step} (saved by {got.saved_world_size} ranks)"
                f"{where}: {got.path}"
            )
        return got

    def _open_checkpointer(self, b: _Built) -> tp.Any:
        """``b.ckpt`` (and ``b.ckpt_dir``) when checkpointing is on (a collective: its agreement group); its
        CheckpointConfig. Also after an in-job recovery, on the new generation's group."""
        pol = self.config.checkpoint
        if not pol.enabled:
            return None
        from hpctrain.ckpt import Checkpointer
        from hpctrain.ckpt.tiers import TieredCheckpointer

        ck_config = pol.checkpointer_config(RunDir(self.run_dir).checkpoints)  # dir None: the run's default
        b.ckpt_dir = Path(ck_config.dir)
        b.ckpt = (TieredCheckpointer if ck_config.local_every_steps else Checkpointer)(
            ck_config,
            run_id=str(self.ctx.job_id or ""),
            identity=(self.identity or {}).get("identity") or "",
            every_steps=pol.every_steps,
        )
        return ck_config

    def _restore_loader(self, loader: tp.Any, state: tp.Mapping[str, tp.Any]) -> None:
        """The loader's position from the checkpoint; a changed dataset it cannot resume in (another sample
        count, batch or seed) stops the run, unless the change was accepted: then the data order starts
        afresh (the model and optimizer keep their restored state), and the log says so."""
        try:
            loader.load_state_dict(state)
        except UsageError as exc:
            if not self.config.accept_data_change:
                raise
            self.display.note(f"hpctrain.train: accepted data change: the data order starts afresh ({exc})")
            loader.load_state_dict({})

    # ------------------------------------------------------------------------------- the loop
    def _train(
        self,
        b: _Built,
        start: int,
        total: int,
        committed_at: tp.Optional[float],
        progress: AttemptProgress,
        records: AttemptRecords,
        evaluator: tp.Optional[Evaluator],
        *,
        joined: bool = False,
    ) -> FitResult:
        """The loop. ``joined``: a warm spare that took a failed rank's place, entering where the survivors
        continue after their recovery (no start record, no first poll: they do not make those collectives)."""
        cfg, pol, ctx = self.config, self.config.checkpoint, self.ctx
        tb_dir = cfg.tensorboard_dir(self.run_dir) if self.rank == 0 else None
        rec = MetricsRecorder(
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            run_dir=self.run_dir,
            total_steps=total,
            log_every=cfg.log_every,
            enabled=cfg.metrics.enabled,
            flops_per_sample=cfg.metrics.flops_per_sample,
            peak_flops_per_device=cfg.metrics.peak_flops_per_device,
            static={
                "job_id": ctx.job_id,
                "restart_count": ctx.restart_count,
                "identity": (self.identity or {}).get("identity"),
            },
            # rank 0: the same TensorBoard run across attempts, the steps after `start` purged (redone here)
            tensorboard=LiveWriter(tb_dir, start_step=start) if tb_dir is not None else None,
        )
        try:
            rec.attach_ddp(b.model)
            watchdog.follow_timer(rec.timer)  # the timer's marks are the hang watchdog's progress within a step
            batches = self._batches(b.loader, start)
            state = {"model": b.module, "optimizer": b.optimizer, "scheduler": b.scheduler, "scaler": b.scaler}
            saver = Saver(b.ckpt, pol, state=state, loader=b.loader, progress=progress)
            step, loss, eval_loss = start, None, None
            startup.mark("metrics")
            if not joined:
                records.start(
                    start_step=start,
                    total=total,
                    ckpt_dir=b.ckpt_dir,
                    committed_at=committed_at,
                    identity=self.identity,
                    progress=progress,
                )
            rec.start_interval(start)
            # a stop that came during start-up (restore, loader warm-up) is acted on before the first step
            stopped = self.stopping.poll(step) if not joined else False
            first_pending = not joined
            if not stopped and step < total:
                batches = warm_up_buckets(
                    b.model,
                    b.module,
                    batches,
                    loss_fn=self.loss_fn,
                    autocast=b.autocast,
                    device=self.device,
                    world_size=self.world_size,
                )
            t_steps = time.perf_counter()
            while step < total and not stopped:
                try:
                    rec.timer.start()
                    loss, samples = self._step(b, batches, rec, step + 1, total)
                    step = progress.step = step + 1
                    if self.in_job is not None:
                        self.in_job.completed(step)  # the boundary snapshot a survivor would send
                    if first_pending:
                        first_pending = False
                        records.first_step()  # every rank: the start-up profile is complete (a collective)
                    if self.stopping.poll(step):  # every step, every rank: all stop at this one
                        rec.step_done(loss, samples=samples)
                        stopped = True
                        break
                    if watchdog.during("save", saver.periodic, step, total):
                        rec.timer.mark("checkpoint")
                    rec.step_done(loss, samples=samples)
                    if rec.due(step):
                        lr = b.optimizer.param_groups[0].get("lr")  # a float, or a tensor: the recorder makes it plain
                        extra = {"last_checkpoint_step": saver.last_step, "lr": lr}
                        if b.loader is not None:
                            extra["epoch"] = b.loader.epoch
                            if hasattr(
                                b.loader, "interval_metrics"
                            ):  # this rank's reads (the capacity planner's input)
                                extra["input"] = b.loader.interval_metrics()
                        # rank 0's clock decides a time-based save, the interval's collective carries it to all
                        report = rec.flush(
                            step, stop=self.stopping.local(step), save=saver.minutes_passed(), extra=extra
                        )
                        self.display.show(report.record)
                        watchdog.interval(report.record)  # rank 0: stragglers (hpctrain.runtime.stragglers)
                        saver.requested = saver.requested or report.save
                        if report.stop and step < total:
                            stopped = True
                            break
                    if evaluator is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < total:
                        ev = self._evaluate(evaluator, b, step, rec)
                        eval_loss = ev.loss if ev.loss is not None else eval_loss
                        if ev.interrupted or self.stopping.poll(step):  # agreed during the evaluation
                            stopped = True
                            break
                except Exception as exc:  # noqa: BLE001 - a peer failure: in-job recovery keeps this process, if on
                    if self.in_job is None:
                        raise
                    step = progress.step = self.in_job.recover(exc, self, b)  # raises what it cannot recover
                    saver.ckpt, saver.loader = b.ckpt, b.loader
                    # sharded state was rebuilt and restored from storage: new objects, and maybe older steps
                    saver.state.update(model=b.module, optimizer=b.optimizer, scheduler=b.scheduler, scaler=b.scaler)
                    if step < rec.last_step:
                        self.in_job.rewound(rec, step)
                    if rec.world_size != self.world_size:  # continued at a smaller world (RecoveryConfig.shrink)
                        self.in_job.resized(rec, records, evaluator, step)
                    batches = warm_up_buckets(
                        b.model,
                        b.module,
                        self._batches(b.loader, step),
                        loss_fn=self.loss_fn,
                        autocast=b.autocast,
                        device=self.device,
                        world_size=self.world_size,
                    )
            if step > start:
                progress.step_s = (time.perf_counter() - t_steps) / (step - start)
            if evaluator is not None and step > start and not stopped:
                ev = self._evaluate(evaluator, b, step, rec)
                eval_loss = ev.loss if ev.loss is not None else eval_loss
            if rec.tensorboard is not None:
                rec.tensorboard.flush()  # before the final (or the stop's) save: nothing written is lost to a kill
            watchdog.during(
                "save", saver.finish, step, start=start, stopped=stopped, stopping=self.stopping, note=self.display.note
            )
        finally:
            rec.close()
        final_loss = float(loss.item()) if loss is not None else None
        self.display.note(
            f"hpctrain.train: {'stopped' if stopped else 'done'} at step {step}/{total}"
            + (f", final loss {final_loss:.4f}" if final_loss is not None else "")
        )
        return FitResult(step, start, None, total, final_loss, eval_loss, stopped, 0.0, b.module)

    def _step(
        self, b: _Built, batches: tp.Iterator[Batch], rec: MetricsRecorder, step: int, total: int
    ) -> tp.Tuple[torch.Tensor, int]:
        """One optimizer step (``step``, counted from 1): ``grad_accum`` micro-batches, the gradient reduction
        (DDP's all-reduce, FSDP's reduce-scatter) on the last only, then clipping (the global norm: over
        DTensor gradients ``clip_grad_norm_`` reduces the shards' norms across the mesh), the optimizer and the
        scheduler. Returns (loss, samples on this rank)."""
        cfg, timer, accum = self.config, rec.timer, self.config.grad_accum
        loss_sum: tp.Optional[torch.Tensor] = None
        samples = 0
        for micro in range(accum):
            batch = self._next_batch(batches, step, total)
            timer.mark("data_wait")
            with grad_sync(b.model, micro == accum - 1):
                if cfg.metrics.enabled and rec.flops_per_sample is None:  # counted once, on the first micro-batch
                    out: tp.List[torch.Tensor] = []
                    flops = count_flops(lambda out=out, batch=batch: out.append(self._forward_backward(b, batch)))
                    n = b.loader.local_batch_size if b.loader is not None else _batch_len(batch)
                    rec.flops_per_sample = flops / max(n, 1)
                    micro_loss = out[0]
                else:
                    micro_loss = self._forward_backward(b, batch)
            timer.mark("forward_backward")
            loss_sum = micro_loss if loss_sum is None else loss_sum + micro_loss
            samples += b.loader.local_batch_size if b.loader is not None else _batch_len(batch)
        if self.in_job is not None:
            self.in_job.check()  # NCCL reports a dead peer here: never step on half-reduced gradients
        if cfg.grad_clip:
            if b.scaler is not None:
                b.scaler.unscale_(b.optimizer)
            torch.nn.utils.clip_grad_norm_(b.module.parameters(), cfg.grad_clip)
        if b.scaler is not None:
            b.scaler.step(b.optimizer)
            b.scaler.update()
        else:
            b.optimizer.step()
        b.optimizer.zero_grad(set_to_none=True)
        if rec.memory.state_bytes is None:  # the optimizer's state exists from its first step on
            rec.memory.state_bytes = state_bytes(b.module, b.optimizer)
        if b.scheduler is not None:
            b.scheduler.step()
        timer.mark("optimizer")
        assert loss_sum is not None
        return (loss_sum / accum if accum > 1 else loss_sum), samples

    def _forward_backward(self, b: _Built, batch: Batch) -> torch.Tensor:
        accum = self.config.grad_accum
        with b.autocast:
            loss = self.loss_fn(b.model, batch)
        scaled = loss / accum if accum > 1 else loss
        (b.scaler.scale(scaled) if b.scaler is not None else scaled).backward()
        return loss.detach()

    def _batches(self, loader: tp.Any, start: int) -> tp.Iterator[Batch]:
        if loader is None:
            got = self.data(start)
            try:
                return iter(got)
            except TypeError:
                raise UsageError(
                    f"Trainer(data=...): the data factory returned a {type(got).__name__}, not an iterable of batches"
                ) from None

        def epochs() -> tp.Iterator[Batch]:
            while True:  # the loader starts the next epoch by itself
                yield from loader

        return epochs()

    def _next_batch(self, batches: tp.Iterator[Batch], step: int, total: int) -> Batch:
        try:
            return next(batches)
        except StopIteration:  # only a factory's iterator ends (HDF5 data goes on to the next epoch)
            raise UsageError(
                f"Trainer(data=...): the data factory's iterator ended at step {step} of {total}; it must yield "
                f"{self.config.grad_accum} batch(es) a step up to the last step (or forever), or use H5DataConfig"
            ) from None

    def _evaluate(self, evaluator: Evaluator, b: _Built, step: int, rec: MetricsRecorder) -> EvalResult:
        result = watchdog.during("eval", evaluator.run, b.module, step, b.autocast)
        rec.write(Evaluator.record(step, result))
        self.display.note(Evaluator.line(step, result))
        return result
