"""On each task: the :class:`RunContext` contract and the :class:`Runner` that calls ``entry(ctx)``, with its
:class:`RunnerSettings`."""

from hpctrain.launch.context import RunContext
from hpctrain.launch.runner import Runner
from hpctrain.launch.settings import RunnerSettings

__all__ = ["RunContext", "Runner", "RunnerSettings"]
