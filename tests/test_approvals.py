"""The approval log: append-only, hash-chained, tied to one committed checkpoint and the run identity.

Standard library only (no torch, as on a login node): the checkpoints here are commit manifests written
by hand, which is all ``approve`` reads of them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from hpctrain.__main__ import main as hpctrain_main
from hpctrain.approvals import (
    GENESIS,
    approvals_summary,
    approve,
    canonical,
    entry_hash,
    verify_chain,
)
from hpctrain.ckpt import manifest_sha256
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir
from tests.ckpt.fixtures import commit, step_dir


def _commit(ckpt_dir: Path, step: int, world: int = 1) -> Path:
    """A committed checkpoint as far as approve can tell: a valid commit manifest."""
    return commit(ckpt_dir, step, world)


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    paths = RunDir(tmp_path / "run")
    paths.root.mkdir()
    for step in (10, 20, 30):
        _commit(paths.checkpoints, step)
    return paths


def _approve(run: RunDir, n: int) -> tp.List[tp.Dict[str, tp.Any]]:
    return [
        approve(run, decision="approved" if i % 2 == 0 else "rejected", by=f"person {i}", reason=f"reason {i}")
        for i in range(n)
    ]


def _lines(run: RunDir) -> tp.List[str]:
    return run.approvals.read_text().splitlines()


def _write(run: RunDir, lines: tp.Sequence[str]) -> None:
    run.approvals.write_text("".join(line + "\n" for line in lines))


def test_entries_chain_and_name_the_checkpoint_and_the_run_identity(run):
    first = approve(run, decision="approved", by="Grace", reason="eval loss 0.41, below the bar")
    assert first["seq"] == 1 and first["prev"] == GENESIS and first["step"] == 30  # default: the newest
    assert first["entry_hash"] == entry_hash(first)
    assert first["checkpoint"]["manifest_sha256"] == manifest_sha256(step_dir(run.checkpoints, 30))
    assert first["run_identity"] is None  # no identity record yet
    second = approve(run, decision="rejected", by="Alan", reason="superseded", step=10)
    assert second["seq"] == 2 and second["prev"] == first["entry_hash"] and second["step"] == 10
    entries, problems = verify_chain(run.approvals)
    assert problems == [] and [e["seq"] for e in entries] == [1, 2]
    assert _lines(run)[0].encode() == canonical(first)  # stored exactly as hashed


def test_run_identity_is_the_newest_attempt_record_s_else_the_submit_record_s(run):
    run.identity.mkdir()
    run.identity_submit.write_text(json.dumps({"identity": "s" * 64}))
    assert approve(run, decision="approved", by="a", reason="b")["run_identity"] == "s" * 64
    ledger = Ledger(run)
    for restart in (0, 1):
        ledger.append({"event": "start", "job_id": "77", "restart_count": restart, "time": 1.0})
    run.identity_attempt("77", 0).write_text(json.dumps({"identity": "0" * 63 + "a"}))
    run.identity_attempt("77", 1).write_text(json.dumps({"identity": "1" * 64}))
    entry = approve(run, decision="approved", by="a", reason="b")
    assert entry["run_identity"] == "1" * 64 and entry["run_identity_source"] == "identity/77-r1.json"
    run.identity_attempt("77", 1).write_text("{not json")  # damaged: the next newest is used, never a traceback
    assert approve(run, decision="approved", by="a", reason="b")["run_identity"] == "0" * 63 + "a"


def test_an_edited_entry_is_named(run):
    _approve(run, 3)
    lines = _lines(run)
    e = json.loads(lines[1])
    e["decision"] = "approved" if e["decision"] == "rejected" else "rejected"
    _write(run, [lines[0], canonical(e).decode(), lines[2]])
    _, problems = verify_chain(run.approvals)
    assert problems == ["seq 2 (line 2): edited: its content does not match its entry_hash"]


def test_an_edited_and_re_hashed_entry_is_named_by_the_next_one(run):
    _approve(run, 3)
    lines = _lines(run)
    e = json.loads(lines[1])
    e["reason"] = "approved after all"
    e["entry_hash"] = entry_hash(e)
    _write(run, [lines[0], canonical(e).decode(), lines[2]])
    _, problems = verify_chain(run.approvals)
    assert len(problems) == 1 and problems[0].startswith("seq 2 (line 2) edited and re-hashed")


def test_a_removed_entry_is_named(run):
    _approve(run, 4)
    lines = _lines(run)
    _write(run, [lines[0], lines[2], lines[3]])
    _, problems = verify_chain(run.approvals)
    assert problems == ["seq 2 removed: seq 3 (line 2) follows seq 1"]
    _write(run, lines[1:])
    assert verify_chain(run.approvals)[1] == ["seq 1 removed: seq 2 (line 1) follows the start of the log"]
    _write(run, [lines[0], lines[3]])
    assert verify_chain(run.approvals)[1] == ["seqs 2..3 removed: seq 4 (line 2) follows seq 1"]


def test_a_removed_entry_with_the_rest_renumbered_and_re_hashed_is_still_seen(run):
    _approve(run, 3)
    lines = _lines(run)
    third = json.loads(lines[2])
    third["seq"] = 2
    third["entry_hash"] = entry_hash(third)
    _write(run, [lines[0], canonical(third).decode()])
    _, problems = verify_chain(run.approvals)
    assert len(problems) == 1 and "seq 2's prev does not match" in problems[0] and problems[0].startswith("seq 1")


def test_reordered_entries_are_named(run):
    _approve(run, 4)
    lines = _lines(run)
    _write(run, [lines[0], lines[2], lines[1], lines[3]])
    _, problems = verify_chain(run.approvals)
    assert problems == ["seq 3 (line 2): reordered: it comes before seq 2 (line 3)"]
    _write(run, [lines[1], lines[0], lines[2], lines[3]])
    assert verify_chain(run.approvals)[1] == ["seq 2 (line 1): reordered: it comes before seq 1 (line 2)"]


def test_duplicates_torn_lines_and_respellings_are_named(run):
    _approve(run, 2)
    lines = _lines(run)
    _write(run, [lines[0], lines[1], lines[1]])
    assert verify_chain(run.approvals)[1] == ["seq 2 appears twice (lines 2 and 3): a copied or forked entry"]
    run.approvals.write_text(lines[0] + "\n" + lines[1][:40])
    assert verify_chain(run.approvals)[1] == ["approvals.jsonl line 2: unfinished last line (the write was cut off)"]
    spaced = json.dumps(json.loads(lines[1]), indent=None)  # same content, other spelling
    _write(run, [lines[0], spaced])
    assert verify_chain(run.approvals)[1] == ["seq 2 (line 2): rewritten (not the canonical JSON it was written as)"]


def test_a_log_that_does_not_verify_is_never_extended(run):
    _approve(run, 2)
    lines = _lines(run)
    _write(run, [lines[1]])
    before = run.approvals.read_bytes()
    with pytest.raises(HpctrainError, match="does not verify .seq 1 removed"):
        approve(run, decision="approved", by="a", reason="b")
    assert run.approvals.read_bytes() == before


def test_bad_input_is_one_usage_line(run, tmp_path):
    with pytest.raises(UsageError, match=r"--step 25 is not a committed checkpoint .* \(committed: 10, 20, 30\)"):
        approve(run, decision="approved", by="a", reason="b", step=25)
    with pytest.raises(UsageError, match="control character"):
        approve(run, decision="approved", by="a", reason="line one\nline two")
    with pytest.raises(UsageError, match="--by must not be empty"):
        approve(run, decision="approved", by="  ", reason="b")
    empty = RunDir(tmp_path / "empty")
    empty.root.mkdir()
    with pytest.raises(UsageError, match="not a run"):
        approve(empty, decision="approved", by="a", reason="b")
    no_ckpt = RunDir(tmp_path / "no-ckpt")
    no_ckpt.checkpoints.mkdir(parents=True)
    with pytest.raises(UsageError, match="no committed checkpoint"):
        approve(no_ckpt, decision="approved", by="a", reason="b")
    assert not run.approvals.exists()


def test_cli_exit_codes_and_json(run, capsys):
    assert hpctrain_main(["approve", str(run.root), "--decision", "approved", "--by", "G", "--reason", "ok"]) == 0
    assert "seq 1: approved step 30 by 'G'" in capsys.readouterr().out
    argv = ["approve", str(run.root), "--decision", "rejected", "--by", "A", "--reason", "no", "--step", "20", "--json"]
    assert hpctrain_main(argv) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["seq"] == 2 and entry["decision"] == "rejected" and entry["step"] == 20
    assert hpctrain_main(["approve", str(run.root), "--decision", "maybe", "--by", "A", "--reason", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpctrain approve: error: argument --decision")
    assert (
        hpctrain_main(["approve", str(run.root), "--decision", "approved", "--by", "A", "--reason", "x", "--step", "5"])
        == 2
    )
    assert capsys.readouterr().err.startswith("hpctrain approve: error: --step 5 is not a committed checkpoint")
    _write(run, _lines(run)[1:])
    assert hpctrain_main(["approve", str(run.root), "--decision", "approved", "--by", "A", "--reason", "x"]) == 1
    assert "does not verify" in capsys.readouterr().err


def test_concurrent_approvers_chain_one_after_the_other(run):
    code = (
        "import sys\nfrom hpctrain.approvals import approve\n"
        "for i in range(6):\n"
        "    approve(sys.argv[1], decision='approved', by=sys.argv[2], reason=str(i))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run.root), f"p{n}"]) for n in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    entries, problems = verify_chain(run.approvals)
    assert problems == [] and [e["seq"] for e in entries] == list(range(1, 19))


def test_summary_for_status(run):
    assert approvals_summary(run) == {
        "path": str(run.approvals),
        "count": 0,
        "head": None,
        "ok": True,
        "problems": [],
        "entries": [],
        "omitted": 0,
        "latest": {},
    }
    entries = _approve(run, 3)
    summary = approvals_summary(run, limit=2)
    assert summary["count"] == 3 and summary["head"] == entries[-1]["entry_hash"] and summary["ok"]
    assert [e["seq"] for e in summary["entries"]] == [2, 3] and summary["omitted"] == 1
    assert summary["latest"] == {"30": {"decision": "approved", "by": "person 2", "time": entries[2]["time"], "seq": 3}}
    assert set(summary["entries"][0]) == {
        "seq",
        "time",
        "decision",
        "by",
        "reason",
        "step",
        "manifest_sha256",
        "run_identity",
        "entry_hash",
    }
    lines = _lines(run)
    _write(run, [lines[0], lines[2]])
    damaged = approvals_summary(run)
    assert not damaged["ok"] and damaged["problems"] == ["seq 2 removed: seq 3 (line 2) follows seq 1"]
    run.approvals.unlink()
    run.approvals.mkdir()  # not even a file: a problem line, no traceback
    assert approvals_summary(run)["problems"] == ["approvals.jsonl: a directory, not a file"]


def test_a_moved_run_approves_its_own_checkpoint_never_the_run_now_at_its_old_path(tmp_path, capsys):
    """Before: a run moved with mv kept naming its old checkpoint directory, and approve recorded the checkpoint
    of the run that lives there now."""
    from tests.test_run import THEIRS, commit, moved

    run, old = moved(tmp_path)
    entry = approve(run, decision="approved", by="a", reason="b")
    assert entry["checkpoint"]["name"] == "step-000000010" and entry["step"] == 10
    shutil.rmtree(run.checkpoints)
    argv = ["approve", str(run.root), "--decision", "approved", "--by", "a", "--reason", "b"]
    assert hpctrain_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"belongs to run {THEIRS[:12]}" in err and "--checkpoint-dir DIR" in err
    commit(tmp_path / "moved-ckpts", 20)
    assert hpctrain_main([*argv, "--checkpoint-dir", str(tmp_path / "moved-ckpts")]) == 0
    assert "approved step 20" in capsys.readouterr().out
    entries, problems = verify_chain(run.approvals)
    assert problems == [] and [e["step"] for e in entries] == [10, 20]
