"""The Trainer's evaluation: ``loss_fn`` over the eval data under ``torch.no_grad``, mean over all ranks.

An evaluation can take long (a whole pass over the eval set), so it polls the collective stop hook at its
batches (:mod:`hpctrain.train.stopping`) and a stop cuts it short. The cut-short evaluation is still
recorded, as a normal ``eval`` record of the batches done, but marked ``"interrupted": true``: its loss is
the mean over fewer batches than the others' and must not be read as comparable.
"""

from __future__ import annotations

import time
import typing as tp
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpctrain.train.stopping import Stopping

__all__ = ["EvalResult", "Evaluator"]


@dataclass(frozen=True)
class EvalResult:
    loss: tp.Optional[float]
    """Mean loss over all ranks' batches; None when a stop came before the first batch."""
    batches: int
    """Batches evaluated per rank."""
    seconds: float
    interrupted: bool
    """A stop cut the evaluation short (every rank stops at the same batch)."""


class Evaluator:
    """Evaluations of one ``fit``: builds the eval loader on first use, keeps it for the next ones.

    ``build_loader(config)`` makes this rank's loader; ``limit`` is ``TrainConfig.eval_batches`` (0 = a whole
    pass). Call :meth:`run` on every rank at the same step (it is collective), :meth:`close` at the end.
    """

    def __init__(
        self,
        data: tp.Any,
        *,
        loss_fn: tp.Callable[[torch.nn.Module, tp.Any], torch.Tensor],
        limit: int,
        stopping: Stopping,
        build_loader: tp.Callable[[tp.Any], tp.Any],
        world_size: int,
        device: torch.device,
    ) -> None:
        self.data, self.loss_fn, self.limit = data, loss_fn, limit
        self.stopping, self.build_loader = stopping, build_loader
        self.world_size, self.device = world_size, device
        self._loader: tp.Any = None
        self._round = 0

    def run(self, module: torch.nn.Module, step: int, autocast: tp.Any) -> EvalResult:
        """One evaluation of ``module`` (not the DDP wrapper: no gradient hooks, no buckets)."""
        if self._loader is None:
            self._loader = self.build_loader(self.data)
        loader, limit = self._loader, self.limit
        self._round += 1
        loader.set_epoch(self._round)  # a fresh pass each time (shuffle=False: the same samples)
        t0 = time.perf_counter()
        total = torch.zeros(2, dtype=torch.float64)
        polls = self.stopping.eval_polls(min(len(loader), limit) if limit else len(loader))
        interrupted = False
        module.eval()
        try:
            with torch.no_grad():
                for i, batch in enumerate(loader):
                    if limit and i >= limit:
                        break
                    if i < polls and self.stopping.poll(step):
                        interrupted = True  # the same answer, at the same batch, on every rank
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
        count = total[1].item()
        mean = float(total[0] / count) if count else None  # a stop before the first batch: no loss, not 0
        return EvalResult(mean, int(count) // self.world_size, time.perf_counter() - t0, interrupted)

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None

    @staticmethod
    def record(step: int, result: EvalResult) -> tp.Dict[str, tp.Any]:
        """The ``eval`` record of the metrics JSONL (schema in docs/train.md)."""
        return {
            "kind": "eval",
            "step": step,
            "loss": result.loss,
            "batches": result.batches,
            "seconds": result.seconds,
            "interrupted": result.interrupted,
        }

    @staticmethod
    def line(step: int, result: EvalResult) -> str:
        """Rank 0's display line."""
        loss = f"loss {result.loss:.4f}" if result.loss is not None else "no loss"
        cut = ", interrupted by a stop" if result.interrupted else ""
        return (
            f"hpctrain.train: eval at step {step}: {loss} ({result.batches} batches a rank, {result.seconds:.1f}s{cut})"
        )
