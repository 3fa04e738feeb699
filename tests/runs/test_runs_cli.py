"""``python -m hpctrain runs``: 20 runs with one squeue and at most one sacct (FakeSlurm counts them), without
accounting, the filters, ``--json`` and a run directory that went missing."""

from __future__ import annotations

import functools
import json
import shutil
import time
import typing as tp
from pathlib import Path

import pytest

from hpctrain._cli import run_main
from hpctrain.errors import UsageError
from hpctrain.registry import record_run
from hpctrain.runs.cli import main
from hpctrain.runs.listing import Snapshot, parse_since, render
from hpctrain.testing import FakeSlurm

NOW = time.time()


def _records(path: Path, records: tp.Sequence[tp.Dict[str, tp.Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def make_run(root: Path, job: str, how: str, *, name: str, nodes: int = 2, step: int = 40) -> Path:
    """A run directory of job ``job``: ``how`` is pending (submitted only), running (one start, metrics),
    done (start, end, exit), requeued (a time-limit exit and a second start) or died (a start and nothing else)."""
    run = root / name
    run.mkdir(parents=True)
    sub = {"job_id": job, "cluster": "slurm", "state": "submitted", "job_name": name, "config": {"nodes": nodes}}
    (run / "submission.json").write_text(json.dumps(sub))
    if how == "pending":
        return run

    def start(restart: int, t: float) -> tp.Dict[str, tp.Any]:
        return {"event": "start", "time": t, "job_id": job, "restart_count": restart, "hostname": "node1",
                "pid": 1, "launcher": "slurm", "world_size": nodes, "total_steps": 100,
                "checkpoint_dir": str(run / "checkpoints")}  # fmt: skip

    ledger = [start(0, NOW - 600)]
    if how == "requeued":
        ledger += [{"event": "exit", "time": NOW - 500, "job_id": job, "restart_count": 0, "cause": "time_limit",
                    "requeued": True, "reason": "requeued"}, start(1, NOW - 400)]  # fmt: skip
    if how == "done":
        ledger += [
            {"event": "end", "time": NOW - 60, "step": 100, "status": "completed"},
            {"event": "exit", "time": NOW - 59, "job_id": job, "restart_count": 0, "cause": "finished",
             "requeued": False, "reason": "finished"},
        ]  # fmt: skip
        step = 100
    _records(run / "train" / "ledger.jsonl", ledger)
    interval = {"kind": "interval", "time": NOW - 70, "step": step, "total_steps": 100, "loss": 2.5 - step / 100}
    _records(run / "train" / "metrics.jsonl", [interval])
    ckpt = run / "checkpoints" / f"step-{step // 2:09d}"
    ckpt.mkdir(parents=True)
    shards = [{"file": f"rank-{r:05d}-of-{nodes:05d}.shard", "bytes": 0, "crc32": 0} for r in range(nodes)]
    manifest = {"format": "hpctrain-ckpt", "format_version": 1, "step": step // 2, "world_size": nodes,
                "shards": shards, "time": NOW - 100, "host": "node1"}  # fmt: skip
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))
    return run


KINDS = ["running"] * 6 + ["pending"] * 4 + ["done"] * 6 + ["requeued"] * 2 + ["died"] * 2


@pytest.fixture
def twenty(tmp_path, monkeypatch):
    """20 registered runs (jobs 100..119) and a FakeSlurm that knows them: squeue lists the running, requeued and
    pending ones, sacct has the done ones as COMPLETED and the died ones as FAILED."""
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    slurm = FakeSlurm()
    runs = {}
    for i, how in enumerate(KINDS):
        job = str(100 + i)
        name = f"lr{i % 4}-seed{i}-{how}"
        runs[job] = make_run(tmp_path / "runs", job, how, name=name)
        age = 3 * 86400 if i < 2 else 3600  # the first two are older than 2 days
        record_run(runs[job], job, name=name, cluster="slurm", submitted_at=NOW - age)
        if how in ("running", "requeued"):
            slurm.queue[job] = ["RUNNING"]
        elif how == "pending":
            slurm.queue[job] = ["PENDING:Resources"]
        elif how == "done":
            slurm.final[job] = "COMPLETED"
        else:
            slurm.final[job] = "FAILED"
    return runs, slurm


def runs_cmd(capsys, slurm, *args: str) -> tp.Tuple[int, str, str, tp.Any]:
    capsys.readouterr()
    code = run_main(functools.partial(main, slurm=slurm), "runs", list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    got = None
    if "--json" in args and code == 0:
        got = json.loads(out, parse_constant=lambda c: pytest.fail(f"not standard JSON: {c}"))
    return code, out, err, got


def test_twenty_runs_with_one_squeue_and_one_sacct(capsys, twenty):
    runs, slurm = twenty
    code, _, err, got = runs_cmd(capsys, slurm, "--json")
    assert code == 0 and err == ""
    assert got["schema"] == "hpctrain.runs/1" and got["count"] == 20
    assert slurm.count("squeue") == 1 and slurm.count("sacct") == 1 and slurm.count() == 2, slurm.calls
    squeue = next(c for c in slurm.calls if c[0] == "squeue")
    assert squeue[squeue.index("-j") + 1].split(",") == [str(100 + i) for i in range(20)]
    sacct = next(c for c in slurm.calls if c[0] == "sacct")
    assert sacct[sacct.index("-j") + 1].split(",") == [str(j) for j in (*range(110, 116), 118, 119)]  # left the queue
    by_job = {r["job_id"]: r for r in got["runs"]}
    assert [r["job_id"] for r in got["runs"]] == [str(100 + i) for i in range(20)]  # oldest submission first
    running, pending, done, requeued, died = by_job["100"], by_job["106"], by_job["110"], by_job["116"], by_job["118"]
    assert (running["state"], running["category"], running["source"]) == ("RUNNING", "running", "squeue")
    assert (running["step"], running["total_steps"], running["loss"], running["checkpoint_step"]) == (40, 100, 2.1, 20)
    assert running["nodes"] == 2 and running["started"] == pytest.approx(NOW - 600)
    assert running["run_dir"] == str(runs["100"]) and running["name"] == "lr0-seed0-running"
    assert (pending["state"], pending["category"], pending["reason"]) == ("PENDING", "pending", "Resources")
    assert (done["state"], done["category"], done["last_ended"], done["step"]) == ("COMPLETED", "done", "finished", 100)
    assert requeued["last_ended"] == "" and requeued["attempts"] == 2  # the newest attempt runs
    assert (died["state"], died["category"]) == ("FAILED", "failed")
    assert got["accounting"] == {"available": True, "unavailable": None}
    assert got["scheduler"]["squeue_calls"] == 1 and got["scheduler"]["sacct_calls"] == 1
    assert not any("not asked per run" in p for r in got["runs"] for p in r["problems"])


def test_the_table_fits_80_columns(capsys, twenty, monkeypatch):
    runs, slurm = twenty
    long = "a-very-long-experiment-name-" * 3
    deep = Path(runs["100"]).parent / ("deep/" * 12) / "x"
    make_run(deep.parent, "555_12", "running", name="x")
    record_run(deep, "555_12", name=long, cluster="slurm")
    slurm.queue["555_12"] = ["PENDING:Priority"]
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _, _ = runs_cmd(capsys, slurm)
    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert lines[0].split() == ["NAME", "JOB", "STATE", "N", "STEP", "LOSS", "CKPT", "STARTED", "ENDED", "RUN", "DIR"]
    assert len(lines) == 1 + 21 + 1 and lines[-1].startswith("21 runs: ")
    row = next(line for line in lines if " 100 " in line)
    assert row.startswith("lr0-seed0") and row.endswith("-seed0-running")  # a cut run dir keeps its own name
    assert "RUNNING" in row and "40/100" in row and "2.1" in row
    assert "…" in next(line for line in lines if "555_12" in line)  # the long name and deep dir were cut
    assert slurm.count("squeue") == 1


@pytest.mark.parametrize("how", ["disabled", "missing"])
def test_without_accounting_the_states_come_from_squeue_and_the_ledger(capsys, twenty, how):
    _, slurm = twenty
    if how == "disabled":
        slurm.accounting = False
    else:
        slurm.missing = {"sacct"}
    code, _, err, got = runs_cmd(capsys, slurm, "--json")
    assert code == 0 and got["count"] == 20
    assert got["accounting"]["available"] is False and got["accounting"]["unavailable"]
    notes = [line for line in err.splitlines() if line]
    assert len(notes) == 1 and notes[0].startswith("hpctrain runs: note: accounting unavailable"), err
    by_job = {r["job_id"]: r for r in got["runs"]}
    assert by_job["100"]["state"] == "RUNNING" and by_job["100"]["source"] == "squeue"
    assert (by_job["110"]["state"], by_job["110"]["source"], by_job["110"]["category"]) == (
        "COMPLETED",
        "run dir",
        "done",
    )
    # started, no end record, not in the queue: it ended (how, only accounting knew)
    assert (by_job["118"]["state"], by_job["118"]["category"]) == ("ENDED?", "failed")
    assert slurm.count("squeue") == 1 and slurm.count("sacct") <= 1
    code, out, err, _ = runs_cmd(capsys, slurm)  # the table says so too (one note line on stderr)
    assert code == 0 and "accounting unavailable" in err and "COMPLETED" in out


def test_filters(capsys, twenty):
    _, slurm = twenty

    def jobs(*args: str) -> tp.List[str]:
        code, _, _, got = runs_cmd(capsys, slurm, "--json", *args)
        assert code == 0
        for job in slurm.queue:  # the fake consumes one squeue answer per call: give it the next one
            slurm.queue[job] = slurm.queue[job] or (["PENDING:Resources"] if 106 <= int(job) < 110 else ["RUNNING"])
        return [r["job_id"] for r in got["runs"]]

    assert jobs("--state", "running") == [str(j) for j in (*range(100, 106), 116, 117)]
    assert jobs("--state", "pending") == [str(j) for j in range(106, 110)]
    assert jobs("--state", "done") == [str(j) for j in range(110, 116)]
    assert jobs("--state", "failed") == ["118", "119"]
    assert jobs("--state", "failed", "--state", "pending") == ["106", "107", "108", "109", "118", "119"]
    assert jobs("--name", "lr1-*") == ["101", "105", "109", "113", "117"]
    assert jobs("--name", "*-done") == [str(j) for j in range(110, 116)]
    assert jobs("--since", "2d") == [str(j) for j in range(102, 120)]
    assert jobs("--since", "2d", "--name", "lr0-*", "--state", "running") == ["104", "116"]
    before = slurm.count("squeue")
    assert jobs("--name", "nothing*") == []
    assert slurm.count("squeue") == before  # nothing to ask about: no call at all


@pytest.mark.parametrize(
    "args,words",
    [
        (["--state", "sleeping"], "invalid choice"),
        (["--since", "yesterday"], "--since 'yesterday'"),
        (["--since", "2x"], "give an age"),
        (["extra"], "unrecognized arguments"),
        (["--sweep", "nowhere"], "--sweep nowhere: not a directory"),
        (["--sweep", "a", "--state", "running"], "--sweep lists one sweep's tasks"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, twenty, args, words):
    _, slurm = twenty
    code, out, err, _ = runs_cmd(capsys, slurm, *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("hpctrain runs: error: ")
    assert words in err
    assert slurm.count() == 0


def test_a_missing_run_dir_is_shown_as_missing(capsys, twenty):
    runs, slurm = twenty
    shutil.rmtree(runs["110"])
    shutil.rmtree(runs["111"] / "train")  # emptied: no run records left
    shutil.rmtree(runs["111"] / "checkpoints")
    (runs["111"] / "submission.json").unlink()
    moved = runs["112"]
    shutil.rmtree(moved)
    moved.write_text("a file now")
    code, _, err, got = runs_cmd(capsys, slurm, "--json")
    assert code == 0 and got["count"] == 20
    by_job = {r["job_id"]: r for r in got["runs"]}
    for job in ("110", "111", "112"):
        assert (by_job[job]["state"], by_job[job]["category"]) == ("MISSING", "missing"), by_job[job]
        assert by_job[job]["problems"]
    code, out, _, _ = runs_cmd(capsys, slurm, "--state", "missing")
    assert code == 0 and out.count("MISSING") == 3 and out.splitlines()[-1] == "3 runs: 3 missing"


def test_no_registry_yet(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "none"))
    slurm = FakeSlurm()
    code, out, err, _ = runs_cmd(capsys, slurm)
    assert (code, out.strip(), err) == (0, "no runs registered yet", "")
    code, _, _, got = runs_cmd(capsys, slurm, "--json")
    assert got["count"] == 0 and got["runs"] == [] and slurm.count() == 0


def test_a_resumed_run_is_one_row_with_its_newest_job(capsys, twenty):
    runs, slurm = twenty
    # submit --resume: a new job, its submission record replaced, the registry a line more
    sub = json.loads((runs["110"] / "submission.json").read_text())
    (runs["110"] / "submission.json").write_text(json.dumps({**sub, "job_id": "300"}))
    record_run(runs["110"], "300", name="lr2-seed10-done", cluster="slurm")
    slurm.queue["300"] = ["RUNNING"]
    code, _, _, got = runs_cmd(capsys, slurm, "--json")
    assert got["count"] == 20 and got["runs"][-1]["job_id"] == "300" and got["runs"][-1]["state"] == "RUNNING"
    assert slurm.count("squeue") == 1 and slurm.count("sacct") == 1
    squeue = next(c for c in slurm.calls if c[0] == "squeue")
    assert "110" not in squeue[squeue.index("-j") + 1].split(",")  # only each run's newest job is asked


def test_a_failing_squeue_is_a_note_and_sacct_still_answers(capsys, twenty):
    _, slurm = twenty
    slurm.missing = {"squeue"}
    code, _, err, got = runs_cmd(capsys, slurm, "--json")
    assert code == 0 and got["count"] == 20 and "squeue failed" in err
    assert got["scheduler"]["squeue_error"] and slurm.count("sacct") == 1
    assert {r["job_id"]: r["state"] for r in got["runs"]}["110"] == "COMPLETED"


def test_a_torn_registry_line_is_one_warning_and_the_rest_lists(capsys, twenty, tmp_path):
    _, slurm = twenty
    with open(tmp_path / "home" / "runs.jsonl", "a") as f:
        f.write('{"run_dir": "/x", "job')
    code, _, err, got = runs_cmd(capsys, slurm, "--json")
    assert code == 0 and got["count"] == 20
    assert len([line for line in err.splitlines() if "warning" in line]) == 1


def test_parse_since_and_the_snapshot_never_runs_a_command():
    assert parse_since("90s", now=1000.0) == 910.0
    assert parse_since("2d", now=200000.0) == 200000.0 - 2 * 86400
    assert parse_since("1.5h", now=10000.0) == 10000.0 - 5400
    assert parse_since("2026-12-01") == time.mktime(time.strptime("2026-12-01", "%Y-%m-%d"))
    with pytest.raises(UsageError):
        parse_since("-2d")
    with pytest.raises(Exception, match="not asked per run"):
        Snapshot({}).run(["squeue", "-j", "1"])
    assert render({"runs": [], "filters": {"name": "x*"}}) == "no runs match"
