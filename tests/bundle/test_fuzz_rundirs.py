"""Seeded fuzz of run directories as people leave them: moved, copied, the checkpoint directory swapped for
another run's, ledgers edited or cut, identity manifests truncated. ``bundle`` and ``approve`` must either take
THIS run's checkpoint (a bundle that verifies; an approval of one of this run's manifests) or refuse in one line
with a non-zero exit: never a traceback, never another run's checkpoint."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import typing as tp
from pathlib import Path

import pytest

from hpctrain.__main__ import main as hpctrain_main
from hpctrain.bundle.verify import verify_bundle
from hpctrain.rundir import RunDir
from tests.fuzzing import bounded

CASES = 24
SEED = 20240528


def _manifests(ckpt_dir: Path) -> tp.Dict[str, str]:
    """sha256 of each checkpoint's MANIFEST.json -> its run identity."""
    return {
        hashlib.sha256(m.read_bytes()).hexdigest(): json.loads(m.read_text()).get("identity")
        for m in ckpt_dir.glob("step-*/MANIFEST.json")
    }


def _other_run(demo_run: RunDir, dst: Path, rng: random.Random) -> Path:
    """Another run's checkpoint directory: the demo's checkpoints, their manifests carrying another identity."""
    shutil.copytree(demo_run.checkpoints, dst)
    ident = "%064x" % rng.getrandbits(256)
    for m in dst.glob("step-*/MANIFEST.json"):
        doc = json.loads(m.read_text())
        doc["identity"] = ident
        m.write_text(json.dumps(doc))
    return dst


def _edit_ledger(run: RunDir, rng: random.Random, old_ckpts: Path) -> str:
    lines = [json.loads(line) for line in run.ledger.read_text().splitlines()]
    how = rng.choice(["moved", "moved", "no identity", "relative", "garbage", "cut", "gone", "as is"])
    for rec in lines:
        if rec.get("event") != "start":
            continue
        if how in ("moved", "no identity"):
            rec["checkpoint_dir"] = str(old_ckpts)
        if how == "no identity":
            rec.pop("identity", None)
        if how == "relative":
            rec["checkpoint_dir"] = "checkpoints"
        if how == "garbage":
            rec["checkpoint_dir"] = rng.choice(["", "\u0000x", 7, None, "/dev/null", "/nonexistent/ckpts"])
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if how == "cut":
        text = text[: rng.randrange(len(text))]
    if how == "gone":
        run.ledger.unlink()
    else:
        run.ledger.write_text(text)
    return how


def _world(demo_run: RunDir, root: Path, rng: random.Random) -> tp.Tuple[RunDir, tp.List[str], tp.Set[str], str]:
    """One damaged world under ``root``: the run, extra bundle/approve flags, this run's manifest shas, a label."""
    run = RunDir(root / "run")
    shutil.copytree(demo_run.root, run.root)
    mine = set(_manifests(run.checkpoints))
    old = root / "old" / "checkpoints"
    at_old = rng.choice(["nothing", "another run", "a copy of this run"])
    if at_old == "another run":
        _other_run(demo_run, old, rng)
    elif at_old == "a copy of this run":
        shutil.copytree(run.checkpoints, old)
    ledger = _edit_ledger(run, rng, old)
    own = rng.choice(["kept", "kept", "removed", "swapped for another run's"])
    if own != "kept":
        shutil.rmtree(run.checkpoints)
    if own == "swapped for another run's":
        _other_run(demo_run, run.checkpoints, rng)
    identity = rng.choice(["intact", "intact", "truncated", "removed"])
    for f in run.identity.glob("*.json"):
        if identity == "truncated" and rng.random() < 0.7:
            raw = f.read_bytes()
            f.write_bytes(raw[: rng.randrange(len(raw))])
        elif identity == "removed":
            f.unlink()
    flags: tp.List[str] = []
    given = rng.choice(["none", "none", "ours", "another run's", "missing"])
    if given == "ours":
        shutil.copytree(demo_run.checkpoints, root / "given")
        flags = ["--checkpoint-dir", str(root / "given")]
    elif given == "another run's":
        flags = ["--checkpoint-dir", str(_other_run(demo_run, root / "given", rng))]
    elif given == "missing":
        flags = ["--checkpoint-dir", str(root / "nowhere")]
    if rng.random() < 0.3:
        flags += ["--step", str(rng.choice([3, 6, 4]))]
    label = f"old path: {at_old}; ledger: {ledger}; own dir: {own}; identity: {identity}; --checkpoint-dir: {given}"
    return run, flags, mine, label


def _one_line_refusal(rc: int, err: str, command: str, label: str) -> None:
    assert rc != 0, label
    assert "Traceback" not in err, (label, err)
    assert err.count("\n") == 1 and err.startswith(f"hpctrain {command}: error: "), (label, err)


@pytest.mark.slow
def test_bundle_and_approve_take_this_run_s_checkpoint_or_refuse_in_one_line(demo_run, tmp_path, capsys):
    rng = random.Random(SEED)
    outcomes: tp.Dict[str, int] = {"bundled": 0, "refused": 0, "approved": 0, "approval refused": 0}
    for case in range(CASES):
        root = tmp_path / f"case{case}"
        with bounded(20):
            run, flags, mine, label = _world(demo_run, root, rng)
            capsys.readouterr()
            out = root / "bundle"
            rc = hpctrain_main(["bundle", str(run.root), "-o", str(out), *flags])
            err = capsys.readouterr().err
            if rc == 0:
                report = verify_bundle(out)
                assert report["ok"], (label, [p for c in report["checks"] for p in c["problems"]])
                bundled = _manifests(out / "checkpoint")
                assert set(bundled) <= mine and bundled, (label, "another run's checkpoint was bundled")
                outcomes["bundled"] += 1
            else:
                _one_line_refusal(rc, err, "bundle", label)
                assert not out.exists() and not list(root.glob(".bundle.tmp-*")), label
                outcomes["refused"] += 1
            argv = ["approve", str(run.root), "--decision", "approved", "--by", "fuzz", "--reason", label[:200]]
            rc = hpctrain_main([*argv, *flags, "--json"])
            captured = capsys.readouterr()
            if rc == 0:
                entry = json.loads(captured.out)
                assert entry["checkpoint"]["manifest_sha256"] in mine, (label, "another run's checkpoint approved")
                outcomes["approved"] += 1
            else:
                _one_line_refusal(rc, captured.err, "approve", label)
                outcomes["approval refused"] += 1
        shutil.rmtree(root)
    # the seed reaches both sides of each command
    assert all(outcomes.values()), outcomes
