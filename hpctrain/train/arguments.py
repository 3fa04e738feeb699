"""What ``Trainer(...)`` accepts: each slip is one :class:`~hpctrain.errors.UsageError` naming the argument,
raised at construction, before any rank builds a model, instead of a traceback from deep inside ``fit``.

The common slips: an object where a factory belongs (``model=nn.Linear(...)``; an nn.Module is callable,
so it would fail later inside ``forward()``), a loss module instead of a ``(model, batch)`` function, and
options that need something not given (``epochs`` without HDF5 data, ``eval_every`` without eval data,
``amp`` on a CPU).
"""

from __future__ import annotations

import typing as tp

import torch

from hpctrain.errors import UsageError
from hpctrain.train.config import TrainConfig

__all__ = ["check_arguments"]


def _factory(where: str, value: tp.Any, example: str) -> None:
    if isinstance(value, torch.nn.Module) or not callable(value):
        what = "an nn.Module" if isinstance(value, torch.nn.Module) else f"a {type(value).__name__}"
        raise UsageError(f"Trainer({where}=...) got {what}; pass a factory: {where}={example}")


def check_arguments(
    *,
    config: tp.Any,
    model: tp.Any,
    optimizer: tp.Any,
    scheduler: tp.Any,
    loss_fn: tp.Any,
    data: tp.Any,
    eval_data: tp.Any,
    device: torch.device,
) -> None:
    """Raise the UsageError of the first argument the Trainer cannot use (``device``: ``ctx.device``)."""
    from hpctrain.data import H5DataConfig

    if not isinstance(config, TrainConfig):
        raise UsageError(f"Trainer(config=...) must be a TrainConfig, got {type(config).__name__}")
    if not (isinstance(data, H5DataConfig) or callable(data)):
        raise UsageError("Trainer(data=...) must be an H5DataConfig or a factory (start_step) -> iterable")
    if config.epochs is not None and not isinstance(data, H5DataConfig):
        raise UsageError("TrainConfig.epochs needs HDF5 data (an H5DataConfig); give TrainConfig.steps instead")
    if eval_data is not None and not isinstance(eval_data, H5DataConfig):
        raise UsageError("Trainer(eval_data=...) must be an H5DataConfig")
    if config.eval_every and eval_data is None:  # else the periodic evaluation would silently never run
        raise UsageError(
            f"TrainConfig.eval_every={config.eval_every} needs eval data: give Trainer(eval_data=...) "
            "(an H5DataConfig) or leave eval_every at 0"
        )
    if config.amp != "off" and device.type != "cuda":
        raise UsageError(f"TrainConfig.amp={config.amp!r} needs a CUDA device; this rank runs on {device}")
    _factory("model", model, "lambda: torch.nn.Linear(...)")
    _factory("optimizer", optimizer, "lambda params: torch.optim.AdamW(params, lr=...)")
    if scheduler is not None:
        _factory("scheduler", scheduler, "lambda opt: torch.optim.lr_scheduler.StepLR(opt, ...)")
    if isinstance(loss_fn, torch.nn.Module) or not callable(loss_fn):
        raise UsageError(
            f"Trainer(loss_fn=...) must be a function (model, batch) -> loss, got {type(loss_fn).__name__}; "
            "e.g. loss_fn=lambda model, b: torch.nn.functional.cross_entropy(model(b['x']), b['y'])"
        )
