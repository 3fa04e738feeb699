"""``python -m hpctrain report``: the page on a synthetic run with a restart, a non-finite loss, damaged
records and hostile strings; empty, missing and damaged run directories; no torch on the login path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.report.cli import main
from hpctrain.report.page import SECTIONS
from hpctrain.rundir import RunDir
from tests.report.pagecheck import parse, self_contained_problems
from tests.report.synth import HOSTILE_EVENT, HOSTILE_HOST, HOSTILE_REASON, make_run

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd or ROOT,
    )


@pytest.fixture
def synthetic(tmp_path):
    run = tmp_path / "run"
    expected = make_run(run)
    return run, expected


def test_synthetic_run_has_every_section_the_restart_gap_and_the_non_finite_loss(synthetic, capsys):
    run, _ = synthetic
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"report {RunDir(run).report} (") and "2 attempt(s)" in out
    page = RunDir(run).report.read_text()
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in page
    assert page.count("<svg") >= 8  # loss, samples/s, MFU, breakdown, per-rank x2, last interval, timeline
    # the restart is a gap on the time axis of every time chart, labelled with the time between the attempts
    gaps = re.findall(r"restart · ([^<]+)</text>", page)
    assert len(gaps) >= 6 and set(gaps) == {"4 min 59 s"}
    # the NaN loss (null) and the literal NaN token: marked, never drawn as a number; the line breaks
    assert "non-finite loss" in page and "2 interval(s) recorded a non-finite loss" in page
    assert "NaN" not in re.sub(r"<p class=\"caption\">.*?</p>|<li>.*?</li>", "", page, flags=re.S)
    # the attempts, how each ended, the lost progress and the time down, from the ledger
    assert "#1 77-r0" in page and "#2 77-r1" in page
    assert "node_failure; requeued" in page and ">failed<" in page and ">completed<" in page
    assert "10.0 s of progress redone by the next attempt" in page
    assert "5 min 00 s" in page  # the second start's down_s
    # damaged lines and fields are notes, the rest is drawn
    assert "unfinished last line" in page and "field &#x27;time&#x27; is &#x27;x&#x27;" in page
    assert "not JSON" in page and "see Notes" in page
    assert self_contained_problems(page) == []


def test_hostile_recorded_strings_appear_escaped_never_as_markup(synthetic):
    run, _ = synthetic
    assert main([str(run), "-o", str(run / "r.html")]) == 0
    page = (run / "r.html").read_text()
    problems, tags = parse(page)
    assert problems == [] and "script" not in tags and "b" not in tags
    assert "<img src=x" not in page and tags.get("img", 0) == page.count('<img alt="capacity plot" src="data:image/')
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt; node lost" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;b&gt;odd&lt;/b&gt;" in page  # an unknown ledger event, in the ledger table
    for raw in (HOSTILE_REASON, HOSTILE_HOST, HOSTILE_EVENT):
        assert raw not in page


def test_control_characters_surrogates_and_huge_strings_do_not_break_the_page(tmp_path):
    run = tmp_path / "run"
    make_run(run)
    ledger = RunDir(run).ledger
    bad = {
        "event": "exit",
        "time": 1_790_000_999.0,
        "cause": "user_error",
        "reason": "\x1b[31mred\ud800" + "y" * 100_000,
    }
    ledger.write_text(ledger.read_text() + json.dumps(bad) + "\n")
    assert main([str(run)]) == 0
    page = RunDir(run).report.read_bytes().decode("utf-8")  # valid UTF-8: the surrogate was replaced
    assert "\\x1b[31mred\ufffd" in page and "\x1b" not in page
    assert re.search(r"y… \(1000\d\d characters\)", page) and len(page) < 400_000  # cut, saying so


def test_empty_or_missing_run_dir_is_exit_2_with_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing", Path(__file__)):
        res = _cli(path)
        assert res.returncode == 2, res
        assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1
        assert res.stderr.startswith("hpctrain report: error: RUN_DIR ")
    assert not (tmp_path / "empty" / "report.html").exists()


def test_output_in_a_missing_directory_is_exit_2(synthetic):
    run, _ = synthetic
    res = _cli(run, "-o", run / "no" / "such" / "r.html")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "does not exist" in res.stderr


@pytest.mark.parametrize("damage", ["train-is-a-file", "fifo-metrics", "garbage-ledger", "submission-only"])
def test_damaged_run_dirs_give_a_report_with_notes_not_a_traceback(tmp_path, damage):
    run = tmp_path / "run"
    if damage == "submission-only":
        run.mkdir()
        (run / "submission.json").write_text(json.dumps({"job_id": "5", "cluster": "local", "state": "submitted"}))
    else:
        make_run(run)
    paths = RunDir(run)
    if damage == "train-is-a-file":
        for p in (paths.ledger, paths.metrics):
            p.unlink()
        paths.train.rmdir()
        paths.train.write_text("not a directory")
        (run / "submission.json").write_text("{}")
    elif damage == "fifo-metrics":
        paths.metrics.unlink()
        os.mkfifo(paths.metrics)
    elif damage == "garbage-ledger":
        paths.ledger.write_bytes(b"\x00\xff{{{\n[1,2]\n" + b'{"event": "start", "time": "soon", "hosts": 7}\n')
    res = _cli(run)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    page = paths.report.read_text()
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in page
    assert self_contained_problems(page) == []
    if damage != "submission-only":
        assert '<section id="notes"><h2>Notes</h2><p class="caption">Records that could not' in page
    if damage in ("train-is-a-file", "submission-only"):
        assert "No interval or eval records with a time" in page


def test_the_login_path_never_imports_torch(synthetic):
    run, _ = synthetic
    code = (
        "import sys; from hpctrain.__main__ import main; rc = main(['report', sys.argv[1]]); "
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)"
    )
    res = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.stdout.strip().splitlines()[-1] == "NO-TORCH 0", res.stderr


def test_capacity_section_says_why_there_is_no_plot(synthetic):
    run, _ = synthetic
    assert main([str(run)]) == 0
    page = RunDir(run).report.read_text()
    section = page[page.index('<section id="capacity">') :]
    section = section[: section.index("</section>")]
    assert "capacity" in section.lower() and (
        '<img alt="capacity plot" src="data:image/' in section or "No capacity" in section
    )


def test_failures_and_in_job_recoveries_are_worded_as_status_words_them(synthetic):
    """The page's 'Failures and recoveries' table: a rank a warm spare replaced in the job and a fallback, each in
    status's wording (one owner: status.nodes), recorded text escaped."""
    run, _ = synthetic
    ledger = RunDir(run).train / "ledger.jsonl"
    common = {"schema": "hpctrain.train.ledger/1", "job_id": "77", "restart_count": 1}
    extra = [
        {**common, "event": "in_job_recovery", "time": 1_790_000_400.0, "generation": 1, "failed_ranks": [3],
         "agreed_step": 129, "steps_redone": 1, "replaced": [{"rank": 3, "spare": 0}],
         "failure_to_first_step_s": 1.57, "fallback": None},
        {**common, "event": "in_job_recovery", "time": 1_790_000_500.0, "generation": 2, "failed_ranks": [1],
         "replaced": [], "fallback": "no warm spare left for <rank(s)> [1]"},
    ]  # fmt: skip
    with ledger.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in extra)
    assert main([str(run)]) == 0
    page = RunDir(run).report.read_text()
    table = page.split("<h3>Failures and recoveries</h3>", 1)[1].split("</table>", 1)[0]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table, flags=re.S)]
    assert cells[0::2] == ["recovered", "recovery"], cells
    assert any(
        c.startswith("attempt 1, generation 1: rank 3 by spare 0 in the job · continued after step 129, 1 step redone")
        and "first step 1.6s after the failure" in c
        for c in cells
    ), cells
    assert any("fell back: no warm spare left for &lt;rank(s)&gt; [1]" in c for c in cells), cells
    assert self_contained_problems(page) == []


def test_a_run_without_failures_has_no_failures_table(synthetic):
    run, _ = synthetic  # its requeue names no failed node: nothing to list
    assert main([str(run)]) == 0
    assert "Failures and recoveries" not in RunDir(run).report.read_text()
