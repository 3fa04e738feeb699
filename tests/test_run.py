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

from hpctrain.ckpt._format import MANIFEST, shard_name, step_name
from hpctrain.errors import UsageError
from hpctrain.ledger import Ledger
from hpctrain.run import RunSelf, choose_checkpoint, nested, ownership, run_self
from hpctrain.rundir import RunDir

MINE, THEIRS = "a" * 64, "b" * 64


def commit(ckpt_dir: Path, step: int, identity: str = MINE, job: str = "") -> Path:
    d = ckpt_dir / step_name(step)
    d.mkdir(parents=True)
    shards = [{"file": shard_name(0, 1), "bytes": 0, "crc32": 0}]
    manifest = {"format": "hpctrain-ckpt", "format_version": 1, "step": step, "world_size": 1, "shards": shards}
    (d / MANIFEST).write_text(json.dumps({**manifest, "time": 1.0, "identity": identity, "run_id": job}))
    return d


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
    assert chosen.path == run.checkpoints / step_name(10) and chosen.how == "run directory" and chosen.checked
    assert chosen.identity == MINE
    assert any(f"{old / step_name(30)} belongs to run {THEIRS[:12]}" in n for n in chosen.notes), chosen.notes


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
        f"checkpoint {old / step_name(30)} belongs to run {THEIRS[:12]} (this run is {MINE[:12]}); "
        "pass --checkpoint-dir DIR to name this run's checkpoints"
    )
    # --checkpoint-dir: the moved checkpoints are taken, another run's are refused the same way
    elsewhere = tmp_path / "elsewhere"
    commit(elsewhere, 20)
    chosen = choose_checkpoint(run, checkpoint_dir=elsewhere)
    assert chosen.path == elsewhere / step_name(20) and chosen.how == "--checkpoint-dir"
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
    assert choose_checkpoint(run).path == run.checkpoints / step_name(10)


def test_ownership_rule():
    me = RunSelf(frozenset({MINE}), frozenset({"7"}), MINE)
    assert ownership({"identity": MINE, "run_id": "7"}, me) == ownership({"identity": MINE}, me)
    assert ownership({"identity": MINE}, me).belongs and ownership({"identity": MINE}, me).checked
    assert not ownership({"identity": THEIRS}, me).belongs
    assert not ownership({"identity": MINE, "run_id": "8"}, me).belongs
    assert ownership({"identity": "", "job_id": "7"}, me).checked
    unknown = ownership({}, me)
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
