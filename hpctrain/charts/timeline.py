"""The attempts timeline: one Gantt row per attempt over the broken time axis (stdlib only)."""

from __future__ import annotations

import typing as tp

from hpctrain._human import esc, fmt_duration
from hpctrain.charts.axes import TimeAxis, axis_line
from hpctrain.charts.elements import COLORS, diamond_d, el, hatch_pattern, new_id, svg_open, svg_text

__all__ = ["Row", "timeline"]


class Row(tp.NamedTuple):
    """One attempt on the timeline: times are Unix seconds (None where unknown); text is plain (escaped when
    drawn)."""

    label: str
    process_start: tp.Optional[float]
    first_step: tp.Optional[float]
    end: tp.Optional[float]
    outcome: str
    text: str
    lost_s: tp.Optional[float]
    title: str
    checkpoints: tp.Sequence[tp.Tuple[float, str]] = ()


def timeline(rows: tp.Sequence[Row]) -> str:
    """The attempts as a Gantt chart over a broken time axis: start-up hatched, training coloured by how it
    ended, the progress redone after it (lost) striped red at its end, checkpoint commits as diamonds."""
    W, L, R, T, B, RH = 1160.0, 150.0, 18.0, 10.0, 34.0, 40.0
    spans = []
    for r in rows:
        a = r.process_start if r.process_start is not None else r.first_step
        if a is not None:
            spans.append((a, max(x for x in (r.end, r.first_step, a) if x is not None)))
    H = T + RH * max(len(rows), 1) + B
    bottom = H - B
    axis = TimeAxis(spans or [(0.0, 1.0)], L, W - L - R, gap=26.0)
    cid = new_id()
    defs = hatch_pattern(f"{cid}-hatch") + hatch_pattern(
        f"{cid}-startup", size=5.0, fill=COLORS["startup"], stroke="#90a4ae", angle=-45
    )
    defs += hatch_pattern(f"{cid}-lost", size=5.0, fill="#ffcdd2", stroke=COLORS["lost"])
    out = [svg_open(W, H, "attempts timeline"), el("defs", defs)]
    for left, right, secs in axis.gaps() if spans else []:
        tip = el("title", f"{esc(fmt_duration(secs))} with nothing running (queue wait, requeue)")
        out.append(el("rect", tip, x=left, y=T, width=right - left, height=bottom - T, fill=f"url(#{cid}-hatch)"))
    for i, r in enumerate(rows):
        top = T + RH * i
        if i % 2:
            out.append(el("rect", x=0.0, y=top, width=W, height=RH, fill="#fafbfc"))
        color = COLORS.get(r.outcome, COLORS["unknown"])
        out.append(svg_text(8, top + 16, esc(r.label, 22), size=12, color=COLORS["text"], font_weight=600))
        out.append(svg_text(8, top + 31, esc(r.outcome), color=color))
        a = r.process_start if r.process_start is not None else r.first_step
        if a is None:
            out.append(svg_text(L, top + 16, f"no time recorded · {esc(r.text, 160)}", size=11))
            continue
        first = r.first_step if r.first_step is not None else a
        end = max(x for x in (r.end, first) if x is not None)
        xa, xf, xe = axis.x(a), axis.x(first), axis.x(end)
        bar_y, bar_h = top + 5, 14.0
        if xf > xa:
            tip = el("title", f"start-up {esc(fmt_duration(first - a))}")
            out.append(el("rect", tip, x=xa, y=bar_y, width=xf - xa, height=bar_h, fill=f"url(#{cid}-startup)"))
        tip = el("title", esc(r.title, 600))
        out.append(el("rect", tip, x=xf, y=bar_y, width=max(xe - xf, 2.0), height=bar_h, fill=color, rx=2))
        if r.lost_s:
            xl = axis.x(end - r.lost_s)
            lost = esc(fmt_duration(r.lost_s))
            tip = el("title", f"{lost} of progress redone by the next attempt (after its last committed checkpoint)")
            out.append(
                el(
                    "rect",
                    tip,
                    x=min(xl, xe - 2),
                    y=bar_y,
                    width=max(xe - xl, 2.0),
                    height=bar_h,
                    fill=f"url(#{cid}-lost)",
                )
            )
        for t, title in list(r.checkpoints)[-60:]:
            d = diamond_d(axis.x(t), bar_y + 2)
            out.append(el("path", el("title", esc(title)), d=d, fill=COLORS["ckpt"], stroke="#fff", stroke_width=0.8))
        right = xa > L + 0.55 * (W - L - R)  # anchored at the bar's end, else at its start
        room = int(((xe - L) if right else (W - R - xa)) / 6.0)  # characters of 10.5 px text that fit
        raw = r.text if len(r.text) <= room else r.text[: max(room - 1, 12)] + "…"  # the table has it whole
        anchor = "end" if right else None
        out.append(svg_text(xe if right else xa, top + 32, esc(raw, 400), color=COLORS["text"], text_anchor=anchor))
    if spans:
        out.append(axis_line(axis, bottom))
    out.append("</svg>")
    return "".join(out)
