"""``Checkpointer``: save (sync or async), verified restore with fallback, retention."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import json
import logging
import os
import socket
import threading
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hpctrain._lustre import LustreCommands
from hpctrain.ckpt._commit import Comm, ShardPlan, commit_save
from hpctrain.ckpt._format import (
    DTYPE_SIZES,
    MAGIC,
    SMALL_PIECE_BYTES,
    CheckpointFormatError,
    crc32,
    encode_header,
    quarantine_name,
    step_name,
)
from hpctrain.ckpt._reader import Index, StoredTensor, build_index
from hpctrain.ckpt._scan import (
    ABANDONED_AFTER_S,
    Deleter,
    plan_retention,
    remove_dir,
    scan,
    settle_replaced,
    stale_write_files,
)
from hpctrain.ckpt._staging import Stager
from hpctrain.ckpt._state import (
    DTYPES,
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
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["CheckpointConfig", "Checkpointer", "RestoreResult"]

log = logging.getLogger("hpctrain.ckpt")

_STATE_NAMES = ("model", "optimizer", "scheduler", "scaler")


@dataclass(kw_only=True, frozen=True)
class CheckpointConfig:
    dir: tp.Union[str, os.PathLike]
    """Directory holding one sub-directory per committed step (on the shared filesystem)."""
    keep_last: int = 3
    """Keep the newest K committed checkpoints (0 = keep all). Incomplete ones never count."""
    keep_every: int = 0
    """Also keep every checkpoint whose step is a multiple of N (0 = off)."""
    verify_checksums: bool = True
    """On restore, check the crc32 of every shard (each rank checks 1/world of them). Sizes are always checked."""
    agreement_timeout_s: float = 600.0
    """Timeout of the control collectives (gloo) of the commit protocol and restore."""
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

    def __post_init__(self) -> None:
        if not str(self.dir):
            raise UsageError("CheckpointConfig.dir must be a directory path")
        if self.keep_last < 0:
            raise UsageError(f"CheckpointConfig.keep_last must be >= 0 (0 keeps all), got {self.keep_last}")
        if self.keep_every < 0:
            raise UsageError(f"CheckpointConfig.keep_every must be >= 0 (0 = off), got {self.keep_every}")
        if not self.agreement_timeout_s > 0:
            raise UsageError(f"CheckpointConfig.agreement_timeout_s must be > 0, got {self.agreement_timeout_s}")
        if not self.abandoned_after_s > 0:
            raise UsageError(f"CheckpointConfig.abandoned_after_s must be > 0, got {self.abandoned_after_s}")
        if self.free_space_margin < 1.0:
            raise UsageError(f"CheckpointConfig.free_space_margin must be >= 1.0, got {self.free_space_margin}")
        if isinstance(self.lustre_stripe, str) or not all(isinstance(a, str) for a in self.lustre_stripe):
            raise UsageError(
                "CheckpointConfig.lustre_stripe must be a tuple of lfs setstripe arguments, e.g. ('-c', '-1')"
            )


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


class Checkpointer:
    """Per-rank sharded checkpoints with a two-phase commit; call every method on every rank."""

    def __init__(
        self, config: CheckpointConfig, *, run_id: str = "", lustre: tp.Optional[LustreCommands] = None
    ) -> None:
        """``lustre``: the ``lfs`` seam used for ``config.lustre_stripe`` (default: the real ``lfs``)."""
        self.config = config
        self.run_id = run_id
        self.root = Path(config.dir)
        self._lustre = lustre
        self._comm = Comm(config.agreement_timeout_s)
        self.rank, self.world_size = self._comm.rank, self._comm.world
        self._writer: tp.Optional[Writer] = None
        self._stager = Stager()
        self._abort = threading.Event()
        self._deleter = Deleter() if self.rank == 0 else None
        if self._deleter is not None:
            # synchronous: a re-save that died between its renames gets its step back before any restore
            # (restore starts with a barrier, so the other ranks scan after this)
            settle_replaced(self.root, scan(self.root))
            if config.clean_abandoned:
                self._deleter.submit(self._clean_abandoned)

    def _clean_abandoned(self) -> None:
        job = (self._comm.job_id, self._comm.restart_count)
        for e in scan(self.root, read_manifests=False, older_than_s=self.config.abandoned_after_s, job=job):
            if e.status in ("abandoned", "deleting"):
                remove_dir(e.path)
        for f in stale_write_files(self.root, self.config.abandoned_after_s):
            f.unlink(missing_ok=True)

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
    ) -> tp.Optional[Path]:
        """Checkpoint ``step``. Blocking: returns the committed dir. Non-blocking: returns None once the
        state is staged in host memory; the commit happens in the background (see :meth:`wait`)."""
        if not isinstance(step, int) or step < 0:
            raise UsageError(f"save(step=...) must be a non-negative int, got {step!r}")
        self.wait()  # at most one save in flight; a previous writer error surfaces here
        try:  # a copy: the caller may mutate its dict while an async save is in flight
            data_state = json.loads(json.dumps(data_state, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"save(data_state=...) must be JSON-serialisable: {exc}") from None
        states = {
            n: o.state_dict() for n, o in zip(_STATE_NAMES, (model, optimizer, scheduler, scaler)) if o is not None
        }
        if extra is not None:
            states["extra"] = extra
        tensors: tp.Dict[str, torch.Tensor] = {}
        trees = {name: flatten(state, name, tensors) for name, state in states.items()}
        lay = layout(tensors)
        pieces = split_replicated(lay, self.rank, self.world_size)
        local: tp.Dict[str, torch.Tensor] = {}
        local_tree = {"rng": flatten(capture_rng(), "local/rng", local)}
        local_pieces = whole(local)
        pieces += local_pieces
        entries, data_size = plan_offsets(pieces)
        header: tp.Dict[str, tp.Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "step": step,
            "entries": entries,
            "local": local_tree,
        }
        if self.rank == 0:
            header["trees"] = trees
        header_bytes = encode_header(header)
        total = lay.total + self.world_size * (
            len(header_bytes) + sum(tensor_bytes(p.tensor) for p in local_pieces) + 64 * len(entries)
        )
        # async: copy everything into the reused host arena (pinned on a GPU) and return right after the
        # copy; blocking: the caller waits for the commit, so large CPU tensors are written straight from
        # their own memory and only the small ones are copied (coalesced into a few large writes)
        chunks = self._stager.stage(pieces, entries, data_size, direct_min=SMALL_PIECE_BYTES if blocking else None)
        plan = ShardPlan(header_bytes, chunks, lay.digest, total)
        manifest_extra = {
            "run_id": self.run_id,
            "data_state": data_state,
            "time": time.time(),
            "entries": sorted(trees),
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
        )
        if self._deleter is not None:
            self._deleter.submit(self._retain)  # planned and done in the background: never delays a save
        return final

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
        """
        self.wait()
        self._comm.all_gather_ints([0])  # rank 0 has settled interrupted re-saves (in __init__) before anyone scans
        mine = sorted((e.step for e in scan(self.root) if e.status == "committed"), reverse=True)
        seen = self._comm.all_gather(mine)
        common = sorted(set(seen[0]).intersection(*map(set, seen[1:])), reverse=True)
        if step is not None:
            if step not in common:
                raise HpctrainError(
                    f"step {step} is not a committed checkpoint in {self.root} on every rank; committed: {common[:10]}"
                )
            common = [step]
        quarantined: tp.List[int] = []
        for s in common:
            path = self.root / step_name(s)
            try:
                loaded, err = self._load(path), ""
            except CheckpointFormatError as exc:
                loaded, err = None, f"rank {self.rank}: {exc}"
            except Exception as exc:  # noqa: BLE001 - damage of any kind quarantines the step, never escapes raw
                loaded, err = None, f"rank {self.rank}: {path.name}: {type(exc).__name__}: {exc}"
            ok = self._comm.all_gather_ints([0 if err else 1])
            errors = [] if all(o[0] for o in ok) else [e for e in self._comm.all_gather(err) if e]
            if not errors:
                assert loaded is not None
                return self._apply(
                    s, path, loaded, quarantined, model, optimizer, scheduler, scaler, map_location, strict, restore_rng
                )
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
        self._comm.all_gather_ints([0])  # everyone is past the quarantine renames
        if quarantined:
            log.error("hpctrain.ckpt: no loadable checkpoint left in %s (quarantined: %s)", self.root, quarantined)
        return None

    def _load(self, path: Path) -> tp.Tuple[Index, tp.Dict[str, torch.Tensor], tp.Any]:
        """Read and check every shard into fresh memory (the caller's objects are not touched).

        The index (manifest, sizes, headers, piece tiling, trees) is the one ``ckpt verify`` builds.
        Tensors come back as views into the read buffers, except tensors split across shards, whose
        pieces are read straight into one tensor (no assembly copy). This rank checks the crc32 of
        1/world of the shards."""
        index = build_index(path)
        n = len(index.shards)
        stored: tp.Dict[str, StoredTensor] = dict(index.tensors)
        if self.rank < n:
            stored.update(index.local[self.rank])  # this rank's own RNG state, not the others'
        # tensors stored in several pieces get their final memory now; reads land there directly
        split = {k: torch.empty(t.numel, dtype=DTYPES[t.dtype]) for k, t in stored.items() if len(t.pieces) > 1}
        direct: tp.List[tp.List[tp.Tuple[int, memoryview]]] = [[] for _ in range(n)]
        for k, out in split.items():
            base, es = out.data_ptr(), out.element_size()
            for p in stored[k].pieces:
                if p.nbytes:
                    view = memoryview((ctypes.c_char * p.nbytes).from_address(base + p.start * es)).cast("B")
                    direct[p.shard].append((p.pos, view))
        bufs: tp.List[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * n
        for k in range(n):  # rank r starts at shard r: the ranks read different files in parallel
            i = (self.rank + k) % n
            s = index.shards[i]
            buf = torch.empty(s["bytes"], dtype=torch.uint8)  # pages under direct-read holes are never touched
            whole = memoryview(buf.numpy())
            segments: tp.List[memoryview] = []
            pos = 0
            for off, dst in sorted(direct[i], key=lambda d: d[0]):
                segments += [whole[pos:off], dst]
                pos = off + dst.nbytes
            segments.append(whole[pos:])
            crc = 0
            check = self.config.verify_checksums and i % self.world_size == self.rank % n
            with index.open_shard(i) as f:
                try:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                except (OSError, AttributeError):  # a hint only (not every kernel/sandbox has it)
                    pass
                for seg in segments:
                    _read_exact(f, seg, f"{path.name}/{s['file']}")
                    if check:
                        crc = crc32(seg, crc)
                if f.read(1):
                    raise CheckpointFormatError(f"{path.name}/{s['file']}: grew while reading")
            if check and crc != s["crc32"]:
                raise CheckpointFormatError(f"{path.name}/{s['file']}: checksum mismatch (corrupted shard)")
            if bytes(whole[: len(MAGIC)]) != MAGIC:
                raise CheckpointFormatError(f"{path.name}/{s['file']}: not an hpctrain shard (changed while reading?)")
            bufs[i] = buf
        tensors: tp.Dict[str, torch.Tensor] = {}
        typed: tp.Dict[tp.Tuple[int, str], torch.Tensor] = {}
        for key, t in stored.items():
            if key in split:
                tensors[key] = split[key].view(t.shape)
                continue
            p = t.pieces[0]
            tv = typed.get((p.shard, t.dtype))
            if tv is None:  # one typed view per shard and dtype (offsets are 64-byte aligned)
                es = DTYPE_SIZES[t.dtype]
                buf = bufs[p.shard]
                tv = typed[(p.shard, t.dtype)] = buf[: buf.numel() // es * es].view(DTYPES[t.dtype])
            strides, acc = [], 1
            for d in reversed(t.shape):
                strides.append(acc)
                acc *= max(d, 1)
            tensors[key] = torch.as_strided(
                tv, t.shape, strides[::-1], tv.storage_offset() + p.pos // tv.element_size()
            )
        return index, tensors, index.local_trees[self.rank] if self.rank < n else None

    def _apply(
        self,
        s: int,
        path: Path,
        loaded: tp.Any,
        quarantined: tp.List[int],
        model: tp.Any,
        optimizer: tp.Any,
        scheduler: tp.Any,
        scaler: tp.Any,
        map_location: tp.Any,
        strict: bool,
        rng: bool,
    ) -> RestoreResult:
        """Check what was loaded against the caller's objects, then load it into them: the model last, after
        its keys, shapes and dtypes were checked, so that a checkpoint that does not fit changes nothing in it."""
        index, tensors, local_tree = loaded
        trees, manifest = index.trees, index.manifest
        targets = [(n, o) for n, o in zip(_STATE_NAMES, (model, optimizer, scheduler, scaler)) if o is not None]
        for name, _ in targets:
            if name not in trees:
                raise HpctrainError(f"checkpoint step {s} holds no {name} state (it has: {', '.join(sorted(trees))})")
        states = {name: unflatten(trees[name], tensors) for name, _ in targets}  # trees were checked by the index
        if model is not None:
            _check_fits_model(s, model, states["model"], strict)
        extra = None
        if "extra" in trees:
            extra = unflatten(
                trees["extra"], {k: v.to(map_location) for k, v in tensors.items() if k.startswith("extra")}
            )
        # All or nothing: the scheduler and scaler (small; their load_state_dict may change them before it
        # fails) first, with a copy of their state to put back; then the optimizer (torch checks its state
        # dict before changing anything); the model last (checked above).
        order = {"scheduler": 0, "scaler": 1, "optimizer": 2, "model": 3}
        undo: tp.List[tp.Tuple[tp.Any, tp.Any, tp.Any]] = []
        for name, obj in sorted(targets, key=lambda t: order[t[0]]):
            try:
                if name in ("scheduler", "scaler"):  # attributes (a load may add some) and state (some change in place)
                    undo.append((obj, copy.copy(getattr(obj, "__dict__", None)), copy.deepcopy(obj.state_dict())))
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
        )


def _check_fits_model(step: int, model: tp.Any, state: tp.Any, strict: bool) -> None:
    """The saved model state has the keys (when strict), shapes and dtype kinds of ``model.state_dict()``:
    ``load_state_dict`` copies tensor by tensor, so a mismatch found there would leave the model half loaded."""
    target = model.state_dict()
    where = f"checkpoint step {step} does not fit the model passed to restore()"
    if not isinstance(state, dict):
        raise HpctrainError(f"{where}: the saved model state is a {type(state).__name__}, not a dict")
    if strict:
        missing = [k for k in target if k not in state]
        unexpected = [k for k in state if k not in target]
        if missing or unexpected:
            raise HpctrainError(
                f"{where}: missing keys {missing[:3]}, unexpected keys {unexpected[:3]} (pass strict=False to allow)"
            )
    for key, want in target.items():
        got = state.get(key)
        if not isinstance(want, torch.Tensor) or got is None:
            continue
        if not isinstance(got, torch.Tensor):
            raise HpctrainError(f"{where}: {key} is saved as a {type(got).__name__}, not a tensor")
        if got.shape != want.shape:
            raise HpctrainError(f"{where}: {key} has shape {list(got.shape)} saved, {list(want.shape)} in the model")
        if got.dtype != want.dtype and not (got.dtype.is_floating_point and want.dtype.is_floating_point):
            raise HpctrainError(f"{where}: {key} is {got.dtype} saved, {want.dtype} in the model")


def _read_exact(f: tp.BinaryIO, view: memoryview, name: str) -> None:
    got = 0
    while got < view.nbytes:
        n = f.readinto(view[got:])
        if not n:
            raise CheckpointFormatError(f"{name}: truncated while reading")
        got += n
