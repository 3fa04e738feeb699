"""The report's chart sections: loss, throughput and MFU, the step-time breakdown, the per-rank spread.

Each draws the interval and eval records over the broken time axis of :class:`~hpctrain.charts.time_chart.TimeChart`
(one piece per attempt, from :func:`_spans`); a long run's records are thinned first (:func:`_drawn`).
"""

from __future__ import annotations

import collections
import math
import typing as tp

from hpctrain._human import esc, fmt_num
from hpctrain.charts.elements import COLORS
from hpctrain.charts.range_bars import range_bars, stats_ok
from hpctrain.charts.time_chart import TimeChart
from hpctrain.report.gather import Attempt, RunData
from hpctrain.report.page_html import _empty, _num, _pct, _section, _when

__all__ = ["PARTS"]

PARTS = (
    ("data_wait_s", "data wait"),
    ("forward_backward_s", "compute (fwd+bwd)"),
    ("grad_comm_exposed_s", "exposed comm"),
    ("optimizer_s", "optimizer"),
    ("checkpoint_s", "checkpoint"),
)
"""The parts of a step, as the interval records' ``per_step`` names them, bottom of the stack first."""
CHART_WINDOWS = 800
"""Beyond twice this many interval records, the charts draw a few per window of consecutive records."""


def _ms(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else "?"


def _fixed(v: float) -> str:
    """``12.34``; ``?`` for a value that is not finite (a page never shows ``nan`` or ``inf``)."""
    return f"{v:.2f}" if math.isfinite(v) else "?"


_CUT = (
    " The y axis leaves out rare spikes (typically the first interval of an attempt: warm-up, first batches): "
    '<span class="bad">▲</span> marks them at the top with their value.'
)


def _spans(attempts: tp.Sequence[Attempt]) -> tp.Tuple[tp.List[tp.Tuple[float, float]], tp.List[str]]:
    """The pieces of the curves' time axis: each attempt that left timed metrics, from its first step to its
    last record; and their labels."""
    spans, labels = [], []
    for a in attempts:
        times = [r["time"] for r in a.intervals + a.evals if r.get("time") is not None]
        if not times:
            continue
        first = a.first_step_time
        t0 = min([first] + times) if first is not None else min(times)
        end_t = (a.end or {}).get("time")
        t1 = max(times + ([end_t] if end_t is not None else []))
        spans.append((t0, t1))
        labels.append(f"#{a.index} {a.label}")
    return spans, labels


def _timed(records: tp.Iterable[tp.Dict[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    return sorted((r for r in records if r.get("time") is not None), key=lambda r: r["time"])


def _step_median(r: tp.Dict[str, tp.Any]) -> float:
    s = r.get("per_step", {}).get("step_s") if isinstance(r.get("per_step"), dict) else None
    return s["median"] if stats_ok(s) else -1.0


def _drawn(records: tp.Sequence[tp.Dict[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The interval records a chart draws: all of them up to :data:`CHART_WINDOWS` x 2; beyond, in each of
    about CHART_WINDOWS windows of consecutive records the first, the highest loss, the slowest step and
    every non-finite loss (a chart is about a thousand pixels wide: the spikes stay, the cost does not grow)."""
    if len(records) <= 2 * CHART_WINDOWS:
        return list(records)
    k = -(-len(records) // CHART_WINDOWS)
    out: tp.List[tp.Dict[str, tp.Any]] = []
    for i in range(0, len(records), k):
        window = records[i : i + k]
        losses = [r for r in window if r.get("loss") is not None]
        keep = [window[0], max(window, key=_step_median)]
        keep += [max(losses, key=lambda r: r["loss"])] if losses else []
        keep += [r for r in window if r.get("loss") is None]
        seen: tp.Set[int] = set()
        out += [r for r in sorted(keep, key=lambda r: r["time"]) if not (id(r) in seen or seen.add(id(r)))]
    return out


def _loss(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals, evals = _drawn(_timed(data.intervals)), _timed(data.evals)
    if not intervals and not evals:
        return _section("loss", _empty("No interval or eval records with a time: nothing to draw yet."))
    chart = TimeChart(spans, label="loss", zero=False, piece_labels=labels, height=280)
    chart.line("train loss (interval mean)", COLORS["loss"], [(r["time"], r.get("loss")) for r in intervals])
    if 0 < len(intervals) <= 300:
        chart.markers(
            "train loss",
            COLORS["loss"],
            [
                (r["time"], r["loss"], f"step {r['step']} · loss {r['loss']:.5g} · {_when(r['time'], '%H:%M:%S')}")
                for r in intervals
                if r.get("loss") is not None
            ],
            legend=False,
        )
    bad = [r for r in intervals if r.get("loss") is None]
    if bad:
        chart.markers(
            "non-finite loss",
            COLORS["nan"],
            [(r["time"], None, f"step {r['step']}: loss not finite (recorded null)") for r in bad],
            shape="cross",
        )
    if evals:
        chart.line("eval loss", COLORS["eval"], [(r["time"], r.get("loss")) for r in evals], dash="5 4")
        chart.markers(
            "eval",
            COLORS["eval"],
            [
                (
                    r["time"],
                    r.get("loss"),
                    f"eval at step {r['step']}: loss {fmt_num(r.get('loss'), 5)}"
                    + (" (interrupted: fewer batches)" if r.get("interrupted") else ""),
                )
                for r in evals
            ],
            legend=False,
        )
    t_lo, t_hi = spans[0][0] - 1, spans[-1][1] + 1
    commits = [
        (c["time"], f"checkpoint step {c['step']} committed {_when(c['time'], '%H:%M:%S')}")
        for c in data.checkpoints
        if c["status"] == "committed" and c["time"] is not None and t_lo <= c["time"] <= t_hi
    ]
    chart.events("checkpoint committed", COLORS["ckpt"], commits)
    caption = (
        "Mean training loss of each log interval (all ranks) and the evaluation loss, over wall time. "
        "Each attempt of the run is one piece of the time axis; the hatched gap between two pieces is a restart "
        "(its width is fixed; the label says how long the run was down). Hover a point for its step."
    )
    body = f'<p class="caption">{caption}</p>{chart.svg(aria="loss over time")}'
    if bad:
        body += (
            f'<p class="caption"><span class="bad">{len(bad)} interval(s) recorded a non-finite loss</span> '
            f"(NaN or infinite, written as null): drawn as ✕ at the top, the line is broken there.</p>"
        )
    return _section("loss", body)


def _throughput(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals = _drawn(_timed(data.intervals))
    if not intervals:
        return _section("throughput", _empty("No interval records with a time: nothing to draw yet."))
    rate = TimeChart(spans, label="samples/s", piece_labels=labels, height=220)
    rate.line("samples/s (all ranks)", COLORS["rate"], [(r["time"], r.get("samples_per_s")) for r in intervals])
    body = (
        '<p class="caption">Samples per second of all ranks in each interval (samples / the slowest rank\'s '
        "interval time).</p>" + rate.svg(aria="samples per second over time")
    )
    if any(r.get("mfu") is not None for r in intervals):
        mfu = TimeChart(spans, label="MFU %", piece_labels=labels, height=200, fmt=lambda v: f"{v:g}")
        mfu.line(
            "MFU (model FLOP/s ÷ peak)",
            COLORS["mfu"],
            [(r["time"], 100 * r["mfu"] if r.get("mfu") is not None else None) for r in intervals],
        )
        body += '<p class="caption">Model FLOPs utilisation: achieved FLOP/s per device ÷ the device\'s peak.</p>'
        body += mfu.svg(aria="MFU over time")
    elif any(r.get("flops_per_s") is not None for r in intervals):
        fl = TimeChart(spans, label="FLOP/s", piece_labels=labels, height=200)
        fl.line("achieved FLOP/s (all ranks)", COLORS["mfu"], [(r["time"], r.get("flops_per_s")) for r in intervals])
        body += (
            '<p class="caption">MFU is unknown for this run: no peak FLOP/s for its device (a CPU, or a GPU '
            'hpctrain does not list; set <span class="mono">metrics.peak_flops_per_device</span>). '
            "The achieved FLOP/s instead:</p>" + fl.svg(aria="FLOP/s over time")
        )
    else:
        body += _empty("MFU and FLOP/s were not recorded.")
    return _section("throughput", body)


def _breakdown(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    intervals = _drawn([r for r in _timed(data.intervals) if isinstance(r.get("per_step"), dict)])
    if not intervals:
        why = (
            "The step was not measured (metrics.enabled=False): no per-part times."
            if any(r.get("measured") is False for r in data.intervals)
            else "No interval record holds per-step times yet."
        )
        return _section("breakdown", _empty(why))
    chart = TimeChart(spans, label="ms per step", piece_labels=labels, height=280, fmt=_ms, clip=True)

    def med(r: tp.Dict[str, tp.Any], part: str) -> tp.Optional[float]:
        s = r["per_step"].get(part)
        return 1e3 * s["median"] if stats_ok(s) else None

    chart.stack([(name, COLORS[part], [(r["time"], med(r, part)) for r in intervals]) for part, name in PARTS])
    chart.line(
        "whole step (median)", "#263238", [(r["time"], med(r, "step_s")) for r in intervals], dash="4 3", width=1.4
    )
    frac = [_num(r.get("data_wait_frac")) for r in intervals]
    known = [f for f in frac if f is not None]
    text = (
        "Each interval's median over ranks of the time a step spends in each part (the interval records' "
        '<span class="mono">per_step</span> medians), stacked; the dashed line is the median whole step, whose '
        "rest (between the marks) is not charged to a part. Data wait on CUDA is GPU idle time waiting for the batch."
    )
    if known:
        text += f" Data wait share over the run: median {_pct(sorted(known)[len(known) // 2])}, last {_pct(known[-1])}."
    svg = chart.svg(aria="step-time breakdown")
    return _section("breakdown", f'<p class="caption">{text}{_CUT if chart.clipped else ""}</p>{svg}')


def _ranks(data: RunData, spans: tp.List[tp.Tuple[float, float]], labels: tp.List[str]) -> str:
    every = [r for r in _timed(data.intervals) if isinstance(r.get("per_step"), dict)]
    intervals = _drawn(every)
    body = ""
    if intervals:
        chart = TimeChart(spans, label="ms per step", piece_labels=labels, height=240, fmt=_ms, clip=True)
        rows = [(r, r["per_step"].get("step_s")) for r in intervals]
        rows = [(r, s) for r, s in rows if stats_ok(s)]
        chart.band(
            "min..max over ranks", COLORS["band"], [(r["time"], 1e3 * s["min"], 1e3 * s["max"]) for r, s in rows]
        )
        chart.line("median rank", COLORS["median"], [(r["time"], 1e3 * s["median"]) for r, s in rows], width=1.5)
        slow_pts = [
            (
                r["time"],
                1e3 * s["max"],
                f"step {r['step']}: slowest rank {_rank(r, s)} ({_fixed(1e3 * s['max'])} ms per step)",
            )
            for r, s in rows
        ]
        labels_at = []
        prev = object()
        for r, s in rows:
            who = _rank(r, s)
            if who != prev:
                labels_at.append((r["time"], 1e3 * s["max"], f"r{who}"))
                prev = who
        chart.markers("slowest rank (max)", COLORS["slow"], slow_pts, labels=labels_at[:30])
        counted = [(r, r["per_step"].get("step_s")) for r in every]
        counts = collections.Counter(str(_rank(r, s)) for r, s in counted if stats_ok(s))
        summary = ", ".join(f"rank {esc(k)} in {v}" for k, v in counts.most_common(5))
        svg = chart.svg(aria="per-rank step time")
        body += (
            '<p class="caption">Mean step time of each rank in each interval: the band spans the fastest to the '
            "slowest rank, the red dots are the slowest rank (labelled where it changes). "
            f"Slowest rank by interval: {summary} of {sum(counts.values())} intervals."
            f"{_CUT if chart.clipped else ''}</p>" + svg
        )
        rated = [r for r in intervals if stats_ok(r.get("samples_per_s_per_rank"))]
        if rated:
            rc = TimeChart(spans, label="samples/s per rank", piece_labels=labels, height=200)
            pr = [(r, r["samples_per_s_per_rank"]) for r in rated]
            rc.band("min..max over ranks", COLORS["band"], [(r["time"], s["min"], s["max"]) for r, s in pr])
            rc.line("median rank", COLORS["rate"], [(r["time"], s["median"]) for r, s in pr], width=1.5)
            body += rc.svg(aria="samples per second per rank")
        last = intervals[-1]
        bars = [("whole step", last["per_step"].get("step_s"))] + [(n, last["per_step"].get(p)) for p, n in PARTS]
        body += f"<h3>Last interval (to step {esc(last['step'])}): each part per step, over ranks</h3>" + range_bars(
            bars
        )
    else:
        body += _empty("No per-rank measurements (interval records with per_step) yet.")
    return _section("ranks", body)


def _rank(r: tp.Dict[str, tp.Any], s: tp.Dict[str, tp.Any]) -> tp.Any:
    who = r.get("slowest_rank")
    return who if who is not None else s.get("max_rank", "?")
