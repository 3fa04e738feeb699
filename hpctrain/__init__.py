"""hpctrain: Slurm-native training runs that are identifiable and recoverable.

The data path, one package per stage: ``submit`` (login node: build and submit the Slurm job) →
``launch`` (on each task: context, entry call) → ``runtime`` (ranks, rendezvous, process group) →
``data`` → ``ckpt``. Importing this package must stay cheap and must not import torch: the login-node tools
(``python -m hpctrain.submit``, ``ckpt ls``, ...) run where torch may be slow or absent.
"""

from hpctrain.errors import CheckpointFormatError, HpctrainError, UsageError

__version__ = "0.1.0"

__all__ = ["__version__", "HpctrainError", "UsageError", "CheckpointFormatError"]
