"""The two-phase commit: every rank writes + fsyncs its shard, all agree, then rank 0 publishes.

Protocol for one save (``commit_save``), on the checkpointer's own gloo group. The tmp dir name
``step-N.tmp-j<job>-r<restart>-<nonce>-<k>`` is known to every rank without communication (nonce
agreed once when the checkpointer is built, ``k`` counts saves), so the fast path is two small collectives:

1. every rank checks free space, creates the tmp dir (idempotent), writes its shard, flushes,
   fsyncs, and computes its crc32 (as it writes, a batch at a time, while the bytes are in the CPU's cache).
2. agreement: one all-gather of (ok, size, crc32, layout hash) per rank. Any failure: nobody commits,
   the errors are gathered (slow path), rank 0 removes the tmp dir, every rank raises the same error.
   Differently shaped state on some rank (not DDP-replicated) is refused the same way.
3. rank 0 writes ``MANIFEST.json`` (tmp + fsync + rename), renames the dir to ``step-N``, fsyncs the
   parent. A last broadcast from rank 0 tells every rank that the commit happened (only rank 0's word
   counts there, so one hop, not a ring). ``LATEST`` (a hint: restore scans) is replaced atomically by
   rank 0 after that, in the checkpointer's background thread when it has one (its two fsyncs, ~8 ms on a
   disk, are not waited for by any rank).

Every rank puts an owner file (host, pid, job) in the tmp dir right after creating it, so that clean-up
(``ckpt gc``, another checkpointer's start) can tell a live save from an abandoned one. A re-save of a
step that exists moves the old copy aside (``step-N.replaced-*``) and renames the new one into place;
the old copy is deleted only after that, and put back by the next clean-up if the save died between.

Fault points (``HPCTRAIN_CKPT_FAULT=point[:rank][:raise|:raiseonce|:efault|:sleepSECONDS]``, comma separated;
SIGKILL by default):
``start``, ``before_write``, ``after_write`` (written, not fsynced), ``after_fsync`` (before the
agreement), ``after_agree``, ``after_manifest``, ``after_move_aside`` (a re-save, between its two
renames), ``after_rename`` (before LATEST), ``after_latest``; and ``restore_read`` (a rank's reads during restore),
``node_buffer`` (a rank's shared-memory buffer of the ``node`` exchange: ``:raise`` makes every rank fall back),
``node_memory`` (a rank's reads into that buffer: ``:efault`` fails them as a full tmpfs does).
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import functools
import logging
import operator
import os
import secrets
import shutil
import signal
import socket
import time
import typing as tp
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from hpctrain._atomic import atomic_write_json, atomic_write_text, fsync_dir
from hpctrain._lustre import LustreCommands
from hpctrain.ckpt._format import (
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    crc32,
    replaced_name,
    shard_name,
    step_name,
    tmp_name,
)
from hpctrain.ckpt._scan import OWNER_PREFIX, owner_record
from hpctrain.errors import HpctrainError
from hpctrain.runtime.env import from_environ

__all__ = [
    "Comm",
    "INLINE_BYTES",
    "INLINE_TOTAL",
    "wire_bytes",
    "fault",
    "FAULT_POINTS",
    "ShardPlan",
    "commit_save",
    "write_shard",
    "job_identity",
]

log = logging.getLogger("hpctrain.ckpt")

FAULT_POINTS = (
    "start",
    "before_write",
    "after_write",
    "after_fsync",
    "after_agree",
    "after_manifest",
    "after_move_aside",
    "after_rename",
    "after_latest",
    "restore_read",
    "node_buffer",
)
FAULT_ENV = "HPCTRAIN_CKPT_FAULT"
_FIRED: tp.Set[str] = set()


def fault(point: str, rank: int, spec: tp.Optional[str] = None) -> None:
    """Test seam: die (SIGKILL) or raise at a named protocol point when ``HPCTRAIN_CKPT_FAULT`` says so
    (``spec``: its value when the work was handed to a background thread, instead of its value now)."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    if not spec:
        return
    for item in spec.split(","):
        parts = item.strip().split(":")
        if parts[0] != point or (len(parts) > 1 and parts[1] not in ("", "*", str(rank))):
            continue
        if len(parts) > 2 and parts[2] == "efault":  # as a read into memory that cannot be had (a full tmpfs)
            raise OSError(errno.EFAULT, f"injected EFAULT at {point}")
        if len(parts) > 2 and parts[2] in ("raise", "raiseonce"):
            if parts[2] == "raiseonce":  # the first time in this process only (a transient failure)
                if item in _FIRED:
                    continue
                _FIRED.add(item)
            raise OSError(f"injected fault at {point}")
        if len(parts) > 2 and parts[2].startswith("sleep"):
            time.sleep(float(parts[2][5:] or 1.0))
            continue
        os.kill(os.getpid(), signal.SIGKILL)


INLINE_BYTES = 4 << 10
"""The pickle bytes a gather of objects carries in its first (and usually only) collective per rank: errors,
tags and read reports fit; a larger message names its own width (a restore's index exchange)."""
INLINE_TOTAL = 8 << 20
"""The bound of the inline part over the whole world (a wide world gathers narrower rows first)."""


def wire_bytes(obj: tp.Any, compress: bool = False) -> bytes:
    """What :meth:`Comm.all_gather_with` sends for ``obj``: its pickle, zlib-compressed (level 1: an index share to
    ~15 % of its bytes, 1 ms for the largest of the benchmark's) when ``compress``."""
    import pickle

    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return zlib.compress(payload, 1) if compress else payload


class Comm:
    """Control-plane collectives on a dedicated gloo group (never the training/NCCL group).

    Without an initialised default group it is a world of one and every collective is local.
    """

    def __init__(self, timeout_s: float, before_agreeing: tp.Optional[tp.Callable[[int], None]] = None) -> None:
        """``before_agreeing(rank)``: called on every rank before the first collective (the tag's gather), so that
        what rank 0 does there (the checkpointer settling interrupted re-saves) is done before any rank's
        constructor returns: a later restore needs no barrier of its own before it scans."""
        import torch.distributed as dist

        self.timeout_s = timeout_s
        if dist.is_available() and dist.is_initialized():
            from hpctrain.runtime.process_group import rank_and_world

            self.rank, self.world = rank_and_world()
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        else:
            self.rank, self.world, self.group = 0, 1, None
        if before_agreeing is not None:
            before_agreeing(self.rank)
        self.job_id, self.restart_count = job_identity()
        # one tag per checkpointer, agreed once: tmp dir names need no round trip at save time
        tag = f"j{self.job_id or 'local'}-r{self.restart_count}-{secrets.token_hex(5)}"
        got = self.all_gather((tag if self.rank == 0 else "", socket.gethostname()))
        self.tag = got[0][0]
        self.hosts = len({host for _, host in got})  # restore's "auto" mode reads once across hosts only
        self.saves = 0
        self.exchanges = 0  # restore's node exchange: every rank counts the same, so its buffer needs no agreed name

    def _fail(self, exc: BaseException) -> HpctrainError:
        return HpctrainError(
            f"checkpoint agreement failed (a rank died or exceeded agreement_timeout_s={self.timeout_s:g}): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        )

    def all_gather(self, obj: tp.Any, inline: int = INLINE_BYTES, compress: bool = False) -> tp.List[tp.Any]:
        """Any picklable object from every rank (errors, restore candidates, a restore's read reports): one
        collective when every rank's pickle fits ``inline`` bytes, two otherwise (:meth:`all_gather_with`)."""
        return self.all_gather_with((), obj, inline, compress)[1]

    def all_gather_with(
        self, values: tp.Sequence[int], obj: tp.Any, inline: int = INLINE_BYTES, compress: bool = False
    ) -> tp.Tuple[tp.List[tp.List[int]], tp.List[tp.Any]]:
        """A few int64 and a picklable object from every rank (every rank passes as many ints), in one collective
        when every rank's pickle fits the inline width, else two. This rank's own entry is ``obj`` itself.

        The first collective gathers from each rank its pickle's length, the ints and the first ``width`` bytes
        of the pickle (``width``: ``inline``, at most :data:`INLINE_TOTAL` over the world: the same on every rank,
        so no round trip agrees on it); only when some pickle is longer, a second one gathers the rest, as wide as
        the longest rest. ``all_gather_object`` always takes two (the lengths, then the pickles): on a host whose
        cores the ranks share, each costs them ~3 ms (4 ranks on 2 cores, gloo), a tenth of a restore's time
        beyond its ceiling. So an agreement that precedes an exchange costs no collective of its own either.

        ``compress`` (every rank passes the same): the pickles travel zlib-compressed (level 1). For a restore's index
        shares (keys, dtypes and numbers of thousands of tensors: 185-192 KB pickled, 25-30 KB compressed, 1 ms each
        on this VM) that is a quarter of the bytes through gloo's TCP threads, whose CPU (6-16 ms a rank in a
        4-rank restore against 2-7 ms in its ceiling's) the ranks pay on cores they share. The bytes a rank sends
        for ``obj``: :func:`wire_bytes`."""
        if self.world == 1:
            return [list(values)], [obj]
        import pickle

        from hpctrain.runtime.process_group import all_gather_into_tensor

        gather, world = all_gather_into_tensor(), self.world
        payload = wire_bytes(obj, compress)
        width = max(1, min(inline, INLINE_TOTAL // world))
        head = 8 * (1 + len(values))
        row = head + width
        mine = torch.zeros(row, dtype=torch.uint8)
        mine[:head] = torch.tensor([len(payload), *values], dtype=torch.int64).view(torch.uint8)
        first = payload[:width]
        mine[head : head + len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
        out = torch.empty(row * world, dtype=torch.uint8)
        try:
            gather(out, mine, group=self.group)
        except Exception as exc:  # noqa: BLE001 - a peer died or timed out
            raise self._fail(exc) from exc
        rows = out.numpy().reshape(world, row)
        got = rows[:, :head].copy().view("<i8").tolist()
        more = max(g[0] for g in got) - width
        rest = None
        if more > 0:
            tail = torch.zeros(more, dtype=torch.uint8)
            if len(payload) > width:
                tail[: len(payload) - width] = torch.frombuffer(bytearray(payload[width:]), dtype=torch.uint8)
            rest = torch.empty(more * world, dtype=torch.uint8)
            try:
                gather(rest, tail, group=self.group)
            except Exception as exc:  # noqa: BLE001
                raise self._fail(exc) from exc
        objs = []
        for r, g in enumerate(got):
            if r == self.rank:  # this rank's own object as it is: no unpickled copy (its index share: ~200 KB)
                objs.append(obj)
                continue
            data: tp.Any = rows[r, head : head + min(g[0], width)]  # unpickled in place, not copied out first
            if g[0] > width:
                assert rest is not None
                data = data.tobytes() + rest.numpy()[r * more : r * more + g[0] - width].tobytes()
            objs.append(pickle.loads(zlib.decompress(data) if compress else data))
        return [g[1:] for g in got], objs

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

    def broadcast_ints(self, values: tp.Sequence[int], src: int = 0) -> tp.List[int]:
        """``src``'s few int64 on every rank (every rank passes as many; the others' values are ignored): one
        collective whose result only ``src`` decides, cheaper than a ring all-gather."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64)
        try:
            dist.broadcast(t, src=src, group=self.group)
        except Exception as exc:  # noqa: BLE001 - a peer died or timed out
            raise self._fail(exc) from exc
        return t.tolist()


@dataclass
class ShardPlan:
    """What one rank writes: ``chunks`` are byte buffers written in order (header first)."""

    header: bytes
    chunks: tp.List[tp.Tuple[int, memoryview]]  # (offset from data start, bytes)
    layout: str
    total_bytes: int  # all ranks together (for the free-space check)
    expect_crc: tp.Optional[int] = None
    """A copy of a shard already written (the local tier drained to the global one): the crc32 its manifest
    records; the copy is refused when its bytes do not match, so a damaged local file never reaches the
    global tier."""
    keep: tp.Any = None
    """What ``chunks`` point into and must outlive them (a blocking save's views of tensors whose only other
    reference was the save's own: the RNG states, numpy arrays converted to tensors)."""


_IOV_MAX = 1024
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX enough to say
    pass


_NBYTES = operator.attrgetter("nbytes")
_SUM_BATCH = 256 << 10
""":func:`_write_summed` writes this many bytes at a time and checksums them right after, while the CPU's cache
still holds them. One process, 64 MiB on tmpfs: write and crc32 22.0 ms against 24.6 for one ``writev`` and a crc32
after it (1 MiB at a time 23.2, 4 MiB 24.2)."""
_KICK = 4 << 20
""":func:`_write_summed` starts the writeback of every this many bytes written (:func:`_start_writeback`), so the
device writes while the rest is written and the fsync waits for the tail only (4 ranks' saves on the dev VM's
disk: 9-16 % faster by median, 2, 4, 8 and 16 MiB tried); a multiple of the 1-4 MiB RPCs a Lustre client sends."""
_SYNC_FILE_RANGE_WRITE = 2
"""``SYNC_FILE_RANGE_WRITE`` (linux/fs.h): start writing back the range's dirty pages, do not wait."""


@functools.lru_cache(maxsize=None)
def _sync_file_range() -> tp.Optional[tp.Callable[..., int]]:
    """libc's ``sync_file_range``, or None where there is none (not Linux)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - Linux has it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return tp.cast(tp.Callable[..., int], fn)


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` back now, without waiting. A hint only:
    durability is the fsync's, and where the filesystem ignores or refuses it (tmpfs, FUSE) nothing changes."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # the result is ignored: a refusal costs nothing


def _writev_all(fd: int, views: tp.Sequence[memoryview]) -> None:
    """Write ``views`` in order with as few ``writev`` calls as IOV_MAX allows, resuming after a short write: the
    kernel copies each buffer straight into the file, so thousands of small tensors are neither coalesced in
    user space (a copy) nor written one syscall each."""
    i, n = 0, len(views)
    rest: tp.Optional[memoryview] = None  # the unwritten tail of views[i] after a short write
    while i < n:
        batch = list(views[i : i + _IOV_MAX])
        if rest is not None:
            batch[0] = rest
        done = os.writev(fd, batch)
        if done == sum(map(_NBYTES, batch)):
            i, rest = i + len(batch), None
            continue
        rest = None  # a short write (a signal, a quota, over 2 GiB in one call): skip what went, resume there
        for v in batch:
            if done < v.nbytes:
                rest = (v if v.format == "B" and v.ndim == 1 else v.cast("B"))[done:]
                break
            done -= v.nbytes
            i += 1


def _write_summed(fd: int, views: tp.Sequence[memoryview]) -> int:
    """Write ``views`` in order from the start of the new file ``fd`` and return the crc32 of all their bytes.

    ~``_SUM_BATCH`` bytes a :func:`_writev_all` (small views together, a larger one in slices of it), each batch
    checksummed as soon as it is written, and the writeback started every :data:`_KICK` bytes."""
    crc = written = kicked = 0
    batch: tp.List[memoryview] = []
    size = 0

    def put(views: tp.Sequence[memoryview], n: int) -> None:
        nonlocal crc, written, kicked
        _writev_all(fd, views)
        for v in views:
            crc = crc32(v, crc)
        written += n
        if written - kicked >= _KICK:
            _start_writeback(fd, kicked, written - kicked)
            kicked = written

    for v in views:
        n = v.nbytes
        if n > _SUM_BATCH:
            if batch:
                put(batch, size)
                batch, size = [], 0
            flat = v if v.format == "B" and v.ndim == 1 else v.cast("B")
            for off in range(0, n, _SUM_BATCH):
                piece = flat[off : off + _SUM_BATCH]
                put((piece,), piece.nbytes)
            continue
        batch.append(v)
        size += n
        if size >= _SUM_BATCH or len(batch) >= _IOV_MAX:
            put(batch, size)
            batch, size = [], 0
    if batch:
        put(batch, size)
    return crc


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


def write_shard(
    path: Path,
    plan: ShardPlan,
    rank: int,
    stripe: tp.Sequence[str] = (),
    lustre: tp.Optional[LustreCommands] = None,
) -> tp.Tuple[int, int]:
    """Write header + data with their crc32 (:func:`_write_summed`), fsync; return (size, crc32).

    With ``stripe``, ``lfs setstripe`` (through ``lustre``) creates the new, empty file with that layout
    first; where it cannot, the file is created with the filesystem's default layout."""
    if stripe and (lustre or LustreCommands()).create_striped(path, stripe):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        parts = [memoryview(plan.header)]
        pos = 0
        for off, view in plan.chunks:
            if off > pos:  # a gap between chunks: zeros
                parts.append(memoryview(bytes(off - pos)))
            parts.append(view)
            pos = off + view.nbytes
        crc = _write_summed(fd, parts)
        fault("after_write", rank)
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return size, crc


def job_identity() -> tp.Tuple[str, int]:
    """(job id, restart count) from the launcher's environment; ("", 0) outside a job or when it is inconsistent."""
    try:
        env = from_environ()
    except HpctrainError:
        return "", 0
    return env.job_id, env.restart_count


def _write_owner(tmp: Path, rank: int, comm: "Comm") -> None:
    """This rank's owner file in the tmp dir (exclusive, never through a planted symlink)."""
    fd = os.open(
        tmp / f"{OWNER_PREFIX}{rank}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
    )
    try:
        os.write(fd, owner_record(rank, comm.job_id, comm.restart_count))
    finally:
        os.close(fd)


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
    lustre: tp.Optional[LustreCommands] = None,
    check_free_space: bool = True,
    space_margin: float = 1.05,
    aborted: tp.Callable[[], bool] = lambda: False,
    defer: tp.Optional[tp.Callable[[tp.Callable[[], None]], None]] = None,
) -> Path:
    """Run the whole protocol for this rank; return the committed directory or raise HpctrainError.

    ``defer``: where rank 0 hands the update of ``LATEST`` once the step is committed (a background thread's
    queue); without it, rank 0 updates it before returning."""
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
            _write_owner(tmp, rank, comm)
            fault("before_write", rank)
            if aborted():
                raise OSError("save abandoned")
            size, crc = write_shard(tmp / name, plan, rank, stripe, lustre)
            if plan.expect_crc is not None and crc != plan.expect_crc:
                raise OSError(f"the source copy fails its checksum (crc32 {crc:#x}, manifest {plan.expect_crc:#x})")
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
    aside: tp.Optional[Path] = None
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
            for r in range(1, world):  # every shard is durable; rank 0's own file marks the dir live until renamed
                (tmp / f"{OWNER_PREFIX}{r}.json").unlink(missing_ok=True)
            atomic_write_json(tmp / MANIFEST, manifest)
            fault("after_manifest", rank)
            if os.path.lexists(final):  # a re-save: move the old copy aside (kept until the new one is in place)
                aside = root / replaced_name(step, secrets.token_hex(4))
                os.rename(final, aside)
                fault("after_move_aside", rank)
            os.rename(tmp, final)
            fsync_dir(root)
            (final / f"{OWNER_PREFIX}0.json").unlink(missing_ok=True)  # (a kill here leaves it: harmless)
            fault("after_rename", rank)
        except OSError as exc:
            commit_err = f"rank 0 could not publish step {step}: {exc}"
            if aside is not None and not os.path.lexists(final):
                try:  # put the previous copy back at once (clean-up would also do it)
                    os.rename(aside, final)
                except OSError:
                    pass
        if not commit_err:
            # LATEST is a hint for humans and tools (restore scans, so a failure here is not fatal, nor a LATEST
            # one step behind after a crash): no rank needs to wait for its fsyncs
            spec = os.environ.get(FAULT_ENV, "")  # the test seam as armed for this save
            (defer or _call)(lambda: _update_latest(root, step, rank, spec))
    try:
        done = comm.broadcast_ints([1 if commit_err else 0], src=0)
    except HpctrainError as exc:
        if rank == 0 and not commit_err:  # every shard was durable and rank 0 published: it is committed
            log.warning("hpctrain.ckpt: step %d committed, but a peer is gone: %s", step, exc)
            return final
        raise
    if done[0]:
        reason = comm.all_gather(commit_err)[0]
        if rank == 0 and not final.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        raise HpctrainError(f"checkpoint step {step} not committed: {reason}")
    return final


def _call(job: tp.Callable[[], None]) -> None:
    job()


def _update_latest(root: Path, step: int, rank: int, spec: str) -> None:
    """Point ``LATEST`` at ``step`` (committed), atomically; a failure is logged, never raised."""
    try:
        atomic_write_text(root / LATEST, step_name(step) + "\n")
    except OSError as exc:
        log.warning("hpctrain.ckpt: step %d committed but LATEST not updated: %s", step, exc)
    fault("after_latest", rank, spec)
