"""``Checkpointer``: save (sync or async), verified restore with fallback, retention."""

from __future__ import annotations

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

from hpctrain.ckpt._async import DIRECT_MIN_BYTES, Stager, Writer
from hpctrain.ckpt._commit import Comm, ShardPlan, commit_save
from hpctrain.ckpt._format import (
    DTYPE_SIZES,
    MAGIC,
    CheckpointFormatError,
    crc32,
    encode_header,
    quarantine_name,
    read_header,
    read_manifest,
    step_name,
)
from hpctrain.ckpt._scan import Deleter, plan_retention, remove_dir, scan
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
    """At startup, delete temporary directories of earlier interrupted saves (in the background, rank 0)."""

    def __post_init__(self) -> None:
        if not str(self.dir):
            raise UsageError("CheckpointConfig.dir must be a directory path")
        if self.keep_last < 0:
            raise UsageError(f"CheckpointConfig.keep_last must be >= 0 (0 keeps all), got {self.keep_last}")
        if self.keep_every < 0:
            raise UsageError(f"CheckpointConfig.keep_every must be >= 0 (0 = off), got {self.keep_every}")
        if not self.agreement_timeout_s > 0:
            raise UsageError(f"CheckpointConfig.agreement_timeout_s must be > 0, got {self.agreement_timeout_s}")
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

    def __init__(self, config: CheckpointConfig, *, run_id: str = "") -> None:
        self.config = config
        self.run_id = run_id
        self.root = Path(config.dir)
        self._comm = Comm(config.agreement_timeout_s)
        self.rank, self.world_size = self._comm.rank, self._comm.world
        self._writer: tp.Optional[Writer] = None
        self._stager = Stager()
        self._abort = threading.Event()
        self._deleter = Deleter() if self.rank == 0 else None
        if self._deleter is not None and config.clean_abandoned:
            for e in scan(self.root, read_manifests=False):
                if e.status in ("abandoned", "deleting"):
                    self._deleter.submit(e.path)

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
        chunks = self._stager.stage(pieces, entries, data_size, direct_min=DIRECT_MIN_BYTES if blocking else None)
        plan = ShardPlan(header_bytes, chunks, lay.digest, total)
        manifest_extra = {
            "run_id": self.run_id,
            "data_state": data_state,
            "time": time.time(),
            "entries": sorted(trees),
            "host": socket.gethostname(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
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
        for e in entries:  # a re-saved step's previous copy, moved aside by the commit
            if e.status == "deleting" and "-replaced-" in e.name:
                remove_dir(e.path)

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
                self._deleter.join()
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
            except (CheckpointFormatError, OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                loaded, err = None, f"rank {self.rank}: {exc}"
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

    def _load(
        self, path: Path
    ) -> tp.Tuple[tp.Dict[str, tp.Any], tp.Dict[str, torch.Tensor], tp.Any, tp.Dict[str, tp.Any]]:
        """Read and check every shard; tensors come back as views into the read buffers, except tensors
        split across shards, whose pieces are read straight into one tensor (no assembly copy)."""
        manifest = read_manifest(path)
        shards = manifest["shards"]
        for s in shards:  # sizes first: cheap, catches truncation and missing files before any big read
            size = (path / s["file"]).stat().st_size
            if size != s["bytes"]:
                raise CheckpointFormatError(
                    f"{path.name}/{s['file']}: size {size} != {s['bytes']} in the manifest (truncated?)"
                )
        headers = [read_header(path / s["file"]) for s in shards]
        pieces: tp.Dict[str, tp.List[tp.Tuple[int, int, int, int, tp.Dict[str, tp.Any]]]] = {}
        for i, hdr in enumerate(headers):
            for e in hdr.header["entries"]:
                if e["key"].startswith("local/") and i != self.rank:
                    continue  # another rank's RNG state
                pieces.setdefault(e["key"], []).append((e["start"], e["stop"], i, hdr.data_start + e["offset"], e))
        where = path.name
        for key, ps in pieces.items():
            _check_pieces(where, key, ps)
        # tensors stored in several pieces get their final memory now; reads land there directly
        split = {
            k: torch.empty(_numel(ps[0][4]["shape"]), dtype=DTYPES[ps[0][4]["dtype"]])
            for k, ps in pieces.items()
            if len(ps) > 1
        }
        direct: tp.List[tp.List[tp.Tuple[int, memoryview]]] = [[] for _ in shards]
        for k, out in split.items():
            base, es = out.data_ptr(), out.element_size()
            for start, stop, i, off, _ in pieces[k]:
                nb = (stop - start) * es
                if nb:
                    direct[i].append((off, memoryview((ctypes.c_char * nb).from_address(base + start * es)).cast("B")))
        bufs: tp.List[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * len(shards)
        n = len(shards)
        for k in range(n):  # rank r starts at shard r: the ranks read different files in parallel
            i = (self.rank + k) % n
            s = shards[i]
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
            with open(path / s["file"], "rb", buffering=0) as f:
                try:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                except (OSError, AttributeError):  # a hint only (not every kernel/sandbox has it)
                    pass
                for seg in segments:
                    _read_exact(f, seg, f"{path.name}/{s['file']}")
                    if check:
                        crc = crc32(seg, crc)
            if check and crc != s["crc32"]:
                raise CheckpointFormatError(f"{path.name}/{s['file']}: checksum mismatch (corrupted shard)")
            if bytes(whole[: len(MAGIC)]) != MAGIC:
                raise CheckpointFormatError(f"{path.name}/{s['file']}: not an hpctrain shard (changed while reading?)")
            bufs[i] = buf
        tensors: tp.Dict[str, torch.Tensor] = {}
        typed: tp.Dict[tp.Tuple[int, str], torch.Tensor] = {}
        for key, ps in pieces.items():
            if key in split:
                tensors[key] = split[key].view([int(d) for d in ps[0][4]["shape"]])
                continue
            _, _, i, off, e = ps[0]
            tv = typed.get((i, e["dtype"]))
            if tv is None:  # one typed view per shard and dtype (offsets are 64-byte aligned)
                es = DTYPE_SIZES[e["dtype"]]
                tv = typed[(i, e["dtype"])] = bufs[i][: bufs[i].numel() // es * es].view(DTYPES[e["dtype"]])
            shape = [int(d) for d in e["shape"]]
            strides, acc = [], 1
            for d in reversed(shape):
                strides.append(acc)
                acc *= max(d, 1)
            tensors[key] = torch.as_strided(tv, shape, strides[::-1], tv.storage_offset() + off // tv.element_size())
        trees = headers[0].header.get("trees")
        if not isinstance(trees, dict):
            raise CheckpointFormatError(f"{path.name}: shard 0 holds no state tree")
        local_tree = headers[self.rank].header.get("local") if self.rank < n else None
        return trees, tensors, local_tree, manifest

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
        trees, tensors, local_tree, manifest = loaded
        for name, obj in zip(_STATE_NAMES, (model, optimizer, scheduler, scaler)):
            if obj is None:
                continue
            if name not in trees:
                raise HpctrainError(f"checkpoint step {s} holds no {name} state (it has: {', '.join(sorted(trees))})")
            state = unflatten(trees[name], tensors)
            try:
                obj.load_state_dict(state, strict=strict) if name == "model" else obj.load_state_dict(state)
            except (RuntimeError, ValueError, KeyError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise HpctrainError(
                    f"checkpoint step {s} does not fit the {name} passed to restore(): {first}"
                ) from exc
        extra = None
        if "extra" in trees:
            extra = unflatten(
                trees["extra"], {k: v.to(map_location) for k, v in tensors.items() if k.startswith("extra")}
            )
        rng_restored = False
        if rng and local_tree is not None and "rng" in local_tree:
            skipped = restore_rng(unflatten(local_tree["rng"], tensors))
            rng_restored = True
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


def _numel(shape: tp.Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _check_pieces(where: str, key: str, ps: tp.List[tp.Tuple[int, int, int, int, tp.Dict[str, tp.Any]]]) -> None:
    """The pieces of one tensor must tile it exactly, with one dtype and shape."""
    if len(ps) > 1:
        ps.sort(key=lambda p: p[0])
    e0 = ps[0][4]
    pos = 0
    for start, stop, _, _, e in ps:
        if start != pos or e["dtype"] != e0["dtype"] or e["shape"] != e0["shape"]:
            raise CheckpointFormatError(f"{where}: the stored pieces of tensor {key!r} do not fit together")
        pos = stop
    if pos != _numel(e0["shape"]):
        raise CheckpointFormatError(
            f"{where}: tensor {key!r} is incomplete ({pos} of {_numel(e0['shape'])} elements stored)"
        )


def _read_exact(f: tp.BinaryIO, view: memoryview, name: str) -> None:
    got = 0
    while got < view.nbytes:
        n = f.readinto(view[got:])
        if not n:
            raise CheckpointFormatError(f"{name}: truncated while reading")
        got += n
