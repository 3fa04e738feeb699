"""Ranks and rendezvous from Slurm (``env``, torch-free) and the process group itself (``process_group``); the
rendezvous ports (``ports``)."""

from hpctrain.runtime.env import DistEnv, DistEnvError, expand_hostlist, from_environ
from hpctrain.runtime.ports import derive_port, free_port

__all__ = ["DistEnv", "DistEnvError", "derive_port", "expand_hostlist", "free_port", "from_environ"]
