"""The Trainer's part of the run identity (docs/bundle.md, "Run identity"), with the real Runner on 2 gloo
ranks: the attempt record gains the training config and the input files; the ledger start, every metrics
record and every checkpoint manifest carry the identity; a resume whose input data changed stops every rank
with one line, and ``--accept-data-change`` continues and is recorded."""

from __future__ import annotations

import json

import pytest

from hpctrain.data import make_dataset
from hpctrain.errors import UsageError
from hpctrain.identity import current_identity
from hpctrain.ledger import Ledger
from hpctrain.rundir import RunDir, read_jsonl
from tests.multiproc import run_world


def _demo(rank, world_size, run_dir, args):
    from hpctrain.launch.runner import Runner

    try:
        return Runner(entry="hpctrain.examples.demo:main", run_dir=run_dir, entry_args=args)()
    except UsageError as exc:
        return {"usage_error": str(exc)}


def _attempt(run_dir, restart, args, world=2):
    env = {"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": str(restart)}
    return run_world(_demo, world, str(run_dir), list(args), init_pg=False, env=env).results


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.h5"
    make_dataset(path, 256, shape=(3, 4, 4), chunk_samples=32, fill="random")
    return path


def test_identity_travels_with_the_records_and_a_changed_input_stops_the_resume(tmp_path, data, capsys):
    run = tmp_path / "run"
    common = ["--data", str(data), "--batch-size", "32", "--workers", "0", "--ckpt-every", "2", "--log-every", "2"]
    _attempt(run, 0, ["--steps", "4", *common])
    ident = current_identity(run, "job7", 0)
    assert ident is not None and len(ident.identity) == 64
    record = json.loads(RunDir(run).identity_attempt("job7", 0).read_text())
    assert record["config"]["train"]["steps"] == 4 and record["config"]["seed"] == 0
    assert [f["cheap"]["name"] for f in record["data"]["files"]] == ["train.h5"]
    (start,) = Ledger(run).records("start")
    assert start["identity"] == ident.identity and start["identity_changed"] == []
    intervals = [r for r in read_jsonl(RunDir(run).metrics)[0] if r.get("kind") == "interval"]
    assert intervals and all(r["identity"] == ident.identity for r in intervals)
    manifest = json.loads((RunDir(run).checkpoints / "step-000000004" / "MANIFEST.json").read_text())
    assert manifest["identity"] == ident.identity

    # the input changes between attempts (a different sample count): every rank stops with rank 0's line
    make_dataset(data, 320, shape=(3, 4, 4), chunk_samples=32, fill="random")
    refused = _attempt(run, 1, ["--steps", "6", *common])
    assert all("usage_error" in r for r in refused), refused
    assert "train.h5" in refused[0]["usage_error"] and "--accept-data-change" in refused[0]["usage_error"]
    assert len(Ledger(run).records("start")) == 1  # nothing trained

    # accepted: the run goes on from its checkpoint, and the acceptance is in the attempt's identity
    accepted = _attempt(run, 2, ["--steps", "6", *common, "--accept-data-change"])
    assert not any("usage_error" in (r or {}) for r in accepted), accepted
    again = current_identity(run, "job7", 2)
    assert again is not None and again.data_change_accepted and "data" in again.changed
    starts = Ledger(run).records("start")
    assert starts[-1]["resumed_from_step"] == 4 and starts[-1]["identity"] == again.identity
    assert starts[-1]["data_change_accepted"] is True

    # status shows the identity history and the approvals of the run
    from hpctrain import approvals
    from hpctrain.status.cli import main as status_main
    from hpctrain.status.report import collect

    assert approvals.main([str(run), "--decision", "approved", "--by", "Ada [x]", "--reason", "curve ok"]) == 0
    report = collect(run)
    assert report["identity"]["current"] == again.identity and report["identity"]["changes"] >= 1
    assert report["approvals"]["count"] == 1 and report["approvals"]["ok"]
    status_main([str(run)])
    text = capsys.readouterr().out
    assert "changed at job7-r2" in text and "data change accepted" in text
    assert "approved by Ada [x]" in text  # recorded text is shown as text, not markup
