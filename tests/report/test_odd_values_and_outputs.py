"""``report``: huge and non-finite values never reach the SVG or the page as ``nan``/``inf``; ``-o`` through a
symlink, a FIFO, ``/dev/null``, ``/dev/full`` and ``/dev/stdout`` writes through and replaces nothing."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hpctrain.charts.range_bars import range_bars
from hpctrain.charts.time_chart import TimeChart
from hpctrain.report.cli import main
from tests.report.synth import PARTS, T0, interval, make_run

ROOT = Path(__file__).resolve().parents[2]
ODD = (1e308, float("inf"), float("nan"), -0.0, -1e308, 1.7e308)
_NUMBER = re.compile(r"(?<![\w#.])[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|\.\d+)(?![\w.])", re.I)
_WORD = re.compile(r"\b(nan|inf|infinity)\b", re.I)
_NOT_NUMERIC = {"id", "class", "fill", "stroke", "font-family", "aria-label", "lang", "charset", "name", "content"}


class _Svg(HTMLParser):
    """Every attribute of every element inside an ``<svg>``, and the text of the charts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.attrs, self.text = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "svg":
            self.depth += 1
        if self.depth:
            self.attrs += [(tag, k, v or "") for k, v in attrs]

    def handle_endtag(self, tag):
        if tag == "svg":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def _bad_attributes(page: str):
    parser = _Svg()
    parser.feed(page)
    bad = []
    for tag, key, value in parser.attrs:
        if _WORD.search(value) and key != "aria-label":
            bad.append((tag, key, value[:80]))
        if key in _NOT_NUMERIC or value.startswith(("url(", "#")):
            continue
        for token in _NUMBER.findall(value):
            if not (math.isfinite(float(token)) and abs(float(token)) <= 1e6):
                bad.append((tag, key, value[:80]))
    return bad, parser


def _odd_run(root: Path) -> None:
    """The synthetic run, and after it intervals whose every number is one of :data:`ODD` (the last one too:
    the per-rank bars draw the last interval)."""
    make_run(root)
    path = root / "train" / "metrics.jsonl"
    lines = path.read_text().split("\n")
    extra = []
    for i, v in enumerate(ODD):
        r = interval(400 + 10 * i, T0 + 500.0 + 5 * i, restart=1, loss=v)
        for key in ("samples_per_s", "mfu", "flops_per_s", "data_wait_frac"):
            r[key] = v
        r["per_step"] = {k: {"min": v, "median": v, "max": v, "max_rank": 0} for k in PARTS}
        r["samples_per_s_per_rank"] = {"min": v, "median": v, "max": v, "max_rank": 0}
        extra.append(json.dumps(r))  # NaN and Infinity as Python's json writes them
    path.write_text("\n".join(lines[:-1] + extra) + "\n")


def test_huge_and_non_finite_values_never_reach_svg_attributes_or_chart_text(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "r.html"
    _odd_run(run)
    assert main([str(run), "-o", str(out)]) == 0
    page = out.read_text()
    bad, parser = _bad_attributes(page)
    assert bad == []
    chart_text = " ".join(parser.text)
    assert not _WORD.search(chart_text), _WORD.search(chart_text)
    assert "left out: a value not finite or beyond ±1e+30" in chart_text
    assert "left out: not finite or beyond ±1e+30 ms" in chart_text  # the per-rank bars of the last interval
    # outside the notes (which quote the damaged records), the page shows no nan or inf either
    # (Python prints a non-finite float as nan, inf or -inf; the prose "NaN or infinite" is not one)
    body = re.sub(r'<section id="notes".*?</section>', "", page, flags=re.S)
    assert not re.search(r">[^<]*\b(nan|inf)\b[^<]*<", body), re.search(r">[^<]*\b(nan|inf)\b[^<]*<", body)


def test_the_chart_pieces_clamp_and_count_what_they_cannot_draw():
    chart = TimeChart([(0.0, 10.0)], label="x", clip=True)
    chart.line("a", "#000", [(1.0, 1.0), (2.0, float("inf")), (3.0, 1e300), (4.0, 2.0), (float("nan"), 1.0)])
    chart.band("b", "#000", [(1.0, 0.5, 1.5), (2.0, 0.5, float("nan"))])
    chart.stack([("s", "#000", [(1.0, 1.0), (2.0, 1e308), (3.0, 1.0)])])
    chart.markers("m", "#000", [(1.0, 1.0, "ok"), (5.0, 1e308, "huge"), (6.0, None, "null: at the top")])
    svg = chart.svg()
    assert chart.left_out == 4  # the times 2, 3 and 5, and the point without a usable time
    assert _bad_attributes(svg)[0] == [] and "4 point(s) left out" in svg and "huge" not in svg
    bars = range_bars([("step", {"min": 1e308, "median": 1e308, "max": 1e308, "max_rank": 0})])
    assert _bad_attributes(bars)[0] == [] and "left out" in bars


# ---- -o: what a shell redirection would do, never a replaced device or link ---------------------------------
@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    make_run(root)
    return root


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_o_a_symlink_to_dev_null_writes_through_and_keeps_link_and_device(run, tmp_path):
    link = tmp_path / "null.html"
    link.symlink_to("/dev/null")
    res = _cli(run, "-o", link)
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_o_a_symlink_to_dev_full_is_one_enospc_line_and_keeps_link_and_device(run, tmp_path):
    link = tmp_path / "full.html"
    link.symlink_to("/dev/full")
    res = _cli(run, "-o", link)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"hpctrain report: error: cannot write {link}: No space left on device\n"
    assert link.is_symlink() and os.readlink(link) == "/dev/full"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.html", "run"]


def test_o_a_fifo_is_written_through_and_stays_a_fifo(run, tmp_path):
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    got = []

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    res = _cli(run, "-o", fifo)
    reader.join(30)
    assert res.returncode == 0, res.stderr
    assert got and got[0].startswith(b"<!DOCTYPE html>") and got[0].rstrip().endswith(b"</html>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_o_dev_stdout_puts_the_page_on_stdout_and_the_summary_on_stderr(run):
    res = _cli(run, "-o", "/dev/stdout")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("<!DOCTYPE html>") and res.stdout.rstrip().endswith("</html>")
    assert res.stderr.startswith("report /dev/stdout (")


def test_o_a_symlink_to_a_file_replaces_the_target_not_the_link(run, tmp_path):
    target = tmp_path / "kept" / "report.html"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    res = _cli(run, "-o", link)  # an existing output: refused without --force, the target untouched
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "pass --force" in res.stderr
    assert target.read_text() == "old"
    res = _cli(run, "-o", link, "--force")
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html"]


def test_o_under_a_file_is_one_line_naming_the_file(run, tmp_path):
    (tmp_path / "file").write_text("")
    res = _cli(run, "-o", tmp_path / "file" / "x.html")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        f"hpctrain report: error: cannot write {tmp_path / 'file' / 'x.html'}: {tmp_path / 'file'} is not a "
        "directory; choose another path\n"
    )
