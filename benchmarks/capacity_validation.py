"""How well ``python -m hpctrain capacity`` predicts step times it has not seen (docs/capacity.md, "Validation").

For each configuration, calibrate at 1 and 2 nodes (one rank per node) through the path ``capacity --calibrate``
takes (submit, the all-reduce probe, the demo), predict 3 x 1, 4 x 1 and 2 x 2, run those, and compare the
predicted step and each of its parts with the measured ones, ``--repeats`` times **interleaved** (every size of
every configuration once per round, the order reversed every other round), so the spread of the measured side
sits beside each error (3 rounds of ``comm``, 5 of ``compute``: ``Config.repeats``):

* ``comm``: a wide model (``--hidden 16384 --layers 0``: 4.9 MB of gradients) on shaped links
  (``--link``, 500 Mbit/s between nodes by default): the all-reduce dominates the step and the CPUs wait.
* ``compute``: a deeper, narrower model (``--hidden 512 --layers 2``: 4.2 MB) with a large batch on faster links
  (1 Gbit/s): forward and backward dominate. (Unshaped, the veths run as fast as the ranks' capped CPUs push TCP,
  and the all-reduce no longer follows a latency-bandwidth law: its 8-32 MiB times at 3 and 4 ranks came out
  15-30 % below the 2-rank probe's fit.)

On the dev cluster (``tests/cluster/devcluster``, 4 nodes of one machine) the script shapes the cluster for each
run: ``devcluster link`` for the configuration's link, and ``devcluster cpu`` giving every rank ``--cores-per-rank``
cores of its own, so that no rank computes slower because another one runs (the model's assumption, true on a real
cluster where each rank has its GPU; the uncapped dev cluster's ranks share two cores, which made its predictions
40-60 % off).
Links and caps are lifted at the end, also on failure or Ctrl-C. On a real cluster give ``--no-shape``.

The prediction uses every round's calibration runs (``capacity_report`` of all of them: the fit's medians); the
measured side of a layout is the median over its rounds, its noise the spread (max - min) / median.

    python benchmarks/capacity_validation.py [--repeats N] [--configs comm,compute] [--json PATH]

Run directories go to a fresh ``OUT/<UTC time>/``. Needs the cluster (``tests/cluster/devcluster up``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import statistics
import sys
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, Shaper, emit, signals_raise  # noqa: E402
from hpctrain.capacity import Targets, capacity_report, read_calibrations  # noqa: E402
from hpctrain.capacity.cli import calibrate  # noqa: E402
from hpctrain.capacity.fit import interconnect_from_probe  # noqa: E402
from hpctrain.capacity.model import allreduce_seconds  # noqa: E402

ENTRY = "hpctrain.examples.demo:main"
PARTS = (("step", "step_s"), ("data wait", "data_wait_s"), ("compute", "compute_s"), ("comm", "comm_s"))
PARTS += (("optimizer", "optimizer_s"), ("other", "other_s"))
CALIBRATE = ((1, 1), (2, 1))
HELD_OUT = ((3, 1), (4, 1), (2, 2))


@dataclass(kw_only=True)
class Config:
    """One validated configuration: the demo's model and batch, the link between nodes and the run length."""

    name: str
    model_args: tp.List[str]
    """The demo's model flags."""
    global_batch: int
    """Samples per step over all ranks, kept at every size (divisible by 1, 2, 3 and 4)."""
    link: tp.Optional[str]
    """``devcluster link`` between nodes (None: unshaped)."""
    steps: int
    log_every: int = 10
    ckpt_every: int = 50
    sizes: tp.Tuple[tp.Tuple[int, int], ...] = field(default=CALIBRATE + HELD_OUT)
    repeats: int = 3
    """Rounds by default (``--repeats`` sets every configuration's): enough that the median of the measured side
    moves less than the goal between two runs of this script. The compute configuration's jobs differ by up to
    12 % in speed from one to the next on the dev machine (the same size, minutes apart: 2026-12-06, compute
    0.21-0.27 ms a sample at 1-4 nodes), three times the comm configuration's spread, hence its 5."""


CONFIGS = {
    "comm": Config(
        name="comm", model_args=["--hidden", "16384", "--layers", "0"], global_batch=192, link="500mbit", steps=120
    ),
    "compute": Config(
        name="compute",
        model_args=["--hidden", "512", "--layers", "2"],
        global_batch=1536,
        link="1gbit",
        steps=80,
        repeats=5,
    ),
}


def _measured(run_dir: Path) -> tp.Dict[str, float]:
    (c,) = read_calibrations(run_dir)
    got = {key: getattr(c, key) for _, key in PARTS}
    got["ckpt_mb"] = (c.checkpoint_bytes or 0) / 1e6
    return got


def entry_args(cfg: Config, data: Path, steps: int) -> tp.List[str]:
    args = ["--data", str(data), "--steps", str(steps), "--log-every", str(cfg.log_every), "--workers", "1"]
    args += ["--ckpt-every", str(cfg.ckpt_every), "--batch-size", str(cfg.global_batch), "--quiet"]
    return args + cfg.model_args


def run_rounds(
    configs: tp.Sequence[Config],
    *,
    out: Path,
    data: Path,
    repeats: tp.Optional[int],
    steps_scale: float,
    submit: tp.Sequence[str],
    shaper: Shaper,
    echo: tp.Callable[[str], None] = print,
) -> tp.Dict[str, tp.Dict[tp.Tuple[int, int], tp.List[tp.Dict[str, tp.Any]]]]:
    """Every size of every configuration once per round, ``repeats`` rounds (odd rounds in reverse order); None:
    each configuration's own ``repeats`` (one with fewer sits out the last rounds)."""
    plan = [(cfg, size) for cfg in configs for size in cfg.sizes]
    runs: tp.Dict[str, tp.Dict[tp.Tuple[int, int], tp.List[tp.Dict[str, tp.Any]]]] = {c.name: {} for c in configs}
    for rnd in range(max(repeats or c.repeats for c in configs)):
        for cfg, (nodes, per_node) in plan if rnd % 2 == 0 else plan[::-1]:
            if rnd >= (repeats or cfg.repeats):
                continue
            shaper.set(cfg.link)
            load = os.getloadavg()[0]
            steps = max(3 * cfg.log_every, int(cfg.steps * steps_scale))
            t0 = time.monotonic()
            (run_dir,) = calibrate(
                [(nodes, per_node)],
                entry=ENTRY,
                entry_args=entry_args(cfg, data, steps),
                out_dir=out / cfg.name / f"r{rnd}",
                submit_args=submit,
                echo=echo,
            )
            runs[cfg.name].setdefault((nodes, per_node), []).append(
                {
                    "run_dir": str(run_dir),
                    "round": rnd,
                    "seconds": time.monotonic() - t0,
                    "load_average": [load, os.getloadavg()[0]],
                    **_measured(run_dir),
                }
            )
    return runs


def _err(pred: float, meas: float) -> tp.Optional[float]:
    return (pred - meas) / meas if meas > 0 else None


def compare(
    cfg: Config, got: tp.Mapping[tp.Tuple[int, int], tp.Sequence[tp.Mapping[str, tp.Any]]]
) -> tp.List[tp.Dict[str, tp.Any]]:
    """Predicted (from every round's calibration runs) against the median of the held-out runs, per part."""
    cal_dirs = [Path(r["run_dir"]) for size in CALIBRATE for r in got.get(size, ())]
    cal_probe = next((c.probe for d in cal_dirs for c in read_calibrations(d) if c.probe and c.world_size > 1), None)
    rows = []
    for nodes, per_node in [s for s in cfg.sizes if s not in CALIBRATE]:
        runs = got.get((nodes, per_node), ())
        if not runs:
            continue
        (pred,) = capacity_report(cal_dirs, Targets(nodes=(nodes,), gpus_per_node=per_node))["rows"]
        predicted = {"step_s": pred["step_s"], **pred["parts"]}
        row: tp.Dict[str, tp.Any] = {"config": cfg.name, "layout": f"{nodes}x{per_node}", "rounds": len(runs)}
        row["checkpoint_MB"] = round(statistics.median(r["ckpt_mb"] for r in runs), 2)
        for label, key in PARTS:
            vals = [r[key] for r in runs]
            med = statistics.median(vals)
            row[label] = {
                "predicted_ms": predicted[key] * 1e3,
                "measured_ms": med * 1e3,
                "runs_ms": [v * 1e3 for v in vals],
                "error": _err(predicted[key], med),
                "noise": (max(vals) - min(vals)) / med if med > 0 else None,
            }
        row["load_average"] = [r["load_average"] for r in runs]
        held = next((c.probe for c in read_calibrations(Path(runs[0]["run_dir"])) if c.probe), None)
        row["probe"] = _probe_check(cal_probe, held)
        rows.append(row)
    return rows


def _probe_check(cal: tp.Any, held: tp.Any) -> tp.List[tp.Dict[str, float]]:
    """The bare all-reduce (no training, no model of DDP) at the held-out size against the latency-bandwidth fit
    of the calibration's 2-rank probe: how far the interconnect itself strays from the formula here."""
    if not cal or not held:
        return []
    latency, busbw = interconnect_from_probe(cal)
    n = held["world_size"]
    out = []
    for size, secs in held["sizes"]:
        want = allreduce_seconds(size, n, busbw=busbw, latency=latency)
        out.append(
            {"bytes": size, "predicted_ms": want * 1e3, "measured_ms": secs * 1e3, "error": (want - secs) / secs}
        )
    return out


def errors(rows: tp.Sequence[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """Mean and max |step-time error|, the largest repeat spread of the measured step, and the row count."""
    errs = [abs(r["step"]["error"]) for r in rows if r["step"]["error"] is not None]
    noise = [r["step"]["noise"] for r in rows if r["step"]["noise"] is not None]
    return {
        "mean": statistics.mean(errs) if errs else math.nan,
        "max": max(errs) if errs else math.nan,
        "noise_max": max(noise) if noise else math.nan,
        "rows": len(errs),
    }


def markdown(rows: tp.Sequence[tp.Mapping[str, tp.Any]]) -> str:
    head = "| config | nodes x ranks | " + " | ".join(f"{label}" for label, _ in PARTS) + " |"
    lines = [head, "|" + " --- |" * (2 + len(PARTS))]
    for r in rows:
        cells = []
        for label, _ in PARTS:
            v = r[label]
            err = f"{v['error']:+.1%}" if v["error"] is not None else "n/a"
            noise = f", ±{v['noise'] / 2:.0%}" if v["noise"] is not None and label == "step" else ""
            cells.append(f"{v['predicted_ms']:.3g} / {v['measured_ms']:.3g} ({err}{noise})")
        lines.append(f"| {r['config']} | {r['layout']} | " + " | ".join(cells) + " |")
    lines.append("\n(predicted / measured ms, the measured side the median of the rounds; step: ± half its spread)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/capacity-validation", help="run directories go to OUT/<UTC time>/")
    p.add_argument("--configs", default="comm,compute", help=f"which configurations ({', '.join(CONFIGS)})")
    p.add_argument(
        "--repeats", type=int, help="rounds (every size of every configuration once each; default: the configuration's)"
    )
    p.add_argument("--held-out", default="3x1,4x1,2x2", help="sizes to predict and run (NODESxRANKS, comma-separated)")
    p.add_argument("--steps-scale", type=float, default=1.0, help="scale every configuration's steps (short forms)")
    p.add_argument("--cores-per-rank", type=float, default=0.4, help="devcluster cpu: cores of each rank's own")
    p.add_argument("--link", help="replace the comm configuration's link (devcluster link RATE[,DELAY])")
    p.add_argument("--no-shape", action="store_true", help="a real cluster: leave links and CPUs alone")
    p.add_argument("--submit-args", default="--cluster slurm --cpus-per-task 1 --time 15", help="submit flags")
    p.add_argument("--json", help="also write the JSON here")
    return p


def validate(ns: argparse.Namespace, echo: tp.Callable[[str], None] = print) -> tp.Dict[str, tp.Any]:
    names = [n for n in ns.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise SystemExit(
            f"capacity_validation: --configs: unknown {unknown or names}; choose from {', '.join(CONFIGS)}"
        )
    if ns.repeats is not None and ns.repeats < 1:
        raise SystemExit("capacity_validation: --repeats must be at least 1")
    try:
        held = tuple(tuple(int(x) for x in size.split("x")) for size in ns.held_out.split(","))
        assert held and all(len(h) == 2 and min(h) >= 1 for h in held)
    except (ValueError, AssertionError):
        raise SystemExit(f"capacity_validation: --held-out {ns.held_out!r}: give sizes like 3x1,4x1,2x2") from None
    configs = [dataclasses.replace(CONFIGS[n], sizes=CALIBRATE + held) for n in names]
    if ns.link:
        configs = [dataclasses.replace(c, link=ns.link) if c.link else c for c in configs]
    os.environ["PYTHONPATH"] = str(ROOT)  # the jobs run this checkout's hpctrain (sbatch exports the environment)
    out = Path(ns.out).resolve() / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True)
    data = out / "data.h5"
    from hpctrain.data import make_dataset

    make_dataset(data, 20000, shape=(64,))
    started = time.time()
    with signals_raise(), Shaper(not ns.no_shape, ns.cores_per_rank) as shaper:
        runs = run_rounds(
            configs,
            out=out,
            data=data,
            repeats=ns.repeats,
            steps_scale=ns.steps_scale,
            submit=shlex.split(ns.submit_args),
            shaper=shaper,
            echo=echo,
        )
    rows = [row for cfg in configs for row in compare(cfg, runs[cfg.name])]
    summary = {cfg.name: errors([r for r in rows if r["config"] == cfg.name]) for cfg in configs}
    echo(markdown(rows))
    for name, s in summary.items():
        echo(
            f"{name}: step |error| mean {s['mean']:.1%}, max {s['max']:.1%} over {s['rows']} layouts "
            f"(goal: mean <= 5 %, max <= 10 %); measured repeat spread up to {s['noise_max']:.1%}"
        )
    return {
        "benchmark": "capacity_validation",
        "argv": sys.argv[1:],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": time.time() - started,
        "cores_per_rank": None if ns.no_shape else ns.cores_per_rank,
        "configs": {c.name: {**c.__dict__, "sizes": [list(s) for s in c.sizes]} for c in configs},
        "summary": summary,
        "rows": rows,
    }


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    ns = parser().parse_args(argv)
    emit(validate(ns), ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
