"""``TieredCheckpointer``: the local + partner tier in front of the global one, with the Checkpointer's interface."""

from __future__ import annotations

import logging
import typing as tp
from pathlib import Path

from hpctrain._lustre import LustreCommands
from hpctrain.ckpt._scan import scan
from hpctrain.ckpt.checkpointer import Checkpointer, RestoreResult
from hpctrain.ckpt.config import CheckpointConfig
from hpctrain.ckpt.tiers._local import LocalCheckpointer
from hpctrain.errors import HpctrainError

__all__ = ["TieredCheckpointer", "TIERS"]

log = logging.getLogger("hpctrain.ckpt")

TIERS = ("auto", "local", "global")
"""``save(tier=...)``: ``auto`` = local, except every ``global_every``-th local save, which is global."""


class TieredCheckpointer:
    """A global :class:`Checkpointer` (``config.dir``) and, with ``config.local_every_steps``, a
    :class:`LocalCheckpointer` (node-local + partner). Call every method on every rank.

    Only the global tier is seen by retention on the shared filesystem, bundles and the ``ckpt`` tools; the
    local tier keeps its last 2 steps per node. One save is in flight at a time across both tiers."""

    tiered = True

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        run_id: str = "",
        identity: str = "",
        lustre: tp.Optional[LustreCommands] = None,
    ) -> None:
        self.config = config
        self.global_ = Checkpointer(config, run_id=run_id, identity=identity, lustre=lustre)
        self.local = LocalCheckpointer(config, run_id=run_id, identity=identity) if config.local_every_steps else None
        self.rank, self.world_size, self.root = self.global_.rank, self.global_.world_size, self.global_.root
        self._local_saves = 0
        self.last_tier = ""
        """The tier of the last save started (``local`` or ``global``)."""

    def save(self, step: int, *, tier: str = "auto", blocking: bool = True, **state: tp.Any) -> tp.Optional[Path]:
        """Save ``step`` to ``tier`` (:data:`TIERS`). A local save that fails (local storage full, a peer's copy
        damaged in transit) logs one line and returns None: the run goes on with the global tier."""
        if tier not in TIERS:
            raise HpctrainError(f"save(tier=...) must be one of {TIERS}, got {tier!r}")
        if tier == "auto" and self.local is not None:
            self._local_saves += 1
            tier = "global" if self._local_saves % self.config.global_every == 0 else "local"
        if self.local is None or tier == "global":
            self._settle_local()
            self.last_tier = "global"
            return self.global_.save(step, blocking=blocking, **state)
        self.global_.wait()
        self._settle_local()
        self.last_tier = "local"
        try:
            return self.local.save(step, blocking=blocking, **state)
        except HpctrainError as exc:
            self._local_failed(exc)
            return None

    def _local_failed(self, exc: BaseException) -> None:
        log.error("hpctrain.ckpt: local tier save failed, the run goes on with the global tier: %s", exc)

    def _settle_local(self) -> None:
        if self.local is None:
            return
        try:
            self.local.wait()
        except HpctrainError as exc:
            self._local_failed(exc)

    @property
    def in_flight(self) -> bool:
        return self.global_.in_flight or (self.local is not None and self.local.in_flight)

    def wait(self) -> tp.Optional[Path]:
        self._settle_local()
        return self.global_.wait()

    def abandon(self) -> bool:
        dropped = self.local.abandon() if self.local is not None else False
        return self.global_.abandon() or dropped

    def close(self) -> None:
        try:
            if self.local is not None:
                self._settle_local()
                self.local.close()
        finally:
            self.global_.close()

    def join_gc(self) -> None:
        self.global_.join_gc()

    def restore(self, **kw: tp.Any) -> tp.Optional[RestoreResult]:
        """The newest complete, verified local step newer than the newest global commit (its shards from the
        node's own copies or from partners), else the global tier as :meth:`Checkpointer.restore`. The result
        says which (``tier``) and how many steps that saved (``global_step``: the newest global commit)."""
        self.wait()
        mine = max((e.step for e in scan(self.root) if e.status == "committed"), default=-1)
        newest_global = min(self.global_._comm.all_gather(mine))  # committed as far as every rank sees
        if self.local is not None and kw.get("step") is None:
            got, why = self.local.restore_local(newest_global, **{k: v for k, v in kw.items() if k != "step"})
            if got is not None and why:
                log.error("hpctrain.ckpt: a newer local step was not usable: %s", why)
            if got is not None:
                got.tier, got.global_step = "local", (newest_global if newest_global >= 0 else None)
                log.warning(
                    "hpctrain.ckpt: restored step %d from the local tier (newest global step: %s)",
                    got.step,
                    newest_global if newest_global >= 0 else "none",
                )
                return got
            if why:
                log.error("hpctrain.ckpt: local tier not usable, restoring from the global tier: %s", why)
        got = self.global_.restore(**kw)
        if got is not None:
            got.tier, got.global_step = "global", got.step
        return got
