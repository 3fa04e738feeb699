"""``Checkpointer``: save (sync or async), verified restore with fallback, retention."""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import json
import logging
import marshal
import math
import mmap
import os
import socket
import threading
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hpctrain._lustre import LustreCommands
from hpctrain.ckpt._clock import PhaseClock
from hpctrain.ckpt._commit import Comm, ShardPlan, commit_save
from hpctrain.ckpt._dtensor import split_sharded
from hpctrain.ckpt._fetch import read, route, shards_read
from hpctrain.ckpt._format import (
    CheckpointFormatError,
    encode_header,
    header_json,
    quarantine_name,
    step_name,
)
from hpctrain.ckpt._index import SHARE_INLINE, Index, build_index, index_share
from hpctrain.ckpt._readahead import Readahead, readahead
from hpctrain.ckpt._restore import Plan, fill, plan, resolve_mode
from hpctrain.ckpt._scan import (
    Deleter,
    plan_retention,
    remove_dir,
    scan,
    settle_replaced,
    stale_write_files,
)
from hpctrain.ckpt._staging import Stager
from hpctrain.ckpt._state import (
    LayoutCache,
    capture_rng,
    flatten,
    layout,
    plan_offsets,
    restore_rng,
    split_replicated,
    tensor_bytes,
    unflatten,
    whole,
)
from hpctrain.ckpt._writer import Writer
from hpctrain.ckpt.config import CheckpointConfig, SaveCadence
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["CheckpointConfig", "Checkpointer", "RestoreResult"]

log = logging.getLogger("hpctrain.ckpt")

_STATE_NAMES = ("model", "optimizer", "scheduler", "scaler")


@dataclass
class RestoreResult:
    step: int
    path: Path
    data_state: tp.Any
    """The data layer's JSON state as saved (the same on every rank, whatever the world size)."""
    extra: tp.Any
    saved_world_size: int
    world_size: int
    run_id: str
    rng_restored: bool
    """False when this rank had no counterpart in the saved world (rank >= saved world size)."""
    quarantined: tp.List[int] = field(default_factory=list)
    """Newer steps that failed verification and were set aside before this one loaded."""
    committed_at: tp.Optional[float] = None
    """When this step was committed (its manifest's ``time``, Unix seconds; None if not a finite number), so
    that callers (the Trainer's ledger: progress lost by a restart) never parse manifests themselves."""
    tier: str = "global"
    """Which tier the step came from: ``global`` (``dir``) or ``local`` (node-local + partner copies,
    ``hpctrain.ckpt.tiers``)."""
    global_step: tp.Optional[int] = None
    """The newest global commit when restored from the local tier (``step - global_step``: steps the local
    tier saved from being redone); the step itself for a global restore."""
    phases: tp.Dict[str, tp.Dict[str, float]] = field(default_factory=dict)
    """Where this rank's restore() spent its time: ``{phase: {"wall_s", "cpu_s"}}``, disjoint phases that add up to
    the call (``hpctrain.ckpt.RESTORE_PHASES`` says what each covers; ``other`` is the rest). ``cpu_s`` is the
    calling thread's CPU time (``time.thread_time``), not gloo's threads'. Measured on every restore (11–17
    timed phases of ~2.5 µs each): docs/checkpoint.md, "Where a restore's time goes"."""


class Checkpointer:
    """Per-rank sharded checkpoints with a two-phase commit; call every method on every rank."""

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        run_id: str = "",
        identity: str = "",
        lustre: tp.Optional[LustreCommands] = None,
        every_steps: int = 0,
    ) -> None:
        """``identity``: the run identity (``hpctrain.identity``) every commit manifest carries, so a checkpoint
        names the code, config, data and environment that made it; ``lustre``: the ``lfs`` seam used for
        ``config.lustre_stripe`` (default: the real ``lfs``); ``every_steps``: the periodic cadence
        :meth:`should_save` answers (``CheckpointPolicy.every_steps``; 0 = saves only when asked)."""
        if config.dir is None:  # None means "the run's default", which only the Trainer knows
            raise UsageError("CheckpointConfig.dir must be a directory path for a Checkpointer, got None")
        self.config = config
        self.cadence = SaveCadence(every_steps=every_steps)
        self.run_id = run_id
        self.identity = str(identity or "")
        self.root = Path(config.dir)
        self._lustre = lustre
        self._comm = Comm(config.agreement_timeout_s, before_agreeing=self._settle)
        self.rank, self.world_size = self._comm.rank, self._comm.world
        self._writer: tp.Optional[Writer] = None
        self._stager = Stager()
        self._layouts = LayoutCache()  # the previous save's tensor metadata, reused while the state keeps its shapes
        self._trees_text: tp.Optional[tp.Tuple[bytes, str]] = None  # rank 0: (marshal of the trees, their JSON)
        self._abort = threading.Event()
        self._deleter = Deleter() if self.rank == 0 else None
        if self._deleter is not None and config.clean_abandoned:
            self._deleter.submit(self._clean_abandoned)

    def _settle(self, rank: int) -> None:
        """Rank 0, before the ranks first agree (in :class:`Comm`): a re-save that died between its renames gets its
        step back, synchronously, so every rank's later scan (a restore) sees it without a barrier of its own."""
        if rank == 0:
            settle_replaced(self.root, scan(self.root))

    def _clean_abandoned(self) -> None:
        job = (self._comm.job_id, self._comm.restart_count)
        for e in scan(self.root, read_manifests=False, older_than_s=self.config.abandoned_after_s, job=job):
            if e.status in ("abandoned", "deleting"):
                remove_dir(e.path)
        for f in stale_write_files(self.root, self.config.abandoned_after_s):
            f.unlink(missing_ok=True)

    tiers: tp.Tuple[str, ...] = ("global",)
    """The tiers this checkpointer saves to (a :class:`~hpctrain.ckpt.tiers.TieredCheckpointer` adds ``local``)."""

    def should_save(self, step: int, *, requested: bool = False) -> tp.Optional[str]:
        """The tier to save ``step`` to (``global``), or None: :class:`SaveCadence`, the one rule of "when"."""
        return self.cadence.tier(step, requested=requested)

    # ------------------------------------------------------------------ save
    def save(
        self,
        step: int,
        *,
        model: tp.Any = None,
        optimizer: tp.Any = None,
        scheduler: tp.Any = None,
        scaler: tp.Any = None,
        data_state: tp.Any = None,
        extra: tp.Any = None,
        blocking: bool = True,
        tier: str = "global",
    ) -> tp.Optional[Path]:
        """Checkpoint ``step``. Blocking: returns the committed dir. Non-blocking: returns None once the
        state is staged in host memory; the commit happens in the background (see :meth:`wait`). ``tier``:
        what :meth:`should_save` answered; this checkpointer has the global tier only (``auto`` is global)."""
        if tier not in ("global", "auto"):
            raise UsageError(f"save(tier=...) must be 'global' or 'auto' without a local tier, got {tier!r}")
        if not isinstance(step, int) or step < 0:
            raise UsageError(f"save(step=...) must be a non-negative int, got {step!r}")
        self.wait()  # at most one save in flight; a previous writer error surfaces here
        try:  # a copy: the caller may mutate its dict while an async save is in flight
            data_state = json.loads(json.dumps(data_state, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"save(data_state=...) must be JSON-serialisable: {exc}") from None

        def prepare() -> tp.Tuple[ShardPlan, tp.List[str], bool]:
            """This rank's shard as bytes to write (the header encoded, the data staged: async, copied into the
            reused host arena, pinned on a GPU; blocking, the caller waits for the commit, so large CPU tensors
            are written straight from their own memory and only the small ones are copied, coalesced into a
            few large writes), the names of the states saved, and whether any of them is sharded. Everything
            else it builds is freed when it returns."""
            states = {
                n: o.state_dict()
                for n, o in zip(_STATE_NAMES, (_unwrap(model), optimizer, scheduler, scaler))
                if o is not None
            }
            if extra is not None:
                states["extra"] = extra
            tensors: tp.Dict[str, torch.Tensor] = {}
            trees = {name: flatten(state, name, tensors) for name, state in states.items()}
            plain, sharded, sharded_bytes, sig = split_sharded(tensors, self.rank)
            lay = layout(plain, self._layouts)
            local: tp.Dict[str, torch.Tensor] = {}
            local_tree = {"rng": flatten(capture_rng(), "local/rng", local)}
            local_pieces = whole(local)
            others = sharded + local_pieces
            # the split, offsets and entries' JSON are reused while the layout repeats (work per own piece)
            shard = self._layouts.shard(lay, others, self.rank, self.world_size)
            if shard is None:  # the first save, or the keys, dtypes or shapes changed
                mine = split_replicated(lay, self.rank, self.world_size)
                entries, data_size = plan_offsets(mine + others)
                shard = self._layouts.remember(lay, mine, others, entries, data_size)
            header: tp.Dict[str, tp.Any] = {
                "rank": self.rank,
                "world_size": self.world_size,
                "step": step,
                "entries": shard.entries,
                "local": local_tree,
            }
            encoded = {"entries": shard.entries_json}
            if self.rank == 0:
                header["trees"] = trees
                encoded["trees"] = self._trees_json(trees)
            # in the caller's thread also for an async save (the entries' and trees' text are reused: what is left
            # is the RNG state), so that the header's objects are freed before the collector resumes
            header_bytes = encode_header(header, encoded)
            # blocking: CPU tensors are written straight from their memory (the caller waits for the commit, so
            # they cannot change meanwhile); async: all copied into the reused arena
            chunks = self._stager.stage(shard.pieces, shard.entries, shard.size, direct_min=0 if blocking else None)
            digest = hashlib.sha1((lay.digest + repr(sig)).encode()).hexdigest() if sig else lay.digest
            local_bytes = sum(tensor_bytes(p.tensor) for p in local_pieces) + 64 * len(shard.entries)
            total = lay.total + sharded_bytes + self.world_size * (len(header_bytes) + local_bytes)
            # a blocking save's chunks are views of the pieces' tensors: they live as long as the plan (an async
            # save's chunks are the arena's, and the caller's tensors are not held past save())
            keep = shard.pieces if blocking else None
            return ShardPlan(header_bytes, chunks, digest, total, keep=keep), sorted(trees), bool(sig)

        # Python's cyclic collector is paused while the shard is prepared (as in restore): that allocates tens
        # of thousands of objects per 4000 tensors, which set off collections of the whole heap (one every
        # other save, ~140 ms CPU a rank against a 30 ms write of 64 MiB to tmpfs). It resumes once they are
        # freed (prepare's frame is gone), so that they are never traversed, only counted and uncounted
        with _gc_paused():
            plan, names, sharded = prepare()
        manifest_extra = {
            "format_version": 2 if sharded else 1,  # 1 when nothing is sharded: older hpctrain reads it
            "run_id": self.run_id,
            "identity": self.identity,
            "data_state": data_state,
            "time": time.time(),
            "entries": names,
            "host": socket.gethostname(),
            "job_id": self._comm.job_id,
        }
        if blocking:
            return self._commit(step, plan, manifest_extra)
        if self._writer is None:
            self._writer = Writer()
        self._abort.clear()
        self._writer.submit(lambda: self._commit(step, plan, manifest_extra))
        return None

    def _trees_json(self, trees: tp.Dict[str, tp.Any]) -> str:
        """Rank 0's state trees as the header's JSON text, reused while the trees are those of the previous save.

        "The same" is decided on ``marshal``'s bytes of the trees (a tenth of the JSON encoding's cost): marshal
        writes every value with its type (1, 1.0 and True, 0.0 and -0.0 differ, where ``==`` calls them equal), so
        equal bytes mean trees that encode to the same JSON; bytes that differ for equal trees (marshal also
        records which objects are shared) only cost a fresh encoding. A leaf marshal cannot write (an ``int`` or
        ``str`` subclass) means no reuse. Only bytes are kept, never the state."""
        try:
            key = marshal.dumps(trees)
        except ValueError:
            self._trees_text = None
            return header_json(trees)
        if self._trees_text is None or key != self._trees_text[0]:
            self._trees_text = (key, header_json(trees))
        return self._trees_text[1]

    def _commit(self, step: int, plan: ShardPlan, manifest_extra: tp.Dict[str, tp.Any]) -> Path:
        cfg = self.config
        final = commit_save(
            self._comm,
            self.root,
            step,
            plan,
            manifest_extra,
            stripe=cfg.lustre_stripe,
            lustre=self._lustre,
            check_free_space=cfg.check_free_space,
            space_margin=cfg.free_space_margin,
            aborted=self._abort.is_set,
            defer=None if self._deleter is None else self._deleter.submit,
        )
        if self._deleter is not None:
            self._deleter.submit(self._retain)  # planned and done in the background: never delays a save
        return final

    def save_copy(
        self, step: int, source: Path, manifest: tp.Dict[str, tp.Any], *, blocking: bool = True
    ) -> tp.Optional[Path]:
        """Commit ``step`` as a copy of a committed step elsewhere: this rank's shard file in ``source`` (the
        local tier's ``step-N``), whose ``manifest`` gives its size and crc32, goes through the same two-phase
        commit as :meth:`save` (the bytes are copied, never re-staged from the model; a copy whose crc32 differs
        from the manifest's is refused on every rank). Non-blocking: the copy and the commit run in the
        background writer (see :meth:`wait`)."""
        self.wait()
        shards = {int(sh["rank"]): sh for sh in manifest["shards"]}
        if int(manifest.get("world_size", -1)) != self.world_size or set(shards) != set(range(self.world_size)):
            raise HpctrainError(f"save_copy: {source} holds a save of another world size than {self.world_size}")
        mine = shards[self.rank]
        # the same on every rank (every node's manifest lists the same shards): the agreement's layout field
        digest = hashlib.sha1(json.dumps([manifest["shards"], manifest.get("entries")]).encode()).hexdigest()
        total = sum(int(sh["bytes"]) for sh in manifest["shards"])
        own = {"format", "step", "world_size", "shards", "torch"}  # written anew by the commit
        extra = {k: v for k, v in manifest.items() if k not in own}

        def job() -> Path:
            mm, chunks, expect = None, [], -1
            try:
                with open(source / mine["file"], "rb") as f:
                    if os.fstat(f.fileno()).st_size != int(mine["bytes"]):
                        raise OSError(f"{source / mine['file']} is not {mine['bytes']} bytes")
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the page cache's bytes, no copy
                chunks, expect = [(0, memoryview(mm))], int(mine["crc32"])
            except OSError as exc:  # still take part: an empty copy fails its checksum, every rank refuses together
                log.error("hpctrain.ckpt: rank %d cannot read its copy of step %d: %s", self.rank, step, exc)
            try:
                return self._commit(step, ShardPlan(b"", chunks, digest, total, expect_crc=expect), extra)
            finally:
                chunks.clear()
                try:
                    if mm is not None:
                        mm.close()
                except BufferError:  # a view still referenced: the map goes with it
                    pass

        if blocking:
            return job()
        if self._writer is None:
            self._writer = Writer()
        self._abort.clear()
        self._writer.submit(job)
        return None

    def _retain(self) -> None:
        entries = scan(self.root)
        for e in plan_retention(entries, self.config.keep_last, self.config.keep_every):
            remove_dir(e.path)
        settle_replaced(self.root, entries)  # a re-saved step's previous copy, once the new one is committed

    @property
    def in_flight(self) -> bool:
        return self._writer is not None and self._writer.busy

    def wait(self) -> tp.Optional[Path]:
        """Finish the in-flight async save (if any); return its committed dir or raise its error."""
        if self._writer is None:
            return None
        return tp.cast(tp.Optional[Path], self._writer.wait())

    def abandon(self) -> bool:
        """Drop the in-flight async save uncommitted (preemption path); True if one was dropped.

        Every rank must call it. A save already past the agreement may still commit (then False).
        """
        if self._writer is None or not self._writer.busy:
            return False
        self._abort.set()
        try:
            self._writer.wait()
            return False
        except HpctrainError as exc:
            log.warning("hpctrain.ckpt: in-flight save abandoned: %s", exc)
            return True
        finally:
            self._abort.clear()

    def close(self) -> None:
        """Finish the in-flight save (raising its error), stop the background threads."""
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self._deleter is not None:
                self._deleter.close()
                self._deleter = None
            self._stager.release()

    def join_gc(self) -> None:
        """Wait for background deletions queued so far (tests, end of job)."""
        if self._deleter is not None:
            self._deleter.join()

    # --------------------------------------------------------------- restore
    def restore(
        self,
        *,
        model: tp.Any = None,
        optimizer: tp.Any = None,
        scheduler: tp.Any = None,
        scaler: tp.Any = None,
        step: tp.Optional[int] = None,
        map_location: tp.Union[str, torch.device] = "cpu",
        strict: bool = True,
        restore_rng: bool = True,
    ) -> tp.Optional[RestoreResult]:
        """Load the newest committed step that every rank sees and that verifies; None when there is none.

        A step that fails verification is quarantined (renamed, kept) on all ranks together and the
        previous committed step is tried. ``step=`` loads exactly that step (no fallback).

        Python's cyclic garbage collector is paused meanwhile: parsing the headers of thousands of tensors
        allocates objects fast enough to trigger collections of the whole heap (a quarter of a restore's time,
        4000 tensors on one process); what a restore allocates is freed by reference counting or later.
        """
        clock = PhaseClock()
        with _gc_paused():
            return self._restore(model, optimizer, scheduler, scaler, step, map_location, strict, restore_rng, clock)

    def _restore(
        self,
        model: tp.Any,
        optimizer: tp.Any,
        scheduler: tp.Any,
        scaler: tp.Any,
        step: tp.Optional[int],
        map_location: tp.Union[str, torch.device],
        strict: bool,
        restore_rng: bool,
        clock: PhaseClock,
    ) -> tp.Optional[RestoreResult]:
        self.wait()  # rank 0 settled interrupted re-saves before the constructor's agreement (Comm): no barrier here
        mine = sorted((e.step for e in scan(self.root) if e.status == "committed"), reverse=True)
        # the usual case, every rank seeing the same steps, takes no collective of its own: 128 bits of a digest of
        # the list travel with the exchange of the first candidate's index (each rank its share of the headers,
        # build_index), not a gather of the lists; lists that differ are then gathered, and the index exchanged anew
        digest = hashlib.sha256(repr(mine).encode()).digest()
        words = [int.from_bytes(digest[i : i + 8], "little", signed=True) for i in (0, 8)]
        first = (mine[0] if mine else None) if step is None else (step if step in mine else None)
        gathered: tp.Dict[int, tp.Tuple[tp.List[tp.Any], tp.Any]] = {}  # a step's exchanged index and our manifest
        via = route(self.config.restore_exchange, self._comm)
        mode = resolve_mode(self.config.restore_mode, self._comm.hosts, node=via.node)
        ahead: tp.Dict[int, Readahead] = {}  # the first candidate's files, read ahead once its headers are parsed
        if self.world_size == 1:
            common = mine
        else:
            if self._index_waits_for_files():  # the headers may arrive in _before_read: no index before the agreement
                with clock("index_exchange"):
                    got = self._comm.all_gather_ints(words)
            else:
                with clock("index"):
                    message, manifest = (
                        index_share(self.root / step_name(first), self.rank, self.world_size)
                        if first is not None
                        else (None, None)
                    )
                    if first is not None and manifest is not None:  # the disk streams while the index is built
                        ahead[first] = readahead(
                            self.root / step_name(first), manifest, self.rank, self.world_size, mode
                        )
                with clock("index_exchange"):
                    got, shares = self._comm.all_gather_with(
                        words, (first, message), inline=SHARE_INLINE, compress=True
                    )
                if first is not None and all(f == first for f, _ in shares):
                    gathered = {first: ([sh for _, sh in shares], manifest)}
            if all(w == got[0] for w in got):
                common = mine
            else:
                gathered = {}
                with clock("index_exchange"):
                    seen = self._comm.all_gather(mine)
                common = sorted(set(seen[0]).intersection(*map(set, seen[1:])), reverse=True)
        if step is not None:
            if step not in common:
                raise HpctrainError(
                    f"step {step} is not a committed checkpoint in {self.root} on every rank; committed: {common[:10]}"
                )
            common = [step]
        for k in [k for k in ahead if k not in common]:  # the ranks differ in their steps: not this one
            ahead.pop(k).stop()
        quarantined: tp.List[int] = []
        targets = [
            (n, o) for n, o in zip(_STATE_NAMES, (_unwrap(model), optimizer, scheduler, scaler)) if o is not None
        ]

        def exchange(message: tp.Any) -> tp.List[tp.Any]:
            with clock("index_exchange"):
                return self._exchange_index(message)

        # the index exchange when it did not ride with the agreement above: the same rows, compressed
        share = (self.rank, self.world_size, exchange) if self.world_size > 1 else None
        for s in common:
            path = self.root / step_name(s)
            with clock("fetch"):
                self._before_read(path, None)
            hint = ahead.pop(s, None) or readahead(path, None, self.rank, self.world_size, mode)
            try:
                index: tp.Optional[Index] = None
                try:
                    with clock("index"):
                        index, err = build_index(path, share=share, gathered=gathered.pop(s, None)), ""
                except CheckpointFormatError as exc:
                    err = f"rank {self.rank}: {exc}"
                except Exception as exc:  # noqa: BLE001 - damage of any kind quarantines the step, never escapes raw
                    err = f"rank {self.rank}: {path.name}: {type(exc).__name__}: {exc}"
                p: tp.Optional[Plan] = None
                misfit: tp.Optional[Exception] = None
                with clock("plan"):
                    if index is not None:
                        try:  # metadata only: a checkpoint that does not fit the objects fails here, nothing read
                            p = plan(index, s, targets, strict, self.rank)
                        except Exception as exc:  # noqa: BLE001 - never raise before the agreement: the others wait in it
                            misfit = exc
                    # one small collective agrees on both: the index (damage: quarantine; it may be found on some ranks
                    # only, and what the others planned from it is then disregarded) and, on an undamaged step, the plan
                    # (a misfit, the same on every rank: raise)
                    ok = self._comm.all_gather_ints([0 if err else 1, 0 if misfit else 1])
                    errors = [] if all(o[0] for o in ok) else [e for e in self._comm.all_gather(err) if e]
                if not errors:
                    if not all(o[1] for o in ok):
                        said = [e for e in self._comm.all_gather(str(misfit) if misfit else "") if e]
                        if misfit is not None and not isinstance(misfit, HpctrainError):
                            raise misfit
                        raise HpctrainError(said[0])
                    assert index is not None and p is not None
                    with clock("plan"):
                        needed = shards_read(index, p, self.rank, self.world_size, mode=mode)
                    with clock("fetch"):
                        self._before_read(path, needed)
                    with clock("read"):
                        tensors, errors = read(
                            index, p, self._comm, mode=mode, verify=self.config.verify_checksums, route=via, clock=clock
                        )
                    if not errors:
                        with clock("load"):
                            result = self._apply(
                                s, path, index, p, tensors, quarantined, targets, map_location, strict, restore_rng
                            )
                        result.phases = clock.result()
                        return result
                log.error(
                    "hpctrain.ckpt: CHECKPOINT STEP %d IS CORRUPT, quarantining it and falling back: %s", s, errors[0]
                )
                if self.rank == 0:
                    stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
                    try:
                        os.rename(path, self.root / quarantine_name(s, stamp))
                    except OSError as exc:
                        log.error("hpctrain.ckpt: could not quarantine %s: %s", path, exc)
                quarantined.append(s)
                if step is not None:
                    raise HpctrainError(f"checkpoint step {s} failed verification and was quarantined: {errors[0]}")
            finally:
                hint.stop()  # the hint's thread ends with the step it read ahead
        self._comm.all_gather_ints([0])  # everyone is past the quarantine renames
        if quarantined:
            log.error("hpctrain.ckpt: no loadable checkpoint left in %s (quarantined: %s)", self.root, quarantined)
        return None

    def _index_waits_for_files(self) -> bool:
        """Whether :meth:`_before_read` may bring this restore shard files (a collective): then the ranks agree on
        the step before any of them parses a header. Never here; the local tier's restore from partner copies."""
        return False

    def _before_read(self, path: Path, shards: tp.Optional[tp.Set[int]]) -> None:
        """Called on every rank before a restore opens the shard files of ``path``: ``shards``, the ones this rank
        reads, or None before the index (the headers it parses). Nothing to do here; the local tier
        (:mod:`hpctrain.ckpt.tiers`) brings a node the shards it lacks from other nodes."""

    def _agree(self, err: str) -> tp.List[str]:
        """Every rank's error ([] when none failed): one small collective, a second only on failure."""
        ok = self._comm.all_gather_ints([0 if err else 1])
        return [] if all(o[0] for o in ok) else [e for e in self._comm.all_gather(err) if e]

    def _exchange_index(self, message: tp.Any) -> tp.List[tp.Any]:
        """Every rank's :func:`index_share` message, as the first candidate's exchange sends it (compressed rows of
        ``SHARE_INLINE`` bytes): for a step tried after a fallback or once its headers arrived."""
        return self._comm.all_gather(message, SHARE_INLINE, compress=True)

    def _apply(
        self,
        s: int,
        path: Path,
        index: Index,
        p: Plan,
        tensors: tp.Dict[str, tp.Any],
        quarantined: tp.List[int],
        targets: tp.List[tp.Tuple[str, tp.Any]],
        map_location: tp.Any,
        strict: bool,
        rng: bool,
    ) -> RestoreResult:
        """Load what was read (and checked against the objects by ``plan``) into the caller's objects, all or
        nothing: a load_state_dict that still fails puts back what the earlier ones changed."""
        manifest = index.manifest
        states = {name: fill(p.skeletons[name], tensors) for name, _ in targets}
        extra = None
        if "extra" in p.skeletons:
            extra = fill(
                p.skeletons["extra"], {k: v.to(map_location) for k, v in tensors.items() if k.startswith("extra")}
            )
        # The scheduler and scaler (small; their load_state_dict may change them before it fails) first, with
        # a copy of their state to put back; then the optimizer (torch checks its state dict before changing
        # anything; its previous state tensors are kept, not copied, to put back); the model last.
        order = {"scheduler": 0, "scaler": 1, "optimizer": 2, "model": 3}
        undo: tp.List[tp.Tuple[tp.Any, tp.Any, tp.Any]] = []
        for name, obj in sorted(targets, key=lambda t: order[t[0]]):
            try:
                if name in ("scheduler", "scaler"):  # attributes (a load may add some) and state (some change in place)
                    undo.append((obj, copy.copy(getattr(obj, "__dict__", None)), copy.deepcopy(obj.state_dict())))
                elif name == "optimizer":
                    undo.append((obj, None, obj.state_dict()))
                obj.load_state_dict(states[name], strict=strict) if name == "model" else obj.load_state_dict(
                    states[name]
                )
            except Exception as exc:  # noqa: BLE001 - whatever a load_state_dict raises, one clear error
                for done, attrs, before in undo:
                    with contextlib.suppress(Exception):
                        if attrs is not None:
                            done.__dict__.clear()
                            done.__dict__.update(attrs)
                        done.load_state_dict(before)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise HpctrainError(
                    f"checkpoint step {s} does not fit the {name} passed to restore(): {first}"
                ) from exc
        local_tree = index.local_trees[self.rank] if self.rank < len(index.shards) else None
        rng_restored = False
        if rng and local_tree is not None and "rng" in local_tree:
            skipped = restore_rng(unflatten(local_tree["rng"], tensors))
            rng_restored = not skipped
            for what in skipped:
                log.warning("hpctrain.ckpt: RNG state not restored: %s", what)
        elif rng:
            log.warning(
                "hpctrain.ckpt: rank %d has no saved RNG state (saved with %d ranks); RNG left as is",
                self.rank,
                manifest["world_size"],
            )
        if quarantined:
            self._comm.all_gather_ints([0])  # quarantine renames (rank 0) are done before anyone returns
        return RestoreResult(
            step=s,
            path=path,
            data_state=manifest.get("data_state"),
            extra=extra,
            saved_world_size=manifest["world_size"],
            world_size=self.world_size,
            run_id=manifest.get("run_id", ""),
            rng_restored=rng_restored,
            quarantined=quarantined,
            committed_at=_finite(manifest.get("time")),
        )


@contextlib.contextmanager
def _gc_paused() -> tp.Iterator[None]:
    """The cyclic collector off for a save's planning or a restore, and back on after without the scan it deferred.

    What the pause allocated and still holds (a first save's layout and entries: thousands of containers) leaves
    the youngest generation's count far over its threshold, so the first allocation after ``gc.enable()`` would
    scan all of it, inside the caller's save: ~3 ms of CPU on the rank holding 3000 small tensors, ~4 % of a
    tmpfs save's wall time (docs/checkpoint.md). ``freeze()`` + ``unfreeze()`` moves every tracked object to the
    oldest generation instead (two list splices; the counts restart at 0): anything in it that is cyclic garbage
    goes at the next full collection. Skipped when the process froze objects itself (``gc.freeze()`` before
    forking workers): ``unfreeze()`` would thaw those too."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _finite(value: tp.Any) -> tp.Optional[float]:
    """A manifest number as a float, None when it is not a finite number (a damaged or older manifest)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _unwrap(model: tp.Any) -> tp.Any:
    """A DDP wrapper's module: its state is saved and restored without the ``module.`` prefix, so that the
    same checkpoint loads into the bare model, DDP or FSDP2 (which keeps the parameter names)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
