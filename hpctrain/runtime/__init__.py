"""Ranks and rendezvous from Slurm (``env``, torch-free) and the process group itself (``process_group``)."""

from hpctrain.runtime.env import DistEnv, DistEnvError, derive_port, expand_hostlist, from_environ

__all__ = ["DistEnv", "DistEnvError", "derive_port", "expand_hostlist", "from_environ"]
