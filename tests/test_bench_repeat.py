"""benchmarks/_rounds.py: the round / median / spread / load-mark logic every benchmark's ``--repeat`` uses,
and how benchmarks/run.py turns rounds into rows (median measured, min-max spread, marked rounds). Pure logic,
no timing: a fake load average and fixed figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _rounds  # noqa: E402


def load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve their string annotations through it
    spec.loader.exec_module(mod)
    return mod


def load_run():
    return load("bench_repeat_run", "run.py")


def test_summary_is_median_and_min_max_of_the_rounds_that_measured_it():
    s = _rounds.summarize([0.9, 0.4, 0.8, None])
    assert s == {"median": 0.8, "min": 0.4, "max": 0.9, "values": [0.9, 0.4, 0.8, None], "rounds": 3}
    assert _rounds.summarize([1.0, 3.0])["median"] == 2.0  # even count: the middle two's mean
    assert _rounds.summarize([None, float("nan")]) is None
    assert _rounds.summarize([True]) is None  # a bool is no figure


def test_a_round_is_marked_when_the_load_moved_by_more_than_one_core():
    assert _rounds.LOAD_CHANGE_CORES == 1.0
    assert not _rounds.load_changed(1.0, 2.0) and _rounds.load_changed(1.0, 2.01) and _rounds.load_changed(3.5, 2.4)
    loads = iter([0.5, 0.7, 0.7, 2.9, 2.9, 2.0])  # before/after of three rounds: the second jumps by 2.2 cores

    rounds = _rounds.run_rounds(3, lambda i: {"ratio": 0.5 + i / 10}, load=lambda: next(loads))
    rep = _rounds.report(rounds)
    assert rep["repeat"] == 3 and rep["load_changed_rounds"] == [2]
    assert [r["load_1min"] for r in rep["rounds"]] == [[0.5, 0.7], [0.7, 2.9], [2.9, 2.0]]
    assert [r["round"] for r in rep["rounds"]] == [1, 2, 3]
    assert rep["spread"]["ratio"]["median"] == 0.7 and rep["spread"]["ratio"]["min"] == 0.6


def test_ratio_median_is_of_per_round_ratios_not_a_ratio_of_medians():
    # hpctrain and its ceiling both slow down in round 2 (load): per round the ratio is steady at 0.8
    times = [{"hp": 1.0, "ceil": 0.8}, {"hp": 3.0, "ceil": 2.4}, {"hp": 1.1, "ceil": 0.88}]
    rounds = _rounds.run_rounds(3, lambda i: {"ratio": times[i - 1]["ceil"] / times[i - 1]["hp"]}, load=lambda: 0.0)
    s = _rounds.report(rounds)["spread"]["ratio"]
    assert abs(s["min"] - 0.8) < 1e-12 and abs(s["max"] - 0.8) < 1e-12


def test_flatten_and_medians_keep_the_result_shape():
    a = {"disk": {"save_vs_raw": 0.4, "dir": "bench_out", "ok": True}, "n": 1}
    b = {"disk": {"save_vs_raw": 0.8, "dir": "bench_out", "ok": True}, "n": 3}
    c = {"disk": {"save_vs_raw": 0.7, "dir": "bench_out", "ok": True}, "n": 2}
    assert _rounds.flatten(a) == {"disk.save_vs_raw": 0.4, "n": 1}
    assert _rounds.medians([a, b, c]) == {"disk": {"save_vs_raw": 0.7, "dir": "bench_out", "ok": True}, "n": 2}
    assert _rounds.fmt_spread(_rounds.summarize([0.4, 0.8])) == "0.4–0.8"
    assert _rounds.fmt_spread(_rounds.summarize([0.4])) == "0.4 (1 round)" and _rounds.fmt_spread(None) == "—"


def test_run_rows_use_the_median_and_carry_the_spread_and_marked_rounds():
    run = load_run()
    loads = iter([0.1, 0.2, 0.2, 1.9, 1.9, 1.8])
    per = [{"disk.save_vs_raw": v, "disk.save_vs_dcp": 5.0} for v in (0.9, 0.3, 0.85)]
    rounds = _rounds.report(_rounds.run_rounds(3, lambda i: per[i - 1], load=lambda: next(loads)))
    rec = {"status": "ok", "error": None, "result": {"disk": {"save_vs_raw": 0.85}}, **rounds}
    bench = [b for b in run.BENCHMARKS if b.name == "checkpoint"]
    by = {r["metric"]: r for r in run.make_rows(bench, {"checkpoint": rec})}
    row = by["disk.save_vs_raw"]
    assert row["measured"] == 0.85 and row["met"] is True  # the median meets >= 0.8; round 2 alone would not
    assert row["spread"]["min"] == 0.3 and row["spread"]["max"] == 0.9 and row["spread"]["rounds"] == 3
    assert row["spread"]["load_changed_rounds"] == [2]
    assert by["disk.save_vs_torch_save"]["spread"] is None and by["disk.save_vs_torch_save"]["status"] == "not measured"
    assert run.fmt_spread(row["spread"], "x") == "0.3–0.9" and run.fmt_rounds(row["spread"]) == "3 (1 marked: 2)"
    assert run.fmt_rounds(None) == "1"


def test_bench_tiers_ratios_are_taken_within_each_round():
    tiers = load("bench_repeat_tiers", "bench_tiers.py")
    t = {"global_save_s": 2.0, "local_save_s": 1.0, "local_async_block_s": 0.2}
    t |= {"restore_global_s": 2.0, "restore_local_s": 0.5, "restore_partner_s": 1.0}
    slow = {k: v * 3 for k, v in t.items()}  # everything 3x slower under load: the same ratios
    out = tiers.basic_rounds(
        [t | {"load_before": 0.1, "load_after": 0.2}, slow | {"load_before": 0.2, "load_after": 3}]
    )
    assert out["local_save_vs_global"] == 2.0 and out["restore_local_vs_global"] == 4.0
    assert out["spread"]["local_save_vs_global"]["min"] == out["spread"]["local_save_vs_global"]["max"] == 2.0
    assert out["global_save_s"] == 4.0 and out["load_changed_rounds"] == [2] and out["repeat"] == 2
