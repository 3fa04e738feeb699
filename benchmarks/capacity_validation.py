"""How well ``python -m hpctrain capacity`` predicts a step it has not seen (docs/capacity.md, "Validation").

For each model (the demo MLP, and a wide one whose checkpoint and gradients are ~60x larger): calibrate at
world sizes 1 and 2 (one rank per node) through the same path as ``capacity --calibrate`` (submit, all-reduce
probe, the demo), predict 4 ranks on 4 nodes and 2 x 2, run those two, and compare the predicted step and
each of its parts with the measured medians. Prints a markdown table and the JSON (``--json PATH`` too).

    python benchmarks/capacity_validation.py [--out DIR] [--steps 300] [--cluster slurm] [--json PATH]

Needs a cluster (the dev cluster: tests/cluster/devcluster up) or ``--cluster local`` (4 local processes).
Run directories that already hold metrics are reused (``--out`` keeps them); delete them to measure again.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import typing as tp
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import emit  # noqa: E402
from hpctrain.capacity import Targets, capacity_report, read_calibrations  # noqa: E402
from hpctrain.capacity.cli import calibrate  # noqa: E402
from hpctrain.capacity.fit import interconnect_from_probe  # noqa: E402
from hpctrain.capacity.model import allreduce_seconds  # noqa: E402

MODELS = {"demo": ["--hidden", "128"], "wide": ["--hidden", "16384"]}
PARTS = (("step", "step_s"), ("data wait", "data_wait_s"), ("compute", "compute_s"), ("comm", "comm_s"))
PARTS += (("optimizer", "optimizer_s"), ("other", "other_s"))


def _measured(run_dir: Path) -> tp.Dict[str, float]:
    (c,) = read_calibrations(run_dir)
    return {
        "step_s": c.step_s,
        "data_wait_s": c.data_wait_s,
        "compute_s": c.compute_s,
        "comm_s": c.comm_s,
        "optimizer_s": c.optimizer_s,
        "other_s": c.other_s,
        "ckpt_mb": (c.checkpoint_bytes or 0) / 1e6,
    }


def validate(out: Path, steps: int, submit: tp.List[str], data: str) -> tp.List[tp.Dict[str, tp.Any]]:
    rows = []
    for name, model_args in MODELS.items():
        entry_args = ["--data", data, "--steps", str(steps), "--log-every", "25", "--ckpt-every", "100"]
        entry_args += ["--workers", "1", "--quiet", *model_args]
        kw = dict(entry="hpctrain.examples.demo:main", entry_args=entry_args, submit_args=submit, echo=print)
        cal = calibrate([(1, 1), (2, 1)], out_dir=out / name, **kw)
        held = calibrate([(4, 1), (2, 2)], out_dir=out / name, **kw)
        (cal_probe,) = [c.probe for c in read_calibrations(cal[1])]
        for run_dir, (nodes, per_node) in zip(held, [(4, 1), (2, 2)]):
            got = _measured(run_dir)
            report = capacity_report(cal, Targets(nodes=(nodes,), gpus_per_node=per_node))
            (pred,) = report["rows"]
            predicted = {"step_s": pred["step_s"], **pred["parts"]}
            row: tp.Dict[str, tp.Any] = {"model": name, "layout": f"{nodes}x{per_node}"}
            row["checkpoint_MB"] = round(got["ckpt_mb"], 2)
            for label, key in PARTS:
                p, m = predicted[key], got[key]
                row[label] = {"predicted_ms": p * 1e3, "measured_ms": m * 1e3, "error": (p - m) / m if m else None}
            row["probe"] = _probe_check(cal_probe, read_calibrations(run_dir)[0].probe)
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


def _errors(rows: tp.Sequence[tp.Dict[str, tp.Any]]) -> tp.Tuple[float, float, int]:
    """Mean and max |step-time error| and the number of runs."""
    errs = [abs(r["step"]["error"]) for r in rows if r["step"]["error"] is not None]
    return (statistics.mean(errs), max(errs), len(errs)) if errs else (math.nan, math.nan, 0)


def _markdown(rows: tp.Sequence[tp.Dict[str, tp.Any]]) -> str:
    head = "| model | nodes x ranks | checkpoint | "
    head += " | ".join(f"{label}: predicted / measured ms" for label, _ in PARTS) + " |"
    lines = [head, "|" + " --- |" * (3 + len(PARTS))]
    for r in rows:
        cells = []
        for label, _ in PARTS:
            v = r[label]
            err = f"{v['error']:+.0%}" if v["error"] is not None else "n/a"
            cells.append(f"{v['predicted_ms']:.3g} / {v['measured_ms']:.3g} ({err})")
        lines.append(f"| {r['model']} | {r['layout']} | {r['checkpoint_MB']} MB | " + " | ".join(cells) + " |")
    mean, worst, n = _errors(rows)
    lines.append(f"\nstep time: mean |error| {mean:.1%}, max {worst:.1%} over {n} runs\n")
    lines.append(
        "| model | nodes x ranks | "
        + " | ".join(f"{s:.0f} B" for s, _ in [(p["bytes"], 0) for p in rows[0]["probe"]])
        + " |"
    )
    lines.append("|" + " --- |" * (2 + len(rows[0]["probe"])))
    for r in rows:
        cells = [f"{p['predicted_ms']:.3g} / {p['measured_ms']:.3g} ({p['error']:+.0%})" for p in r["probe"]]
        lines.append(f"| {r['model']} | {r['layout']} | " + " | ".join(cells) + " |")
    lines.append("(the bare all-reduce at the held-out size: the 2-rank probe's fit / measured ms)")
    return "\n".join(lines)


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/capacity-validation", help="where the run directories go (reused)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--cluster", default="auto", choices=("auto", "slurm", "local"))
    p.add_argument(
        "--submit-args",
        default="--cpus-per-task 1 --time 15",
        help="submit flags of every run (default: one intra-op thread per rank, 15 min)",
    )
    p.add_argument("--json", help="also write the JSON here")
    ns = p.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.h5"
    if not data.exists():
        from hpctrain.data import make_dataset

        make_dataset(data, 20000, shape=(64,))
    # default: one intra-op thread per rank (each dev-cluster node advertises 4 CPUs of the same 2-core machine)
    submit = ["--cluster", ns.cluster, *shlex.split(ns.submit_args)]
    rows = validate(out, ns.steps, submit, str(data.resolve()))
    print(_markdown(rows))
    mean, worst, n = _errors(rows)
    emit(
        {"benchmark": "capacity_validation", "rows": rows, "step_error": {"mean": mean, "max": worst, "runs": n}},
        ns.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
