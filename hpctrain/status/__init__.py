"""``python -m hpctrain status RUN_DIR``: a run's state from the login node (no torch). See docs/train.md.

:func:`collect` (:mod:`hpctrain.status.report`) builds the report as a JSON-able dict; :func:`main`
(:mod:`hpctrain.status.cli`) is the command line that prints it.
"""

from hpctrain.status.cli import main
from hpctrain.status.report import collect

__all__ = ["collect", "main"]
