"""Defaults that more than one module uses, each defined here once (stdlib only: the login node imports it).

A default that only one config has lives on that config's field (e.g. ``CheckpointConfig.keep_last``);
everything else that needs it refers to the field or to the constant here.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_DIST_TIMEOUT_S",
    "DEFAULT_MAX_REQUEUES",
    "DEFAULT_FAILURES_PER_1000_NODE_DAYS",
    "DEFAULT_MTBF_NODE_HOURS",
    "DEFAULT_POLL_S",
    "DEFAULT_STAGE_DIR",
]

DEFAULT_DIST_TIMEOUT_S = 600
"""Seconds a rank waits for the others before failing: the rendezvous and the training process group
(``--dist-timeout``, ``SubmitConfig.dist_timeout``, ``Runner``, ``init_process_group``), the stop agreement's
collective (``StopAgreement``) and the checkpointer's control collectives
(``CheckpointConfig.agreement_timeout_s``)."""

DEFAULT_MAX_REQUEUES = 3
"""Requeues after a time limit, preemption or rank/node failure (``--max-requeues``,
``SubmitConfig.max_requeues``, ``Runner``, ``python -m hpctrain.launch``)."""

DEFAULT_FAILURES_PER_1000_NODE_DAYS = 6.50
"""Unplanned failures per 1000 node-days on Meta's RSC-1 (16k A100, 8 per node; Kokolis et al. 2025), the
worse of the two clusters measured there: the default failure rate when none is given."""

DEFAULT_MTBF_NODE_HOURS = 24.0 * 1000.0 / DEFAULT_FAILURES_PER_1000_NODE_DAYS
"""About 3692 hours between unplanned failures of one node (RSC-1's rate): a 64-node job fails every ~58 h,
a 512-node job every ~7.2 h (``CheckpointPolicy.mtbf_node_hours``, the planner's ``--mtbf-node-hours``)."""

DEFAULT_POLL_S = 10.0
"""Seconds between two questions to the scheduler (``squeue``/``sacct``) from one process that watches a job
(``submit --follow``; ``runs`` asks once per listing), overridden by the ``HPCTRAIN_POLL_S`` environment
variable; doubled while the job is pending, up to 60 s. Why: every squeue or sacct is an RPC to slurmctld or
slurmdbd shared by the whole site (a tool polling each second per job, times a sweep of thousands of tasks,
has stalled clusters); what changes each second is the run directory, read locally in between."""

DEFAULT_STAGE_DIR = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/hpctrain-stage"
"""Where ``submit --stage`` copies the inputs on every node (``--stage-dir``, ``SubmitConfig.stage_dir``,
``python -m hpctrain.data.stage``): the job's node-local scratch (``$SLURM_TMPDIR`` where the site sets one, else
``$TMPDIR``, else ``/tmp``), expanded on the node, not on the login node. Inside it each run has its own folder
and each node its own below that (``<run>-<hash>/<node name>``), so nodes that share one file system (the dev
cluster) still each read their own copy. A requeue reuses a copy only where the directory outlives the job:
a job container's private ``/tmp`` does not."""
