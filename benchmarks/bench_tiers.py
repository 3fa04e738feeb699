"""Checkpoint tiers benchmark: the local + partner tier vs the global tier, in one run.

    python benchmarks/bench_tiers.py [--size-mb 256] [--world 4] [--ranks-per-node 2] [--repeat 2]
        [--global-dir ./bench_out/tiers-global] [--local-dir /dev/shm/hpctrain-tiers] [--json PATH]

``--world`` real processes on a gloo group (CPU) in simulated nodes of ``--ranks-per-node`` ranks (each its
own local directory; ``hpctrain.ckpt.tiers.SIM_NODES_ENV``), a DDP-like replicated state of ``--size-mb``.
Every timing is wall time between two barriers, the best of ``--repeat`` rounds. Measured:

* ``global_save_s`` / ``local_save_s``: a blocking save to the global directory / to the local tier (own shard,
  partner exchange, replica written, every node's commit); ``local_async_block_s``: what an async local save
  blocks the step for (the copy to host memory);
* ``restore_global_s`` (a plain Checkpointer on the global directory), ``restore_local_s`` (the local tier,
  every node intact), ``restore_partner_s`` (node 1's local directory wiped: its shards come from partners).

Ratios > 1 mean the local tier is faster. On one machine the "global" directory is a local disk, not a
parallel filesystem shared by every node of a job: the ratios here understate what the local tier saves there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import sys
import time
import typing as tp
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Holder:
    def __init__(self, sd: tp.Dict[str, tp.Any]) -> None:
        self.sd = sd

    def state_dict(self) -> tp.Dict[str, tp.Any]:
        return self.sd

    def load_state_dict(self, sd: tp.Dict[str, tp.Any], strict: bool = True) -> None:
        self.sd = sd


def _target(state: tp.Dict[str, tp.Any]) -> _Holder:
    """An object to restore into: the state's keys and shapes."""
    return _Holder({k: v.new_empty(v.shape) for k, v in state.items()})


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:  # pragma: no cover
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    from hpctrain.ckpt import CheckpointConfig, Checkpointer
    from hpctrain.ckpt.tiers import TieredCheckpointer

    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = int(args.size_mb * 2**20 / 4 / 8)
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(n, generator=g) for i in range(8)}
    local_max = int(args.size_mb * 2**20 * 8)
    cfg = CheckpointConfig(
        dir=args.global_dir,
        keep_last=2,
        local_every_steps=1,
        global_every=1_000_000,
        local_dir=args.local_dir,
        local_max_bytes=local_max,
        restore_mode="read_once",
    )
    ck = TieredCheckpointer(cfg, identity="bench")
    res: tp.Dict[str, float] = {}

    def timed(name: str, fn: tp.Callable[[], tp.Any]) -> None:
        os.sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        res[name] = min(res.get(name, float("inf")), time.perf_counter() - t0)

    ck.save(1, tier="global", model=_Holder(state))  # warm-up: first-save costs (buffers, layouts) in neither
    ck.save(2, tier="local", model=_Holder(state))
    step = 2
    for _ in range(args.repeat):
        step += 1
        timed("global_save_s", lambda s=step: ck.save(s, tier="global", model=_Holder(state)))
        step += 1
        timed("local_save_s", lambda s=step: ck.save(s, tier="local", model=_Holder(state)))
        step += 1
        t0 = time.perf_counter()
        ck.save(step, tier="local", model=_Holder(state), blocking=False)
        res["local_async_block_s"] = min(res.get("local_async_block_s", float("inf")), time.perf_counter() - t0)
        ck.wait()
        dist.barrier()
        plain = Checkpointer(CheckpointConfig(dir=args.global_dir, restore_mode="read_once", clean_abandoned=False))
        timed("restore_global_s", lambda c=plain: c.restore(model=_target(state)))
        plain.close()
        timed("restore_local_s", lambda: ck.restore(model=_target(state)))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(Path(args.local_dir) / "node-1", ignore_errors=True)
        timed("restore_partner_s", lambda: ck.restore(model=_target(state)))
    ck.close()
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=256.0)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--global-dir", default="bench_out/tiers-global")
    p.add_argument("--local-dir", default="/dev/shm/hpctrain-tiers")
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    args = p.parse_args(argv)
    if args.world < 2 or args.world % args.ranks_per_node or args.world // args.ranks_per_node < 2:
        p.error("--world must be at least two nodes of --ranks-per-node ranks")
    for d in (args.global_dir, args.local_dir):
        shutil.rmtree(d, ignore_errors=True)
    os.environ["HPCTRAIN_CKPT_SIM_RANKS_PER_NODE"] = str(args.ranks_per_node)
    out = Path(args.global_dir).parent / "tiers-result.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = _port()
    procs = [ctx.Process(target=_worker, args=(r, args.world, port, args, str(out))) for r in range(args.world)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    try:
        if any(pr.exitcode for pr in procs):
            print(f"bench_tiers: a rank failed (exit codes {[pr.exitcode for pr in procs]})", file=sys.stderr)
            return 1
        r = json.loads(out.read_text())
    finally:
        for d in (args.global_dir, args.local_dir):
            shutil.rmtree(d, ignore_errors=True)
    r.update(
        size_mb=args.size_mb,
        world=args.world,
        ranks_per_node=args.ranks_per_node,
        local_save_vs_global=r["global_save_s"] / r["local_save_s"],
        local_async_block_vs_global_save=r["local_async_block_s"] / r["global_save_s"],
        restore_local_vs_global=r["restore_global_s"] / r["restore_local_s"],
        restore_partner_vs_global=r["restore_global_s"] / r["restore_partner_s"],
    )
    text = json.dumps(r, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
