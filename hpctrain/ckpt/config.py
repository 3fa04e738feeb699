"""The checkpointer's configuration: one frozen, keyword-only dataclass, checked on construction (no torch).

``import hpctrain.ckpt`` loads it on the login node; the torch-based :class:`~hpctrain.ckpt.Checkpointer`
takes it on the nodes. The Trainer carries one in ``CheckpointPolicy.config`` (``dir=None`` there: the
run's ``RUN_DIR/checkpoints``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing as tp
from dataclasses import dataclass

from hpctrain._validate import check_bool, check_choice, check_int, check_number, check_path, check_strings
from hpctrain.defaults import DEFAULT_DIST_TIMEOUT_S
from hpctrain.errors import UsageError

__all__ = [
    "CheckpointConfig",
    "RESTORE_TIERS",
    "RESTORE_MODES",
    "RESTORE_EXCHANGES",
    "ABANDONED_AFTER_S",
    "check_field",
]

# Defined here, where the login node reads them without torch. _restore.RESTORE_MODES, _fetch.EXCHANGES and
# _scan.ABANDONED_AFTER_S must be these objects (tests/ckpt/test_config.py checks that they are equal).

RESTORE_TIERS = ("global", "local", "partner")
"""Where a restore came from (``RestoreResult.tier``, the ledger's ``restored_tier``): the global tier (``dir``),
the local tier with every shard on the node that wrote it, or the local tier with some shard taken from its
partner copy on another node (its own node was lost or replaced)."""
RESTORE_MODES = ("auto", "read_once", "read_all")
"""``CheckpointConfig.restore_mode`` values."""
RESTORE_EXCHANGES = ("auto", "host", "device", "node")
"""``CheckpointConfig.restore_exchange`` values."""
ABANDONED_AFTER_S = 3600.0
"""``CheckpointConfig.abandoned_after_s`` and ``ckpt gc --older-than``: seconds untouched after which a
temporary directory whose writers cannot be proven gone counts as abandoned."""


@dataclass(kw_only=True, frozen=True)
class CheckpointConfig:
    """Where and how the :class:`~hpctrain.ckpt.Checkpointer` saves, keeps and restores. Every field is
    checked on construction; an error names it (``CheckpointConfig.keep_last must be ...``)."""

    dir: tp.Optional[tp.Union[str, os.PathLike]] = None
    """Directory holding one sub-directory per committed step (on the shared filesystem). None = the run's
    default, ``RUN_DIR/checkpoints`` (``RunDir(run_dir).checkpoints``): only where the Trainer fills it in;
    a Checkpointer built directly needs a directory."""
    keep_last: int = 3
    """Keep the newest K committed checkpoints (0 = keep all). Incomplete ones never count."""
    keep_every: int = 0
    """Also keep every checkpoint whose step is a multiple of N (0 = off)."""
    verify_checksums: bool = True
    """On restore, check the crc32 of every shard (each rank checks 1/world of them). Sizes are always checked."""
    agreement_timeout_s: float = DEFAULT_DIST_TIMEOUT_S
    """Timeout of the control collectives (gloo) of the commit protocol and restore, in seconds."""
    lustre_stripe: tp.Tuple[str, ...] = ()
    """Arguments for ``lfs setstripe`` on each new checkpoint dir, e.g. ``("-c", "-1", "-S", "16M")``; () = off.
    Ignored where ``lfs`` is not installed."""
    check_free_space: bool = True
    """Fail before writing when the filesystem lacks room for the checkpoint."""
    free_space_margin: float = 1.05
    """Required free space as a multiple of the checkpoint size."""
    clean_abandoned: bool = True
    """At startup, delete temporary directories of earlier interrupted saves (in the background, rank 0):
    those of earlier restarts of this job, those whose writers are provably gone, and those untouched
    for ``abandoned_after_s``."""
    abandoned_after_s: float = ABANDONED_AFTER_S
    """A temporary directory whose writers cannot be proven gone is left alone until untouched this long."""
    restore_mode: str = "auto"
    """``read_once``: each rank reads about 1/world of the replicated state from the files and the ranks
    exchange the rest over the checkpointer's gloo group (the filesystem sees each byte once).
    ``read_all``: every rank reads all of it (no network traffic; every host reads the whole checkpoint).
    ``auto``: ``read_once`` when the ranks run on several hosts, or on one host with the ``node`` exchange (its
    shared memory: faster than every rank reading every byte); ``read_all`` on one host otherwise (its page cache
    serves the bytes to every rank, and that is faster than the loopback gloo exchange).
    Sharded (DTensor) state is always read by the ranks that need it, each byte range once."""
    restore_exchange: str = "auto"
    """How ``read_once`` ranks exchange the bytes. ``node`` (every rank on one host): through a shared-memory
    buffer in ``/dev/shm`` that each rank reads its part into and then copies whole (no socket; across hosts,
    and where ``/dev/shm`` lacks room, it is ``host``). ``host``: in host memory over the checkpointer's own gloo
    group. ``device``: over the training (default) process group through buffers on its device, at most 1 GiB
    of device memory at a time (under NCCL: NVLink/InfiniBand instead of TCP). ``auto``: ``node`` on one host;
    across hosts ``device`` when the default group is NCCL, else ``host``."""
    local_every_steps: int = 0
    """The local tier (docs/checkpoint.md, "Tiers"): the Trainer saves every N steps to node-local storage, each
    rank's shard also copied to a rank on the next node (its partner); 0 = off. Used by the Trainer
    (``hpctrain.ckpt.tiers.TieredCheckpointer``), not by a plain Checkpointer."""
    global_every_local_saves: int = 5
    """Every K-th local save (K counts local saves, not steps) also goes to ``dir`` (the global tier, on the
    shared filesystem): its local copy, once committed, is copied there in the background (never staged from
    the model a second time)."""
    local_dir: tp.Optional[tp.Union[str, os.PathLike]] = None
    """Node-local directory of the local tier; None = ``$SLURM_TMPDIR``, else ``$TMPDIR``, else ``/tmp``.
    ``{host}`` in it is replaced by the node's host name (a path on a filesystem the nodes share, that must
    act per node). ``/dev/shm`` is allowed with ``local_max_bytes`` set (it is memory). A local copy serves a
    requeued job only where this directory outlives the job: ``$SLURM_TMPDIR`` of a job container does not
    (it still serves restarts inside the allocation: spare nodes, hangs)."""
    local_max_bytes: int = 0
    """Most bytes the local tier may hold on one node (its own and its partner copies of the last 2 steps);
    a local save that would exceed it fails with a clear line and the run goes on with the global tier.
    0 = no bound but the filesystem's free space; required for ``/dev/shm``."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_field(self, f.name, getattr(self, f.name))
        if self.local_dir is not None and str(self.local_dir).startswith("/dev/shm") and not self.local_max_bytes:
            raise UsageError(
                f"CheckpointConfig.local_dir={str(self.local_dir)!r} is memory: set CheckpointConfig.local_max_bytes "
                "(bytes of the node's memory the local tier may hold)"
            )
        object.__setattr__(self, "lustre_stripe", tuple(self.lustre_stripe))


_RULES: tp.Dict[str, tp.Callable[[tp.Any, str, tp.Any], tp.Any]] = {
    "dir": functools.partial(check_path, what="a directory path", none_ok=True, hint="None = RUN_DIR/checkpoints"),
    "keep_last": functools.partial(check_int, min=0, hint="0 = keep all"),
    "keep_every": functools.partial(check_int, min=0, hint="0 = off"),
    "verify_checksums": check_bool,
    "agreement_timeout_s": functools.partial(check_number, above=0, hint="seconds"),
    "lustre_stripe": functools.partial(check_strings, hint="lfs setstripe arguments, e.g. ('-c', '-1'); () = off"),
    "check_free_space": check_bool,
    "free_space_margin": functools.partial(check_number, min=1.0, hint="a multiple of the checkpoint size"),
    "clean_abandoned": check_bool,
    "abandoned_after_s": functools.partial(check_number, above=0, hint="seconds"),
    "restore_mode": functools.partial(check_choice, choices=RESTORE_MODES),
    "restore_exchange": functools.partial(check_choice, choices=RESTORE_EXCHANGES),
    "local_every_steps": functools.partial(check_int, min=0, hint="steps; 0 = local tier off"),
    "global_every_local_saves": functools.partial(
        check_int, min=1, hint="every K-th local save goes to the global tier"
    ),
    "local_dir": functools.partial(check_path, what="a directory path", none_ok=True, hint="None = $SLURM_TMPDIR"),
    "local_max_bytes": functools.partial(check_int, min=0, hint="bytes per node; 0 = no bound"),
}


@dataclass(frozen=True, kw_only=True)
class SaveCadence:
    """When the periodic saves come, by step: the one rule behind ``should_save(step)`` of both checkpointers
    (as torchtitan's ``CheckpointManager._should_save``). The Trainer asks the checkpointer and saves to the
    tier it answers; a time-based save (``every_minutes``) is agreed across ranks by the Trainer's log-interval
    collective and passed in as ``requested``, since only the Trainer holds that clock."""

    every_steps: int = 0
    """A save to the global tier every N steps (``CheckpointPolicy.every_steps``); 0 = not by step count."""
    local_every_steps: int = 0
    """A save to the local tier every N steps (``CheckpointConfig.local_every_steps``); 0 = no local tier."""

    def tier(self, step: int, *, requested: bool = False) -> tp.Optional[str]:
        """The tier to save ``step`` to (``global``, or ``auto``: local, every
        ``global_every_local_saves``-th of them also global), or None for no save. A global save wins over a
        local one at the same step: it is the one the next attempt can read on any node."""
        if requested or (self.every_steps and step % self.every_steps == 0):
            return "global"
        if self.local_every_steps and step % self.local_every_steps == 0:
            return "auto"
        return None


def check_field(owner: tp.Any, name: str, value: tp.Any) -> None:
    """Check ``value`` as ``CheckpointConfig.<name>``, named in the error as ``owner`` names its options:
    the one rule for a field, also when it is given through a shorthand (``CheckpointPolicy(keep_last=...)``)."""
    _RULES[name](owner, name, value)
