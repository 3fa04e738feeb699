"""Training on top of the run context, the HDF5 loader and the checkpointer (see docs/train.md).

Two layers: composable pieces for a loop you already have (:class:`MetricsRecorder` with its
:class:`StepTimer`, :class:`StopSignal`) and a small :class:`Trainer` for the common case, configured
by :class:`TrainConfig`.

Importing this package does not import torch (the login-node ``status`` command reads
:mod:`hpctrain.ledger`, :mod:`hpctrain.rundir`); the torch-side classes load on first access.
"""

from __future__ import annotations

import typing as tp

from hpctrain.runtime.recovery_config import RecoveryConfig
from hpctrain.train.config import AMP_MODES, CheckpointPolicy, MetricsConfig, ParallelConfig, TrainConfig

__all__ = [
    "AMP_MODES",
    "CheckpointPolicy",
    "FitResult",
    "IntervalReport",
    "MetricsConfig",
    "MetricsRecorder",
    "ParallelConfig",
    "RecoveryConfig",
    "StepTimer",
    "StopSignal",
    "TrainConfig",
    "Trainer",
]

_LAZY = {
    "Trainer": "hpctrain.train.trainer",
    "FitResult": "hpctrain.train.trainer",
    "StopSignal": "hpctrain.train.stopping",
    "MetricsRecorder": "hpctrain.train.metrics",
    "StepTimer": "hpctrain.train.metrics",
    "IntervalReport": "hpctrain.train.metrics",
}

if tp.TYPE_CHECKING:  # pragma: no cover
    from hpctrain.train.metrics import IntervalReport, MetricsRecorder, StepTimer
    from hpctrain.train.stopping import StopSignal
    from hpctrain.train.trainer import FitResult, Trainer


def __getattr__(name: str) -> tp.Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpctrain.train' has no attribute {name!r}")
