"""The two-phase commit: every rank writes + fsyncs its shard, all agree, then rank 0 publishes.

Protocol for one save (``commit_save``), on the checkpointer's own gloo group. The tmp dir name
``step-N.tmp-j<job>-r<restart>-<nonce>-<k>`` is known to every rank without communication (nonce
agreed once when the checkpointer is built, ``k`` counts saves), so the fast path is two small collectives:

1. every rank checks free space, creates the tmp dir (idempotent), writes its shard, flushes,
   fsyncs, and computes its crc32 (overlapped with the fsync).
2. agreement: one all-gather of (ok, size, crc32, layout hash) per rank. Any failure: nobody commits,
   the errors are gathered (slow path), rank 0 removes the tmp dir, every rank raises the same error.
   Differently shaped state on some rank (not DDP-replicated) is refused the same way.
3. rank 0 writes ``MANIFEST.json`` (tmp + fsync + rename), renames the dir to ``step-N``, fsyncs the
   parent, replaces ``LATEST`` atomically. A last all-gather tells every rank that the commit happened.

Fault points (``HPCTRAIN_CKPT_FAULT=point[:rank][:raise|:sleepSECONDS]``, comma separated; SIGKILL by default):
``start``, ``before_write``, ``after_write`` (written, not fsynced), ``after_fsync`` (before the
agreement), ``after_agree``, ``after_manifest``, ``after_rename`` (before LATEST), ``after_latest``.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import typing as tp
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from hpctrain._atomic import atomic_write_json, atomic_write_text, fsync_dir
from hpctrain.ckpt._format import FORMAT_VERSION, LATEST, MANIFEST, crc32, shard_name, step_name, tmp_name
from hpctrain.errors import HpctrainError

__all__ = ["Comm", "fault", "FAULT_POINTS", "ShardPlan", "commit_save", "write_shard"]

log = logging.getLogger("hpctrain.ckpt")

FAULT_POINTS = (
    "start",
    "before_write",
    "after_write",
    "after_fsync",
    "after_agree",
    "after_manifest",
    "after_rename",
    "after_latest",
)
FAULT_ENV = "HPCTRAIN_CKPT_FAULT"


def fault(point: str, rank: int) -> None:
    """Test seam: die (SIGKILL) or raise at a named protocol point when ``HPCTRAIN_CKPT_FAULT`` says so."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    for item in spec.split(","):
        parts = item.strip().split(":")
        if parts[0] != point or (len(parts) > 1 and parts[1] not in ("", "*", str(rank))):
            continue
        if len(parts) > 2 and parts[2] == "raise":
            raise OSError(f"injected fault at {point}")
        if len(parts) > 2 and parts[2].startswith("sleep"):
            time.sleep(float(parts[2][5:] or 1.0))
            continue
        os.kill(os.getpid(), signal.SIGKILL)


class Comm:
    """Control-plane collectives on a dedicated gloo group (never the training/NCCL group).

    Without an initialised default group it is a world of one and every collective is local.
    """

    def __init__(self, timeout_s: float) -> None:
        import torch.distributed as dist

        self.timeout_s = timeout_s
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        else:
            self.rank, self.world, self.group = 0, 1, None
        # one tag per checkpointer, agreed once: tmp dir names need no round trip at save time
        self.tag = self.all_gather(_job_tag() if self.rank == 0 else "")[0]
        self.saves = 0

    def _fail(self, exc: BaseException) -> HpctrainError:
        return HpctrainError(
            f"checkpoint agreement failed (a rank died or exceeded agreement_timeout_s={self.timeout_s:g}): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        )

    def all_gather(self, obj: tp.Any) -> tp.List[tp.Any]:
        """Any picklable object from every rank (slow path: errors, restore candidates)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: tp.List[tp.Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except Exception as exc:  # noqa: BLE001 - a peer died or timed out
            raise self._fail(exc) from exc
        return out

    def all_gather_ints(self, values: tp.Sequence[int]) -> tp.List[tp.List[int]]:
        """A few int64 from every rank in one collective (the fast path of the protocol)."""
        if self.world == 1:
            return [list(values)]
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(t) for _ in range(self.world)]
        try:
            dist.all_gather(out, t, group=self.group)
        except Exception as exc:  # noqa: BLE001 - a peer died or timed out
            raise self._fail(exc) from exc
        return [o.tolist() for o in out]


@dataclass
class ShardPlan:
    """What one rank writes: ``chunks`` are byte buffers written in order (header first)."""

    header: bytes
    chunks: tp.List[tp.Tuple[int, memoryview]]  # (offset from data start, bytes)
    layout: str
    total_bytes: int  # all ranks together (for the free-space check)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


def write_shard(path: Path, plan: ShardPlan, rank: int, stripe: tp.Sequence[str] = ()) -> tp.Tuple[int, int]:
    """Write header + data, fsync (in a thread) while computing crc32; return (size, crc32).

    With ``stripe``, ``lfs setstripe`` creates the (new, empty) file with that layout first."""
    if _stripe(path, stripe):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        crc_parts: tp.List[memoryview] = [memoryview(plan.header)]
        _write_all(fd, memoryview(plan.header))
        pos = 0
        pending = bytearray()
        for off, view in plan.chunks:
            if off > pos:
                pad = bytes(off - pos)
                crc_parts.append(memoryview(pad))
                pending += pad
            crc_parts.append(view)
            if view.nbytes < (256 << 10):  # coalesce small tensors into one write
                pending += view
            else:
                if pending:
                    _write_all(fd, memoryview(pending))
                    pending = bytearray()
                _write_all(fd, view)
            pos = off + view.nbytes
        if pending:
            _write_all(fd, memoryview(pending))
        fault("after_write", rank)
        err: tp.List[BaseException] = []

        def _sync() -> None:
            try:
                os.fsync(fd)
            except BaseException as exc:  # noqa: BLE001
                err.append(exc)

        syncer = threading.Thread(target=_sync, name="hpctrain-ckpt-fsync")
        syncer.start()
        crc = 0
        for part in crc_parts:
            crc = crc32(part, crc)
        syncer.join()
        if err:
            raise err[0]
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return size, crc


def _job_tag() -> str:
    job = os.environ.get("SLURM_JOB_ID", "local")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    return f"j{job}-r{restart}-{uuid.uuid4().hex[:10]}"


def _stripe(path: Path, spec: tp.Sequence[str]) -> bool:
    """Create ``path`` striped with ``lfs setstripe``; False (nothing created) when off or unavailable."""
    if not spec or shutil.which("lfs") is None:
        return False
    try:
        subprocess.run(["lfs", "setstripe", *spec, str(path)], check=True, capture_output=True, timeout=60)
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("hpctrain.ckpt: lfs setstripe %s failed (continuing unstriped): %s", " ".join(spec), exc)
        path.unlink(missing_ok=True)
        return False
    return path.exists()


def _space_error(root: Path, need: int, margin: float) -> str:
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    if free < need * margin:
        return (
            f"not enough free space in {root}: the checkpoint needs {need / 2**20:.1f} MiB "
            f"(x{margin:g} margin), {free / 2**20:.1f} MiB free; free space or lower keep_last"
        )
    return ""


def commit_save(
    comm: Comm,
    root: Path,
    step: int,
    plan: ShardPlan,
    manifest_extra: tp.Dict[str, tp.Any],
    *,
    stripe: tp.Sequence[str] = (),
    check_free_space: bool = True,
    space_margin: float = 1.05,
    aborted: tp.Callable[[], bool] = lambda: False,
) -> Path:
    """Run the whole protocol for this rank; return the committed directory or raise HpctrainError."""
    rank, world = comm.rank, comm.world
    fault("start", rank)
    comm.saves += 1  # every rank saves in the same order, so every rank names the same tmp dir
    tmp = root / tmp_name(step, f"{comm.tag}-{comm.saves}")
    name = shard_name(rank, world)
    # -- phase 1: every rank checks space, creates the tmp dir (idempotent), writes + fsyncs its shard
    err, size, crc = "", 0, 0
    try:
        root.mkdir(parents=True, exist_ok=True)
        if check_free_space:
            err = _space_error(root, plan.total_bytes, space_margin)
        if not err:
            tmp.mkdir(exist_ok=True)
            fault("before_write", rank)
            if aborted():
                raise OSError("save abandoned")
            size, crc = write_shard(tmp / name, plan, rank, stripe)
            fault("after_fsync", rank)
    except OSError as exc:
        hint = " (disk full)" if getattr(exc, "errno", None) == 28 else ""
        err = f"rank {rank} could not write {name}: {exc.strerror or exc}{hint}"
    # -- phase 2: agreement, one small collective: ok, size, crc32, layout of every rank
    layout = int(plan.layout[:15], 16) if plan.layout else 0
    results = comm.all_gather_ints([0 if err else 1, size, crc, layout, comm.saves, step])
    if not all(r[0] for r in results):
        errors = [e for e in comm.all_gather(err) if e]  # the slow path: who failed and why
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(f"checkpoint step {step} not committed (earlier checkpoints are intact): {errors[0]}")
    if len({(r[4], r[5]) for r in results}) > 1:  # some rank skipped or added a save: never mix directories
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(
            f"checkpoint step {step} not committed: ranks disagree on the save sequence "
            f"(step, save count per rank: {[(r[5], r[4]) for r in results]}); "
            "call save() on every rank with the same step"
        )
    if len({r[3] for r in results}) > 1:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(
            f"checkpoint step {step} not committed: ranks hold differently shaped model/optimizer state; "
            "every rank must pass the same replicated state (DDP) to save()"
        )
    shards = [
        {"file": shard_name(r, world), "rank": r, "bytes": res[1], "crc32": res[2]} for r, res in enumerate(results)
    ]
    fault("after_agree", rank)
    # -- phase 3: rank 0 publishes
    final = root / step_name(step)
    commit_err = ""
    if rank == 0 and aborted():
        commit_err = "save abandoned"
    elif rank == 0:
        try:
            manifest = {
                "format": "hpctrain-ckpt",
                "format_version": FORMAT_VERSION,
                "step": step,
                "world_size": world,
                "shards": shards,
                "torch": torch.__version__,
                **manifest_extra,
            }
            atomic_write_json(tmp / MANIFEST, manifest)
            fault("after_manifest", rank)
            if final.exists():  # a re-save of a step: move the old one aside, never write into it
                os.rename(final, root / f"{step_name(step)}.deleting-replaced-{uuid.uuid4().hex[:8]}")
            os.rename(tmp, final)
            fsync_dir(root)
            fault("after_rename", rank)
        except OSError as exc:
            commit_err = f"rank 0 could not publish step {step}: {exc}"
        if not commit_err:
            try:  # LATEST is a hint for humans and tools; restore scans, so a failure here is not fatal
                atomic_write_text(root / LATEST, step_name(step) + "\n")
            except OSError as exc:
                log.warning("hpctrain.ckpt: step %d committed but LATEST not updated: %s", step, exc)
            fault("after_latest", rank)
    try:
        done = comm.all_gather_ints([1 if commit_err else 0])
    except HpctrainError as exc:
        if rank == 0 and not commit_err:  # every shard was durable and rank 0 published: it is committed
            log.warning("hpctrain.ckpt: step %d committed, but a peer is gone: %s", step, exc)
            return final
        raise
    if done[0][0]:
        reason = comm.all_gather(commit_err)[0]
        if rank == 0 and not final.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(f"checkpoint step {step} not committed: {reason}")
    return final
