"""One CLI convention for every command (docs/cli.md): walks every command's parser, then runs the reports.

Every module in :data:`hpctrain.__main__.COMMANDS` exposes ``build_parser()``; each parser and sub-parser is
checked for ``-o/--output`` + ``--force``, the one ``RUN_DIR`` help text, ``--json`` on every command that
reports, and the same help words for the same option everywhere. Then each ``--json`` is run on a small run
directory and must print exactly one standard JSON object (no NaN/Infinity) with a ``schema`` field.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import shutil
import typing as tp
from pathlib import Path

import pytest

from hpctrain import _cli
from hpctrain.__main__ import COMMANDS
from hpctrain.__main__ import main as hpctrain_main
from tests.status import rundirs

# ---------------------------------------------------------------------------------------------- the parsers
NO_JSON: tp.Dict[str, str] = {}
"""Commands without --json, and why (none: every command reports something)."""

CANONICAL_HELP = dict(_cli.HELP)
"""The help text every command gives for the same thing (RUN_DIR, --json, --force)."""

# Options whose name is shared but whose meaning differs in some commands: those commands, and why.
DIFFERENT_MEANING: tp.Dict[str, tp.Tuple[tp.Tuple[str, ...], str]] = {
    "--follow": (("logs",), "logs: the chosen rank's lines across requeues; submit: rank 0 with a live status"),
    "--step": (("ckpt verify",), "ckpt verify: only this step; its default is every committed step"),
    "--samples": (("data synth", "capacity"), "data synth: samples to write; capacity: samples to train on"),
    "--nodes": (("capacity",), "capacity: the node counts to predict; submit: the job's node count"),
    "--gpus-per-node": (("capacity",), "capacity: ranks per node of the prediction; submit: the job's GPUs"),
    "--entry": (("capacity",), "capacity: the entry to calibrate; submit: the entry to run"),
    "--dry-run": (("ckpt gc",), "ckpt gc: what would be deleted; submit: the sbatch script"),
    "--sweep": (("runs",), "runs: the SWEEP_DIR a sweep made (a row per task); submit: the plan FILE to submit"),
    "--tolerance": (("reproduce compare",), "reproduce compare: overrides the tolerance reproduce run recorded"),
}
STEP_COMMANDS = ("approve", "bundle create", "ckpt digest")
"""Commands whose --step is "the committed checkpoint's step (default: the newest)": ``_cli.STEP_HELP``."""


def _walk(parser: argparse.ArgumentParser, path: str) -> tp.Iterator[tp.Tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` for ``parser`` and every sub-parser below it (each once)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: tp.Set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _walk(sub, f"{path} {name}")


def _leaves() -> tp.List[tp.Tuple[str, argparse.ArgumentParser]]:
    out = []
    for name, (module, _) in COMMANDS.items():
        parser = importlib.import_module(module).build_parser()
        for path, p in _walk(parser, name):
            if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
                out.append((path, p))
    return out


LEAVES = _leaves()


def _visible(p: argparse.ArgumentParser) -> tp.List[argparse.Action]:
    return [a for a in p._actions if a.help is not argparse.SUPPRESS]


def test_every_command_has_a_build_parser_and_sub_commands_through_the_convention():
    for name, (module, _) in COMMANDS.items():
        parser = importlib.import_module(module).build_parser()
        assert isinstance(parser, _cli.ArgumentParser), name
        for path, p in _walk(parser, name):
            assert isinstance(p, _cli.ArgumentParser), path  # one error line, exit 2
            subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
            for a in subs:  # add_subcommands: dest "cmd", required, COMMAND
                assert a.dest == "cmd" and a.required and a.metavar == "COMMAND", path
    names = {path for path, _ in LEAVES}
    assert {"bundle create", "bundle verify", "reproduce run", "reproduce compare", "ckpt ls", "data synth"} <= names


def test_every_output_option_is_dash_o_output_with_force():
    outputs = []
    for path, p in LEAVES:
        for a in p._actions:
            if a.dest == "output" or "-o" in a.option_strings or "--output" in a.option_strings:
                if a.help is argparse.SUPPRESS:
                    continue  # a hidden older spelling (--plot, --run-dir) of the same destination
                assert a.option_strings == ["-o", "--output"], (path, a.option_strings)
                assert a.metavar in ("FILE", "DIR"), (path, a.metavar)
                outputs.append(path)
                if path != "reproduce run":  # a new run directory: never replaces one, so no --force
                    assert "--force" in p._option_string_actions, path
                    assert a.help.startswith("write ") and a.help.endswith(
                        "; an existing output there is replaced only with --force"
                    ), (path, a.help)
        assert "--out" not in p._option_string_actions, path
        assert "--overwrite" not in p._option_string_actions or (
            p._option_string_actions["--overwrite"].help is argparse.SUPPRESS
        ), path
    assert set(outputs) >= {"report", "export-tensorboard", "bundle create", "capacity", "data synth", "reproduce run"}


def test_run_dir_has_one_help_text_everywhere():
    seen = []
    for path, p in LEAVES:
        for a in p._actions:
            if not a.option_strings and a.metavar == "RUN_DIR":
                assert a.help == CANONICAL_HELP["RUN_DIR"], (path, a.help)
                seen.append(path)
    assert set(seen) >= {"status", "report", "export-tensorboard", "bundle create", "approve", "reproduce compare"}
    assert "capacity" in seen


def test_every_reporting_command_has_json():
    for path, p in LEAVES:
        if path.split()[0] in NO_JSON:
            continue
        assert "--json" in p._option_string_actions, f"{path}: no --json"


def test_the_same_option_has_the_same_help_words_everywhere():
    helps: tp.Dict[str, tp.Dict[str, str]] = {}
    for path, p in LEAVES:
        for a in _visible(p):
            for opt in a.option_strings:
                helps.setdefault(opt, {})[path] = a.help or ""
    for opt, canonical in CANONICAL_HELP.items():
        if opt.startswith("-"):
            assert helps[opt] and set(helps[opt].values()) == {canonical}, (opt, helps[opt])
    for opt, by_path in helps.items():
        if opt in ("-h", "--help", "-o", "--output"):
            continue  # -o/--output: the same words, checked above; what is written differs
        if "reproduce run" in by_path and "submit" in by_path:  # reproduce run takes submit's flags as they are
            assert by_path["reproduce run"] == by_path["submit"], opt
        excluded = DIFFERENT_MEANING.get(opt, ((), ""))[0]
        same = {path: h for path, h in by_path.items() if path not in excluded}
        assert len(set(same.values())) <= 1, (opt, by_path)
    for path in STEP_COMMANDS:
        assert helps["--step"][path] == _cli.STEP_HELP, path


# ---------------------------------------------------------------------------------------------- the --json reports
def _strict(text: str) -> tp.Any:
    return json.loads(text, parse_constant=rundirs.reject_constant)


def _one_object(out: str, schema_prefix: str) -> tp.Dict[str, tp.Any]:
    doc = _strict(out)  # exactly one JSON document: json.loads refuses anything after it
    assert isinstance(doc, dict), type(doc)
    assert isinstance(doc.get("schema"), str) and doc["schema"].startswith(schema_prefix), doc.get("schema")
    return doc


def _run(capsys: tp.Any, *argv: str) -> tp.Tuple[int, str, str]:
    capsys.readouterr()
    code = hpctrain_main(list(argv))
    got = capsys.readouterr()
    assert "Traceback" not in got.err, got.err[-2000:]
    return code, got.out, got.err


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A small complete run directory (status's), with a NaN in a metrics record."""
    root = rundirs.build(tmp_path / "run")
    metrics = root / rundirs.METRICS
    metrics.write_text(metrics.read_text().replace('"loss": 2.1', '"loss": NaN'))
    return root


def test_status_json(run, capsys, monkeypatch):
    from hpctrain.status import cli as status_cli

    monkeypatch.setattr(status_cli, "collect", _with_fake_slurm(status_cli.collect))
    code, out, _ = _run(capsys, "status", str(run), "--json")
    assert code == 0
    _one_object(out, "hpctrain.status/")  # the NaN loss is null (the strict parser refuses NaN)


def _with_fake_slurm(collect: tp.Callable[..., tp.Any]) -> tp.Callable[..., tp.Any]:
    def call(run_dir: tp.Any, slurm: tp.Any = None) -> tp.Any:
        return collect(run_dir, slurm=slurm or rundirs.fake_slurm())

    return call


def test_report_json_and_the_overwrite_rule(tmp_path, capsys):
    from tests.report.synth import make_run

    root = tmp_path / "run"
    make_run(root)
    out = tmp_path / "r.html"
    code, stdout, _ = _run(capsys, "report", str(root), "-o", str(out), "--json")
    assert code == 0
    doc = _one_object(stdout, "hpctrain.report/")
    assert doc["output"] == str(out) and doc["bytes"] == out.stat().st_size
    # an existing output: refused without --force (exit 2, one line, the file unchanged), replaced with it
    out.write_text("keep me")
    code, stdout, err = _run(capsys, "report", str(root), "-o", str(out))
    assert code == 2 and err.count("\n") == 1 and "already exists; pass --force" in err and not stdout
    assert out.read_text() == "keep me"
    code, _, err = _run(capsys, "report", str(root), "-o", str(out), "--force")
    assert code == 0, err
    assert out.read_text().startswith("<!DOCTYPE html>") or "<html" in out.read_text()[:2000]
    # the default output too
    assert _run(capsys, "report", str(root))[0] == 0
    assert _run(capsys, "report", str(root))[0] == 2
    assert _run(capsys, "report", str(root), "--force")[0] == 0


def test_export_tensorboard_json_and_the_overwrite_rule(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tests.report.synth import make_run

    root = tmp_path / "run"
    make_run(root)
    logdir = tmp_path / "tb"
    code, out, err = _run(capsys, "export-tensorboard", str(root), "-o", str(logdir), "--json")
    assert code == 0, err
    doc = _one_object(out, "hpctrain.export-tensorboard/")
    assert doc["scalars"] > 0 and Path(doc["event_file"]).is_file()
    before = sorted(p.name for p in logdir.iterdir())
    code, out, err = _run(capsys, "export-tensorboard", str(root), "-o", str(logdir))
    assert code == 2 and err.count("\n") == 1 and "--force" in err
    assert sorted(p.name for p in logdir.iterdir()) == before
    assert _run(capsys, "export-tensorboard", str(root), "-o", str(logdir), "--force")[0] == 0
    assert _run(capsys, "export-tensorboard", str(root), "-o", str(logdir), "--overwrite")[0] == 0  # older spelling


def test_ckpt_json_objects(run, capsys):
    ckpts = run / "checkpoints"
    code, out, _ = _run(capsys, "ckpt", "ls", str(ckpts), "--json")
    assert code == 0
    doc = _one_object(out, "hpctrain.ckpt.ls/")
    assert [r["step"] for r in doc["checkpoints"] if r["status"] == "committed"] == [10, 20]
    code, out, _ = _run(capsys, "ckpt", "verify", str(ckpts), "--json")
    assert code in (0, 1)  # the fake checkpoints have no shards: invalid, still one object
    doc = _one_object(out, "hpctrain.ckpt.verify/")
    assert doc["ok"] is (code == 0) and {r["step"] for r in doc["checkpoints"]} == {10, 20}
    code, out, _ = _run(capsys, "ckpt", "gc", str(ckpts), "--keep", "5", "--dry-run", "--json")
    assert code == 0
    _one_object(out, "hpctrain.ckpt.gc/")


def test_data_json_objects(tmp_path, capsys):
    pytest.importorskip("h5py")
    out = tmp_path / "d.h5"
    code, stdout, err = _run(capsys, "data", "synth", "-o", str(out), "--samples", "8", "--shape", "4", "--json")
    assert code == 0, err
    assert _one_object(stdout, "hpctrain.data.synth/")["samples"] == 8
    for sub in ("inspect", "hash"):
        code, stdout, err = _run(capsys, "data", sub, str(out), "--json")
        assert code == 0, err
        _one_object(stdout, f"hpctrain.data.{sub}/")
    before = out.read_bytes()
    code, _, err = _run(capsys, "data", "synth", str(out), "--samples", "4", "--shape", "4")  # the older form
    assert code == 2 and err.count("\n") == 1 and "--force" in err and out.read_bytes() == before
    assert _run(capsys, "data", "synth", str(out), "--samples", "4", "--shape", "4", "--force")[0] == 0
    assert _run(capsys, "data", "synth", "--samples", "4")[0] == 2  # no output named


def test_approve_json(tmp_path, capsys):
    from tests.test_approvals import _commit

    root = tmp_path / "run"
    root.mkdir()
    _commit(root / "checkpoints", 10)
    code, out, err = _run(
        capsys, "approve", str(root), "--decision", "approved", "--by", "G", "--reason", "ok", "--json"
    )
    assert code == 0, err
    assert _one_object(out, "hpctrain.approvals/")["seq"] == 1


def test_capacity_json_is_one_object(run, capsys):
    code, out, err = _run(capsys, "capacity", str(run), "--json")
    if code == 0:
        _one_object(out, "hpctrain.capacity/")
    else:  # not a calibration run: one line, exit 2, nothing on stdout
        assert code == 2 and err.count("\n") == 1 and not out


def test_submit_json_dry_run_is_one_object(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "--entry", "hpctrain.examples.demo:main", "--cluster", "local", "--dry-run", "--json"]
    code, out, err = _run(capsys, *argv, "--run-dir", str(tmp_path / "r"))
    assert code == 0, err
    doc = _one_object(out, "hpctrain.submit/")
    assert doc["dry_run"] is True and doc["sbatch"].startswith("#!/bin/bash") and not (tmp_path / "r").exists()


def test_print_json_is_standard_and_one_object(capsys):
    _cli.print_json({"a": math.nan, "b": [math.inf, (1, -math.inf)], "c": Path("/x"), "schema": "old"}, schema="s/1")
    doc = _strict(capsys.readouterr().out)
    assert doc == {"schema": "s/1", "a": None, "b": [None, [1, None]], "c": "/x"}
    with pytest.raises(TypeError):
        _cli.print_json([1, 2], schema="s/1")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- sub-commands
def test_a_run_named_verify_is_reachable_and_bundle_verify_is_the_sub_command(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("verify").mkdir()  # a directory named like a sub-command, not a bundle
    code, out, err = _run(capsys, "bundle", "verify", "verify")
    assert code == 2 and err.count("\n") == 1 and "not an hpctrain bundle" in err  # verify read it as a BUNDLE
    code, out, err = _run(capsys, "bundle", "create", "verify", "-o", "b")
    assert code == 2 and err.count("\n") == 1 and "bundle" not in err.split("error:")[1][:12]
    assert "not a run" in err or "run directory" in err, err
    code, out, err = _run(capsys, "bundle", "./verify", "-o", "b")  # the short form of create
    assert code == 2 and ("not a run" in err or "run directory" in err), err
    # a word that is neither a sub-command nor an existing path: argparse's one line, never read as a run
    code, out, err = _run(capsys, "bundle", "verfy", "x")
    assert code == 2 and "invalid choice: 'verfy'" in err
    code, out, err = _run(capsys, "reproduce", "compare", "verify")
    assert code == 2 and "not a reproduction" in err


def test_bundle_json_create_and_verify_and_force(tmp_path, capsys):
    """The bundle of a real run: skipped where the demo cannot train (no torch)."""
    pytest.importorskip("torch")
    from hpctrain.rundir import RunDir
    from tests.bundle.conftest import DEMO_ARGS, _demo, write_identity
    from tests.multiproc import run_world

    run = RunDir(tmp_path / "verify")  # a run named like the sub-command
    run_world(_demo, 1, str(run.root), list(DEMO_ARGS), init_pg=False)
    write_identity(run, [("", 0)])
    out = tmp_path / "b"
    code, stdout, err = _run(capsys, "bundle", "create", str(run.root), "-o", str(out), "--json")
    assert code == 0, err
    _one_object(stdout, "hpctrain.bundle.create/")
    code, stdout, err = _run(capsys, "bundle", "verify", str(out), "--json")
    assert code == 0, err
    assert _one_object(stdout, "hpctrain.bundle.verify/")["ok"] is True
    listing = (out / "MANIFEST.sha256").read_bytes()
    code, _, err = _run(capsys, "bundle", str(run.root), "-o", str(out))  # the short form; OUT exists
    assert code == 2 and err.count("\n") == 1 and "--force" in err and (out / "MANIFEST.sha256").read_bytes() == listing
    code, _, err = _run(capsys, "bundle", str(run.root), "-o", str(out), "--force")
    assert code == 0, err
    assert _run(capsys, "bundle", "verify", str(out))[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "verify"]  # nothing left aside
    # --force never deletes a directory that is not a bundle
    other = tmp_path / "other"
    (other / "keep").mkdir(parents=True)
    code, _, err = _run(capsys, "bundle", str(run.root), "-o", str(other), "--force")
    assert code == 2 and "not a bundle" in err and (other / "keep").is_dir()
    shutil.rmtree(other)
