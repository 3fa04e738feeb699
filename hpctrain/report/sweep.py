"""One self-contained HTML page comparing the tasks of a sweep: the loss curves of every task overlaid (train, and
eval where the tasks evaluate), the table of :mod:`hpctrain.sweep.table` with the best task marked, and which
parameters mattered (the mean final loss per value of each parameter, and its spread).

Like the run report (:mod:`hpctrain.report.page`): inline CSS and SVG, no script, nothing fetched; every text that
came from a run directory or the sweep file goes through :func:`hpctrain._human.esc`. Stdlib only.
It lives in the report package (not in ``hpctrain.sweep``) because it draws with the report's parts, and
``hpctrain.sweep`` sits below ``submit``, which reads sweep files.
"""

from __future__ import annotations

import math
import time
import typing as tp
from pathlib import Path

from hpctrain._human import esc
from hpctrain.charts.elements import plottable
from hpctrain.report.page_html import page_head

__all__ = ["render_sweep", "write_sweep_report", "REPORT_FILE"]

# distinct colours for up to 12 overlaid curves (then they repeat, the legend still names each)
PALETTE = ("#1f5fbf", "#e07000", "#2e7d32", "#c62828", "#6a1b9a", "#00838f",
           "#5d4037", "#ad1457", "#827717", "#37474f", "#ef6c00", "#283593")  # fmt: skip
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header,main,footer{max-width:1200px;margin:0 auto;padding:12px 20px}
h1{font-size:20px;margin:8px 0}h2{font-size:16px;margin:18px 0 6px}
.sub,footer{color:#666;font-size:12px}
table{border-collapse:collapse;background:#fff}th,td{padding:3px 10px;border-bottom:1px solid #e0e0e0;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}tr.best td{background:#e8f5e9;font-weight:600}
svg{background:#fff;border:1px solid #e0e0e0;width:100%;height:auto}
.legend span{display:inline-block;margin-right:14px;font-size:12px}.legend i{display:inline-block;width:18px;
height:3px;vertical-align:middle;margin-right:4px}
"""


def _fmt(v: tp.Optional[float]) -> str:
    return "-" if v is None else f"{v:.4g}"


def _ticks(lo: float, hi: float, n: int = 5) -> tp.List[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def curves_svg(series: tp.Sequence[tp.Tuple[str, tp.Sequence[tp.Tuple[int, float]]]], *, label: str) -> str:
    """An SVG of loss over step, one polyline per ``(name, points)``; a log y axis when the values span 30x."""
    pts = [(s, v) for _, p in series for s, v in p if plottable(v) and plottable(s)]
    if not pts:
        return '<p class="sub">no values to draw</p>'
    W, H, L, R, T, B = 1160.0, 320.0, 70.0, 18.0, 20.0, 36.0
    xs, ys = [s for s, _ in pts], [v for _, v in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    log = min(ys) > 0 and max(ys) / min(ys) >= 30
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    y0, y1 = f(min(ys)), f(max(ys))
    if y1 <= y0:
        y0, y1 = y0 - 1, y1 + 1

    def X(s: float) -> float:
        return L + (s - x0) / (x1 - x0) * (W - L - R)

    def Y(v: float) -> float:
        return T + (1 - (f(v) - y0) / (y1 - y0)) * (H - T - B)

    parts = [f'<svg viewBox="0 0 {W:.0f} {H:.0f}" role="img" aria-label="{esc(label)}">']
    for t in _ticks(x0, x1):
        parts.append(f'<line x1="{X(t):.1f}" y1="{T}" x2="{X(t):.1f}" y2="{H - B}" stroke="#eee"/>')
        parts.append(f'<text x="{X(t):.1f}" y="{H - B + 16}" font-size="11" text-anchor="middle">{t:g}</text>')
    yt = [10**e for e in range(math.floor(y0), math.ceil(y1) + 1)] if log else _ticks(y0, y1)
    for t in yt:
        if f(t) < y0 - 1e-9 or f(t) > y1 + 1e-9:
            continue
        parts.append(f'<line x1="{L}" y1="{Y(t):.1f}" x2="{W - R}" y2="{Y(t):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{L - 6}" y="{Y(t) + 4:.1f}" font-size="11" text-anchor="end">{t:.3g}</text>')
    parts.append(f'<text x="{W / 2:.0f}" y="{H - 4}" font-size="11" text-anchor="middle">step</text>')
    parts.append(f'<text x="12" y="{T + 4}" font-size="11">{esc(label)}{" (log)" if log else ""}</text>')
    for i, (name, p) in enumerate(series):
        good = [(s, v) for s, v in p if plottable(v) and plottable(s) and (not log or v > 0)]
        if not good:
            continue
        line = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in good)
        color = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<polyline class="curve" data-task="{esc(name)}" fill="none" stroke="{color}" stroke-width="1.8" '
            f'points="{line}"><title>{esc(name)}</title></polyline>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{esc(name)}</span>'
        for i, (name, _) in enumerate(series)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _mattered(rows: tp.Sequence[tp.Mapping[str, tp.Any]], metric: str) -> str:
    """Per parameter: the mean final loss for each of its values, and the spread of those means (the larger, the
    more that parameter moved the result in this sweep)."""
    keys: tp.List[str] = []
    for r in rows:
        keys += [k for k in r["params"] if k not in keys]
    out = []
    for key in keys:
        by: tp.Dict[str, tp.List[float]] = {}
        for r in rows:
            if key in r["params"] and r[metric] is not None:
                by.setdefault(str(r["params"][key]), []).append(r[metric])
        means = {v: sum(x) / len(x) for v, x in by.items()}
        if not means:
            continue
        spread = max(means.values()) - min(means.values())
        cells = ", ".join(f"{esc(v)}: {_fmt(m)} ({len(by[v])})" for v, m in means.items())
        out.append((spread, f"<tr><td>{esc(key)}</td><td>{cells}</td><td class='n'>{_fmt(spread)}</td></tr>"))
    if not out:
        return '<p class="sub">no final losses yet</p>'
    body = "".join(row for _, row in sorted(out, key=lambda x: -x[0]))
    what = "eval" if metric == "eval_loss" else "train"
    return (
        f"<table><tr><th>parameter</th><th>mean final {what} loss per value (tasks)</th>"
        f"<th>spread of the means</th></tr>{body}</table>"
    )


def render_sweep(
    table: tp.Mapping[str, tp.Any], curves: tp.Mapping[int, tp.Mapping[str, tp.Sequence[tp.Tuple[int, float]]]]
) -> str:
    """The page: ``table`` is :func:`hpctrain.sweep.table.sweep_table`'s, ``curves`` each task's
    :func:`hpctrain.sweep.table.task_curves` by task index."""
    import hpctrain

    rows = table["tasks"]
    keys: tp.List[str] = []
    for r in rows:
        keys += [k for k in r["params"] if k not in keys]
    head = "".join(f"<th>{esc(h)}</th>" for h in ["task", "job", *keys, "state", "step", "train loss", "eval loss",
                                                   "attempts", ""])  # fmt: skip
    body = []
    for r in rows:
        step = "-" if r["step"] is None else f"{r['step']}" + (f"/{r['total_steps']}" if r["total_steps"] else "")
        cells = [esc(r["index"]), esc(r["job_id"] or "-"), *(esc(r["params"].get(k, "")) for k in keys)]
        cells += [esc(r["state"]), esc(step)]
        body.append(
            f'<tr{" class=best" if r["best"] else ""}>' + "".join(f"<td>{c}</td>" for c in cells)
            + "".join(f'<td class="n">{esc(x)}</td>' for x in (_fmt(r["train_loss"]), _fmt(r["eval_loss"]),
                                                             r["attempts"]))
            + f"<td>{'best' if r['best'] else ''}</td></tr>"
        )  # fmt: skip
    train = [(str(r["name"]), curves.get(r["index"], {}).get("train", [])) for r in rows]
    evals = [(str(r["name"]), curves.get(r["index"], {}).get("eval", [])) for r in rows]
    charts = f"<h2>Train loss</h2>{curves_svg(train, label='train loss')}"
    if any(p for _, p in evals):
        charts += f"<h2>Eval loss</h2>{curves_svg(evals, label='eval loss')}"
    by = "final eval loss" if table["best_by"] == "eval_loss" else "final train loss"
    name = Path(str(table["sweep_dir"])).name
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return (
        page_head(f"hpctrain sweep: {name[:120]}", CSS) + f"<header><h1>Sweep report: {esc(name, 120)}</h1>"
        f'<div class="sub">{esc(table["sweep_dir"], 500)} · job array {esc(table.get("array_job_id") or "-")}, '
        f"{len(rows)} task(s), at most {esc(table.get('max_parallel'))} at once · generated {esc(when)} by hpctrain "
        f"{esc(hpctrain.__version__)}</div></header><main>"
        f"<h2>Tasks</h2><table><tr>{head}</tr>{''.join(body)}</table>"
        f'<p class="sub">best: the lowest {esc(by)}; states from {esc(table.get("slurm"))} and each task\'s ledger</p>'
        f"{charts}<h2>Which parameters mattered</h2>{_mattered(rows, table['best_by'])}"
        "</main><footer>python -m hpctrain.report.sweep · one self-contained file: no script, nothing fetched"
        "</footer></body></html>\n"
    )


def write_sweep_report(
    sweep_dir: tp.Union[str, Path],
    output: tp.Optional[tp.Union[str, Path]] = None,
    *,
    slurm: tp.Any = None,
    overwrite: bool = True,
) -> tp.Any:
    """Read the sweep (one squeue call) and its tasks' metrics, write the page (default
    ``SWEEP_DIR/sweep-report.html``) through :func:`hpctrain._output.output_file` (a file atomically; an
    existing one only with ``overwrite``); returns the :class:`~hpctrain._output.OutputFile` written."""
    from hpctrain._cli import FORCE_HINT
    from hpctrain._output import output_file
    from hpctrain.sweep.table import sweep_table, task_curves

    target = output_file(output if output is not None else Path(sweep_dir) / REPORT_FILE, overwrite=overwrite,
                         hint=FORCE_HINT)  # fmt: skip
    table = sweep_table(sweep_dir, slurm=slurm)
    curves = {r["index"]: task_curves(Path(r["run_dir"])) for r in table["tasks"]}
    target.write_text(render_sweep(table, curves))
    return target


REPORT_FILE = "sweep-report.html"
"""The sweep page's default name, in the sweep directory (``python -m hpctrain report SWEEP_DIR``)."""
