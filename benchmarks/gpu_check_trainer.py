"""GPU check for the Trainer under FSDP2: the demo and a ~1 B-parameter model built on the meta device.

    python benchmarks/gpu_check_trainer.py --out DIR [--gpus N] [--params P]
    python benchmarks/gpu_check_trainer.py --out DIR --cpu      # the same logic on CPU (2 ranks, gloo)

Through ``python -m hpctrain.submit --cluster local`` on every GPU here (at most 8), one rank per GPU:

* the demo with ``--parallel fsdp --activation-checkpoint 2`` and checkpoints, then again with more steps:
  it resumes from the checkpoint and ends with the same gathered weights on every rank;
* ``big_entry`` below: a stack of MLP blocks of about ``--params`` parameters (default 1e9) built on the
  meta device (``TrainConfig.parallel.meta_init``: no rank ever holds the whole model), sharded per block,
  bf16 compute (``param_dtype``), trained a few steps and saved; a second ``fit`` on the same directory
  restores it, and every rank compares its restored shards with the ones it saved, bit for bit;
* from the metrics records: peak device memory per rank (allocated, reserved), the state bytes per rank
  against the whole model's, and MFU.

``--cpu`` (or no CUDA with ``--cpu``): the same jobs on two CPU ranks (gloo) with the GPU switches off
(``--gpus-per-node 0``, no ``param_dtype``) and a small model, so the check's logic is tested without a
GPU. Without CUDA and without ``--cpu``: exit 2 with one line. Prints one JSON object (also
DIR/gpu_check_trainer.json); exit 0 when every assertion held, 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the siblings below, also when a rank imports big_entry

from _common import emit  # noqa: E402
from gpu_check_ddp import read  # noqa: E402


def _blocks_for(params: float, width: int) -> int:
    """Blocks of ``Linear(width, 4 width) + Linear(4 width, width)`` (8 width^2 + 5 width parameters each)."""
    return max(2, round(params / (8 * width * width + 5 * width)))


def big_entry(ctx: tp.Any) -> None:
    """Entry: train the big model a few steps under fsdp, save; restore it in a second fit and compare the
    shards. Writes run_dir/big/rank-N.json."""
    import torch

    from hpctrain.train import CheckpointPolicy, MetricsConfig, ParallelConfig, TrainConfig, Trainer

    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--blocks", type=int, required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    opts = p.parse_args(ctx.args)
    gpu = ctx.device.type == "cuda"
    width = opts.width

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))

    class Big(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(opts.blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x

    def data(start: int) -> tp.Iterator[torch.Tensor]:
        gen = torch.Generator(device=ctx.device)
        step = start
        while True:
            step += 1
            gen.manual_seed(step * 1000 + ctx.rank)
            yield torch.randn(opts.batch, opts.seq if gpu else 8, width, device=ctx.device, generator=gen)

    def run(steps: int) -> tp.Any:
        config = TrainConfig(
            steps=steps,
            log_every=1,
            checkpoint=CheckpointPolicy(every_steps=1000, async_save=False),
            metrics=MetricsConfig(display=False),
            parallel=ParallelConfig(
                mode="fsdp", meta_init=True, param_dtype="bfloat16" if gpu else None, activation_checkpoint="full"
            ),
        )
        return Trainer(
            ctx,
            config=config,
            model=Big,
            optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
            loss_fn=lambda m, x: m(x).float().pow(2).mean(),
            data=data,
        ).fit()

    first = run(opts.steps)
    saved = [p.detach().to_local().cpu().clone() for p in first.model.parameters()]
    n_params = sum(p.numel() for p in first.model.parameters())  # global sizes (DTensor.numel)
    del first
    if gpu:
        torch.cuda.empty_cache()
    again = run(opts.steps)  # restore only: the checkpoint's step is the total
    got = [p.detach().to_local().cpu() for p in again.model.parameters()]
    mismatched = sum(not torch.equal(a, b) for a, b in zip(saved, got))
    out = ctx.run_dir / "big"
    out.mkdir(exist_ok=True)
    record = {
        "rank": ctx.rank,
        "params": n_params,
        "resumed_step": (again.resumed or {}).get("step"),
        "mismatched_tensors": mismatched,
        "tensors": len(saved),
    }
    tmp = out / f".rank-{ctx.rank}.json.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, out / f"rank-{ctx.rank}.json")


def submit(out: Path, name: str, ranks: int, gpu: bool, entry: str, args: tp.Sequence[str]) -> int:
    """One local job; its output goes to OUT/NAME.log; the exit status of the submit command."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", "--nodes", "1", "--time", "15"]
    cmd += ["--gpus-per-node", str(ranks)] if gpu else ["--gpus-per-node", "0", "--tasks-per-node", str(ranks)]
    cmd += ["--entry", entry, "--run-dir", str(out / name), "--", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode


def last_interval(run_dir: Path) -> tp.Dict[str, tp.Any]:
    """The newest interval record of a run (its metrics JSONL)."""
    path = run_dir / "train" / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return next((r for r in reversed(recs) if r.get("kind") == "interval"), {})


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, default=0, help="GPUs (ranks) to use (default: all here, at most 8)")
    p.add_argument("--params", type=float, default=1e9, help="parameters of the big model (GPU)")
    p.add_argument("--cpu", action="store_true", help="run the logic on 2 CPU ranks with a small model")
    args = p.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu and not args.cpu:
        print("gpu_check_trainer: CUDA is not available on this machine; run this check on a GPU node", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = (args.gpus or min(8, torch.cuda.device_count())) if gpu else 2
    width = 2048 if gpu else 16
    blocks = _blocks_for(args.params, width) if gpu else 3
    res: tp.Dict[str, tp.Any] = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "torch": torch.__version__,
        "ranks": n,
    }
    failures: tp.List[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    first, more, big_steps = (10, 15, 6) if gpu else (4, 6, 2)  # CPU: the logic, in few steps
    common = ["--parallel", "fsdp", "--activation-checkpoint", "2", "--layers", "4", "--batch-size", str(16 * n)]
    common += ["--ckpt-every", str(first), "--ckpt-dir", str(out / "demo-ckpt"), "--quiet", "--log-every", "2"]
    for name, steps in (("demo", first), ("demo_resume", more)):
        rc = submit(out, name, n, gpu, "hpctrain.examples.demo:main", ["--steps", str(steps), *common])
        d = read(out / name / "demo_result.json")
        res[name] = {k: d.get(k) for k in ("steps", "steps_run", "resumed", "device", "final_loss", "weights_in_sync")}
        res[name]["exit"] = rc
        expect(rc == 0 and d.get("steps") == steps, f"{name}: exit {rc}, steps {d.get('steps')} (see {name}.log)")
        expect(bool(d.get("weights_in_sync")), f"{name}: ranks disagree on the gathered weights")
        expect(str(d.get("device", "")).startswith("cuda") == gpu, f"{name}: ran on {d.get('device')}")
    resumed = (res["demo_resume"].get("resumed") or {}).get("step")
    expect(resumed == first, f"demo_resume resumed at {resumed}, not at step {first}")

    big_args = ["--width", str(width), "--blocks", str(blocks), "--steps", str(big_steps)]
    rc = submit(out, "big", n, gpu, "gpu_check_trainer:big_entry", big_args)
    ranks = [read(out / "big" / "big" / f"rank-{r}.json") for r in range(n)]
    rec = last_interval(out / "big")
    mem = rec.get("memory") or {}
    params = ranks[0].get("params", 0) if ranks and ranks[0] else 0
    res["big"] = {
        "exit": rc,
        "params": params,
        "blocks": blocks,
        "width": width,
        "resumed_step": [r.get("resumed_step") for r in ranks],
        "mismatched_tensors": [r.get("mismatched_tensors") for r in ranks],
        "peak_allocated_gib": _gib(mem.get("peak_allocated_bytes")),
        "peak_reserved_gib": _gib(mem.get("peak_reserved_bytes")),
        "state_gib_per_rank": _gib(mem.get("state_bytes")),
        "rss_gib": _gib(mem.get("rss_bytes")),
        "mfu": rec.get("mfu"),
        "step_s": ((rec.get("per_step") or {}).get("step_s") or {}).get("median"),
        "exposed_comm_s": ((rec.get("per_step") or {}).get("grad_comm_exposed_s") or {}).get("median"),
    }
    restored = all(r.get("resumed_step") == big_steps for r in ranks)
    expect(rc == 0 and restored, f"big: exit {rc}, not restored (see big.log)")
    expect(all(r.get("mismatched_tensors") == 0 and r.get("tensors") for r in ranks), "big: restored shards differ")
    state = (mem.get("state_bytes") or {}).get("max")
    # AdamW: parameters + two moments, fp32, split over n ranks (+ the per-tensor step counters)
    expect(state is not None and state <= 12 * params / n * 1.05 + 4096, f"big: state bytes per rank {state}")
    if gpu:
        expect((mem.get("peak_allocated_bytes") or {}).get("max", 0) > 0, "big: no peak device memory recorded")
        expect(rec.get("mfu") is not None, "big: no MFU in the metrics record")
    emit({**res, "failures": failures, "ok": not failures}, out / "gpu_check_trainer.json")
    return 0 if not failures else 1


def _gib(spread: tp.Any) -> tp.Any:
    """The max over ranks of a memory spread, in GiB."""
    return round(spread["max"] / 2**30, 6) if isinstance(spread, dict) else None


if __name__ == "__main__":
    sys.exit(main())
