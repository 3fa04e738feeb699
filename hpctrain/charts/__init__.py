"""Inline SVG charts drawn from numbers: the one chart engine of hpctrain (stdlib only, never torch).

The run report's charts, the capacity plot and the benchmarks' picture are all drawn here, by hand, as
SVG strings: nothing to install on a login node, the same input gives the same bytes, and a page that
inlines them stays self-contained under the report's Content-Security-Policy (no script, no font, no
fetch). Text that came from a run directory goes through :func:`hpctrain._human.esc`; a value a chart
cannot draw (not finite, beyond :data:`~hpctrain.charts.elements.PLOTTABLE`, not positive on a log axis)
is left out with a note in the chart, never a crash and never ``nan`` in an attribute.

The modules, by what they draw:

* :mod:`hpctrain.charts.elements`: the palette (:data:`~hpctrain.charts.elements.COLORS`), coordinates,
  elements, patterns, legend swatches;
* :mod:`hpctrain.charts.axes`: the broken time axis (:class:`~hpctrain.charts.axes.TimeAxis`), ticks;
* :mod:`hpctrain.charts.time_chart`: :class:`~hpctrain.charts.time_chart.TimeChart`, curves over wall time;
* :mod:`hpctrain.charts.timeline`: the attempts :func:`~hpctrain.charts.timeline.timeline`;
* :mod:`hpctrain.charts.range_bars`: the per-rank :func:`~hpctrain.charts.range_bars.range_bars`;
* :mod:`hpctrain.charts.xy`: :class:`~hpctrain.charts.xy.XYChart`, x against y on log or linear axes,
  and :func:`~hpctrain.charts.xy.side_by_side` (several panels in one SVG);
* :mod:`hpctrain.charts.bars`: :func:`~hpctrain.charts.bars.ratio_bars`, one bar per row on a log ratio axis.
"""
