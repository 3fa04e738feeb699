"""``status`` on damaged run directories (issue 17 §2): one regression test per way it used to hang or print a
traceback. Every call goes through :func:`tests.status.rundirs.status`: bounded in time (a FIFO fails the test
instead of hanging it), exit 0 or one UsageError line, no traceback, ``--json`` is standard JSON. Each test
also checks that the intact parts are still shown and that the damage is one warning naming the file, the
record and the field."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

from hpctrain._procs import pid_alive
from hpctrain.status.report import MAX_PROBLEMS, TIME, collect, sanitize, to_json
from tests.status.rundirs import (
    CKPT_STEP,
    LAST_STEP,
    LEDGER,
    MANIFEST,
    METRICS,
    N_RECORDS,
    SUBMISSION,
    build,
    fake_slurm,
    status,
)


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # no wrapped lines in the text checks


@pytest.fixture
def run(tmp_path):
    return build(tmp_path / "run")


def both(capsys, run):
    """(text output, --json report) of ``run``."""
    text = status(capsys, run)
    assert text.code == 0, text.err
    js = status(capsys, run, "--json")
    return text.out, js.report


def edit_lines(path: Path, index: int, change) -> None:
    """Apply ``change`` to the JSON record on line ``index`` of a JSONL file (or, for a .json file, to it)."""
    if path.suffix == ".json":
        rec = json.loads(path.read_text())
        change(rec)
        path.write_text(json.dumps(rec))
        return
    lines = path.read_text().splitlines()
    rec = json.loads(lines[index])
    change(rec)
    lines[index] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def set_raw(path: Path, index: int, key: str, raw: str) -> None:
    """Set ``key`` of record ``index`` to the raw JSON text ``raw`` (NaN, 1e400, a 400-digit integer ...)."""
    marker = "\x01raw\x01"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[index])
    rec[key] = marker
    lines[index] = json.dumps(rec).replace(json.dumps(marker), raw)
    path.write_text("\n".join(lines) + "\n")


def intact_metrics(out, report):
    assert f"interval to step {LAST_STEP}" in out and "exposed comm" in out
    assert report["last_interval"]["step"] == LAST_STEP and report["last_eval"]["step"] == LAST_STEP


def intact_ledger(out, report):
    assert "starts     2 (1 restart)" in out and "last exit  attempt 1: finished" in out
    assert report["starts"] == 2 and len(report["ledger"]) == N_RECORDS


def intact_checkpoint(out, report):
    assert f"checkpoint step {CKPT_STEP} committed" in out and report["checkpoint"]["step"] == CKPT_STEP


def intact_job(out, report):
    assert "COMPLETED" in out and "from sacct" in out
    assert report["job"]["state"] == "COMPLETED" and report["job"]["source"] == "sacct"


def warned(report, *words):
    hits = [p for p in report["problems"] if all(w in p for w in words)]
    assert hits, (words, report["problems"])
    return hits


# ------------------------------------------------------------------------------------------- hangs: FIFOs
@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION])
def test_a_fifo_in_place_of_a_record_is_a_warning_not_a_hang(capsys, run, target):
    (run / target).unlink()
    os.mkfifo(run / target)
    out, report = both(capsys, run)
    warned(report, Path(target).name, "not a regular file")
    if target != METRICS:
        intact_metrics(out, report)
    if target != LEDGER:
        intact_ledger(out, report)
        intact_checkpoint(out, report)
    if target != SUBMISSION:
        intact_job(out, report)  # the ledger's launcher says slurm: sacct is asked with its job id


def test_a_fifo_as_a_checkpoints_manifest_falls_back_to_the_older_step(capsys, run):
    (run / MANIFEST).unlink()
    os.mkfifo(run / MANIFEST)
    out, report = both(capsys, run)
    assert report["checkpoint"]["step"] == 10 and "checkpoint step 10 committed" in out
    intact_metrics(out, report)
    intact_ledger(out, report)


# ------------------------------------------------------------------------------------ special files
@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION])
def test_a_directory_where_a_record_file_should_be(capsys, run, target):
    (run / target).unlink()
    (run / target).mkdir()
    out, report = both(capsys, run)
    warned(report, Path(target).name, "a directory")
    if target != METRICS:
        intact_metrics(out, report)


def test_train_being_a_file_is_one_warning(capsys, run):
    for name in (LEDGER, METRICS):
        (run / name).unlink()
    (run / "train").rmdir()
    (run / "train").write_text("not a directory\n")
    out, report = both(capsys, run)
    assert report["problems"] == ["train/: not a directory; no ledger or metrics read"]
    intact_job(out, report)
    assert report["starts"] == 0 and "no step recorded yet" in out


@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION, "train"])
def test_a_symlink_loop(capsys, run, target):
    path = run / target
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()
    path.symlink_to(path.name)  # itself
    out, report = both(capsys, run)
    warned(report, "Too many levels of symbolic links")
    if target == SUBMISSION:
        intact_ledger(out, report)
        intact_metrics(out, report)


@pytest.mark.parametrize("device", ["/dev/zero", "/proc/self/mem"])
@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION])
def test_a_record_linked_to_a_device_or_proc_file(capsys, run, target, device):
    (run / target).unlink()
    (run / target).symlink_to(device)
    out, report = both(capsys, run)
    warned(report, Path(target).name)
    if target != LEDGER:
        intact_ledger(out, report)


@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION, "train"])
def test_a_symlink_to_nothing_in_place_of_a_record_is_a_warning(capsys, run, target):
    path = run / target
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()
    path.symlink_to("gone")
    out, report = both(capsys, run)
    warned(report, f"{path.name}", "a symbolic link to 'gone', which does not exist")
    if target == SUBMISSION:
        intact_ledger(out, report)


@pytest.mark.parametrize("how", ["file", "fifo", "loop"])
def test_a_checkpoint_dir_that_is_not_a_directory_is_a_warning(capsys, run, how):
    ck = run / "checkpoints"
    for child in ck.iterdir():
        for f in child.iterdir():
            f.unlink()
        child.rmdir()
    ck.rmdir()
    {"file": lambda: ck.write_text("x"), "fifo": lambda: os.mkfifo(ck), "loop": lambda: ck.symlink_to(ck.name)}[how]()
    out, report = both(capsys, run)
    warned(report, f"checkpoint dir {ck}", "not a directory" if how != "loop" else "cannot open it")
    assert report["checkpoint"]["step"] is None and "checkpoint none committed yet" in out
    intact_ledger(out, report)


def test_huge_record_files_are_not_read_whole(capsys, run):
    # sparse files: no disk used, but far over every byte bound (the metrics are read as a 1 MiB tail)
    for name in (SUBMISSION, LEDGER):
        os.truncate(run / name, 2 << 30)
    with open(run / METRICS, "r+b") as f:
        f.seek(2 << 30)
        f.write(b"\n" + (run / METRICS).read_bytes().split(b"\n")[2] + b"\n")
    out, report = both(capsys, run)
    warned(report, "submission.json", "over the")
    warned(report, "ledger.jsonl", "over the")
    assert report["last_interval"]["step"] == LAST_STEP


def test_a_run_dir_that_is_a_symlink_loop_or_a_file_is_a_usage_error(capsys, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    res = status(capsys, loop)
    assert res.code == 2 and "cannot open it" in res.err
    (tmp_path / "file").write_text("x")
    res = status(capsys, tmp_path / "file", "--json")
    assert res.code == 2 and "not a directory" in res.err
    res = status(capsys, tmp_path / ("x" * 5000))
    assert res.code == 2 and "characters)" in res.err  # the name is cut, not 5000 characters of error


# ------------------------------------------------------------------------------------------- nesting
@pytest.mark.parametrize("target", [LEDGER, METRICS, SUBMISSION])
def test_json_nested_1000_deep(capsys, run, target):
    deep = "[" * 1000 + "]" * 1000
    path = run / target
    if target == SUBMISSION:
        path.write_text(deep)
    else:
        path.write_text(path.read_text() + deep + "\n")
    out, report = both(capsys, run)
    warned(report, Path(target).name, "nested too deep")
    if target != SUBMISSION:
        intact_job(out, report)


def test_a_field_nested_900_deep_inside_a_valid_record(capsys, run):
    # parses (under the recursion limit), but json.dumps(indent=2) of it would not: cut at the schema's bound
    path = run / LEDGER
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"config": {', '"config": ' + "[" * 900 + "]" * 900 + ', "x": {', 1)
    path.write_text("\n".join(lines) + "\n")
    out, report = both(capsys, run)
    warned(report, "ledger.jsonl record 1", "field 'config'", "nested deeper than")
    intact_ledger(out, report)
    assert report["ledger"][0]["config"] is None


# ------------------------------------------------------------------------------------------- wrong types
@pytest.mark.parametrize("value", ["x", None])
def test_a_ledger_time_that_is_not_a_number(capsys, run, value):
    edit_lines(run / LEDGER, 2, lambda r: r.update(time=value))
    out, report = both(capsys, run)
    why = "'x', not a Unix time" if value == "x" else "null, not a Unix time"
    warned(report, "ledger.jsonl record 3", f"field 'time' is {why}; shown as unknown")
    intact_ledger(out, report)
    assert report["ledger"][2]["time"] is None and re.search(r"^start +\? ", out, re.M)


def test_a_null_step_in_the_end_record_and_the_last_interval(capsys, run):
    edit_lines(run / LEDGER, 3, lambda r: r.update(step=None))
    edit_lines(run / METRICS, 2, lambda r: r.update(step=None))
    out, report = both(capsys, run)
    warned(report, "ledger.jsonl record 4", "field 'step' is null")
    warned(report, "metrics.jsonl last interval record", "field 'step' is null")
    assert report["progress"]["step"] is None and "step ?/100" in out and "ended: completed" in out


def test_wrong_types_in_otherwise_valid_records(capsys, run):
    edit_lines(run / METRICS, 2, lambda r: r.update(total_steps="100", samples_per_s="fast"))
    edit_lines(run / METRICS, 2, lambda r: r["samples_per_s_per_rank"].update(min="1"))
    edit_lines(run / METRICS, 2, lambda r: r["per_step"]["step_s"].pop("median"))
    edit_lines(run / LEDGER, 2, lambda r: r.update(checkpoint_dir=5, hosts=7))
    out, report = both(capsys, run)
    warned(report, "field 'total_steps' is '100', not an integer >= 0")
    warned(report, "field 'samples_per_s' is 'fast'")
    warned(report, "field 'samples_per_s_per_rank.min' is '1'")
    warned(report, "field 'per_step.step_s.median' is missing")
    warned(report, "ledger.jsonl record 3", "field 'checkpoint_dir' is 5, not a path")
    warned(report, "ledger.jsonl record 3", "field 'hosts' is 7, not a list of strings")
    # the start of restart 0 still names the checkpoint dir; the total comes from the start record
    intact_checkpoint(out, report)
    assert report["progress"]["total_steps"] == 100 and "? samples/s" in out
    assert re.search(r"│ whole step +│ 100.0 ms │ +\? │ 150.0 ms │", out)


def test_an_int_checkpoint_dir_in_every_start_means_no_checkpoint(capsys, run):
    for i in (0, 2):
        edit_lines(run / LEDGER, i, lambda r: r.update(checkpoint_dir=5))
    out, report = both(capsys, run)
    assert report["checkpoint"] is None and "checkpoint none configured" in out


# -------------------------------------------------------------------------------------- non-finite numbers
@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e300", "1e400", "1" + "0" * 400])
def test_non_finite_or_huge_times(capsys, run, raw):
    set_raw(run / LEDGER, 0, "time", raw)
    set_raw(run / METRICS, 2, "time", raw)
    out, report = both(capsys, run)
    warned(report, "ledger.jsonl record 1", "field 'time'", "not a Unix time")
    warned(report, "metrics.jsonl last interval record", "field 'time'")
    assert f"interval to step {LAST_STEP}, ?)" in out
    intact_ledger(out, report)


def test_an_infinite_eta(capsys, run):
    edit_lines(run / LEDGER, 3, lambda r: r.update(event="note"))  # no end: the ETA is shown
    set_raw(run / METRICS, 2, "eta_s", "Infinity")
    out, report = both(capsys, run)
    warned(report, "field 'eta_s' is Infinity, not a finite number >= 0")
    assert report["progress"]["eta_s"] is None and "ETA" not in out


def test_a_huge_integer_time_in_a_manifest_is_a_warning(capsys, run):
    # the checkpoint package's manifest check raises OverflowError on it (math.isfinite of a 400-digit int)
    path = run / MANIFEST
    m = json.loads(path.read_text())
    m["time"] = "\x01"
    path.write_text(json.dumps(m).replace(json.dumps("\x01"), "1" + "0" * 400))
    out, report = both(capsys, run)
    assert report["checkpoint"]["step"] in (None, 10, CKPT_STEP)
    intact_ledger(out, report)
    intact_metrics(out, report)


# ------------------------------------------------------------------------------------------- NaN loss
def test_a_nan_loss_prints_standard_json_and_a_null_loss_shows_as_unknown(capsys, run):
    set_raw(run / METRICS, 2, "loss", "NaN")
    set_raw(run / METRICS, 3, "loss", "null")
    out, report = both(capsys, run)
    assert report["last_interval"]["loss"] is None and report["last_eval"]["loss"] is None
    warned(report, "metrics.jsonl last interval record", "field 'loss' is NaN")
    assert not [p for p in report["problems"] if "last eval" in p]  # null: what the writer writes for NaN
    assert "loss ? (interval to step 30" in out and "eval       loss ? at step 30" in out


def test_to_json_never_writes_nan_tokens():
    text = to_json({"a": float("nan"), "b": [float("inf"), {"c": -float("inf")}], "d": 1.5})
    assert json.loads(text, parse_constant=lambda t: pytest.fail(t)) == {"a": None, "b": [None, {"c": None}], "d": 1.5}


# ------------------------------------------------------------------------------------------- rich markup
def test_rich_markup_and_terminal_controls_in_recorded_text_are_shown_literally(capsys, run):
    edit_lines(run / LEDGER, 1, lambda r: r.update(event="[/]"))
    edit_lines(run / LEDGER, 4, lambda r: r.update(cause="[/]", reason="[bold red]boom\x1b[2J\\"))
    edit_lines(run / SUBMISSION, 0, lambda r: r.update(cluster="local", state="[/]x"))
    edit_lines(run / LEDGER, 3, lambda r: r.update(event="note"))  # no end: the submission's state is shown
    for i in (0, 2):
        edit_lines(run / LEDGER, i, lambda r: r.update(hosts=["[link=file:///etc]", ":warning:"]))
    out, report = both(capsys, run)
    assert re.search(r"^\[/\] +\S", out, re.M) and "last exit  attempt 1: [/] · [bold red]boom\\x1b[2J\\" in out
    assert "\x1b" not in out and ":warning:" in out and "[link=file:///etc]" in out
    assert report["last_exit"]["cause"] == "[/]"


def test_a_slurm_state_with_markup_is_escaped(capsys, run):
    slurm = fake_slurm()
    slurm.final["77"] = "[/]"
    res = status(capsys, run, slurm=slurm)
    assert "(slurm): [/]" in res.out


def test_thousands_of_bad_lines_are_capped_problems(capsys, run):
    with open(run / METRICS, "a") as f:
        f.write("not json\n" * 5000)
    out, report = both(capsys, run)
    assert len(report["problems"]) == MAX_PROBLEMS + 1 and report["problems"][-1] == "... and 4800 more problems"
    intact_ledger(out, report)


# ------------------------------------------------------------------------------------------- pids
@pytest.mark.parametrize(
    "pid,state",
    [(0, "RUNNING?"), (-1, "RUNNING?"), (2**70, "RUNNING?"), (True, "RUNNING?"), (999_999_999, "DIED")],
)
def test_a_recorded_pid_of_any_value_on_this_host(capsys, run, pid, state):
    (run / SUBMISSION).unlink()
    for i in (0, 2):
        edit_lines(run / LEDGER, i, lambda r: r.update(launcher="local", hostname=socket.gethostname(), pid=pid))
    lines = (run / LEDGER).read_text().splitlines()
    (run / LEDGER).write_text("\n".join(lines[:3]) + "\n")  # the second start has no end yet
    out, report = both(capsys, run)
    assert report["job"]["state"].startswith(state)


def test_pid_alive():
    assert pid_alive(os.getpid()) is True
    assert pid_alive(999_999_999) is False
    for bad in (0, -1, 2**31, 2**70, True, "1", 1.0, None):
        assert pid_alive(bad) is None


# ------------------------------------------------------------------------------------------- the library
def test_collect_is_a_library_with_trusted_types(run):
    report = collect(run, slurm=fake_slurm())
    assert report["problems"] == [] and report["progress"]["step"] == LAST_STEP
    problems: list = []
    clean = sanitize({"time": "x", "step": 3, "extra": float("nan")}, {"time": TIME}, "f", problems)
    assert clean == {"time": None, "step": 3, "extra": None}
    assert problems == ["f: field 'time' is 'x', not a Unix time; shown as unknown"]


def test_a_damaged_but_unreadable_run_dir_is_still_a_report_not_a_usage_error(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / SUBMISSION)
    res = status(capsys, run, "--json")
    assert res.code == 0 and res.report["job"]["state"] == "UNKNOWN"
    warned(res.report, "submission.json", "not a regular file")
