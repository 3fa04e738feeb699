"""``python -m hpctrain capacity RUN_DIR [RUN_DIR...] [targets] [--json] [-o FILE]`` (login node, no torch).

How many nodes to ask for, how long the run takes, how many GPU-hours, how often to checkpoint, what
failures cost and what limits the run, predicted from calibration runs' own measurements
(docs/capacity.md). ``--calibrate`` first submits short calibration runs of an entry (through
``python -m hpctrain.submit``, with the all-reduce probe of :mod:`hpctrain.launch.probe`) and then
predicts from them.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import typing as tp
from pathlib import Path

from hpctrain._cli import EXIT_OK, FORCE_HINT, add_json_flag, add_output, add_run_dir, command_parser, print_json
from hpctrain._files import shorten
from hpctrain._output import output_dir, output_file
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import RunDir

__all__ = ["main", "build_parser", "calibrate", "format_table", "input_line", "staging_lines"]

GB = 1e9


def _nodes(text: str) -> tp.Tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(
            f"--nodes {shorten(text)!r} is not a comma-separated list of integers (e.g. 1,8,64,512)"
        ) from None
    if not values or any(v < 1 or v > 10_000_000 for v in values):
        raise UsageError(f"--nodes {shorten(text)!r}: node counts must be integers from 1 to 10000000")
    return values


def _positive(flag: str) -> tp.Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} {shorten(text)!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{flag} {shorten(text)!r} must be a number > 0")
        return value

    return parse


def _nonneg(flag: str) -> tp.Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} {shorten(text)!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{flag} {shorten(text)!r} must be a number >= 0")
        return value

    return parse


def _limit(text: str) -> float:
    from hpctrain._slurm import parse_time

    return float(parse_time(text, "--time-limit"))


def _sizes(text: str) -> tp.List[tp.Tuple[int, int]]:
    """``1,2,2x2`` -> [(nodes, ranks per node)]: ``W`` is W nodes of one rank (GPUs: see --gpus-per-node)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        try:
            if "x" in item:
                n, r = item.split("x", 1)
                out.append((int(n), int(r)))
            elif item:
                out.append((int(item), 0))
        except ValueError:
            raise UsageError(f"--calibrate {shorten(text)!r}: give world sizes or NODESxRANKS, e.g. 1,2,2x2") from None
    if not out or any(n < 1 or r < 0 for n, r in out):
        raise UsageError(f"--calibrate {shorten(text)!r}: give world sizes or NODESxRANKS, e.g. 1,2,2x2")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "capacity",
        "Predict step time, time to train, GPU-hours, the checkpoint interval, failure costs and the bounding "
        "resource at each node count, from calibration runs' own measurements (docs/capacity.md).",
        epilog="examples:\n"
        "  python -m hpctrain capacity runs/cal-w1 runs/cal-w2 --nodes 1,8,64,512 --epochs 90\n"
        "  python -m hpctrain capacity --calibrate 1,2 --entry mypkg.train:main -- --steps 300\n",
    )
    add_run_dir(p, dest="run_dirs", nargs="*")  # calibration runs: several world sizes
    t = p.add_argument_group("targets")
    t.add_argument("--nodes", type=_nodes, help="node counts to predict (default 1,2,4,...,512)")
    t.add_argument("--gpus-per-node", type=int, help="ranks per node (default: the calibration's)")
    size = t.add_mutually_exclusive_group()
    size.add_argument("--samples", type=_positive("--samples"), help="samples to train on")
    size.add_argument("--epochs", type=_positive("--epochs"), help="passes over the dataset")
    batch = t.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=_positive("--global-batch"), help="global batch kept at every size")
    batch.add_argument("--local-batch", type=_positive("--local-batch"), help="per-rank batch kept at every size")
    t.add_argument("--peak-flops", type=_positive("--peak-flops"), help="peak FLOP/s of one GPU (e.g. 989e12)")
    t.add_argument("--busbw", type=_positive("--busbw"), help="all-reduce bus bandwidth between nodes, GB/s")
    t.add_argument("--latency-us", type=_nonneg("--latency-us"), help="all-reduce latency per message round, us")
    t.add_argument("--read-bw", type=_positive("--read-bw"), help="filesystem aggregate read bandwidth, GB/s")
    t.add_argument(
        "--local-read-bw", type=_positive("--local-read-bw"), help="a node's read rate from node-local storage, GB/s"
    )
    t.add_argument("--write-bw", type=_positive("--write-bw"), help="filesystem aggregate write bandwidth, GB/s")
    fail = t.add_mutually_exclusive_group()
    fail.add_argument("--mtbf-node-hours", type=_positive("--mtbf-node-hours"), help="hours between failures of a node")
    fail.add_argument("--failure-rate", type=_positive("--failure-rate"), help="failures per 1000 node-days")
    t.add_argument("--time-limit", type=_limit, help="the partition's time limit (HH:MM:SS, D-HH:MM:SS)")
    t.add_argument("--queue-wait", type=_nonneg("--queue-wait"), help="seconds queued per job and requeue")
    o = p.add_argument_group("output")
    add_json_flag(o)
    # --plot FILE: the older spelling of -o, still accepted (not shown)
    add_output(o, kind="file", help="the plot, an SVG file (.svg; for a PNG: rsvg-convert)", aliases=("--plot",))
    c = p.add_argument_group("calibration runs (submitted first, through python -m hpctrain.submit)")
    c.add_argument(
        "--calibrate", type=_sizes, metavar="SIZES", help="world sizes to calibrate at: 1,2 or 2x2 (nodes x ranks)"
    )
    c.add_argument("--entry", help="the training entry to calibrate (package.module:function); its args after --")
    c.add_argument("--calibrate-dir", default="runs/capacity", help="where the calibration run dirs go")
    c.add_argument(
        "--submit-args", default="", help="extra submit flags, one string (e.g. '--partition gpu --time 15')"
    )
    return p


def _targets(ns: argparse.Namespace) -> tp.Any:
    from hpctrain.capacity.targets import DEFAULT_NODES, Targets

    def gb(x: tp.Optional[float]) -> tp.Optional[float]:
        return x * GB if x is not None else None

    return Targets(
        nodes=ns.nodes or DEFAULT_NODES,
        gpus_per_node=ns.gpus_per_node,
        samples=ns.samples,
        epochs=ns.epochs,
        global_batch=ns.global_batch,
        local_batch=ns.local_batch,
        peak_flops=ns.peak_flops,
        busbw=gb(ns.busbw),
        latency_s=ns.latency_us * 1e-6 if ns.latency_us is not None else None,
        read_bw=gb(ns.read_bw),
        local_read_bw=gb(ns.local_read_bw),
        write_bw=gb(ns.write_bw),
        mtbf_node_hours=ns.mtbf_node_hours,
        failure_rate=ns.failure_rate,
        time_limit_s=ns.time_limit,
        queue_wait_s=ns.queue_wait,
    )


def calibrate(
    sizes: tp.Sequence[tp.Tuple[int, int]],
    *,
    entry: str,
    entry_args: tp.Sequence[str],
    out_dir: tp.Union[str, "os.PathLike[str]"],
    gpus_per_node: tp.Optional[int] = None,
    submit_args: tp.Sequence[str] = (),
    echo: tp.Callable[[str], None] = print,
) -> tp.List[Path]:
    """Submit one calibration run per size through ``python -m hpctrain.submit --follow`` (the entry wrapped
    in the all-reduce probe) and wait for each; a run directory that already holds metrics is reused.
    ``sizes``: ``(nodes, ranks per node)``; ranks 0 means one rank per node (a CPU job) or, with
    ``gpus_per_node``, that many GPUs per node. Returns the run directories."""
    from hpctrain._entry import split_entry

    split_entry(entry)
    out = output_dir(out_dir, parents=True, label="--calibrate-dir: ")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpctrainError(
            f"--calibrate-dir: cannot create {shorten(os.fspath(out_dir), 300)}: {exc.strerror}"
        ) from None
    dirs = []
    for nodes, ranks in sizes:
        per_node = ranks or gpus_per_node or 1
        label = f"n{nodes}x{per_node}"
        run_dir = out / label
        dirs.append(run_dir)
        if RunDir(run_dir).metrics.exists():
            echo(f"calibration {label}: reusing {run_dir}")
            continue
        placement = ["--gpus-per-node", str(per_node)] if gpus_per_node else ["--tasks-per-node", str(per_node)]
        argv = [sys.executable, "-m", "hpctrain.submit", "--nodes", str(nodes), *placement]
        argv += ["--job-name", f"capacity-{label}", "--run-dir", str(run_dir), "--follow", *submit_args]
        argv += ["--entry", "hpctrain.launch.probe:main", "--", "--entry", entry, "--", *entry_args]
        log = out / f"{label}.log"
        echo(f"calibration {label}: {nodes} node(s) x {per_node} rank(s) -> {run_dir} (log {log})")
        with open(log, "wb") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            raise HpctrainError(f"calibration run {label} failed (submit exit {rc}); see {log}")
    return dirs


def _finite(x: tp.Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ms(x: tp.Optional[float]) -> str:
    return f"{x * 1e3:.3g}" if _finite(x) and _finite(x * 1e3) else "?"  # type: ignore[operator]


def _fmt(x: tp.Any, spec: str) -> str:
    """``x`` formatted with ``spec``, or ``?`` when it is unknown or not finite (never ``nan``/``inf``)."""
    return format(x, spec) if _finite(x) else "?"


def _dur(seconds: tp.Optional[float]) -> str:
    from hpctrain.capacity.advice import _dur as dur

    if seconds is None or not math.isfinite(seconds):
        return "never"
    return dur(seconds)


def format_table(report: tp.Mapping[str, tp.Any]) -> tp.Any:
    """The report's rows as a rich Table."""
    from rich.table import Table

    peak = report["model"]["peak_flops"]["value"]
    table = Table(
        title="predicted per node count (step, data wait, compute, comm: ms per step; ckpt: Daly's interval)",
        title_justify="left",
    )
    cols = ["nodes", "GPUs", "step", "data", "compute", "comm", "samples/s", "E(N)"]
    cols += ["MFU"] if peak else []
    cols += ["train", "wall", "GPU-h", "ckpt", "ETTR", "jobs", "bound"]
    for c in cols:
        table.add_column(c, justify="left" if c == "bound" else "right")
    for r in report["rows"]:
        if not r.get("feasible"):
            table.add_row(str(r["nodes"]), str(r["gpus"]), *["-"] * (len(cols) - 3), r.get("bound") or "infeasible")
            continue
        p = r["parts"]
        ck = r["checkpoint"]
        cells = [str(r["nodes"]), str(r["gpus"]), _ms(r["step_s"]), _ms(p["data_wait_s"]), _ms(p["compute_s"])]
        cells += [_ms(p["comm_s"]), _fmt(r["samples_per_s"], ",.0f"), _fmt(r["efficiency"] or None, ".2f")]
        if peak:
            cells.append(_fmt(r.get("mfu"), ".0%"))
        cells += [_dur(r["train_s"]), _dur(r["wall_s"])]
        cells.append(_fmt(r.get("gpu_hours"), ",.1f"))
        every = _dur(ck["daly_s"]) if ck.get("daly_s") else "?"
        cells += [every, _fmt(r["ettr"], ".3f"), str(r["segments"] or "?"), r["bound"]]
        table.add_row(*cells)
    return table


def _model_line(report: tp.Mapping[str, tp.Any]) -> str:
    md = report["model"]

    def v(name: str) -> tp.Any:
        return md[name]["value"]

    def src(name: str) -> str:
        note = md[name]["note"]
        return f"{md[name]['source']}{': ' + note if note else ''}"

    inv = v("comm_inv_busbw")
    bw = f"{_fmt(1 / inv / GB, '.3g')} GB/s" if _finite(inv) and inv > 0 else "no cost (not modelled)"
    return (
        f"model     compute {_ms(v('compute_multi_per_step_s'))} ms/step + {_us(v('compute_multi_per_sample_s'))} "
        f"us/sample on several ranks ({md['compute_multi_per_sample_s']['source']}; one rank: "
        f"{_us(v('compute_per_sample_s'))} us/sample) · exposed comm {_ms(v('comm_base_s'))} ms + "
        f"{_us(v('comm_latency_s'))} us/round ({src('comm_latency_s')}) + bytes at "
        f"{bw} ({src('comm_inv_busbw')}) + {_ms(v('comm_extra_s'))} ms · save stall "
        f"{_ms(v('save_stall_s'))} ms, commit {_ms(v('save_commit_s'))} ms · start-up {_dur(v('startup_s'))}, "
        f"restore {_dur(v('restore_s'))} ({md['restore_s']['source']}) · node MTBF "
        f"{_fmt(v('mtbf_node_hours'), '.0f')} h ({md['mtbf_node_hours']['source']})"
    )


def _gbs(x: tp.Any) -> str:
    return f"{_fmt(x / GB, '.3g')} GB/s" if _finite(x) else "?"


def input_line(report: tp.Mapping[str, tp.Any]) -> str:
    """The input path in one line: bytes per sample, a node's read rate, the file system's aggregate bandwidth and
    the node count where storage becomes the bound (``summary.storage_bound_from``)."""
    md = report["model"]

    def src(name: str) -> str:
        note = md[name]["note"]
        return f"{md[name]['source']}{': ' + note if note else ''}"

    bps = md["bytes_per_sample"]["value"]
    head = (
        f"input     {_fmt(bps, ',.0f')} B/sample ({src('bytes_per_sample')}) · a node reads "
        f"{_gbs(md['node_read_rate']['value'])} ({src('node_read_rate')}) · file system "
    )
    agg = md["read_bw"]["value"]
    if not agg:
        return head + "bandwidth unknown: give --read-bw GB/s (aggregate) to find where storage becomes the bound"
    head += f"{_gbs(agg)} aggregate ({md['read_bw']['source']})"
    if not bps:
        return head + ": no bytes per sample recorded, the storage bound is not modelled"
    bound = (report["summary"] or {}).get("storage_bound_from")
    top = max(r["nodes"] for r in report["rows"])
    if bound is None:
        return head + f": storage is not the bound up to {top} nodes"
    at = next((r for r in report["rows"] if r["nodes"] == bound and r.get("feasible")), None)
    need = f" (a node needs {_gbs(at['input']['node_read_need'])}, gets {_gbs(agg / bound)})" if at else ""
    return head + f": storage becomes the bound at {bound} node{'s' if bound > 1 else ''}{need}"


def staging_lines(report: tp.Mapping[str, tp.Any]) -> tp.List[str]:
    """When staging pays off, at the first row storage bounds and at the largest node count."""
    rows = [r for r in report["rows"] if r.get("feasible") and r.get("staging")]
    if not rows:
        return []
    bound = [r for r in rows if r["input"]["storage_bound"]]
    show = ([bound[0]] if bound else []) + ([rows[-1]] if not bound or rows[-1] is not bound[0] else [])
    return [f"staging   at {r['nodes']} node{'s' if r['nodes'] > 1 else ''}: {r['staging']['verdict']}" for r in show]


def _us(x: tp.Optional[float]) -> str:
    return _fmt((x or 0) * 1e6, ".3g")


def _print(report: tp.Mapping[str, tp.Any], file: tp.Optional[tp.TextIO] = None) -> None:
    from rich.console import Console
    from rich.markup import escape

    file = file or sys.stdout
    console = Console(file=file, highlight=False, soft_wrap=True, width=None if file.isatty() else 200)
    for c in report["calibration"]:
        console.print(
            f"calibrated {escape(shorten(c['run_dir'], 80))}: world {c['world_size']} on {c['nodes']} node(s), "
            f"local batch {_fmt(c['local_batch'], 'g')}, step {_ms(c['step_s'])} ms (data {_ms(c['data_wait_s'])}, "
            f"compute {_ms(c['compute_s'])}, comm {_ms(c['comm_s'])}, optimizer {_ms(c['optimizer_s'])}, other "
            f"{_ms(c['other_s'])}), {c['intervals']} intervals"
        )
    console.print(escape(_model_line(report)))
    console.print(escape(input_line(report)))
    samples = report["model"]["samples"]
    console.print(
        f"target    {_fmt(samples['value'], ',.0f')} samples "
        f"({samples['source']}{': ' + samples['note'] if samples['note'] else ''})"
    )
    console.print(format_table(report))
    rows = report["rows"]
    for i, r in enumerate(rows):  # the first row of each run of one bound, and the last row
        if 0 < i < len(rows) - 1 and r["bound"] == rows[i - 1]["bound"]:
            continue
        console.print(
            f"  {r['nodes']:>6} node{'s' if r['nodes'] > 1 else ' '}: [bold]{escape(r['bound'])}[/] — "
            f"{escape(r.get('advice', ''))}"
        )
    for line in staging_lines(report):
        console.print(escape(line))
    s = report["summary"]
    if s:
        half = s.get("efficiency_below_half_from")
        console.print(
            f"fastest at {s['fastest']} node(s), fewest GPU-hours at {s['cheapest']} node(s)"
            + (f"; E(N) falls below 0.5 from {half} nodes" if half else "")
        )
    for note in report["notes"]:
        console.print(f"[yellow]note[/]: {escape(note)}")


def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    from hpctrain.capacity.predict import SCHEMA, capacity_report

    args = list(sys.argv[1:] if argv is None else argv)
    entry_args: tp.List[str] = []
    if "--" in args:
        i = args.index("--")
        args, entry_args = args[:i], args[i + 1 :]
    ns = build_parser().parse_args(args)
    targets = _targets(ns)
    plot = None
    if ns.output:
        suffix = Path(ns.output).suffix.lower()
        if suffix == ".png":
            from hpctrain.capacity.plot import PNG_HINT

            raise UsageError(f"-o {shorten(ns.output)!r}: {PNG_HINT}")
        if suffix != ".svg":
            raise UsageError(f"-o {shorten(ns.output)!r}: name a .svg file for the plot")
        # checked before any calibration run is submitted
        plot = output_file(ns.output, overwrite=ns.force, label="-o: ", hint=FORCE_HINT)
        if plot.to_stdout and ns.json:
            raise UsageError("-o names standard output, where --json prints the report; write the plot to a file")
    submit_args = _submit_args(ns.submit_args)
    run_dirs: tp.List[tp.Any] = list(ns.run_dirs)
    if ns.calibrate:
        if not ns.entry:
            raise UsageError("--calibrate needs --entry package.module:function (the training entry to calibrate)")
        echo = (lambda line: print(line, file=sys.stderr)) if ns.json else print
        run_dirs += calibrate(
            ns.calibrate,
            entry=ns.entry,
            entry_args=entry_args,
            out_dir=ns.calibrate_dir,
            gpus_per_node=ns.gpus_per_node,
            submit_args=submit_args,
            echo=echo,
        )
    elif ns.entry or entry_args:
        raise UsageError("--entry and arguments after -- belong to --calibrate")
    if not run_dirs:
        raise UsageError("give at least one calibration RUN_DIR, or --calibrate SIZES --entry MOD:FN")
    report = capacity_report(run_dirs, targets)
    if plot is not None:
        from hpctrain.capacity.plot import render_plot

        plot.write_bytes(render_plot(report, "svg"))
        report["plot"] = os.fspath(ns.output)
    if ns.json:
        print_json(report, schema=SCHEMA)
    else:
        # the plot went to standard output (-o /dev/stdout): the table goes to stderr, not into the image
        out = sys.stderr if plot is not None and plot.to_stdout else sys.stdout
        _print(report, file=out)
        if report.get("plot"):
            print(f"plot      {report['plot']}", file=out)
    return EXIT_OK


def _submit_args(text: str) -> tp.List[str]:
    """``--submit-args`` split as a shell would; unbalanced quotes are one line (exit 2)."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UsageError(
            f"--submit-args {shorten(text)!r} cannot be split into flags ({str(exc).lower()}); balance its quotes, "
            "e.g. --submit-args \"--partition gpu --comment 'a b'\""
        ) from None
