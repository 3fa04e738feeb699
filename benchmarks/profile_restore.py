"""Where a read-once restore spends its time, rank by rank, against its ceiling: a profile from the restore's meters.

    python benchmarks/profile_restore.py [--size-mb 256] [--world 4] [--small-tensors 1000] [--rounds 12]
        [--dir /dev/shm/hpctrain-prof] [--cold] [--json PATH] [--what-if free-metadata] [--what-if no-verify]
        [--what-if no-readahead]

``--world`` ranks (one process each, gloo on the CPU) save ``bench_checkpoint.py``'s state (``--small-tensors``
as there) once in ``--dir`` (tmpfs by default), then in the same processes run ``--rounds`` rounds of its
read-once ceiling (``read_once_node_ceiling``: each rank reads its quarter into the node's shared buffer, maps the
whole, copies the model out) and of ``Checkpointer.restore`` (``restore_mode="read_once"``, the node exchange),
alternating which goes first. ``--cold``: the checkpoint's files are dropped from the page cache before each side
(``_common.evict``, as ``bench_checkpoint.py`` does before its reads), for a ``--dir`` on a disk. Per rank and
round: the restore's own phases (``RestoreResult.phases``: wall and the calling thread's CPU per phase,
``hpctrain.ckpt.RESTORE_PHASES``), the ceiling's read and copy CPU, and each side's process CPU (every thread, gloo's
included). Prints the medians of rounds 2.. (the first warms the processes up)
as a table of CPU milliseconds, and the ceiling/restore ratio of each round's wall time with its median; ``--json
PATH`` writes every figure. A profile, not a benchmark: the goal's ratio comes from ``bench_checkpoint.py``,
whose restores run warm in the same way.

``--what-if`` (repeatable) measures what a part of the restore is worth by taking it away, the rest unchanged:
``free-metadata``: every round after the first reuses the first round's index and plan (``index_share``,
``build_index`` and ``plan`` answer from memory: no header parsed, typed or checked, no skeleton, no packing; the
exchange and the agreements still run): the most any faster index (a columnar header, an index kept as columns)
could give. ``no-verify``: ``verify_checksums=False`` (no crc32 computed or combined): what the checksums cost.
``no-readahead``: the shard files are not read ahead while the index is built (``hpctrain.ckpt._readahead``):
what the read-ahead is worth (with ``--cold`` on a disk; nothing on tmpfs). Only the last is a restore one could
use: the reused index would miss a damaged or changed checkpoint, and no checksum would catch a flipped byte.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import evict, run_ranks  # noqa: E402
from bench_checkpoint import SMALL_TENSORS  # noqa: E402

_METADATA_STEPS = ("index_share", "build_index", "plan")
"""What ``--what-if free-metadata`` takes away: the restore's index and plan, as ``Checkpointer.restore`` calls them."""
WHAT_IFS = ("free-metadata", "no-verify", "no-readahead")


def _first_answer(fn: tp.Callable[..., tp.Any]) -> tp.Callable[..., tp.Any]:
    """``fn`` answering every call after its first with its first call's result (``--what-if free-metadata``)."""
    first: tp.List[tp.Any] = []

    def again(*args: tp.Any, **kwargs: tp.Any) -> tp.Any:
        if not first:
            first.append(fn(*args, **kwargs))
        return first[0]

    return again


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    from bench_checkpoint import Holder, make_state, read_once_node_ceiling

    from hpctrain.ckpt import CheckpointConfig, Checkpointer
    from hpctrain.ckpt import checkpointer as restore_module

    if "free-metadata" in args.what_if:
        for name in _METADATA_STEPS:
            setattr(restore_module, name, _first_answer(getattr(restore_module, name)))
    hints = [0]  # the read-ahead threads the restores started (none with --what-if no-readahead)
    real_readahead = restore_module.readahead

    class NoHint:
        """What the restore stops when nothing was read ahead (``--what-if no-readahead``)."""

        def stop(self) -> None:
            pass

    def counted_readahead(*a: tp.Any, **k: tp.Any) -> tp.Any:
        if "no-readahead" in args.what_if:
            return NoHint()
        hints[0] += 1
        return real_readahead(*a, **k)

    restore_module.readahead = counted_readahead  # type: ignore[assignment]
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=600)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)  # the ceiling's exchange, as the checkpointer makes its own
    model, optim = make_state(args.size_mb, args.small_tensors)
    ck_dir = Path(args.work) / "ck"
    saver = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=1))
    saver.save(1, model=Holder(model, True), optimizer=Holder(optim, False), data_state={"samples": 1})
    saver.close()
    verify = "no-verify" not in args.what_if
    ck = Checkpointer(CheckpointConfig(dir=ck_dir, keep_last=0, restore_mode="read_once", verify_checksums=verify))
    files = sorted(next(ck_dir.glob("step-*")).glob("*.shard"))
    model_dst = [torch.zeros_like(v) for v in model.values()]

    def cold() -> None:
        """With ``--cold``: the checkpoint's files out of the page cache (rank 0; the next barrier waits for it)."""
        if args.cold and rank == 0:
            evict(ck_dir)

    def restore() -> tp.Dict[str, tp.Any]:
        model2 = {k: torch.zeros_like(v) for k, v in model.items()}
        mh, oh = Holder(model2, True), Holder({"state": {}, "param_groups": []}, False)
        cold()
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        before = hints[0]
        r = ck.restore(model=mh, optimizer=oh)
        dist.barrier()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert r is not None and r.step == 1 and all(torch.equal(model[k], model2[k]) for k in model)
        verified, read_ahead = ck.config.verify_checksums, hints[0] > before
        return {
            "wall_s": wall,
            "process_cpu_s": cpu,
            "phases": r.phases,
            "verified": verified,
            "read_ahead": read_ahead,
        }

    def ceiling() -> tp.Dict[str, tp.Any]:
        parts: tp.Dict[str, float] = {}
        cold()
        dist.barrier()
        c0, t0, m0 = time.process_time(), time.perf_counter(), time.thread_time()
        read_once_node_ceiling(files, rank, world, gloo, model_dst, cpu=parts)
        main = time.thread_time() - m0
        dist.barrier()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"wall_s": wall, "process_cpu_s": cpu, "main_cpu_s": main, **{f"{k}_cpu_s": v for k, v in parts.items()}}

    rounds = []
    for i in range(args.rounds):
        first, second = (restore, ceiling) if i % 2 else (ceiling, restore)
        a, b = first(), second()
        rounds.append({"restore": a, "ceiling": b} if first is restore else {"restore": b, "ceiling": a})
    ck.close()
    everyone: tp.List[tp.Any] = [None] * world
    dist.all_gather_object(everyone, rounds)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.barrier()
    dist.destroy_process_group()


def _median(xs: tp.Iterable[float]) -> float:
    return statistics.median(list(xs))


def summarize(per_rank: tp.List[tp.List[tp.Dict[str, tp.Any]]]) -> tp.Dict[str, tp.Any]:
    """Medians over rounds 2.. (all rounds when there is one) of every figure, per rank; the per-round ratios."""
    from hpctrain.ckpt import RESTORE_PHASES

    rounds = [r[1:] or r for r in per_rank]
    ratios = [c["ceiling"]["wall_s"] / c["restore"]["wall_s"] for c in rounds[0]]  # wall between barriers: rank 0's
    table: tp.Dict[str, tp.List[float]] = {}
    for key in ("read_cpu_s", "copy_cpu_s", "main_cpu_s"):
        table[f"ceiling {key[:-6]}"] = [_median(r["ceiling"][key] for r in rs) for rs in rounds]
    names = [n for n in RESTORE_PHASES if any(n in r["restore"]["phases"] for rs in rounds for r in rs)]
    for name in names:
        table[f"restore {name}"] = [
            _median(r["restore"]["phases"].get(name, {}).get("cpu_s", 0.0) for r in rs) for rs in rounds
        ]
    table["restore main thread"] = [
        _median(sum(p["cpu_s"] for p in r["restore"]["phases"].values()) for r in rs) for rs in rounds
    ]
    for side in ("ceiling", "restore"):
        table[f"{side} process (every thread)"] = [_median(r[side]["process_cpu_s"] for r in rs) for rs in rounds]
    return {
        "rounds": len(rounds[0]),
        "ratio_median": _median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "wall_ms": {side: 1e3 * _median(r[side]["wall_s"] for r in rounds[0]) for side in ("ceiling", "restore")},
        "cpu_ms": {k: [round(1e3 * v, 2) for v in vs] for k, vs in table.items()},
    }


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=256.0, help="total state size (params + optimizer), MiB")
    p.add_argument("--world", type=int, default=4, help="number of ranks (processes)")
    p.add_argument(
        "--small-tensors",
        type=int,
        default=SMALL_TENSORS,
        help="the state's small parameters (as bench_checkpoint.py's)",
    )
    p.add_argument("--rounds", type=int, default=12, help="rounds of ceiling + restore (the first is not counted)")
    p.add_argument("--dir", type=Path, default=Path("/dev/shm/hpctrain-prof"), help="where the checkpoint is saved")
    p.add_argument("--cold", action="store_true", help="drop the files from the page cache before each side (disk)")
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    p.add_argument(
        "--what-if",
        action="append",
        default=[],
        choices=WHAT_IFS,
        help="take a part of the restore away to measure its worth (repeatable; the module docstring)",
    )
    args = p.parse_args(argv)
    if args.size_mb <= 0 or args.world < 2 or args.rounds < 1 or args.small_tensors < 1:
        p.error("--size-mb must be > 0, --world >= 2 (the read-once exchange), --rounds >= 1 and --small-tensors >= 1")
    made = not args.dir.exists()
    args.dir.mkdir(parents=True, exist_ok=True)
    args.work = tempfile.mkdtemp(prefix="profile-restore-", dir=args.dir)
    out = Path(args.work) / "rounds.json"
    try:
        if not run_ranks(_worker, args.world, args, out, "profile_restore"):
            return 1
        per_rank = json.loads(out.read_text())
        result = summarize(per_rank)
        result["what_if"] = sorted(set(args.what_if))
        result["cold"] = args.cold
        # as the ranks' checkpointers had it (every round of every rank), not as asked
        result["verified"] = all(r["restore"]["verified"] for rs in per_rank for r in rs)
        result["read_ahead"] = all(r["restore"]["read_ahead"] for rs in per_rank for r in rs)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
        if made:  # the directory it made goes too, when nothing else was put there meanwhile
            with contextlib.suppress(OSError):
                args.dir.rmdir()
    print(f"{'CPU ms, median of rounds 2..':<36}" + "".join(f"{'rank ' + str(r):>10}" for r in range(args.world)))
    for name, values in result["cpu_ms"].items():
        print(f"{name:<36}" + "".join(f"{v:>10.1f}" for v in values))
    if args.what_if:
        print(f"what if: {', '.join(result['what_if'])} (not a restore to use: the module docstring)")
    print(
        f"wall ms: ceiling {result['wall_ms']['ceiling']:.1f}, restore {result['wall_ms']['restore']:.1f}; "
        f"ceiling/restore per round: median {result['ratio_median']:.3f} "
        f"({result['ratio_min']:.3f}-{result['ratio_max']:.3f}), {result['rounds']} rounds"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
