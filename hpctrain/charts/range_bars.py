"""The per-rank range bars: one min..median..max bar per part of the step, over ranks (stdlib only)."""

from __future__ import annotations

import typing as tp

from hpctrain._human import esc, fmt_num
from hpctrain.charts.axes import nice_ticks
from hpctrain.charts.elements import COLORS, PLOTTABLE, el, fmt_sig, left_out_note, plottable, svg_open, svg_text

__all__ = ["stats_ok", "range_bars"]


def stats_ok(s: tp.Any) -> bool:
    """Whether ``s`` is a usable ``{min, median, max, max_rank}`` (the sanitiser leaves None for a bad one)."""
    return isinstance(s, dict) and all(s.get(k) is not None for k in ("min", "median", "max"))


def range_bars(rows: tp.Sequence[tp.Tuple[str, tp.Optional[tp.Dict[str, tp.Any]]]], *, unit: float = 1e3) -> str:
    """One horizontal min..max bar per row (``(name, {min, median, max, max_rank})``, seconds), the median a
    tick, the max a red dot labelled with the rank that holds it. Values are shown in ms. A row whose values
    are not finite or beyond PLOTTABLE (in ms) is written, not drawn, and the chart says how many."""
    W, L, R, T, RH = 1160.0, 150.0, 240.0, 24.0, 26.0
    H = T + RH * len(rows) + 24

    def drawable(s: tp.Any) -> bool:
        return stats_ok(s) and all(plottable(s[k]) and plottable(unit * s[k]) for k in ("min", "median", "max"))

    left_out = sum(1 for _, s in rows if stats_ok(s) and not drawable(s))
    hi = max((unit * s["max"] for _, s in rows if drawable(s)), default=0.0) or 1.0
    ticks = nice_ticks(0.0, hi)
    hi = max(ticks[-1], hi)

    def x(v: float) -> float:
        return L + (W - L - R) * v / hi

    out = [svg_open(W, H, "per-rank spread of the last interval")]
    for v in ticks:
        out.append(el("line", x1=x(v), x2=x(v), y1=T - 6, y2=H - 20, stroke=COLORS["grid"]))
        out.append(svg_text(x(v), H - 6, f"{esc(fmt_num(v))} ms", text_anchor="middle"))
    key = "per step, over ranks: bar min..max · tick median · " + el(
        "tspan", "● max, on the rank named", fill=COLORS["slow"]
    )
    out.append(svg_text(L, 12, key, size=11.5, color=COLORS["text"]))
    for i, (name, s) in enumerate(rows):
        cy = T + RH * i + RH / 2
        out.append(svg_text(L - 10, cy + 4, esc(name), size=12, color=COLORS["text"], text_anchor="end"))
        if not stats_ok(s):
            out.append(svg_text(L, cy + 4, "not measured", size=11))
            continue
        if not drawable(s):
            out.append(
                svg_text(
                    L, cy + 4, f"left out: not finite or beyond ±{PLOTTABLE:.0e} ms", size=11, color=COLORS["slow"]
                )
            )
            continue
        assert s is not None
        lo, med, top = (unit * s[k] for k in ("min", "median", "max"))
        rank = esc(s.get("max_rank"))
        out.append(el("rect", x=x(lo), y=cy - 5, width=max(x(top) - x(lo), 1.5), height=10, fill=COLORS["band"], rx=3))
        out.append(el("line", x1=x(med), x2=x(med), y1=cy - 8, y2=cy + 8, stroke=COLORS["median"], stroke_width=2.5))
        tip = el(
            "title",
            f"{esc(name)}: min {fmt_sig(lo)} ms, median {fmt_sig(med)} ms, max {fmt_sig(top)} ms on rank {rank}",
        )
        out.append(el("circle", tip, cx=x(top), cy=cy, r=4.5, fill=COLORS["slow"]))
        label = f"median {fmt_sig(med)} ms · max {fmt_sig(top)} on rank {rank}"
        out.append(svg_text(x(top) + 9, cy + 4, label, size=11, color=COLORS["text"]))
    out.append(left_out_note(left_out, W - 10, 12, text_anchor="end"))
    out.append("</svg>")
    return "".join(out)
