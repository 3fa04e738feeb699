"""``TieredCheckpointer``: the local + partner tier in front of the global one, with the Checkpointer's interface."""

from __future__ import annotations

import logging
import typing as tp
from pathlib import Path

from hpctrain._lustre import LustreCommands
from hpctrain.ckpt._scan import scan
from hpctrain.ckpt.checkpointer import Checkpointer, RestoreResult
from hpctrain.ckpt.config import CheckpointConfig, SaveCadence
from hpctrain.ckpt.tiers._local import LOCAL_FIELDS, LocalCheckpointer
from hpctrain.errors import HpctrainError

__all__ = ["TieredCheckpointer", "TIERS"]

log = logging.getLogger("hpctrain.ckpt")

TIERS = ("auto", "local", "global")
"""``save(tier=...)``: ``auto`` = local, every ``global_every_local_saves``-th local save then copied to the
global tier."""


class TieredCheckpointer:
    """A global :class:`Checkpointer` (``config.dir``) and, with ``config.local_every_steps``, a
    :class:`LocalCheckpointer` (node-local + partner). Call every method on every rank.

    Only the global tier is seen by retention on the shared filesystem, bundles and the ``ckpt`` tools; the
    local tier keeps its last 2 steps per node. One save is in flight at a time across both tiers."""

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        run_id: str = "",
        identity: str = "",
        lustre: tp.Optional[LustreCommands] = None,
        every_steps: int = 0,
    ) -> None:
        """As :class:`Checkpointer`'s; :meth:`should_save` adds the local tier's cadence
        (``config.local_every_steps``)."""
        self.config = config
        self.global_tier = Checkpointer(config, run_id=run_id, identity=identity, lustre=lustre)
        self.cadence = SaveCadence(every_steps=every_steps, local_every_steps=config.local_every_steps)
        self.tiers: tp.Tuple[str, ...] = ("local", "global") if config.local_every_steps else ("global",)
        """The tiers saved to: ``local`` only with ``config.local_every_steps``."""
        self.local = LocalCheckpointer(config, run_id=run_id, identity=identity) if config.local_every_steps else None
        self.rank, self.world_size, self.root = (
            self.global_tier.rank,
            self.global_tier.world_size,
            self.global_tier.root,
        )
        self._local_saves = 0
        self._force_global = False  # a drained save failed: the next auto save is a global one
        self._copying = False  # the global writer holds a copy of a local step (its failure is not the caller's)
        self.last_tier = ""
        """The tier of the last save started (``local`` or ``global``)."""

    def should_save(self, step: int, *, requested: bool = False) -> tp.Optional[str]:
        """The tier to save ``step`` to (``global`` or ``auto``), or None: :class:`SaveCadence`, the one rule."""
        return self.cadence.tier(step, requested=requested)

    def save(self, step: int, *, tier: str = "auto", blocking: bool = True, **state: tp.Any) -> tp.Optional[Path]:
        """Save ``step`` to ``tier`` (:data:`TIERS`). ``auto``: the local tier; every
        ``global_every_local_saves``-th one is then copied from its committed local files to the global tier in
        the background (one staging of the state for both). ``global``: straight to the global tier (the stop
        save: the next attempt may run on other nodes). A local save that fails (local storage full, a peer's
        copy damaged in transit) logs one line and returns None; one that was to be copied to the global tier is
        saved there directly when it fails at once (a blocking save, or before staging), else the next ``auto``
        save goes there."""
        if tier not in TIERS:
            raise HpctrainError(f"save(tier=...) must be one of {TIERS}, got {tier!r}")
        drain = False
        if tier == "auto" and self.local is not None:
            self._local_saves += 1
            drain = self._local_saves % self.config.global_every_local_saves == 0
            tier = "global" if self._force_global else "local"
        self._settle()
        if self.local is None or tier == "global":
            self._force_global = False
            self.last_tier = "global"
            return self.global_tier.save(step, blocking=blocking, **state)
        self.last_tier = "global" if drain else "local"
        if drain:  # set until the local commit hands the step over: a failure before it loses the global copy
            self.local.pending_global_copy = self._drain
        try:
            got = self.local.save(step, blocking=blocking, **state)
        except HpctrainError as exc:
            self.local.pending_global_copy = None
            self._local_failed(exc)
            if drain:  # the caller's state is still this step's: the global tier straight from it
                return self.global_tier.save(step, blocking=blocking, **state)
            return None
        if blocking and drain:
            return self._settle()
        return got

    def _drain(self, step: int, local: Path, manifest: tp.Dict[str, tp.Any]) -> None:
        """After a local commit (in the thread that made it): copy it to the global tier in the global
        checkpointer's writer thread."""
        self._copying = True
        plain = {k: v for k, v in manifest.items() if k not in LOCAL_FIELDS}  # an ordinary global manifest
        self.global_tier.save_copy(step, local, plain, blocking=False)

    def _local_failed(self, exc: BaseException) -> None:
        log.error("hpctrain.ckpt: local tier save failed, the run goes on with the global tier: %s", exc)

    def _settle(self) -> tp.Optional[Path]:
        """Finish the in-flight local save (which may hand a copy to the global tier), then the global one."""
        if self.local is not None:
            try:
                self.local.wait()
            except HpctrainError as exc:
                if (
                    self.local.pending_global_copy is not None
                ):  # a save to be copied never committed: no global copy was made
                    self._force_global = True
                self._local_failed(exc)
            finally:
                self.local.pending_global_copy = None
        try:
            return self.global_tier.wait()
        except HpctrainError as exc:
            if not self._copying:
                raise
            # the copy of a committed local step to the global tier failed on some rank (every rank raises):
            # the local step stands; the next save goes to the global tier from the model's state
            self._force_global = True
            log.error("hpctrain.ckpt: copy of a local step to the global tier failed, the next save is global: %s", exc)
            return None
        finally:
            self._copying = False

    @property
    def in_flight(self) -> bool:
        return self.global_tier.in_flight or (self.local is not None and self.local.in_flight)

    def wait(self) -> tp.Optional[Path]:
        """Finish the in-flight save (and a global copy of it); the global tier's committed dir, if one was made."""
        return self._settle()

    def abandon(self) -> bool:
        """Drop the in-flight save (and its global copy) uncommitted; True if one was dropped (preemption)."""
        dropped = self.local.abandon() if self.local is not None else False
        if self.local is not None:  # a local save dropped before its commit never hands over its copy
            self.local.pending_global_copy = None
        try:
            return self.global_tier.abandon() or dropped
        finally:
            self._copying = False

    def close(self) -> None:
        try:
            if self.local is not None:
                self.wait()
                self.local.close()
        finally:
            self.global_tier.close()

    def join_gc(self) -> None:
        self.global_tier.join_gc()

    def restore(self, **kw: tp.Any) -> tp.Optional[RestoreResult]:
        """The newest complete, verified local step newer than the newest global commit (its shards from the
        node's own copies or from partners), else the global tier as :meth:`Checkpointer.restore`. The result
        says which (``tier``) and how many steps that saved (``global_step``: the newest global commit)."""
        self.wait()
        mine = max((e.step for e in scan(self.root) if e.status == "committed"), default=-1)
        newest_global = min(self.global_tier._comm.all_gather(mine))  # committed as far as every rank sees
        if self.local is not None and kw.get("step") is None:
            got, why = self.local.restore_local(newest_global, **{k: v for k, v in kw.items() if k != "step"})
            if got is not None and why:
                log.error("hpctrain.ckpt: a newer local step was not usable: %s", why)
            if got is not None:
                got.tier = "partner" if self.local.refilled else "local"
                got.global_step = newest_global if newest_global >= 0 else None
                log.warning(
                    "hpctrain.ckpt: restored step %d from the %s tier (newest global step: %s)%s",
                    got.step,
                    got.tier,
                    newest_global if newest_global >= 0 else "none",
                    f": the shards of ranks {self.local.refilled[:8]} from their partner copies"
                    if self.local.refilled
                    else "",
                )
                return got
            if why:
                log.error("hpctrain.ckpt: local tier not usable, restoring from the global tier: %s", why)
        got = self.global_tier.restore(**kw)
        if got is not None:
            got.tier, got.global_step = "global", got.step
        return got
