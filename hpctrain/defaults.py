"""Defaults that more than one module uses, each defined here once (stdlib only: the login node imports it).

A default that only one config has lives on that config's field (e.g. ``CheckpointConfig.keep_last``);
everything else that needs it refers to the field or to the constant here.
"""

from __future__ import annotations

__all__ = ["DEFAULT_DIST_TIMEOUT_S", "DEFAULT_MAX_REQUEUES"]

DEFAULT_DIST_TIMEOUT_S = 600
"""Seconds a rank waits for the others before failing: the rendezvous and the training process group
(``--dist-timeout``, ``SubmitConfig.dist_timeout``, ``Runner``, ``init_process_group``), the stop agreement's
collective (``StopAgreement``) and the checkpointer's control collectives
(``CheckpointConfig.agreement_timeout_s``)."""

DEFAULT_MAX_REQUEUES = 3
"""Requeues after a time limit, preemption or rank/node failure (``--max-requeues``,
``SubmitConfig.max_requeues``, ``Runner``, ``python -m hpctrain.launch``)."""
