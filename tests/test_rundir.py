"""hpctrain.rundir: the one spelling of a run directory's paths, of an attempt's label, and its bounded readers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.rundir import (
    RunDir,
    append_jsonl_atomic,
    attempt_label,
    dumps_record,
    parse_label,
    read_json,
    read_jsonl,
)


def test_paths_are_under_the_root_and_touch_nothing(tmp_path):
    run = RunDir(tmp_path / "run")
    assert not run.root.exists()  # building it creates nothing
    assert os.fspath(run) == str(tmp_path / "run") and repr(run) == f"RunDir({str(tmp_path / 'run')!r})"
    assert run.submission == run.root / "submission.json"
    assert run.sbatch_script == run.root / "sbatch.sh"
    assert run.previous_submission(0) == run.root / "submissions" / "0.json"
    assert run.log_file("42") == run.root / "logs" / "42_0_log.out"
    assert run.log_file("42", rank=3, stream="err") == run.root / "logs" / "42_3_log.err"
    assert run.ledger == run.root / "train" / "ledger.jsonl" and run.metrics == run.root / "train" / "metrics.jsonl"
    assert run.checkpoints == run.root / "checkpoints" and run.approvals == run.root / "approvals.jsonl"
    assert run.identity_submit == run.root / "identity" / "submit.json"
    assert not run.root.exists()


def test_every_attempt_path_lies_in_the_folder_named_by_its_label(tmp_path):
    run = RunDir(tmp_path)
    attempt = run.attempt_dir("42", 1)
    assert attempt == run.ranks / "42-r1" and run.attempt_dir("", 0) == run.ranks / "local-r0"
    for path in (
        run.rank_record("42", 1, 0),
        run.rank_end("42", 1, 0),
        run.attempt_exit("42", 1),
        run.heartbeat("42", 1, 2),
        run.stack_dump("42", 1, 2),
        run.stack_dump("42", 1, 2, tool="py-spy"),
        run.hang_report("42", 1),
    ):
        assert path.parent == attempt
    assert run.stack_dump("42", 1, 2, tool="py-spy").name == "stacks-rank-2.py-spy.txt"
    assert run.identity_attempt("42", 1) == run.identity / "42-r1.json"


def test_attempt_numbers_are_the_restart_counts_on_disk_ascending(tmp_path):
    run = RunDir(tmp_path)
    assert run.attempt_numbers("42") == []  # no ranks folder yet: not an error
    for label in ("42-r2", "42-r0", "42-r10", "420-r1", "42-r?", "7-r0"):
        (run.ranks / label).mkdir(parents=True)
    assert run.attempt_numbers("42") == [0, 2, 10]


@pytest.mark.parametrize(
    "job, restart, label",
    [("42", 0, "42-r0"), ("42_3", 12, "42_3-r12"), (None, 0, "local-r0"), ("", 1, "local-r1"), ("42", None, "42-r?")],
)
def test_attempt_label_and_parse_label_round_trip(job, restart, label):
    assert attempt_label(job, restart) == label
    assert parse_label(label) == (job or "", restart)


@pytest.mark.parametrize("text", ["", "42", "42-r", "-r1", "42-rx", "42-r-1", "42-r1 ", "r1", None, 42])
def test_parse_label_refuses_what_is_not_a_label(text):
    assert parse_label(text) is None


def test_read_json_missing_is_none_without_a_problem(tmp_path):
    problems: list = []
    assert read_json(tmp_path / "absent.json", problems) is None and problems == []


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    ],
)
def test_read_json_names_what_is_wrong_in_one_problem(tmp_path, raw, why):
    path = tmp_path / "r.json"
    path.write_bytes(raw)
    problems: list = []
    assert read_json(path, problems) is None
    assert len(problems) == 1 and problems[0].startswith("r.json: ") and why in problems[0], problems


def test_read_json_refuses_a_file_over_its_limit_and_what_is_not_a_regular_file(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 100}))
    problems: list = []
    assert read_json(path, problems, limit=1 << 20) == {"pad": "x" * 100}
    assert read_json(path, problems, limit=50) is None and len(problems) == 1
    (tmp_path / "dir.json").mkdir()
    assert read_json(tmp_path / "dir.json", problems) is None and len(problems) == 2


def test_dumps_record_writes_strict_json():
    line = dumps_record({"b": float("nan"), "a": float("inf"), "p": Path("/x"), "t": (1, 2)})
    assert json.loads(line) == {"a": None, "b": None, "p": "/x", "t": [1, 2]}
    assert "\n" not in line and line.index('"a"') < line.index('"b"')  # one line, keys sorted


def test_append_jsonl_then_read_jsonl_and_its_problems(tmp_path):
    path = tmp_path / "train" / "ledger.jsonl"
    assert read_jsonl(path) == ([], [])
    append_jsonl_atomic(path, {"step": 1}, schema="s/1")
    append_jsonl_atomic(path, {"step": 2}, schema="s/1")
    records, problems = read_jsonl(path)
    assert records == [{"schema": "s/1", "step": 1}, {"schema": "s/1", "step": 2}] and problems == []
    with open(path, "a") as f:
        f.write('[1]\n{"step": 3')  # a non-object line, then a torn last line
    records, problems = read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2] and len(problems) == 2
    assert "not an object" in problems[0] and "unfinished last line" in problems[1]
