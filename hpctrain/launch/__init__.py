"""On each task: the :class:`RunContext` contract and the :class:`Runner` that calls ``entry(ctx)``."""

from hpctrain.launch.context import RunContext
from hpctrain.launch.runner import Runner

__all__ = ["RunContext", "Runner"]
