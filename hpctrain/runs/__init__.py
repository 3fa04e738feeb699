"""``python -m hpctrain runs``: every run of the user, one table (stdlib only, no torch). See docs/runs.md.

:func:`list_runs` (:mod:`hpctrain.runs.listing`) builds the listing as a JSON-able dict from the run registry
(:mod:`hpctrain.registry`), one batched question to the scheduler and each run directory; :func:`main`
(:mod:`hpctrain.runs.cli`) is its command line.
"""

from hpctrain.runs.cli import main
from hpctrain.runs.listing import SCHEMA, list_runs, render

__all__ = ["main", "list_runs", "render", "SCHEMA"]
