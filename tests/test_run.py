"""hpctrain.run: which checkpoint directory is a run's, and whether a checkpoint belongs to it.

Standard library only (no torch, as on a login node): the checkpoints are commit manifests written by hand, with
the run identity and job id a Trainer's Checkpointer writes into them.
"""

from __future__ import annotations

import json
import shutil
import typing as tp
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.ledger import Ledger
from hpctrain.run import (
    Attempt,
    RunSelf,
    attempt_keys,
    attempt_label,
    attempts,
    checkpoint_dir,
    checkpoint_ownership,
    choose_checkpoint,
    is_run_dir,
    nested,
    parse_label,
    recorded_checkpoint_dirs,
    run_self,
)
from hpctrain.rundir import RunDir
from tests.ckpt.fixtures import commit as commit_manifest
from tests.ckpt.fixtures import step_dir

MINE, THEIRS = "a" * 64, "b" * 64


def commit(ckpt_dir: Path, step: int, identity: str = MINE, job: str = "") -> Path:
    return commit_manifest(ckpt_dir, step, identity=identity, run_id=job)


def make_run(
    root: Path, identity: tp.Optional[str] = MINE, job: str = "", ckpt_dir: tp.Optional[Path] = None
) -> RunDir:
    """A run whose ledger names its checkpoint directory by absolute path (as the Trainer writes it)."""
    run = RunDir(root)
    run.root.mkdir(parents=True)
    start: tp.Dict[str, tp.Any] = {"event": "start", "time": 1.0, "job_id": job, "restart_count": 0}
    start["checkpoint_dir"] = str(ckpt_dir or run.checkpoints)
    if identity:
        run.identity.mkdir()
        run.identity_attempt(job, 0).write_text(json.dumps({"identity": identity, "attempt": {"job_id": job}}))
    Ledger(run).append(start)
    return run


def moved(tmp_path: Path, other_at_old_path: bool = True) -> tp.Tuple[RunDir, Path]:
    """A run moved with mv from old/ to new/; another run (another identity) now lives at old/."""
    run = make_run(tmp_path / "old")
    commit(run.checkpoints, 10)
    new = tmp_path / "new"
    shutil.move(str(run.root), new)
    if other_at_old_path:
        other = make_run(tmp_path / "old", identity=THEIRS)
        commit(other.checkpoints, 30, identity=THEIRS)
    return RunDir(new), tmp_path / "old" / "checkpoints"


def test_a_moved_run_takes_its_own_checkpoints_not_the_run_now_at_its_old_path(tmp_path):
    run, old = moved(tmp_path)
    chosen = choose_checkpoint(run)
    assert chosen.path == step_dir(run.checkpoints, 10) and chosen.how == "run directory" and chosen.checked
    assert chosen.identity == MINE
    assert any(f"{step_dir(old, 30)} belongs to run {THEIRS[:12]}" in n for n in chosen.notes), chosen.notes


def test_a_moved_run_with_nothing_at_its_old_path_is_still_found(tmp_path):
    run, old = moved(tmp_path, other_at_old_path=False)
    chosen = choose_checkpoint(run)
    assert chosen.step == 10 and any(f"{old} is gone" in n for n in chosen.notes)


def test_another_run_s_checkpoint_is_refused_in_one_line_naming_both(tmp_path):
    run, old = moved(tmp_path)
    shutil.rmtree(run.checkpoints)
    with pytest.raises(UsageError) as err:
        choose_checkpoint(run)
    msg = str(err.value)
    assert msg == (
        f"checkpoint {step_dir(old, 30)} belongs to run {THEIRS[:12]} (this run is {MINE[:12]}); "
        "pass --checkpoint-dir DIR to name this run's checkpoints"
    )
    # --checkpoint-dir: the moved checkpoints are taken, another run's are refused the same way
    elsewhere = tmp_path / "elsewhere"
    commit(elsewhere, 20)
    chosen = choose_checkpoint(run, checkpoint_dir=elsewhere)
    assert chosen.path == step_dir(elsewhere, 20) and chosen.how == "--checkpoint-dir"
    with pytest.raises(UsageError, match=f"belongs to run {THEIRS[:12]}"):
        choose_checkpoint(run, checkpoint_dir=old)
    with pytest.raises(UsageError, match=r"^--checkpoint-dir .*nope is not a directory$"):
        choose_checkpoint(run, checkpoint_dir=tmp_path / "nope")


def test_the_same_identity_from_another_job_is_another_run(tmp_path):
    """Identical code, config, data and environment give the same identity: the job id tells the runs apart."""
    run = make_run(tmp_path / "run", job="100")
    commit(run.checkpoints, 10, job="200")
    with pytest.raises(UsageError, match=r"was saved by job 200 \(this run's jobs: 100\)"):
        choose_checkpoint(run)
    commit(run.checkpoints, 20, job="100")
    assert choose_checkpoint(run, 20).checked


def test_a_step_is_looked_for_in_the_run_s_own_directory(tmp_path):
    run, _ = moved(tmp_path)
    assert choose_checkpoint(run, 10).step == 10
    with pytest.raises(
        UsageError, match=r"--step 11 is not a committed checkpoint in .*new/checkpoints \(committed: 10\)"
    ):
        choose_checkpoint(run, 11)


def test_no_identity_on_either_side_is_taken_and_said(tmp_path):
    run = make_run(tmp_path / "old-run", identity=None)
    commit(run.checkpoints, 10, identity="")
    chosen = choose_checkpoint(run)
    assert chosen.step == 10 and not chosen.checked
    assert any("neither this run nor its checkpoint records an identity" in n for n in chosen.notes)


def test_a_run_that_lost_its_identity_records_cannot_take_an_identified_checkpoint(tmp_path):
    run = make_run(tmp_path / "run")
    commit(run.checkpoints, 10)
    assert choose_checkpoint(run).checked
    run.identity_attempt("", 0).write_text('{"identity": "aaa')  # truncated
    with pytest.raises(UsageError, match="but this run records none"):
        choose_checkpoint(run)
    # the ledger's start records carry the identity too (the Trainer writes both): that is enough
    Ledger(run).append({"event": "start", "time": 2.0, "job_id": "", "restart_count": 1, "identity": MINE})
    assert choose_checkpoint(run).checked


def test_a_checkpoint_directory_proven_to_be_the_run_s_is_preferred_to_one_that_cannot_be_told(tmp_path):
    run, old = moved(tmp_path)
    shutil.rmtree(old)
    commit(old, 40, identity="")  # at the old path: a checkpoint without identity (cannot be told)
    assert choose_checkpoint(run).path == step_dir(run.checkpoints, 10)


def test_ownership_rule():
    me = RunSelf(frozenset({MINE}), frozenset({"7"}), MINE)
    assert checkpoint_ownership({"identity": MINE, "run_id": "7"}, me) == checkpoint_ownership({"identity": MINE}, me)
    assert checkpoint_ownership({"identity": MINE}, me).belongs and checkpoint_ownership({"identity": MINE}, me).checked
    assert not checkpoint_ownership({"identity": THEIRS}, me).belongs
    assert not checkpoint_ownership({"identity": MINE, "run_id": "8"}, me).belongs
    assert checkpoint_ownership({"identity": "", "job_id": "7"}, me).checked
    unknown = checkpoint_ownership({}, me)
    assert unknown.belongs and not unknown.checked and "records no run identity" in unknown.why


def test_run_self_reads_every_identity_and_job(tmp_path):
    run = make_run(tmp_path / "run", job="5")
    run.identity_submit.write_text(json.dumps({"identity": "c" * 64}))
    run.identity_attempt("5", 1).write_text(json.dumps({"identity": "d" * 64, "attempt": {"job_id": "5"}}))
    (run.identity / "data-cache.json").write_text(json.dumps({"identity": "e" * 64}))  # not an identity record
    Ledger(run).append({"event": "exit", "time": 3.0, "job_id": "6", "restart_count": 0})
    me = run_self(run)
    assert me.identities == {MINE, "c" * 64, "d" * 64} and me.job_ids == {"5", "6"}


def test_nested_resolves_symlinks_and_paths_that_do_not_exist(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    assert nested(tmp_path / "link" / "a" / "b", tmp_path / "run") == "inside"
    assert nested(tmp_path / "run", tmp_path / "run") == "inside"
    assert nested(tmp_path, tmp_path / "link") == "contains"
    assert nested(tmp_path / "runs", tmp_path / "run") is None


# ---------------------------------------------------------------------------------------------- attempts
REQUEUED_RUN = [
    # attempt 1: its start record was lost, its end and exit were written (an end without a start)
    {"event": "end", "time": 20.0, "step": 5, "status": "stopped", "committed_step": 5},
    {"event": "exit", "time": 21.0, "job_id": "12", "restart_count": 0, "cause": "preemption", "requeued": True},
    # attempt 2: start, end, exit (requeued)
    {"event": "start", "time": 30.0, "job_id": "12", "restart_count": 1, "launcher": "slurm", "resumed_from_step": 5},
    {"event": "end", "time": 40.0, "step": 9, "status": "stopped", "committed_step": 9},
    {"event": "exit", "time": 41.0, "job_id": "12", "restart_count": 1, "cause": "time_limit", "requeued": True},
    # attempt 3: a start without an end (running, or died)
    {"event": "start", "time": 50.0, "job_id": "12", "restart_count": 2, "launcher": "slurm", "resumed_from_step": 9},
]
LABELS = ["12-r0", "12-r1", "12-r2"]


def test_status_report_and_bundle_agree_on_the_attempts_of_a_requeued_run(tmp_path, capsys):
    from hpctrain.bundle.attempts import attempts_from_ledger, summary
    from hpctrain.report.gather import gather
    from hpctrain.testing import FakeSlurm
    from tests.status.rundirs import status

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    for rec in REQUEUED_RUN:
        Ledger(run).append(dict(rec))
    found = attempts(Ledger(run).records())
    assert [a.label for a in found] == LABELS
    assert [(a.started, a.ended) for a in found] == [(False, True), (True, True), (True, False)]
    report = status(capsys, run.root, "--json", slurm=FakeSlurm()).report
    assert [r["attempt"] for r in report["attempts"]] == LABELS
    assert [r["started"] for r in report["attempts"]] == [False, True, True]
    assert [r["attempt"] for r in report["slurm_view"]["attempts"]] == LABELS
    assert [a.label for a in gather(run.root, slurm=FakeSlurm()).attempts] == LABELS
    bundled = [summary(a) for a in attempts_from_ledger(Ledger(run).records())]
    assert [(b["job_id"], b["restart_count"]) for b in bundled] == [("12", 0), ("12", 1), ("12", 2)]
    assert attempt_keys(run) == [("12", 0), ("12", 1), ("12", 2)]


def test_the_pairing_rule():
    ledger = [
        {"event": "start", "job_id": "", "restart_count": 0, "time": 1.0},
        {"event": "exit", "job_id": "", "restart_count": 0, "time": 2.0, "cause": "hang"},  # exit before the end
        {"event": "end", "time": 3.0, "step": 1, "status": "failed"},
        {"event": "end", "time": 4.0, "step": 1, "status": "failed"},  # a second end: an attempt of its own
        {"event": "exit", "job_id": "7", "restart_count": 3, "time": 5.0},  # names the end-only attempt
        {"event": "in_job_restart", "job_id": "7", "restart_count": 3, "time": 6.0},  # not an attempt
        {"event": "exit", "job_id": "7", "restart_count": 4, "time": 7.0},  # an exit without a start
    ]
    found = attempts(ledger)
    assert [a.label for a in found] == ["local-r0", "7-r3", "7-r4"]
    assert found[0].end is not None and found[0].exit is not None and found[1].end["time"] == 4.0
    assert [a.index for a in found] == [1, 2, 3] and [a.later_attempt for a in found] == [True, True, False]


@pytest.mark.parametrize(
    "job, restart, label",
    [("12", 0, "12-r0"), ("", 3, "local-r3"), ("12_4", None, "12_4-r?"), ("a-r1", 2, "a-r1-r2")],
)
def test_the_label_round_trips(job, restart, label):
    assert attempt_label(job, restart) == label and Attempt(job, restart).label == label
    assert parse_label(label) == (job, restart)


@pytest.mark.parametrize("text", ["", "12", "12-r", "12-rx", "-r1", "12-r-1"])
def test_parse_label_refuses_what_is_not_a_label(text):
    assert parse_label(text) is None


@pytest.mark.parametrize(
    "what, is_run",
    [
        ("nothing", False),
        ("submission.json", True),
        ("train/ledger.jsonl", True),
        ("train/metrics.jsonl", True),
        ("identity/submit.json", True),
        ("checkpoints/", True),
        ("train/", False),
        ("other.txt", False),
    ],
)
def test_is_run_dir(tmp_path, what, is_run):
    root = tmp_path / "run"
    root.mkdir()
    if what.endswith("/"):
        (root / what).mkdir(parents=True)
    elif what != "nothing":
        (root / what).parent.mkdir(parents=True, exist_ok=True)
        (root / what).write_text("{}")
    assert is_run_dir(root) is is_run
    assert not is_run_dir(tmp_path / "missing") and not is_run_dir(root / "submission.json")


def test_the_checkpoint_dir_rule(tmp_path):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    assert checkpoint_dir(run) == run.checkpoints  # the ledger names none
    Ledger(run).append({"event": "start", "time": 1.0, "checkpoint_dir": "/old", "restart_count": 0})
    Ledger(run).append({"event": "start", "time": 2.0, "checkpoint_dir": "rel/ck", "restart_count": 1})
    assert checkpoint_dir(run) == run.root / "rel/ck"  # relative: against the run (no submission cwd)
    (run.root / "submission.json").write_text(json.dumps({"cwd": "/work"}))
    assert checkpoint_dir(run) == Path("/work/rel/ck")
    assert recorded_checkpoint_dirs(Ledger(run).records()) == ["/old", "rel/ck"]
