"""In-job recovery vs a restart from the last checkpoint: a rank's process SIGKILLed, failure -> first new step.

    python benchmarks/bench_recovery.py [--world 4] [--hidden 1024] [--steps 40] [--kill-at 30]
        [--ckpt-every 10] [--repeat 1] [--backend gloo|nccl] [--json PATH]

Both figures in one run, on this machine's processes (gloo on CPU; ``--backend nccl``: one GPU per process):

* ``in_job``: ``--world`` ranks and one warm spare (:mod:`hpctrain.runtime.recovery`); rank ``world-1`` writes
  the time and SIGKILLs itself mid-step ``--kill-at`` (after the forward); the survivors leave the group, agree,
  the spare takes the rank and receives the state from rank 0's memory. ``failure_to_first_step_s``: the kill
  -> the end of the first new step on the source rank; ``phases_s``: its ledger record's (detect is from the
  dead rank's last heartbeat, the others exact); ``steps_redone``: the interrupted one.
* ``restart``: today's path without Slurm: the same kill with in-job recovery off, so every survivor exits (as a
  peer failure); when the last has exited, ``--world`` new processes start, import torch, rendezvous, build the
  model and restore the newest commit of a :class:`hpctrain.ckpt.Checkpointer` saved every ``--ckpt-every``
  steps. ``failure_to_first_step_s``: the kill -> the first step of the new processes (rank 0); the steps since
  that commit are redone. A Slurm restart adds srun's start of a new step (or the queue) on top of this.

Exit 0 when every in-job run ended bit-exact, 1 when one did not; with ``--backend nccl``, 2 without CUDA and 3
with fewer GPUs than ``--world`` + 1 (one line on stderr; ``gpu_checks.sh`` calls both skipped).

``ratio`` = restart / in_job (median over ``--repeat``), with the model size, the load average before and
after, and whether the final parameters of the in-job run equal those of an uninterrupted run (``bit_exact``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

QUICK = {"collective_timeout_s": 30.0, "agree_timeout_s": 60.0}


class Loader:
    """The global batch of a step from (seed, position), rank r's slice of it; state: the global position."""

    def __init__(self, rank: int, world_size: int, per_rank: int = 16) -> None:
        self.rank, self.world_size, self.per_rank, self.position = rank, world_size, per_rank, 0

    def set_rank(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> tp.Dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: tp.Mapping[str, int]) -> None:
        self.position = int(state["position"])

    def __iter__(self) -> tp.Iterator[tp.Any]:
        import torch

        while True:
            g = torch.Generator().manual_seed(1000 + self.position)
            x = torch.randn(self.world_size * self.per_rank, 64, generator=g)
            self.position += 1
            mine = x[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]
            yield mine, mine.sum(1, keepdim=True).sin()


def _now_file(path: str) -> None:
    Path(path).write_text(repr(time.time()))


def _worker(role: str, index: int, port: int, opts: tp.Dict[str, tp.Any], out: str) -> None:  # pragma: no cover
    from hpctrain.errors import InJobRecoveryFallback

    try:
        _train(role, index, port, opts, out)
    except InJobRecoveryFallback:
        os._exit(1)  # its one line is printed; the restart path starts new processes


def _train(role: str, index: int, port: int, opts: tp.Dict[str, tp.Any], out: str) -> None:  # pragma: no cover
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from hpctrain.runtime.recovery import InJobRecovery, RecoveryConfig
    from hpctrain.runtime.state_transfer import ReplicatedState

    world, h, backend = opts["world"], opts["hidden"], opts["backend"]
    slot = index if role == "rank" else world + index  # one GPU per process under nccl
    device = torch.device("cuda", slot) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 1)]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = Loader(index if role == "rank" else 0, world)
    state = ReplicatedState(module=model, optimizer=optimizer, loader=loader, device=device)
    config = RecoveryConfig(**QUICK, spares=opts["spares"], enabled=opts["recover"])
    who = {"rank": index} if role == "rank" else {"spare": index}
    rec = InJobRecovery(config, host="127.0.0.1", port=port, world_size=world, state=state, backend=backend,
                        device=device, **who)  # fmt: skip
    ckpt = None
    if role == "rank":
        rec.start()
        if opts.get("ckpt_dir"):
            from hpctrain.ckpt import CheckpointConfig, Checkpointer

            ckpt = Checkpointer(CheckpointConfig(dir=opts["ckpt_dir"], keep_last=2), run_id="bench")
            got = ckpt.restore(model=model, optimizer=optimizer, map_location=device)
            if got is not None:
                loader.load_state_dict(got.data_state["loader"])
                rec.step = got.step
                state.boundary()
    elif rec.stand_by(on_rank=loader.set_rank) is None:
        Path(out).write_text(json.dumps({"idle": True}))
        return
    step, first = rec.step, None

    def wrap() -> tp.Tuple[tp.Any, tp.Iterator[tp.Any]]:
        """DDP on the current generation, after the bucket warm-up that keeps a 3+ rank run bit-exact."""
        from hpctrain.train.ddp_warmup import warm_up_buckets

        def loss_fn(m: tp.Any, b: tp.Any) -> tp.Any:
            return torch.nn.functional.mse_loss(m(b[0].to(device)), b[1].to(device))

        ddp = DistributedDataParallel(model)
        got = warm_up_buckets(ddp, model, iter(loader), loss_fn=loss_fn, autocast=contextlib.nullcontext(),
                              device=device, world_size=world)  # fmt: skip
        return ddp, got

    ddp, batches = wrap()
    while step < opts["steps"]:
        try:
            x, y = (t.to(device) for t in next(batches))
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if role == "rank" and index == world - 1 and step + 1 == opts.get("kill_at"):
                _now_file(opts["killed_at"])
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            rec.check()  # NCCL: a peer's failure is reported here, before the optimizer step
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first = first or time.time()
            rec.completed(step)
            if ckpt is not None and step % opts["ckpt_every"] == 0:
                ckpt.save(step, model=model, optimizer=optimizer, data_state={"loader": loader.state_dict()})
        except Exception as exc:  # noqa: BLE001 - recover() re-raises what it cannot handle
            got = rec.recover(exc)
            step = got.step
            ddp, batches = wrap()
    if ckpt is not None:
        ckpt.close()
    rec.finish()
    h_ = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    Path(out).write_text(json.dumps({"rank": rec.rank, "first_step_at": first, "records": rec.records, "digest": h_}))


def _job(opts: tp.Dict[str, tp.Any], spares: int, timeout: float = 300.0) -> tp.Dict[str, tp.Any]:
    """One world (+ spares) to its end; each process's JSON (None for one that died)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        who = [("rank", r) for r in range(opts["world"])] + [("spare", i) for i in range(spares)]
        procs = {w: ctx.Process(target=_worker, args=(*w, store.port, opts, f"{tmp}/{w[0]}{w[1]}.json")) for w in who}
        for p in procs.values():
            p.start()
        for p in procs.values():
            p.join(timeout)
            if p.is_alive():
                p.kill()
        out = {}
        for w in who:
            f = Path(tmp) / f"{w[0]}{w[1]}.json"
            out[f"{w[0]}{w[1]}"] = json.loads(f.read_text()) if f.exists() else None
        out["exitcodes"] = {f"{w[0]}{w[1]}": p.exitcode for w, p in procs.items()}
    return out


def _round(args: argparse.Namespace, work: Path) -> tp.Dict[str, tp.Any]:
    base = {"world": args.world, "hidden": args.hidden, "steps": args.steps, "backend": args.backend}
    killed = str(work / "killed_at")
    ref = _job({**base, "spares": 0, "recover": True}, 0)
    inj = _job({**base, "spares": 1, "recover": True, "kill_at": args.kill_at, "killed_at": killed}, 1)
    record = inj["rank0"]["records"][0]
    in_job = {
        "failure_to_first_step_s": record["first_step_at"] - float(Path(killed).read_text()),
        "phases_s": record["phases_s"],
        "agreed_step": record["agreed_step"],
        "steps_redone": record["steps_redone"],
        "bit_exact": inj["rank0"]["digest"] == inj["spare0"]["digest"] == ref["rank0"]["digest"],
    }
    ckpt_dir = str(work / "ckpt")
    opts = {**base, "spares": 0, "recover": False, "kill_at": args.kill_at, "killed_at": killed}
    _job({**opts, "ckpt_dir": ckpt_dir, "ckpt_every": args.ckpt_every}, 0)
    t_exit = time.time()
    again = _job({**opts, "kill_at": None, "ckpt_dir": ckpt_dir, "ckpt_every": args.ckpt_every}, 0)
    commit = (args.kill_at - 1) // args.ckpt_every * args.ckpt_every
    restart = {
        "failure_to_first_step_s": again["rank0"]["first_step_at"] - float(Path(killed).read_text()),
        "all_exited_after_s": t_exit - float(Path(killed).read_text()),
        "restored_step": commit,
        "steps_redone": args.kill_at - commit,
    }
    return {"in_job": in_job, "restart": restart}


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4, help="ranks (plus one warm spare)")
    parser.add_argument("--hidden", type=int, default=1024, help="the MLP's width (64 -> H -> H -> 1, Adam)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-at", type=int, default=30, help="the step whose forward the last rank dies after")
    parser.add_argument("--ckpt-every", type=int, default=10, help="the restart path's blocking checkpoint")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            print("bench_recovery: CUDA is not available on this machine; run it on a GPU node", file=sys.stderr)
            return 2
        if torch.cuda.device_count() < args.world + 1:
            print(
                f"bench_recovery: --backend nccl --world {args.world} needs {args.world + 1} GPUs (one per rank, one "
                f"for the spare), this machine has {torch.cuda.device_count()}",
                file=sys.stderr,
            )
            return 3  # gpu_checks.sh: skipped, said so
    load_before = os.getloadavg()
    rounds = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-recovery-work-") as work:
            rounds.append(_round(args, Path(work)))
    inj = statistics.median(r["in_job"]["failure_to_first_step_s"] for r in rounds)
    rst = statistics.median(r["restart"]["failure_to_first_step_s"] for r in rounds)
    params = 64 * args.hidden + args.hidden + args.hidden * args.hidden + args.hidden + args.hidden + 1
    result = {
        "benchmark": "recovery",
        "world": args.world,
        "backend": args.backend,
        "params": params,
        "state_mb": round(params * 4 * 3 / 2**20, 1),  # parameters + Adam's two moments, fp32
        "in_job_failure_to_first_step_s": round(inj, 3),
        "restart_failure_to_first_step_s": round(rst, 3),
        "ratio": round(rst / inj, 2),
        "bit_exact": all(r["in_job"]["bit_exact"] for r in rounds),
        "rounds": rounds,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    emit(result, args.json)
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
