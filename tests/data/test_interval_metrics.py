"""LoaderMetrics.interval: what the loader did since the previous call (the interval records' ``input``)."""

from __future__ import annotations

import pytest

from hpctrain.data.metrics import LoaderMetrics, StepMetrics


def test_interval_is_the_difference_since_the_previous_call():
    m = LoaderMetrics()
    m.record(StepMetrics(0, 0.25, 1, 8, 800))
    m.add_read(1600, 0.5)
    first = m.interval(readers=2)
    assert first == {
        "steps": 1,
        "samples": 8,
        "bytes": 800,
        "bytes_read": 1600,
        "read_s": pytest.approx(0.5),
        "wait_s": pytest.approx(0.25),
        "readers": 2,
    }
    m.record(StepMetrics(1, 0.0, 2, 8, 800))
    m.record(StepMetrics(2, 0.1, 2, 8, 800))
    m.add_read(800, 0.2)
    second = m.interval(readers=2)
    assert (second["steps"], second["samples"], second["bytes"], second["bytes_read"]) == (2, 16, 1600, 800)
    assert second["read_s"] == pytest.approx(0.2) and second["wait_s"] == pytest.approx(0.1)
    assert m.interval()["steps"] == 0  # nothing since


def test_reset_starts_the_intervals_again():
    m = LoaderMetrics()
    m.record(StepMetrics(0, 0.0, 1, 4, 40))
    m.interval()
    m.reset()
    m.record(StepMetrics(0, 0.0, 1, 4, 40))
    assert m.interval()["samples"] == 4
