"""Which TCP ports hpctrain's process groups rendezvous on: the one owner of that fact.

Both ranges lie below Linux's default ephemeral range (``ip_local_port_range``, 32768-60999). A port inside it
may become, at any moment, the local end of any outgoing connection on the node (another job's gloo or NCCL
mesh, a test session's), and the rendezvous master's bind then fails with EADDRINUSE: a derived port of
36738 did exactly that in CI, beside another session's gloo meshes. Below the range only a deliberate bind
can take a port.

- :func:`derive_port`: the job's rendezvous port, a pure function of its id, so every rank on every node
  derives the same one without talking (``PORT_BASE`` .. ``PORT_BASE + 2*PORT_SPAN - 1``).
- :func:`free_port`: a port free now, for a local process group whose master binds it a moment later (tests,
  benchmarks), from a range of its own below ``PORT_BASE``, so it never takes a running job's derived port.

A site whose ephemeral range starts lower sets ``HPCTRAIN_MASTER_PORT`` (``hpctrain.runtime.env``).
"""

from __future__ import annotations

import random
import socket
import zlib

__all__ = ["PORT_BASE", "PORT_SPAN", "FREE_PORT_RANGE", "derive_port", "free_port"]

PORT_BASE = 20000
PORT_SPAN = 6000
"""Derived ports are ``PORT_BASE`` .. ``PORT_BASE + 2*PORT_SPAN - 1`` (20000-31999): 6000 consecutive job ids
on a node get distinct ports, two each (a requeued job alternates)."""
FREE_PORT_RANGE = (10000, PORT_BASE)
"""Where :func:`free_port` picks (the upper end excluded): below the derived ports, above the well-known ones."""


def derive_port(job_id: str, restart_count: int = 0) -> int:
    """A rendezvous port from the job id: consecutive job ids on a shared node get distinct ports,
    and a requeued job alternates between two so it never waits on its previous run's TIME_WAIT socket."""
    key = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return PORT_BASE + (key % PORT_SPAN) * 2 + (restart_count % 2)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago, from :data:`FREE_PORT_RANGE`. Its user binds it later
    (the spawned ranks' master, seconds on): only another caller's pick can take it meanwhile, 1 in 10000.
    Falls back to the kernel's choice when 64 random picks were all taken."""
    pick = random.SystemRandom()
    for _ in range(64):
        port = pick.randrange(*FREE_PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
