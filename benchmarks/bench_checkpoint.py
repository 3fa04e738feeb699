"""Checkpoint benchmark: hpctrain vs the raw write/read ceiling vs torch.distributed.checkpoint vs torch.save.

    python benchmarks/bench_checkpoint.py [--size-mb 256] [--world 4] [--small-tensors 1000] [--json PATH]
        [--keep DIR] [--round N] [--dir WORKDIR [--dir /dev/shm/WORKDIR ...]]

One run per ``--dir`` (default: ``./bench_out`` on disk and ``/dev/shm/hpctrain-bench`` on tmpfs, side by
side in one JSON object), ``--world`` real processes on a gloo group (CPU). The state is model-like and
identical on every rank (as under DDP): ``--size-mb`` in total, one third parameters (a few tensors
of tens of MB, about a thousand of a few KB: ``--small-tensors``) and two thirds an Adam-like optimizer state
(exp_avg, exp_avg_sq per parameter + a step scalar). Every timing is wall time between two barriers.
The same bytes in fewer tensors (``--small-tensors 4``: 32 tensors instead of 4016) separate what the data path
costs from what the per-tensor work does (docs/checkpoint.md, "What the remaining fraction is spent on").

Measured (all in the same run):
* ceiling: raw ``write``+``fsync`` of the same bytes split over the same ranks, into new files per save
  with the same retention as the checkpoints (the newest 3 kept); raw cold reads of the checkpoint's
  files: each rank reads 1/world of the files' bytes and one ``all_gather`` of those raw bytes on a
  gloo group of the same ranks (as the checkpointer's exchange) gives every rank the rest
  (``raw_read_once_s``: the least a read-once restore over a socket must do, ``restore_vs_raw_gloo``); each rank
  1/world of them into one /dev/shm file of the node, the whole then mapped copy-on-write and the model's bytes
  copied into the model's tensors, as any restore into a module must (``raw_read_once_node_s``: the least it must do
  on one host, where the checkpointer exchanges that way: the ceiling of ``restore_vs_raw``), each
  rank its own shard without the exchange (``raw_read_own_s``, ``restore_vs_raw_own_read``), and every
  rank all of them (``raw_read_s``: what a read-all restore must read, ``restore_read_all_vs_raw_all``);
* hpctrain: sync save, async save (blocking time; time until committed; second save = reused buffers),
  restore in both modes (cold page cache: the files are evicted with ``posix_fadvise(DONTNEED)`` after
  fsync), and the bytes each restore read from the files (``hpctrain.ckpt.meters()["bytes_read"]``;
  ``restore_read_amplification`` = bytes read by all ranks / checkpoint size; DCP's from ``/proc/self/io``
  ``rchar``), and where the ``read_once`` restore's time went (``restore_cpu_ms``: every rank's CPU by phase of
  ``RestoreResult.phases``, summed over the ranks, the mean of the round's two restores);
* floor for async staging: one in-memory copy of the whole state (preallocated ``copy_``);
* peers: DCP ``save``, ``async_save`` (blocking time), ``load`` (cold); ``torch.save`` of the full
  state on rank 0 + fsync, into a new file per save, the newest 3 kept.

Each figure is the best of ``--repeat`` rounds (3 by default: the machine may be shared), and every timed phase
starts after ``sync`` and a short pause, so that no phase pays for the previous one's write-back (measured order
effects were up to 3x on a VM disk). The order is balanced within each round: hpctrain's sync save and the raw write
are each measured twice, in mirrored order (A B B A), and so are its restores and the raw reads; each of those
figures is the mean of its two times, and each timed sync save and restore is the first of a new ``Checkpointer``
(as the one a round measured before the pairs was), not a warm repeat (so ``hp_async1``, the async saves'
checkpointer's first save, is its first of any kind). Which side is A alternates with the round number (``--round``,
which benchmarks/run.py passes, plus the repeat's index): ``hpctrain_first`` in the result. Why: sync and the pause
do not remove the order's effect. With one measurement a side, in an order alternating by round, 30 rounds of issue
34's command on the reference VM gave disk ``save_vs_raw`` 0.59 by median with the raw write first and 1.09 with the
save first, tmpfs ``restore_vs_raw`` 0.85 with the raw reads first and 0.77 after them, and the median of 5 rounds
(3 of one order, 2 of the other) took the majority order's bias (docs/benchmarks.md).
Prints one JSON object; ratios > 1 mean hpctrain is faster, except ``async_block_vs_*`` (lower is better).
Like any user, it reaches hpctrain through public names only (the meters and ``replicated_share``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import re
import shutil
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, evict, run_ranks  # noqa: E402

SMALL_TENSORS = 1000
"""The model's small parameters by default (with their optimizer states and steps: 4016 tensors in the checkpoint)."""


def make_state(size_mb: float, small_n: int = SMALL_TENSORS) -> tp.Tuple[tp.Dict[str, tp.Any], tp.Dict[str, tp.Any]]:
    """Deterministic model-like state: (model state_dict, Adam-like optimizer state_dict). ``small_n``: how many
    small parameters hold the 20 % of the parameters' bytes that the 4 big ones do not (``--small-tensors``)."""
    import torch

    g = torch.Generator().manual_seed(0)
    param_bytes = int(size_mb * 2**20 / 3)
    big = max(1, int(param_bytes * 0.8) // 4 // 4)  # 4 big tensors hold 80% of the parameters
    small = max(1, (param_bytes - 4 * big * 4) // 4 // small_n)
    model = {f"layers.{i}.big.weight": torch.randn(big, generator=g) for i in range(4)}
    for i in range(small_n):
        model[f"blocks.{i // 4}.small{i % 4}"] = torch.randn(small, generator=g)
    opt_state = {
        i: {
            "step": torch.tensor(10.0),
            "exp_avg": torch.randn(t.shape, generator=g),
            "exp_avg_sq": torch.rand(t.shape, generator=g),
        }
        for i, t in enumerate(model.values())
    }
    optim = {
        "state": opt_state,
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(len(model)))}],
    }
    return model, optim


class Holder:
    """``state_dict`` / ``load_state_dict`` like a module (copy into place) or an optimizer (keep tensors)."""

    def __init__(self, sd: tp.Dict[str, tp.Any], copy_into: bool) -> None:
        self.sd, self.copy_into = sd, copy_into

    def state_dict(self) -> tp.Dict[str, tp.Any]:
        return self.sd

    def load_state_dict(self, sd: tp.Dict[str, tp.Any], strict: bool = True) -> None:
        if self.copy_into:
            for k, v in sd.items():
                self.sd[k].copy_(v)
        else:
            self.sd = sd


def _tensors(obj: tp.Any) -> tp.Iterator[tp.Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def read_once_node_ceiling(
    files: tp.Sequence[Path],
    rank: int,
    world: int,
    group: tp.Any,
    model_dst: tp.Sequence[tp.Any],
    cpu: tp.Optional[tp.Dict[str, float]] = None,
) -> None:
    """What a read-once restore must do at least when every rank is on one host (the checkpointer's
    ``restore_exchange="node"``, auto's choice there): this rank reads 1/world of the files' bytes into one
    /dev/shm file of the node, and after a barrier maps the whole file copy-on-write (no byte copied);
    then the model's bytes are copied from the mapping into the model's existing tensors (``model_dst``).
    Collective on ``group`` (every rank calls it).

    That copy is the user-visible result a restore into a module must produce, and hpctrain's timed
    restore pays it: ``Module.load_state_dict`` (here the model ``Holder``) copies every parameter into
    the module's own tensors, so the restored values cannot stay in the mapping. Without it the ceiling
    did less than any restore into a module must (85 of the 256 MiB, 1004 ``copy_`` calls per rank, the
    pages of the mapping touched). The optimizer keeps the tensors it is handed (torch's
    ``Optimizer.load_state_dict`` does not copy them), so its bytes are not copied here, as hpctrain
    hands it views of the mapping. The source offsets are consecutive 64-byte aligned ranges of the
    mapping (the copy's cost depends on its sizes and count, not on which bytes).

    ``cpu``: filled with the calling thread's CPU seconds in the read (``read``) and in the copy (``copy``), for
    benchmarks/profile_restore.py."""
    import torch
    import torch.distributed as dist

    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    chunk = -(-total // world)
    path = f"/dev/shm/hpctrain-bench-ceiling-{os.getppid()}"
    if rank == 0:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, total)
    dist.barrier(group=group)
    if rank != 0:
        fd = os.open(path, os.O_RDWR)
    try:
        shared = mmap.mmap(fd, total, flags=mmap.MAP_SHARED)
        lo, hi, start = rank * chunk, min((rank + 1) * chunk, total), 0
        c0 = time.thread_time() if cpu is not None else 0.0
        for f, n in zip(files, sizes):
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                with open(f, "rb", buffering=0) as fh:
                    view, got = memoryview(shared)[a:b], 0
                    while got < b - a:
                        k = os.preadv(fh.fileno(), [view[got:]], a - start + got)
                        if k <= 0:
                            raise OSError(f"{f}: truncated")
                        got += k
                    view.release()
            start += n
        if cpu is not None:
            cpu["read"] = time.thread_time() - c0
        dist.barrier(group=group)
        c0 = time.thread_time() if cpu is not None else 0.0
        whole = mmap.mmap(fd, total, flags=mmap.MAP_PRIVATE)
        mapped = torch.frombuffer(whole, dtype=torch.uint8)  # every rank holds all the bytes, as storage
        at = 0
        for dst in model_dst:  # the module's load_state_dict: each parameter copied into its own tensor
            n = dst.numel() * dst.element_size()
            dst.copy_(mapped[at : at + n].view(dst.dtype).view(dst.shape))
            at = (at + n + 63) // 64 * 64
        if cpu is not None:
            cpu["copy"] = time.thread_time() - c0
        del mapped
        try:
            shared.close()
        except BufferError:  # a view still alive: the mapping goes with it
            pass
    finally:
        os.close(fd)
    dist.barrier(group=group)
    if rank == 0:
        os.unlink(path)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from hpctrain.ckpt import CheckpointConfig, Checkpointer, meters, replicated_share

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    work = Path(args.dir)
    model, optim = make_state(args.size_mb, args.small_tensors)
    state = {"model": model, "optim": optim}
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    res: tp.Dict[str, tp.Any] = {}

    def settle() -> None:
        """Every timed phase starts from the same disk state: nothing dirty, device write cache drained."""
        if rank == 0:
            os.sync()
            time.sleep(args.settle_s)
        dist.barrier()

    paired: tp.Dict[str, tp.List[float]] = {}  # a figure measured twice in a round (A B B A): its two times

    def timed(name: str, fn: tp.Callable[[], tp.Any], before: tp.Optional[tp.Callable[[], None]] = None) -> tp.Any:
        settle()
        if before is not None and rank == 0:
            before()
        dist.barrier()
        t0 = time.perf_counter()
        value = fn()
        dist.barrier()
        res["order"].append(name)
        if name in paired:
            paired[name].append(time.perf_counter() - t0)
        else:
            res[name] = min(res.get(name, float("inf")), time.perf_counter() - t0)  # best of --repeat
        return value

    def abba(sides: tp.Tuple[tp.Callable[[], None], tp.Callable[[], None]], names: tp.Sequence[str]) -> None:
        """The two sides in mirrored order, A B B A, each figure the mean of its two times (then the best of
        --repeat). Why pairs: the module docstring."""
        paired.update({n: [] for n in names})
        for side in sides + sides[::-1]:
            side()
        for n in names:
            times = paired.pop(n)
            res[n] = min(res.get(n, float("inf")), sum(times) / len(times))

    def keep_min(name: str, value: float) -> None:
        res[name] = min(res.get(name, float("inf")), value)

    # -- ceiling: raw write + fsync of this rank's 1/world of the bytes (the share its shard file holds)
    mine = replicated_share(state, rank, world)
    raw_dir = work / "raw"

    raw_saves = [0]

    def retain(paths: tp.Sequence[Path]) -> None:
        """The same retention as the checkpointer's keep_last=3: older copies are deleted, never overwritten."""
        for old in sorted(paths, key=lambda q: int(re.findall(r"\d+", q.name)[-1]))[:-3]:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)

    def raw_write() -> None:
        raw_saves[0] += 1
        d = raw_dir / f"save-{raw_saves[0]}"
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / f"rank{rank}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        pending = bytearray()
        for t in mine:
            view = memoryview(t.view(torch.uint8).numpy())
            if view.nbytes < (256 << 10):
                pending += view
                continue
            if pending:
                os.write(fd, pending)
                pending = bytearray()
            while view:
                view = view[os.write(fd, view) :]
        if pending:
            os.write(fd, pending)
        os.fsync(fd)
        os.close(fd)
        if rank == 0:
            retain(list(raw_dir.glob("save-*")))

    def one_round(rep: int) -> tp.List[Path]:
        hp_first = (args.round + rep) % 2 == 0
        res["hpctrain_first"] = int(hp_first)
        res["order"] = []  # the round's timed phases as they ran (the last round's in the result)
        base = 10 * rep
        steps = iter((base + 1, base + 2))

        def hp_save() -> None:
            # a new checkpointer for each: its first save, not a warm repeat (the module docstring)
            step, fresh = next(steps), Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=3))
            timed("hp_save_s", lambda: fresh.save(step, model=mh, optimizer=oh, data_state={"samples": step}))
            fresh.close()

        def raw_save() -> None:
            timed("raw_write_s", raw_write)

        abba((hp_save, raw_save) if hp_first else (raw_save, hp_save), ("hp_save_s", "raw_write_s"))

        # -- floor for staging: one in-memory copy of the whole state into preallocated buffers
        dst = [torch.empty_like(t) for t in _tensors(state)]
        for d in dst:
            d.zero_()

        def copy_all() -> None:
            for d, s in zip(dst, _tensors(state)):
                d.copy_(s)

        timed("copy_s", copy_all)

        # -- hpctrain
        for step in (base + 3, base + 4):
            settle()
            t0 = time.perf_counter()
            ck.save(step, model=mh, optimizer=oh, data_state={"samples": step}, blocking=False)
            block = time.perf_counter() - t0
            ck.wait()
            dist.barrier()
            total = time.perf_counter() - t0
            tag = "hp_async1" if step == 3 else "hp_async"  # the very first async save allocates the staging arena
            keep_min(f"{tag}_block_s", max(_gather(block, world)))
            keep_min(f"{tag}_commit_s", total)

        # -- raw cold read of the checkpoint's files (every rank reads all of them, as a replicated restore must)
        files = sorted((ck_dir / f"step-{base + 4:09d}").glob("*.shard"))

        def raw_read(which: tp.Sequence[Path]) -> None:
            for f in which:
                with open(f, "rb", buffering=0) as fh:
                    buf = torch.empty(os.fstat(fh.fileno()).st_size, dtype=torch.uint8)
                    fh.readinto(buf.numpy())

        def raw_read_once() -> None:
            """What a read-once restore must do at least: this rank reads 1/world of the files' bytes (the files
            as one byte stream cut into equal parts: about its own shard) with plain reads, and one all_gather
            of those raw bytes on a dedicated gloo group (as the checkpointer's own) gives every rank all of them."""
            sizes = [f.stat().st_size for f in files]
            chunk = -(-sum(sizes) // world)
            buf = torch.empty(chunk * world, dtype=torch.uint8)
            lo, hi, start = rank * chunk, min((rank + 1) * chunk, sum(sizes)), 0
            for f, n in zip(files, sizes):
                a, b = max(lo, start), min(hi, start + n)
                if a < b:
                    with open(f, "rb", buffering=0) as fh:
                        view, got = memoryview(buf[a:b].numpy()), 0
                        while got < b - a:
                            k = os.preadv(fh.fileno(), [view[got:]], a - start + got)
                            if k <= 0:
                                raise OSError(f"{f}: truncated")
                            got += k
                start += n
            from hpctrain.runtime.process_group import all_gather_into_tensor

            gather = all_gather_into_tensor()
            gather(buf, buf[rank * chunk : (rank + 1) * chunk], group=gloo)

        model_dst = [torch.zeros_like(v) for v in model.values()]  # the restored model's tensors, as model2 below

        def raw_read_once_node() -> None:
            read_once_node_ceiling(files, rank, world, gloo, model_dst)

        def raw_reads() -> None:
            timed("raw_read_s", lambda: raw_read(files), before=lambda: evict(ck_dir))
            timed("raw_read_own_s", lambda: raw_read(files[rank :: len(files)]), before=lambda: evict(ck_dir))
            timed("raw_read_once_s", raw_read_once, before=lambda: evict(ck_dir))
            timed("raw_read_once_node_s", raw_read_once_node, before=lambda: evict(ck_dir))

        restore_cpu: tp.List[tp.Dict[str, float]] = []  # the read_once restores' CPU by phase, this round

        def hp_restores() -> None:
            for mode, name in (("read_once", "hp_restore_s"), ("read_all", "hp_restore_read_all_s")):
                model2 = {k: torch.zeros_like(v) for k, v in model.items()}
                optim2: tp.Dict[str, tp.Any] = {"state": {}, "param_groups": []}
                mh2, oh2 = Holder(model2, True), Holder(optim2, False)
                # a new checkpointer for each, as for the saves: its first restore, as a job's at its start
                rck = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=0, restore_mode=mode))
                before = meters()["bytes_read"]
                r = timed(
                    name, lambda c=rck, m=mh2, o=oh2: c.restore(model=m, optimizer=o), before=lambda: evict(ck_dir)
                )
                rck.close()
                assert r is not None and r.step == base + 4
                if mode == "read_once":  # where its time went: every rank's CPU by phase, for each of the pair
                    phases = _gather({k: v["cpu_s"] for k, v in r.phases.items()}, world)
                    restore_cpu.append({k: sum(ph.get(k, 0.0) for ph in phases) for k in _keys(phases)})
                assert all(torch.equal(model[k], model2[k]) for k in model)
                res[f"{name[:-2]}_bytes"] = sum(_gather(meters()["bytes_read"] - before, world))

        reads = ("raw_read_s", "raw_read_own_s", "raw_read_once_s", "raw_read_once_node_s", "hp_restore_s")
        abba((hp_restores, raw_reads) if hp_first else (raw_reads, hp_restores), reads + ("hp_restore_read_all_s",))
        res["restore_cpu_ms"] = {  # the pair's mean (of the round's last repeat)
            k: 1e3 * sum(c.get(k, 0.0) for c in restore_cpu) / len(restore_cpu) for k in _keys(restore_cpu)
        }

        # -- peers
        timed("dcp_save_s", lambda: dcp.save(state, checkpoint_id=str(dcp_dir / f"sync{rep}")))
        settle()
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=str(dcp_dir / f"async{rep}"))
        block = time.perf_counter() - t0
        (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
        dist.barrier()
        keep_min("dcp_async_block_s", max(_gather(block, world)))
        keep_min("dcp_async_commit_s", time.perf_counter() - t0)
        target = {
            "model": {k: torch.zeros_like(v) for k, v in model.items()},
            "optim": {
                "state": {i: {k: torch.zeros_like(v) for k, v in s.items()} for i, s in optim["state"].items()},
                "param_groups": optim["param_groups"],
            },
        }
        rchar = _rchar()
        timed(
            "dcp_load_s",
            lambda: dcp.load(target, checkpoint_id=str(dcp_dir / f"sync{rep}")),
            before=lambda: evict(dcp_dir),
        )
        res["dcp_load_bytes"] = sum(_gather(_rchar() - rchar, world))
        dcp_bytes = sum(f.stat().st_size for f in (dcp_dir / f"sync{rep}").iterdir())
        res["dcp_checkpoint_bytes"] = dcp_bytes
        if rank == 0:  # DCP keeps what the caller keeps: the same retention
            retain([q for q in dcp_dir.iterdir() if q.name.startswith("sync")])
            retain([q for q in dcp_dir.iterdir() if q.name.startswith("async")])

        def torch_save() -> None:
            if rank == 0:
                path = work / f"torch_save-{rep}.pt"
                torch.save(state, path)
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                retain(list(work.glob("torch_save-*.pt")))

        timed("torch_save_s", torch_save)
        return files

    ck_dir, dcp_dir = work / "hpctrain", work / "dcp"
    ck = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=3))  # the async saves' (its first is hp_async1)
    # the read-once ceiling's exchange: a dedicated gloo group of the same ranks, as each Checkpointer creates
    # for its own exchange (dist.new_group(backend="gloo")), used once here as the checkpointer uses its own
    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=600))
    dist.all_gather_object([None] * world, rank, group=gloo)
    mh, oh = Holder(model, True), Holder(optim, False)
    for rep in range(args.repeat):
        files = one_round(rep)
    ck.close()
    if rank == 0:
        res["state_bytes"] = nbytes
        res["tensors"] = sum(1 for _ in _tensors(state))
        res["checkpoint_bytes"] = sum(f.stat().st_size for f in files)
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def _rchar() -> int:
    """Bytes this process read through read(2)/pread(2) so far (any file: the meter for DCP's reads)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _keys(dicts: tp.Iterable[tp.Dict[str, tp.Any]]) -> tp.List[str]:
    """Every key of ``dicts``, in the order first met (a phase one restore or rank took and another did not)."""
    return list(dict.fromkeys(k for d in dicts for k in d))


def _gather(x: tp.Any, world: int) -> tp.List[tp.Any]:
    import torch.distributed as dist

    out: tp.List[tp.Any] = [None] * world
    dist.all_gather_object(out, x)
    return out


def run_one(args: argparse.Namespace, base: Path) -> tp.Optional[tp.Dict[str, tp.Any]]:
    """One full measurement on the filesystem holding ``base``; None when a rank failed."""
    from hpctrain.ckpt import meters  # torch-free

    created = not base.exists()  # then removed again at the end (an empty /dev/shm/hpctrain-bench was left behind)
    base.mkdir(parents=True, exist_ok=True)
    args.dir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=base)).resolve()
    out = args.dir / "result.json"
    try:
        if not run_ranks(_worker, args.world, args, out, "bench_checkpoint"):
            return None
        m = json.loads(out.read_text())
        gb = m["state_bytes"] / 1e9
        result = {
            "dir": str(base),
            "world": args.world,
            "size_mb": args.size_mb,
            "small_tensors": args.small_tensors,
            "tensors": m["tensors"],
            "repeat": args.repeat,
            "hpctrain_first": m["hpctrain_first"],  # 1: hpctrain measured before its ceilings (the last repeat)
            "order": m["order"],
            "state_bytes": m["state_bytes"],
            "checkpoint_bytes": m["checkpoint_bytes"],
            "crc32": meters()["crc32_impl"],  # isal (the [fast] extra) or zlib: the checksum cost in save and restore
            "times_s": {k: round(v, 4) for k, v in m.items() if k.endswith("_s")},
            "throughput_GBps": {
                "raw_write": gb / m["raw_write_s"],
                "hpctrain_save": gb / m["hp_save_s"],
                "dcp_save": gb / m["dcp_save_s"],
                "torch_save_rank0": gb / m["torch_save_s"],
                "raw_read_per_rank": gb / m["raw_read_s"],
                # the read-once ceilings' rates: one host (1/world read into one /dev/shm buffer, the whole mapped:
                # hpctrain_restore / it = restore_vs_raw) and over a socket (1/world read + the all_gather)
                "raw_read_once": gb / m["raw_read_once_node_s"],
                "raw_read_once_gloo": gb / m["raw_read_once_s"],
                "hpctrain_restore": gb / m["hp_restore_s"],
                "dcp_load": gb / m["dcp_load_s"],
            },
            "save_vs_raw": m["raw_write_s"] / m["hp_save_s"],
            "save_vs_dcp": m["dcp_save_s"] / m["hp_save_s"],
            "save_vs_torch_save": m["torch_save_s"] / m["hp_save_s"],
            "async_block_vs_copy": m["hp_async_block_s"] / m["copy_s"],
            "async_block_vs_dcp": m["hp_async_block_s"] / m["dcp_async_block_s"],
            "async_first_block_vs_copy": m["hp_async1_block_s"] / m["copy_s"],
            "async_commit_vs_sync_save": m["hp_async_commit_s"] / m["hp_save_s"],
            "dcp_async_block_vs_dcp_save": m["dcp_async_block_s"] / m["dcp_save_s"],
            # read_once restore vs its ceiling on one host, where the checkpointer exchanges through the node's
            # /dev/shm (restore_exchange="node", auto's choice): each rank reads 1/world of the files' bytes into one
            # shared buffer, then maps the whole (the least read_once must do here)
            "restore_vs_raw": m["raw_read_once_node_s"] / m["hp_restore_s"],
            # ... and vs the ceiling of an exchange over a socket (1/world read + one all_gather on gloo), what a
            # read-once restore across hosts must do (the row's ceiling until the node exchange)
            "restore_vs_raw_gloo": m["raw_read_once_s"] / m["hp_restore_s"],
            # read_once restore vs each rank only reading its own shard (no exchange: a lower bound, not reachable)
            "restore_vs_raw_own_read": m["raw_read_own_s"] / m["hp_restore_s"],
            # read_all restore vs every rank reading every shard (what that mode must read)
            "restore_read_all_vs_raw_all": m["raw_read_s"] / m["hp_restore_read_all_s"],
            "restore_read_once_vs_read_all": m["hp_restore_read_all_s"] / m["hp_restore_s"],
            "restore_vs_dcp": m["dcp_load_s"] / m["hp_restore_s"],
            "restore_read_amplification": m["hp_restore_bytes"] / m["checkpoint_bytes"],
            "restore_read_all_read_amplification": m["hp_restore_read_all_bytes"] / m["checkpoint_bytes"],
            "dcp_load_read_amplification": m["dcp_load_bytes"] / m["dcp_checkpoint_bytes"],
            # the read_once restore's CPU by phase (RestoreResult.phases), all ranks' main threads summed: with ranks
            # sharing cores their CPU adds up, so this says which phase a slower round spent more in
            "restore_cpu_ms": m["restore_cpu_ms"],
        }
        result = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}
        result["throughput_GBps"] = {k: round(v, 3) for k, v in result["throughput_GBps"].items()}
        result["restore_cpu_ms"] = {k: round(v, 2) for k, v in result["restore_cpu_ms"].items()}
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for entry in (args.dir / "hpctrain").iterdir():
                shutil.move(str(entry), str(args.keep / entry.name))
        return result
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):  # not empty: another run's, or kept on purpose
                base.rmdir()


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=256.0, help="total state size (params + optimizer), MiB")
    p.add_argument("--world", type=int, default=4, help="number of ranks (processes)")
    p.add_argument(
        "--small-tensors",
        type=int,
        default=SMALL_TENSORS,
        help=f"the model's small parameters (default {SMALL_TENSORS}; each adds 4 tensors with its optimizer state): "
        "the same bytes in fewer tensors show what the per-tensor work costs",
    )
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    p.add_argument("--keep", type=Path, help="leave hpctrain's committed checkpoints (the last 3) in this directory")
    p.add_argument("--repeat", type=int, default=3, help="rounds; each figure is the best round (shared machines)")
    p.add_argument("--settle-s", type=float, default=0.3, help="sync + pause before each timed phase")
    p.add_argument(
        "--round",
        type=int,
        default=1,
        help="this run's round in a suite (benchmarks/run.py passes it): odd leads each A B B A pair with the "
        "ceiling, even with hpctrain; with --repeat the lead alternates between repeats",
    )
    p.add_argument(
        "--dir",
        type=Path,
        action="append",
        help="working directory on a filesystem to test; repeat for several (default: ./bench_out and "
        "/dev/shm/hpctrain-bench: disk and tmpfs side by side)",
    )
    args = p.parse_args(argv)
    if args.size_mb <= 0 or args.world < 1 or args.repeat < 1 or args.small_tensors < 1:
        p.error("--size-mb must be > 0, --world >= 1, --repeat >= 1 and --small-tensors >= 1")
    dirs = args.dir or [Path("bench_out"), Path("/dev/shm/hpctrain-bench")]
    results = {}
    for d in dirs:
        r = run_one(args, d)
        args.keep = None  # --keep: the first filesystem's checkpoints
        if r is None:
            return 1
        results["tmpfs" if str(d.resolve()).startswith("/dev/shm") else ("disk" if len(dirs) < 3 else str(d))] = r
    final = next(iter(results.values())) if len(results) == 1 else results
    emit(final, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
