"""The Trainer's configuration: nested keyword-only dataclasses, checked on construction (no torch).

Every check raises :class:`~hpctrain.errors.UsageError` naming the option as ``TrainConfig.<field>`` or
``TrainConfig.checkpoint.<field>``, so a bad value fails before any rank builds a model.
"""

from __future__ import annotations

import math
import os
import typing as tp
from dataclasses import asdict, dataclass, field

from hpctrain.errors import UsageError

__all__ = ["TrainConfig", "CheckpointPolicy", "MetricsConfig", "AMP_MODES"]

AMP_MODES = ("off", "bf16", "fp16")


def _int_at_least(where: str, value: tp.Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{where} must be an integer >= {low}, got {value!r}")


def _number_at_least(where: str, value: tp.Any, low: float, *, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if strict else value < low):
        raise UsageError(f"{where} must be a number {'>' if strict else '>='} {low}, got {value!r}")


@dataclass(kw_only=True)
class CheckpointPolicy:
    """When and where the Trainer saves. Saving is on when ``every_steps`` or ``every_minutes`` is set."""

    dir: tp.Optional[tp.Union[str, os.PathLike]] = None
    """Checkpoint directory (shared by all nodes); None = ``RUN_DIR/checkpoints``. A run resumes from the
    newest committed checkpoint found here."""
    every_steps: int = 0
    """Save every N optimizer steps (0 = not by step count)."""
    every_minutes: float = 0.0
    """Save when this many minutes passed since the last save (0 = not by time). Rank 0's clock decides,
    at the next log interval, so that every rank saves at the same step."""
    keep_last: int = 2
    """Committed checkpoints to keep (0 = all)."""
    async_save: bool = True
    """Periodic saves return after copying the state to host memory; a background thread writes it.
    The final save (end of training or stop) always blocks until committed."""
    resume: bool = True
    """Restore from the newest committed checkpoint in ``dir`` at start (False: start fresh even if one exists)."""

    @property
    def enabled(self) -> bool:
        return bool(self.every_steps or self.every_minutes)

    def __post_init__(self) -> None:
        _int_at_least("TrainConfig.checkpoint.every_steps", self.every_steps, 0)
        _number_at_least("TrainConfig.checkpoint.every_minutes", self.every_minutes, 0.0)
        _int_at_least("TrainConfig.checkpoint.keep_last", self.keep_last, 0)
        if self.dir is not None and not os.fspath(self.dir):
            raise UsageError("TrainConfig.checkpoint.dir must be a directory path or None (RUN_DIR/checkpoints)")


@dataclass(kw_only=True)
class MetricsConfig:
    """The always-on measurement (see docs/train.md for the JSONL schema)."""

    enabled: bool = True
    """Time every step's phases on every rank and gather them at each log interval. False keeps only the
    loss and samples/s (for A/B measurements of the measurement itself)."""
    display: bool = True
    """Rank 0 shows a live view (rich) of each interval; other ranks never print."""
    flops_per_sample: tp.Optional[float] = None
    """Training FLOPs (forward + backward) per sample; None = counted once with
    ``torch.utils.flop_counter`` on the first step of each start."""
    peak_flops_per_device: tp.Optional[float] = None
    """Peak FLOP/s of one device for MFU; None = looked up for known GPUs (dense bf16), else MFU is null."""

    def __post_init__(self) -> None:
        if self.flops_per_sample is not None:
            _number_at_least("TrainConfig.metrics.flops_per_sample", self.flops_per_sample, 0.0, strict=True)
        if self.peak_flops_per_device is not None:
            _number_at_least("TrainConfig.metrics.peak_flops_per_device", self.peak_flops_per_device, 0.0, strict=True)


@dataclass(kw_only=True)
class TrainConfig:
    """What the Trainer does. Give exactly one of ``steps`` or ``epochs``."""

    steps: tp.Optional[int] = None
    """Total optimizer steps of the run (a resumed run counts from its checkpoint's step)."""
    epochs: tp.Optional[int] = None
    """Total epochs over the training data (HDF5 data only): ``epochs * batches_per_epoch // grad_accum`` steps."""
    log_every: int = 10
    """Optimizer steps per metrics interval: one JSONL record, one collective, one display update."""
    eval_every: int = 0
    """Evaluate on the eval data every N steps (0 = only at the end, when eval data is given)."""
    eval_batches: int = 0
    """Eval batches per evaluation (0 = one whole pass over the eval data)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are synchronised only on the last one (DDP no_sync)."""
    grad_clip: float = 0.0
    """Clip the gradient norm to this value before each optimizer step (0 = off)."""
    amp: str = "off"
    """Mixed precision on GPU: 'off', 'bf16' (autocast) or 'fp16' (autocast + GradScaler, checkpointed)."""
    seed: int = 0
    """Seeds python, numpy and torch before the model is built (the same initial weights on every rank)."""
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """When and where to checkpoint."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Measurement and display."""

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise UsageError(
                f"TrainConfig: give exactly one of steps or epochs (got steps={self.steps!r}, epochs={self.epochs!r})"
            )
        if self.steps is not None:
            _int_at_least("TrainConfig.steps", self.steps, 1)
        if self.epochs is not None:
            _int_at_least("TrainConfig.epochs", self.epochs, 1)
        _int_at_least("TrainConfig.log_every", self.log_every, 1)
        _int_at_least("TrainConfig.eval_every", self.eval_every, 0)
        _int_at_least("TrainConfig.eval_batches", self.eval_batches, 0)
        _int_at_least("TrainConfig.grad_accum", self.grad_accum, 1)
        _number_at_least("TrainConfig.grad_clip", self.grad_clip, 0.0)
        _int_at_least("TrainConfig.seed", self.seed, 0)
        if self.amp not in AMP_MODES:
            raise UsageError(f"TrainConfig.amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if not isinstance(self.checkpoint, CheckpointPolicy):
            raise UsageError("TrainConfig.checkpoint must be a CheckpointPolicy")
        if not isinstance(self.metrics, MetricsConfig):
            raise UsageError("TrainConfig.metrics must be a MetricsConfig")

    def to_dict(self) -> tp.Dict[str, tp.Any]:
        out = asdict(self)
        if out["checkpoint"]["dir"] is not None:
            out["checkpoint"]["dir"] = os.fspath(out["checkpoint"]["dir"])
        return out
