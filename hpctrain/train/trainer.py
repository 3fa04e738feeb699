"""``Trainer``: the wiring every DDP job repeats, as a library.

Restore from the newest committed checkpoint (model, optimizer, scheduler, grad scaler, RNG, loader
position) -> train with gradient accumulation, clipping and AMP -> evaluate -> checkpoint -> close the
loader and the checkpointer, with every step measured (:mod:`hpctrain.train.metrics`) and each start
and end recorded in the run's ledger (:mod:`hpctrain.ledger`).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import os
import random
import sys
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.errors import UsageError
from hpctrain.ledger import Ledger, process_start_time
from hpctrain.rundir import RunDir, read_jsonl
from hpctrain.train.config import TrainConfig
from hpctrain.train.display import IntervalDisplay
from hpctrain.train.metrics import MetricsRecorder, count_flops

__all__ = ["Trainer", "FitResult", "StopSignal"]

Batch = tp.Any
DataFactory = tp.Callable[[int], tp.Iterable[Batch]]


class StopSignal:
    """A local stop request (``Trainer(should_stop=...)`` or your own loop).

    ``request()`` may be called from a signal handler or another thread. A hook like this one is local to
    its rank, so the Trainer agrees on it in the collective of each log interval (any rank's request stops
    all of them at the same step, up to ``log_every`` steps later), saves a checkpoint and returns. The
    Runner's ``ctx.should_stop`` is collective itself and is polled after every step instead.
    """

    def __init__(self) -> None:
        self._requested = False

    def request(self) -> None:
        self._requested = True

    def __call__(self, step: tp.Optional[int] = None) -> bool:
        return self._requested


def _stop_hook(fn: tp.Optional[tp.Callable[..., bool]]) -> tp.Optional[tp.Callable[[int], bool]]:
    """``fn(step)`` or ``fn()`` as ``hook(step)`` (``StopAgreement.should_stop`` takes the step). A hook
    marked ``collective`` (``RunContext.should_stop``) agrees across ranks by itself and is polled every
    step and in evaluation; any other is agreed at log intervals."""
    if fn is None:
        return None
    try:
        takes_step = any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            for p in inspect.signature(fn).parameters.values()
        )
    except (TypeError, ValueError):
        takes_step = False
    hook = (lambda step: bool(fn(step))) if takes_step else (lambda step: bool(fn()))
    hook.collective = bool(getattr(fn, "collective", False))  # type: ignore[attr-defined]
    return hook


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
        from hpctrain.data import H5DataConfig

        if not isinstance(config, TrainConfig):
            raise UsageError(f"Trainer(config=...) must be a TrainConfig, got {type(config).__name__}")
        if not (isinstance(data, H5DataConfig) or callable(data)):
            raise UsageError("Trainer(data=...) must be an H5DataConfig or a factory (start_step) -> iterable")
        if config.epochs is not None and not isinstance(data, H5DataConfig):
            raise UsageError("TrainConfig.epochs needs HDF5 data (an H5DataConfig); give TrainConfig.steps instead")
        if eval_data is not None and not isinstance(eval_data, H5DataConfig):
            raise UsageError("Trainer(eval_data=...) must be an H5DataConfig")
        device = torch.device(ctx.device)
        if config.amp != "off" and device.type != "cuda":
            raise UsageError(f"TrainConfig.amp={config.amp!r} needs a CUDA device; this rank runs on {device}")
        self.ctx, self.config, self.device = ctx, config, device
        self.model_factory, self.optimizer_factory, self.scheduler_factory = model, optimizer, scheduler
        self.loss_fn, self.data, self.eval_data = loss_fn, data, eval_data
        ctx_stop = getattr(ctx, "should_stop", None)
        self.should_stop = _stop_hook(should_stop or (ctx_stop if callable(ctx_stop) else None))
        self._collective_stop = bool(getattr(self.should_stop, "collective", False))
        self._last_save_s: tp.Optional[float] = None
        self._step_s: tp.Optional[float] = None
        self.run_dir = Path(ctx.run_dir)
        self.rank, self.world_size = int(ctx.rank), int(ctx.world_size)
        self.display = IntervalDisplay(enabled=config.metrics.display and self.rank == 0)
        self._eval_loader: tp.Any = None
        self._eval_round = 0

    # ------------------------------------------------------------------------------------ fit
    def fit(self) -> FitResult:
        t_fit = time.perf_counter()
        cfg, pol = self.config, self.config.checkpoint
        _seed_everything(cfg.seed)
        module = self.model_factory().to(self.device)
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            from hpctrain.runtime.process_group import wrap_ddp

            model: torch.nn.Module = wrap_ddp(module, self.device)
        else:
            model = module
        optimizer = self.optimizer_factory(module.parameters())
        scheduler = self.scheduler_factory(optimizer) if self.scheduler_factory else None
        scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
        loader = self._build_loader(self.data) if not callable(self.data) else None
        ckpt = None
        step = 0
        resumed: tp.Optional[tp.Dict[str, tp.Any]] = None
        status, error = "failed", ""
        try:
            total = cfg.steps if cfg.steps is not None else cfg.epochs * len(loader) // cfg.grad_accum
            if total < 1:
                raise UsageError(
                    f"TrainConfig.epochs={cfg.epochs} gives no optimizer step: {len(loader)} batches per epoch "
                    f"and grad_accum={cfg.grad_accum}"
                )
            if pol.enabled:
                from hpctrain.ckpt import CheckpointConfig, Checkpointer

                ckpt_dir = Path(pol.dir) if pol.dir is not None else RunDir(self.run_dir).checkpoints
                ckpt = Checkpointer(
                    CheckpointConfig(dir=ckpt_dir, keep_last=pol.keep_last), run_id=str(self.ctx.job_id or "")
                )
                got = (
                    ckpt.restore(
                        model=module, optimizer=optimizer, scheduler=scheduler, scaler=scaler, map_location=self.device
                    )
                    if pol.resume
                    else None
                )
                if got is not None:
                    step = got.step
                    resumed = {"step": got.step, "saved_world_size": got.saved_world_size, "path": str(got.path)}
                    if loader is not None:
                        loader.load_state_dict((got.data_state or {}).get("loader", {}))
                    self.display.note(
                        f"hpctrain.train: resumed from step {got.step} (saved by {got.saved_world_size} ranks): "
                        f"{got.path}"
                    )
            else:
                ckpt_dir = None
            self._start_step = step
            result = self._train(model, module, optimizer, scheduler, scaler, loader, ckpt, ckpt_dir, step, total)
            step = result.step
            status = "stopped" if result.stopped else "completed"
            result.resumed, result.seconds = resumed, time.perf_counter() - t_fit
            return result
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.display.close()
            for closer in (loader, self._eval_loader):
                if closer is not None:
                    closer.close()
            if ckpt is not None:
                if status == "failed":
                    ckpt.abandon()  # an in-flight save of a failing run must not block the exit
                ckpt.close()
            if self.rank == 0 and getattr(self, "_ledger_started", False):
                end = {
                    "event": "end",
                    "time": time.time(),
                    "step": getattr(self, "_step", step),
                    "status": status,
                    "committed_step": getattr(self, "_committed", None),
                    "last_save_s": self._last_save_s,
                    "step_s": self._step_s,
                }
                Ledger(self.run_dir).append({**end, **({"error": error[:500]} if error else {})})

    def _build_loader(self, data_cfg: tp.Any) -> tp.Any:
        from hpctrain.data import H5Loader

        return H5Loader(data_cfg, rank=self.rank, world_size=self.world_size, device=self.device)

    # ------------------------------------------------------------------------------- the loop
    def _train(self, model, module, optimizer, scheduler, scaler, loader, ckpt, ckpt_dir, start, total) -> FitResult:
        cfg, pol, ctx = self.config, self.config.checkpoint, self.ctx
        accum = cfg.grad_accum
        local_batch = loader.local_batch_size if loader is not None else None
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
            static={"job_id": ctx.job_id, "restart_count": ctx.restart_count},
        )
        rec.attach_ddp(model)
        timer = rec.timer
        batches = self._batches(loader, start)
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16)
            if cfg.amp != "off"
            else contextlib.nullcontext()
        )
        can_skip_sync = hasattr(model, "no_sync")
        count_first = cfg.metrics.enabled and cfg.metrics.flops_per_sample is None
        last_ckpt: tp.Optional[int] = None
        last_save_time = time.monotonic()
        save_requested = stopped = False
        step, loss, eval_loss = start, None, None
        collective = self._collective_stop
        self._committed = start if start else None

        def save(at: int, blocking: bool) -> None:
            nonlocal last_ckpt, last_save_time
            assert ckpt is not None
            data_state = {"loader": loader.state_dict()} if loader is not None else {}
            t0 = time.perf_counter()
            ckpt.save(
                at,
                model=module,
                optimizer=optimizer,
                scheduler=scheduler,
                scaler=scaler,
                data_state=data_state,
                blocking=blocking,
            )
            if blocking:
                self._last_save_s, self._committed = time.perf_counter() - t0, at
            last_ckpt, last_save_time = at, time.monotonic()

        self._begin_ledger(start, ckpt_dir, total)
        rec.start_interval(start)
        # a stop that came during start-up (restore, loader warm-up) is acted on before the first step
        stopped = collective and self.should_stop is not None and self.should_stop(step)
        if not stopped and step < total:
            batches = self._fix_ddp_buckets(model, module, batches, autocast)
        t_steps = time.perf_counter()
        while step < total and not stopped:
            timer.start()
            loss_sum = None
            samples = 0
            for micro in range(accum):
                batch = next(batches)
                timer.mark("data_wait")
                sync = micro == accum - 1 or not can_skip_sync
                with contextlib.nullcontext() if sync else model.no_sync():
                    if count_first:
                        count_first = False
                        flops = count_flops(lambda b=batch: self._forward_backward(model, b, autocast, scaler, accum))
                        n = local_batch or _batch_len(batch)
                        rec.flops_per_sample = flops / max(n, 1)
                        micro_loss = self._last_loss
                    else:
                        micro_loss = self._forward_backward(model, batch, autocast, scaler, accum)
                timer.mark("forward_backward")
                loss_sum = micro_loss if loss_sum is None else loss_sum + micro_loss
                samples += local_batch or _batch_len(batch)
            if cfg.grad_clip:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
            timer.mark("optimizer")
            step += 1
            self._step = step
            loss = loss_sum / accum if accum > 1 else loss_sum
            if collective and self.should_stop(step):  # every step, every rank: all stop at this one
                rec.step_done(loss, samples=samples)
                stopped = True
                break
            if (
                ckpt is not None
                and step < total
                and ((pol.every_steps and step % pol.every_steps == 0) or save_requested)
            ):
                save(step, blocking=not pol.async_save)
                save_requested = False
                timer.mark("checkpoint")
            rec.step_done(loss, samples=samples)
            if rec.due(step):
                time_due = bool(pol.every_minutes) and time.monotonic() - last_save_time >= 60 * pol.every_minutes
                stop_now = self.should_stop is not None and not collective and self.should_stop(step)
                extra = {"last_checkpoint_step": last_ckpt, "lr": optimizer.param_groups[0].get("lr")}
                if loader is not None:
                    extra["epoch"] = loader.epoch
                report = rec.flush(step, stop=stop_now, save=time_due, extra=extra)
                self.display.show(report.record)
                save_requested = save_requested or report.save
                if report.stop and step < total:
                    stopped = True
                    break
            if self.eval_data is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < total:
                eval_loss = self._evaluate(module, step, autocast, rec)
                if collective and self.should_stop(step):  # agreed during the evaluation
                    stopped = True
                    break
        if step > start:
            self._step_s = (time.perf_counter() - t_steps) / (step - start)
        if self.eval_data is not None and step > start and not stopped:
            eval_loss = self._evaluate(module, step, autocast, rec)
        if stopped and ckpt is not None:
            self._settle_in_flight(ckpt)
        if ckpt is not None and step > start and last_ckpt == step:
            ckpt.wait()  # a time-based save already took this step
            self._committed = step
        elif ckpt is not None and step > start:
            t0 = time.perf_counter()
            save(step, blocking=True)
            self.display.note(f"hpctrain.train: checkpoint of step {step} committed in {time.perf_counter() - t0:.2f}s")
        rec.close()
        final_loss = float(loss.item()) if loss is not None else None
        self.display.note(
            f"hpctrain.train: {'stopped' if stopped else 'done'} at step {step}/{total}"
            + (f", final loss {final_loss:.4f}" if final_loss is not None else "")
        )
        return FitResult(step, start, None, total, final_loss, eval_loss, stopped, 0.0, module)

    def _settle_in_flight(self, ckpt: tp.Any) -> None:
        """At an agreed stop: finish the in-flight async save when there is time for it and the stop save,
        else abandon it (uncommitted) so the stop save gets the disk. Every rank decides the same (any rank
        short of time decides for all), because ``abandon`` is collective."""
        left = self.ctx.stop_time_left() if callable(getattr(self.ctx, "stop_time_left", None)) else None
        need = 2 * (self._last_save_s or 0.0) + (self._step_s or 0.0)
        short = int(left is not None and left < need + 5.0)
        stop = getattr(self.ctx, "stop", None)
        if stop is not None and hasattr(stop, "reduce"):
            short = stop.reduce([short], "max")[0]
        if short:
            dropped = ckpt.abandon()
            self.display.note(
                f"hpctrain.train: {'abandoned' if dropped else 'finished'} the in-flight save "
                f"({left if left is not None else float('nan'):.0f}s left, a save takes {need:.1f}s)"
            )
        else:
            ckpt.wait()

    def _fix_ddp_buckets(self, model, module, batches: tp.Iterator[Batch], autocast: tp.Any) -> tp.Iterator[Batch]:
        """One zero-loss forward/backward before the first step of every attempt, so that resuming is bit-exact.

        DDP reduces gradients in buckets laid out in reverse parameter order for its first backward, then
        rebuilds them once in the order gradients became ready. An element's place in a bucket decides the
        order in which the ranks' values are added (ring all-reduce), so with 3 or more ranks the first step
        after a restart, on the initial layout, differs in the last bits from the same step of an
        uninterrupted run, on the rebuilt one. This pass lets DDP record the ready order (the grads are
        zeros and are dropped; eval mode and a forked RNG leave BatchNorm statistics, dropout and the random
        streams as they were), so every real step of every attempt runs on the rebuilt layout. ``loss_fn``
        sees this call with ``model.training`` False.
        """
        if not hasattr(model, "no_sync") or self.world_size < 3:
            return batches  # no DDP, or two ranks: a + b == b + a, the layout cannot change a sum
        first = next(batches, None)
        if first is None:
            return iter(())
        was_training = model.training
        model.eval()
        devices = [self.device.index] if self.device.type == "cuda" and self.device.index is not None else []
        with torch.random.fork_rng(devices=devices):
            with autocast:
                loss = self.loss_fn(model, first)
            (loss.float() * 0.0).backward()
        model.train(was_training)
        for p in module.parameters():
            p.grad = None
        return itertools.chain([first], batches)

    def _forward_backward(self, model, batch, autocast, scaler, accum) -> torch.Tensor:
        with autocast:
            loss = self.loss_fn(model, batch)
        scaled = loss / accum if accum > 1 else loss
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        self._last_loss = loss.detach()
        return self._last_loss

    def _batches(self, loader: tp.Any, start: int) -> tp.Iterator[Batch]:
        if loader is None:
            return iter(self.data(start))

        def epochs() -> tp.Iterator[Batch]:
            while True:  # the loader starts the next epoch by itself
                yield from loader

        return epochs()

    # ----------------------------------------------------------------------------- evaluation
    def _evaluate(self, module: torch.nn.Module, step: int, autocast: tp.Any, rec: MetricsRecorder) -> float:
        if self._eval_loader is None:
            self._eval_loader = self._build_loader(self.eval_data)
        loader, limit = self._eval_loader, self.config.eval_batches
        self._eval_round += 1
        loader.set_epoch(self._eval_round)  # a fresh pass each time (shuffle=False: the same samples)
        t0 = time.perf_counter()
        total = torch.zeros(2, dtype=torch.float64)
        # The stop poll is collective: poll only at batches every rank reaches (ranks may hold different
        # numbers of eval batches), agreed once per evaluation.
        polls = 0
        if self._collective_stop and self.should_stop is not None:
            stop = getattr(self.ctx, "stop", None)
            n = min(len(loader), limit) if limit else len(loader)
            polls = stop.reduce([n], "min")[0] if stop is not None and hasattr(stop, "reduce") else n
        module.eval()
        try:
            with torch.no_grad():
                for i, batch in enumerate(loader):
                    if limit and i >= limit:
                        break
                    if i < polls and self.should_stop(step):
                        break
                    with autocast:
                        loss = self.loss_fn(module, batch)
                    total += torch.tensor([float(loss), 1.0], dtype=torch.float64)
        finally:
            module.train()
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            moved = total.to(self.device if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(moved)
            total = moved.cpu()
        mean = float(total[0] / max(total[1].item(), 1.0))
        seconds, batches = time.perf_counter() - t0, int(total[1]) // self.world_size
        rec.write({"kind": "eval", "step": step, "loss": mean, "batches": batches, "seconds": seconds})
        self.display.note(
            f"hpctrain.train: eval at step {step}: loss {mean:.4f} ({batches} batches a rank, {seconds:.1f}s)"
        )
        return mean

    # --------------------------------------------------------------------------------- ledger
    def _begin_ledger(self, start: int, ckpt_dir: tp.Optional[Path], total: int) -> None:
        """Rank 0 records this start: who, where, from which step, what the restart cost."""
        self._step = start
        if self.rank != 0:
            return
        ctx, now = self.ctx, time.time()
        previous, _ = read_jsonl(RunDir(self.run_dir).metrics, tail_bytes=1 << 20)
        last_seen = max((r["time"] for r in previous if isinstance(r.get("time"), (int, float))), default=None)
        committed_at = self._manifest_time(ckpt_dir, start) if start else None
        after, warning = self._previous_attempt(getattr(ctx, "signal_lead_s", 0.0) or 0.0)
        record: tp.Dict[str, tp.Any] = {
            "event": "start",
            "time": now,
            "job_id": ctx.job_id,
            "restart_count": ctx.restart_count,
            "hosts": list(ctx.hostnames or [ctx.hostname]),
            "world_size": self.world_size,
            "launcher": getattr(ctx, "launcher", None),
            "pid": os.getpid(),
            "hostname": ctx.hostname,
            "resumed_from_step": start,
            "total_steps": total,
            "checkpoint_dir": str(ckpt_dir) if ckpt_dir is not None else None,
            # start-up: interpreter, imports, rendezvous, model build and restore, until the first step
            "startup_s": now - process_start_time(),
            # progress made after the restored checkpoint was committed and seen in the last interval
            # record of an earlier start: redone now (a lower bound: steps after that record are unseen)
            "lost_s": max(0.0, last_seen - committed_at) if last_seen and committed_at else (0.0 if start else None),
            "down_s": now - last_seen if last_seen else None,
            # why the previous attempt ended (its Runner's exit record), when this is a restart
            "after": after,
            "signal_lead_s": getattr(ctx, "signal_lead_s", None),
            "warning": warning,
            "config": self.config.to_dict(),
        }
        Ledger(self.run_dir).append(record)
        self._ledger_started = True

    def _previous_attempt(self, lead_s: float) -> tp.Tuple[tp.Optional[str], tp.Optional[str]]:
        """The previous attempt's end cause, and a warning when the signal lead is shorter than its last
        measured save plus one step (the stop save would not be committed before the kill)."""
        restarts = int(getattr(self.ctx, "restart_count", 0) or 0)
        after, save_s, step_s = Ledger(self.run_dir).previous_attempt(restarts)
        warning = None
        if save_s is not None and step_s is not None and lead_s:
            if lead_s < save_s + step_s:
                warning = (
                    f"the signal lead ({lead_s:.0f}s) is shorter than the last save ({save_s:.1f}s) plus one step "
                    f"({step_s:.1f}s): a stop save may not commit before the kill; raise --signal-lead"
                )
                print(f"hpctrain.train: warning: {warning}", file=sys.stderr, flush=True)
        return after, warning

    @staticmethod
    def _manifest_time(ckpt_dir: tp.Optional[Path], step: int) -> tp.Optional[float]:
        """When the checkpoint of ``step`` was saved (its MANIFEST.json ``time``)."""
        if ckpt_dir is None:
            return None
        try:
            manifest = json.loads((ckpt_dir / f"step-{step:09d}" / "MANIFEST.json").read_text())
            value = manifest.get("time")
            return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
        except (OSError, ValueError):
            return None
