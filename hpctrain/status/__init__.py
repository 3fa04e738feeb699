"""``python -m hpctrain status RUN_DIR``: a run's state from the login node (no torch). See docs/train.md."""

from hpctrain.status.cli import collect, main

__all__ = ["collect", "main"]
