"""Checkpoint tiers benchmark: the local + partner tier vs the global tier, in one run.

    python benchmarks/bench_tiers.py [--size-mb 256] [--world 4] [--ranks-per-node 2] [--repeat 3]
        [--global-dir ./bench_out/tiers-global] [--local-dir /dev/shm/hpctrain-tiers] [--json PATH]
        [--no-overhead | --overhead-only] [--no-demo] [--step-width 512] [--overhead-every 40] ...  (--help)

``--world`` real processes on a gloo group (CPU) in simulated nodes of ``--ranks-per-node`` ranks (each its
own local directory; ``hpctrain.ckpt.tiers.SIM_NODES_ENV``), a DDP-like replicated state of ``--size-mb``.
Every timing is wall time between two barriers. ``--repeat N`` rounds, interleaved: each round measures every
figure below once, in the same order, and the ratios are taken within the round; the top-level times and ratios
are the medians over the rounds, ``spread`` has every figure's median and min-max, ``rounds`` each round's
figures and the 1-min load average before / after it (``load_changed``: moved by more than one core;
``_rounds.py``). Measured:

* ``global_save_s`` / ``local_save_s``: a blocking save to the global directory / to the local tier (own shard,
  partner exchange, replica written, every node's commit); ``local_async_block_s``: what an async local save
  blocks the step for (the copy to host memory);
* ``restore_global_s`` (a plain Checkpointer on the global directory), ``restore_local_s`` (the local tier,
  every node intact), ``restore_partner_s`` (node 1's local directory wiped: its shards come from partners).

Ratios > 1 mean the local tier is faster. On one machine the "global" directory is a local disk, not a
parallel filesystem shared by every node of a job: the ratios here understate what the local tier saves there.

``overhead`` (skipped with ``--no-overhead``): what async saves cost a training loop. The same ranks run DDP-like
steps (an MLP's forward + backward, one all_reduce of its gradients, SGD) holding ``--size-mb`` of state (the MLP +
untouched tensors), with no checkpoint (``step_s``) and with an async ``local`` / ``global`` /
``local_then_global`` (a local save, then its files copied to the global tier in the background: what every
``global_every_local_saves``-th save of a run does) save every ``--overhead-every`` steps. ``save_cost_s``: per
save (median), the steps from the save's call until no rank has it in flight (its blocking part included) less
as many steps of the reference (the mean step just before and after that window); ``overhead_at_60s`` /
``_300s`` = save_cost_s / interval.
``direct``: the check of that model, alternating blocks of ``--direct-interval`` seconds of steps with one
local save / with none, ``--direct-seconds`` of each: ``overhead`` = with / without - 1, beside
``predicted_overhead`` = the local save_cost_s / the blocks' interval.

``demo`` (skipped with ``--no-demo``): the demo trainer (``python -m torch.distributed.run --nproc-per-node 2
-m hpctrain.launch --entry hpctrain.examples.demo:main``) without and with ``--local-every E`` (E =
``--demo-local-every``, local dir on disk next to ``--global-dir``), ``--log-every E/3``, ``--demo-pairs``
alternating runs: the median step time, ``save_cost_s`` = (with - without) * E, ``save_cost_within_s`` (from
the intervals around each save in the runs with saves, see ``_demo``), and their overhead at 60 s / 300 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _rounds  # noqa: E402
from _common import free_port  # noqa: E402

# the basic section's ratios, each (numerator, denominator) of times measured in the same round
RATIOS = {
    "local_save_vs_global": ("global_save_s", "local_save_s"),
    "local_async_block_vs_global_save": ("local_async_block_s", "global_save_s"),
    "restore_local_vs_global": ("restore_global_s", "restore_local_s"),
    "restore_partner_vs_global": ("restore_global_s", "restore_partner_s"),
}


def basic_rounds(per_round: tp.Sequence[tp.Mapping[str, float]]) -> tp.Dict[str, tp.Any]:
    """The basic section from its rounds' times (each with ``load_before`` / ``load_after``): every time and
    ratio as its median over the rounds (each ratio taken within its round), plus ``_rounds.report``'s fields."""
    rounds = []
    for i, t in enumerate(per_round, 1):
        figures = {k: v for k, v in t.items() if k.endswith("_s")}
        figures.update({name: figures[a] / figures[b] for name, (a, b) in RATIOS.items()})
        rounds.append(_rounds.Round(i, t["load_before"], t["load_after"], figures, t.get("seconds")))
    rep = _rounds.report(rounds)
    return {k: v["median"] for k, v in rep["spread"].items()} | rep


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


def _basic(rank: int, args: argparse.Namespace, ck: tp.Any, res: tp.Dict[str, tp.Any]) -> int:  # pragma: no cover
    """Blocking saves and restores of both tiers (the first figures); returns the last step saved."""
    import torch
    import torch.distributed as dist

    from hpctrain.ckpt import CheckpointConfig, Checkpointer

    n = int(args.size_mb * 2**20 / 4 / 8)
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(n, generator=g) for i in range(8)}

    def timed(name: str, fn: tp.Callable[[], tp.Any]) -> None:
        os.sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        cur[name] = time.perf_counter() - t0

    ck.save(1, tier="global", model=_Holder(state))  # warm-up: first-save costs (buffers, layouts) in neither
    ck.save(2, tier="local", model=_Holder(state))
    step = 2
    per_round: tp.List[tp.Dict[str, float]] = []
    for _ in range(args.repeat):
        cur: tp.Dict[str, float] = {"load_before": _rounds.load_1min()}
        t_round = time.perf_counter()
        step += 1
        timed("global_save_s", lambda s=step: ck.save(s, tier="global", model=_Holder(state)))
        step += 1
        timed("local_save_s", lambda s=step: ck.save(s, tier="local", model=_Holder(state)))
        step += 1
        t0 = time.perf_counter()
        ck.save(step, tier="local", model=_Holder(state), blocking=False)
        cur["local_async_block_s"] = time.perf_counter() - t0
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
        cur.update(load_after=_rounds.load_1min(), seconds=round(time.perf_counter() - t_round, 2))
        per_round.append(cur)
    res["basic_rounds"] = per_round  # rank 0's: main() turns them into medians and spreads
    return step


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:  # pragma: no cover
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from hpctrain.ckpt import CheckpointConfig
    from hpctrain.ckpt.tiers import TieredCheckpointer

    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = CheckpointConfig(
        dir=args.global_dir,
        keep_last=2,
        local_every_steps=1,
        global_every_local_saves=1,  # every tier="auto" save: local, then copied to the global tier (the drain)
        local_dir=args.local_dir,
        local_max_bytes=int(args.size_mb * 2**20 * 8),
        restore_mode="read_once",
    )
    ck = TieredCheckpointer(cfg, identity="bench")
    res: tp.Dict[str, tp.Any] = {}
    step = 0 if args.overhead_only else _basic(rank, args, ck, res)
    if not args.no_overhead:
        res["overhead"] = _overhead(rank, world, ck, step, args)
    ck.close()
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- overhead
def _train_step(args: argparse.Namespace, world: int) -> tp.Tuple[tp.Callable[[float], bool], tp.Dict[str, tp.Any]]:
    """A DDP-like step (an MLP's forward + backward, one all_reduce of the flattened gradients, an SGD update)
    and the state a save holds: the MLP's parameters plus untouched tensors up to ``--size-mb`` (optimizer
    state, frozen weights). ``step(flag)`` also all-reduces ``flag`` (with the gradients: no extra collective)
    and returns whether any rank passed a nonzero one: whether a save is in flight on some rank."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1)
    w = args.step_width
    mlp = torch.nn.Sequential(*[m for _ in range(args.step_layers) for m in (torch.nn.Linear(w, w), torch.nn.Tanh())])
    params = list(mlp.parameters())
    sizes = [p.numel() for p in params]
    flat = torch.zeros(sum(sizes) + 1)
    x = torch.randn(args.step_batch, w, generator=g)
    rest = max(0, int(args.size_mb * 2**20) - 4 * sum(sizes)) // 4 // 8
    state = {f"mlp.{k}": v for k, v in mlp.state_dict().items()}  # views of the live parameters
    state.update({f"bulk{i}": torch.randn(rest, generator=g) for i in range(8)})

    def step(flag: float) -> bool:
        loss = mlp(x).square().mean()
        grads = torch.autograd.grad(loss, params)
        torch.cat([gr.reshape(-1) for gr in grads] + [torch.tensor([flag])], out=flat)
        dist.all_reduce(flat)
        with torch.no_grad():
            for p, gr in zip(params, flat[:-1].split(sizes)):
                p.sub_(gr.view_as(p), alpha=1e-4 / world)
        return bool(flat[-1].item() > 0)

    return step, state


def _med(xs: tp.Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _se(xs: tp.Sequence[float]) -> float:
    """The standard error of the mean of ``xs``: how far the machine's noise moves a mean of them."""
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


OVERHEAD_KEYS = {"local": "local", "global": "global", "auto": "local_then_global"}
"""The overhead section's tiers: ``auto`` is a local save whose committed files are then copied to the global
tier in the background (every ``global_every_local_saves``-th save of a run; every save here)."""


def _overhead(rank: int, world: int, ck: tp.Any, step0: int, args: argparse.Namespace) -> tp.Dict[str, tp.Any]:
    """(a) steps without checkpoints, (b)/(c) an async local / global save every ``--overhead-every`` steps:
    per save, the wall time of the steps during which it is in flight (its blocking part included) less as
    many steps at the mean of the steps just before the save and after that window; (d) the direct check:
    alternating blocks of ``--direct-interval`` seconds of steps with one local save / with none."""
    import torch
    import torch.distributed as dist

    t_section = time.perf_counter()
    torch.set_num_threads(args.step_threads)  # the ranks share this machine's cores: no oversubscription
    step, state = _train_step(args, world)
    holder = _Holder(state)
    counter = [step0]

    def save(tier: str) -> float:
        counter[0] += 1
        t0 = time.perf_counter()
        ck.save(counter[0], tier=tier, blocking=False, model=holder)
        return time.perf_counter() - t0

    def loop(steps: int, tier: str = "", every: int = 0) -> tp.Tuple[tp.List[float], tp.List[bool], tp.List[float]]:
        times: tp.List[float] = []
        busy: tp.List[bool] = []
        blocks: tp.List[float] = []
        for i in range(steps):
            t0 = time.perf_counter()
            if tier and i % every == 0:
                blocks.append(save(tier))
            busy.append(step(1.0 if ck.in_flight else 0.0))
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ck.wait()  # a save still in flight: its rest counts in the loop's last step
        times[-1] += time.perf_counter() - t0
        return times, busy, blocks

    for _ in range(3):  # warm-up: allocator, gloo buffers
        step(0.0)
    for tier in ("local", "global", "auto"):  # a tier's first async save allocates its host arena: not measured
        save(tier)
        ck.wait()
    base, _, _ = loop(args.overhead_steps)
    res: tp.Dict[str, tp.Any] = {"step_s": _med(base), "step_s_mean": statistics.fmean(base)}
    every, pre = args.overhead_every, max(2, args.overhead_every // 4)
    for tier in ("local", "global", "auto"):
        costs, blocks, spans, refs, overrun = [], [], [], [], False
        for _ in range(args.overhead_saves):
            # the reference: the steps just before the save and those after its window (the machine's load
            # drifts: a reference from another minute would measure the drift)
            before = loop(pre)[0]
            times, busy, block = loop(every, tier, every)
            end = 0
            while end < every - 1 and busy[end]:
                end += 1  # the first step after which no rank had the save in flight closes its window
            overrun |= busy[end]
            ref = statistics.fmean(before + times[end + 1 :])  # a mean: the window's steps count as a sum
            costs.append(sum(times[: end + 1]) - ref * (end + 1))
            blocks += block
            spans.append((end + 1, sum(times[: end + 1])))
            refs.append(ref)
        cost = _med(costs)
        res[OVERHEAD_KEYS[tier]] = {
            "step_s_ref": _med(refs),
            "save_cost_s": cost,
            "save_costs_s": costs,
            "save_cost_se_s": _se(costs),
            "save_block_s": _med(blocks),
            "in_flight_steps": _med([n for n, _ in spans]),
            "in_flight_s": _med([s for _, s in spans]),
            "window_overrun": overrun,
            "overhead_at_60s": cost / 60.0,
            "overhead_at_300s": cost / 300.0,
        }
    # the direct check: blocks with / without a save in A B B A order (a load that drifts on a shared machine
    # hits both alike); the block's steps from the latest step time; at most twice --direct-seconds in all
    n = torch.tensor([max(2, round(args.direct_interval / res["global"]["step_s_ref"]))])
    dist.broadcast(n, 0)  # every rank runs the same steps (saves are collective)
    block = int(n.item())
    reps = max(1, round(args.direct_seconds / args.direct_interval))
    without: tp.List[float] = []
    with_: tp.List[float] = []
    t_start = time.perf_counter()
    for i in range(reps):
        for kind in ("without", "with") if i % 2 == 0 else ("with", "without"):
            if kind == "with":
                with_.append(sum(loop(block, "local", block)[0]))
            else:
                without.append(sum(loop(block)[0]))
        go = torch.tensor([int(time.perf_counter() - t_start < 2 * args.direct_seconds)])
        dist.broadcast(go, 0)
        if not go.item():
            break
    done = len(with_)
    res["direct"] = {
        "block_steps": block,
        "saves": done,
        "interval_s": statistics.fmean(with_),
        "step_s_without": sum(without) / (done * block),
        "step_s_with": sum(with_) / (done * block),
        "overhead": sum(with_) / sum(without) - 1.0,
        "save_cost_s": (sum(with_) - sum(without)) / done,
        "save_costs_s": [w - o for w, o in zip(with_, without)],
        "save_cost_se_s": _se([w - o for w, o in zip(with_, without)]),
        "predicted_overhead": res["local"]["save_cost_s"] / statistics.fmean(with_),
    }
    res["seconds"] = time.perf_counter() - t_section
    return res


def _demo(args: argparse.Namespace, work: Path) -> tp.Dict[str, tp.Any]:
    """The real demo trainer (``hpctrain.examples.demo`` under torchrun, ``--demo-world`` CPU ranks, each its
    own simulated node) without and with ``--local-every E`` (no global save in the loop), ``--log-every E/3``,
    alternating runs. A metrics interval's step time is the median rank's mean step. Two estimates of a save's
    cost: across runs, (median interval with - median interval without) * E; within each run with saves
    (the machine's load drifts between runs), per save at step s (but the first: its buffers are allocated
    then) the interval ending at s (its blocking part) and the next one (its background part) less the two
    intervals with no save part, ending at s - E/3 and s + 2E/3, times E/3 steps."""
    every, third = args.demo_local_every, args.demo_local_every // 3
    env = dict(os.environ, HPCTRAIN_CKPT_SIM_RANKS_PER_NODE="1", TORCH_CPP_LOG_LEVEL="ERROR")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    got: tp.Dict[str, tp.List[float]] = {"without": [], "with": []}
    blocked: tp.List[float] = []
    within: tp.List[float] = []
    t_section = time.perf_counter()
    for i in range(args.demo_pairs):
        for kind in ("without", "with") if i % 2 == 0 else ("with", "without"):  # A B B A: drift cancels
            run = work / f"{kind}-{i}"
            tier = ["--local-every", str(every), "--global-every", "1000000", "--local-dir", str(work / "local")]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.demo_world)]
            cmd += ["--master-port", str(free_port()), "-m", "hpctrain.launch"]
            cmd += ["--entry", "hpctrain.examples.demo:main"]
            cmd += ["--run-dir", str(run), "--", "--steps", str(args.demo_steps), "--log-every", str(third)]
            cmd += ["--quiet", "--ckpt-dir", str(run / "ck")] + (tier if kind == "with" else [])
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            if r.returncode:
                raise RuntimeError(f"the demo failed ({' '.join(cmd)}): {(r.stdout + r.stderr)[-1500:]}")
            lines = (run / "train" / "metrics.jsonl").read_text().splitlines()
            recs = [x for x in map(json.loads, filter(str.strip, lines)) if x.get("kind") == "interval"]
            step_s = {x["step"]: x["per_step"]["step_s"]["median"] for x in recs if "per_step" in x}
            got[kind].append(statistics.median([v for k, v in step_s.items() if k > third] or step_s.values()))
            if kind == "with":
                per = {x["step"]: x["per_step"]["checkpoint_s"]["median"] for x in recs if "per_step" in x}
                blocked += [per[s] * third for s in range(2 * every, args.demo_steps + 1, every) if s in per]
                for s in range(2 * every, args.demo_steps + 1, every):
                    parts = [step_s.get(k) for k in (s, s + third, s - third, s + 2 * third)]
                    if None not in parts:
                        a, b, c0, c1 = tp.cast(tp.List[float], parts)
                        within.append(third * (a + b - c0 - c1))
            shutil.rmtree(run, ignore_errors=True)
    without, with_ = statistics.median(got["without"]), statistics.median(got["with"])
    cost = (with_ - without) * every
    inside = _med(within)
    return {
        "world": args.demo_world,
        "steps": args.demo_steps,
        "local_every": every,
        "step_s_without": without,
        "step_s_with": with_,
        "runs_step_s": got,
        "overhead": with_ / without - 1.0,
        "interval_s": with_ * every,
        "save_cost_s": cost,
        "save_cost_within_s": inside,
        "save_cost_within_se_s": _se(within),
        "saves_within": len(within),
        "save_block_s": _med(blocked),
        "overhead_at_60s": cost / 60.0,
        "overhead_at_300s": cost / 300.0,
        "overhead_within_at_60s": inside / 60.0,
        "overhead_within_at_300s": inside / 300.0,
        "seconds": time.perf_counter() - t_section,
    }


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=256.0)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds of the basic section (median, spread)")
    p.add_argument("--global-dir", default="bench_out/tiers-global")
    p.add_argument("--local-dir", default="/dev/shm/hpctrain-tiers")
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    o = p.add_argument_group("step-time overhead (the 'overhead' section)")
    o.add_argument("--no-overhead", action="store_true", help="skip the overhead section")
    o.add_argument("--overhead-only", action="store_true", help="only the overhead section")
    o.add_argument("--step-width", type=int, default=512, help="MLP width of the training step")
    o.add_argument("--step-layers", type=int, default=4, help="MLP layers of the training step")
    o.add_argument("--step-batch", type=int, default=256, help="rows per rank per step")
    o.add_argument("--step-threads", type=int, default=1, help="torch threads per rank")
    o.add_argument("--overhead-steps", type=int, default=40, help="steps of the loop without checkpoints")
    o.add_argument("--overhead-every", type=int, default=40, help="steps between async saves (per tier)")
    o.add_argument("--overhead-saves", type=int, default=5, help="async saves per tier")
    o.add_argument("--direct-interval", type=float, default=5.0, help="seconds between saves, direct check")
    o.add_argument("--direct-seconds", type=float, default=60.0, help="seconds with saves (as many without)")
    o.add_argument("--no-demo", action="store_true", help="skip the demo trainer's runs")
    o.add_argument("--demo-world", type=int, default=2, help="demo ranks (each a simulated node)")
    o.add_argument("--demo-steps", type=int, default=1500, help="steps per demo run")
    o.add_argument("--demo-local-every", type=int, default=75, help="the demo's --local-every (a multiple of 3)")
    o.add_argument("--demo-pairs", type=int, default=2, help="demo runs without / with the local tier")
    args = p.parse_args(argv)
    if args.world < 2 or args.world % args.ranks_per_node or args.world // args.ranks_per_node < 2:
        p.error("--world must be at least two nodes of --ranks-per-node ranks")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.no_overhead and args.overhead_only:
        p.error("--no-overhead and --overhead-only exclude each other")
    counts = ("step_width", "step_layers", "step_batch", "step_threads", "overhead_steps", "overhead_saves")
    counts += ("demo_local_every", "demo_pairs")
    if min(getattr(args, k) for k in counts) < 1 or args.overhead_every < 2:
        p.error("--step-*, --overhead-*, --demo-local-every, --demo-pairs must be >= 1, --overhead-every >= 2")
    if args.demo_world < 2 or args.demo_local_every % 3 or args.demo_steps < 3 * args.demo_local_every:
        p.error("--demo-world must be >= 2, --demo-local-every a multiple of 3, --demo-steps >= 3 times it")
    if not 0 < args.direct_interval <= args.direct_seconds:
        p.error("--direct-interval must be > 0 and at most --direct-seconds")
    t_main = time.perf_counter()
    for d in (args.global_dir, args.local_dir):
        shutil.rmtree(d, ignore_errors=True)
    os.environ["HPCTRAIN_CKPT_SIM_RANKS_PER_NODE"] = str(args.ranks_per_node)
    out = Path(args.global_dir).parent / "tiers-result.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
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
    r.update(size_mb=args.size_mb, world=args.world, ranks_per_node=args.ranks_per_node)
    if not (args.no_overhead or args.no_demo):
        work = Path(args.global_dir).parent / "tiers-demo"
        shutil.rmtree(work, ignore_errors=True)
        try:
            r["demo"] = _demo(args, work)
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
            print(f"bench_tiers: {exc}", file=sys.stderr)
            return 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if not args.overhead_only:
        r.update(basic_rounds(r.pop("basic_rounds")))
    r["seconds"] = time.perf_counter() - t_main  # the whole run
    text = json.dumps(r, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
