"""The one chart engine (:mod:`hpctrain.charts`): the x/y chart's log axis, values it cannot draw, escaped
text, the same bytes for the same input; the ratio bars."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from hpctrain.charts.bars import Bar, ratio_bars
from hpctrain.charts.xy import XYChart, side_by_side

NS = "{http://www.w3.org/2000/svg}"


def _chart(name: str = "series") -> XYChart:
    c = XYChart(title="t", xlabel="nodes", ylabel="hours", xlog=True, ylog=True)
    c.line(name, "#111", [(1, 10.0), (10, 5.0), (100, 2.0)])
    c.stars("measured", "#222", [(2, 8.0), (1000, 1.0)])
    return c


def test_a_larger_value_on_a_log_axis_is_further_right():
    root = ET.fromstring(_chart().svg(standalone=True))
    stars = [e for e in root.iter(f"{NS}path") if (e.findtext(f"{NS}title") or "").startswith("measured")]
    xs = [float(re.match(r"M([-\d.]+),", e.get("d")).group(1)) for e in stars]
    assert len(xs) == 2 and xs[1] > xs[0]
    circles = sorted((float(e.get("cx")), e.findtext(f"{NS}title")) for e in root.iter(f"{NS}circle"))
    assert [t.split(": ")[1].split(",")[0] for _, t in circles] == ["1", "10", "100"]


def test_values_a_log_axis_cannot_draw_are_left_out_with_a_note():
    c = XYChart(title="t", xlog=True, ylog=True)
    c.line("l", "#111", [(1, 1.0), (0, 2.0), (-3, 2.0), (4, float("nan")), (8, float("inf")), (16, 1e308), (32, 0.0)])
    svg = c.svg(standalone=True)
    root = ET.fromstring(svg)
    notes = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "left-out"]
    assert notes == ["6 point(s) left out: not finite, beyond ±1e+30, or not positive on a log axis"]
    assert not re.search(r"\b(nan|inf)\b", svg, re.I)
    empty = XYChart(title="nothing", xlog=True)
    empty.line("l", "#111", [(0, 1.0)])
    assert "no data" in empty.svg() and "1 point(s) left out" in empty.svg()


def test_recorded_text_is_escaped():
    svg = side_by_side([_chart("<script>alert(1)</script>")], label='a "label" & <b>', standalone=True)
    assert "<script>" not in svg and "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
    ET.fromstring(svg)  # still well-formed XML
    bars = ratio_bars([Bar("<img src=x>", 2.0, "#0a0", text="<i>"), Bar("f", None, "#999", note="&<")], title="<t>")
    assert "<img" not in bars and "<i>" not in bars and "&amp;&lt;" in bars
    ET.fromstring(bars)


def test_the_same_input_gives_the_same_bytes():
    assert _chart().svg(standalone=True) == _chart().svg(standalone=True)
    assert side_by_side([_chart(), _chart()], label="x") == side_by_side([_chart(), _chart()], label="x")


def test_ratio_bars_reach_further_for_a_larger_ratio_and_leave_out_a_bad_one():
    svg = ratio_bars([Bar("a", 0.5, "#111"), Bar("b", 2.0, "#111"), Bar("c", float("nan"), "#111")], title="t")
    root = ET.fromstring(svg)
    widths = [float(r.get("width")) for r in root.iter(f"{NS}rect") if r.find(f"{NS}title") is not None]
    assert len(widths) == 2 and widths[1] > widths[0]
    assert "left out: not a finite ratio &gt; 0" in svg or "left out: not a finite ratio > 0" in svg
