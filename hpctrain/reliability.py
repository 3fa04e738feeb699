"""Reliability formulas: MTBF, the optimum checkpoint interval, ETTR, what a failure costs (stdlib only).

The one home of this arithmetic, torch-free and at the bottom of the house: the Trainer's
``CheckpointPolicy(every_minutes="auto")`` (:mod:`hpctrain.train.saving`) and the planner
(:mod:`hpctrain.capacity`) both import it. Units: seconds, hours where named. Sources (docs/capacity.md
has the derivations and the checks):

* checkpoint interval: Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
  1974 (``sqrt(2 delta M)``); Daly, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), 2006 (the perturbation form);
* effective training time ratio: Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
  Research Clusters", HPCA 2025 (arXiv 2410.21680): ``E[ETTR] ~ (1 - (u0 + tau/2)/M) / (1 + delta/tau)``
  with the job's failure rate ``1/M = nodes * r_f``.

The default node MTBF is :data:`hpctrain.defaults.DEFAULT_MTBF_NODE_HOURS`.
"""

from __future__ import annotations

import math

__all__ = [
    "HOUR",
    "mtbf_node_hours_from_rate",
    "job_mtbf_seconds",
    "young_interval",
    "daly_interval",
    "ettr",
    "failure_loss_seconds",
]

HOUR = 3600.0


def mtbf_node_hours_from_rate(failures_per_1000_node_days: float) -> float:
    """Kokolis et al.'s failure rate ``r_f`` (failures per 1000 node-days) as one node's MTBF in hours."""
    return 24.0 * 1000.0 / failures_per_1000_node_days


def job_mtbf_seconds(nodes: int, mtbf_node_hours: float) -> float:
    """A job fails when any of its nodes does: ``M = M_node / nodes`` (``MTTF = 1 / (N r_f)``)."""
    return mtbf_node_hours * HOUR / nodes


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974): the compute time between checkpoints that minimises the expected loss, ``sqrt(2 delta M)``
    (``delta`` the time one checkpoint costs, ``M`` the job's MTBF)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006), the higher-order optimum: for ``delta < 2M``,
    ``sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta``; else ``M``.
    (Daly's own checks: M = 24 h, delta = 5 min -> 117 min; M = 6 h -> 57 min.)"""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def failure_loss_seconds(interval: float, restart: float) -> float:
    """Expected time one failure costs: the half interval of training redone plus the restart (down time,
    start-up, restore, queue; and, for an async save, the commit not yet durable)."""
    return interval / 2.0 + restart


def ettr(interval: float, delta: float, mtbf: float, restart: float) -> float:
    """Kokolis et al. (2025), the expected effective training time ratio of a job that checkpoints every
    ``interval`` seconds of training, stalling ``delta`` per checkpoint, failing every ``mtbf`` seconds and
    losing ``restart`` seconds per failure besides the half interval redone on average:
    ``(1 - failure_loss_seconds(interval, restart) / M) / (1 + delta / interval)``, in [0, 1]."""
    value = (1.0 - failure_loss_seconds(interval, restart) / mtbf) / (1.0 + delta / interval)
    return min(1.0, max(0.0, value))
