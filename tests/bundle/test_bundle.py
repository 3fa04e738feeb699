"""``bundle`` and ``bundle verify`` on a real small run: what is inside, and that any damage is named."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hpctrain.__main__ import main as hpctrain_main
from hpctrain.approvals import approve
from hpctrain.bundle._io import regular_files
from hpctrain.bundle.build import build_bundle
from hpctrain.bundle.layout import BundleLayout
from hpctrain.bundle.verify import verify_bundle
from hpctrain.errors import UsageError
from tests.bundle.conftest import identity_record


def _problems(report):
    return [p for c in report["checks"] for p in c["problems"]]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def bundle(demo_run, tmp_path_factory) -> Path:
    """One bundle of the demo run, built once (copied where a test changes it)."""
    out = tmp_path_factory.mktemp("out") / "demo.bundle"
    build_bundle(demo_run.root, out, copy=True)
    return out


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.bundle"
    shutil.copytree(bundle, dst)
    return dst


def test_bundle_holds_every_part_and_verifies(demo_run, bundle):
    lay = BundleLayout(bundle)
    files = sorted(lay.rel(f) for f in regular_files(bundle)[0])
    assert files == [
        "MANIFEST.sha256",
        "README.md",
        "bundle.json",
        "checkpoint/step-000000006/MANIFEST.json",
        "checkpoint/step-000000006/rank-00000-of-00002.shard",
        "checkpoint/step-000000006/rank-00001-of-00002.shard",
        "code/snapshot.tar.gz",
        "data/fingerprint.json",
        "environment/requirements.lock",
        "identity/local-r0.json",
        "identity/submit.json",
        "ro-crate-metadata.json",
        "ro-crate-preview.html",
        "run/approvals.jsonl",
        "run/ledger.jsonl",
        "run/metrics.jsonl",
        "run/submission.json",
    ]
    assert lay.requirements_lock.read_text().splitlines()[4:] == [
        "h5py==3.12.1",
        "hpctrain==0.1.0",
        "numpy==2.1.0",
        "torch==2.13.0+cpu",
    ]
    assert (bundle / "run/metrics.jsonl").read_bytes() == demo_run.metrics.read_bytes()
    record = json.loads(lay.record.read_text())
    assert record["checkpoint"]["step"] == 6 and record["checkpoint"]["link"] == "copy"
    assert record["approvals"]["entries"] == 2 and record["run_identity"] == identity_record("attempt")["identity"]
    # sha256sum reads the file list as it is (the self line is a comment to it)
    out = subprocess.run(["sha256sum", "-c", "--quiet", "MANIFEST.sha256"], cwd=bundle, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    report = verify_bundle(bundle)
    assert report["ok"], _problems(report)
    assert [c["check"] for c in report["checks"]] == ["files", "checkpoint", "approvals", "identity", "crate"]
    assert [a["decision"] for a in report["approvals"]] == ["approved", "rejected"]


def test_checkpoint_is_hard_linked_on_one_filesystem_and_copied_on_request(run_copy, tmp_path):
    src = run_copy.checkpoints / "step-000000006" / "rank-00000-of-00002.shard"
    linked = build_bundle(run_copy.root, tmp_path / "linked")
    assert linked["checkpoint"]["link"] == "hardlink"
    assert (
        os.stat(tmp_path / "linked/checkpoint/step-000000006/rank-00000-of-00002.shard").st_ino == os.stat(src).st_ino
    )
    copied = build_bundle(run_copy.root, tmp_path / "copied", copy=True, step=3)
    assert copied["checkpoint"]["link"] == "copy" and copied["checkpoint"]["step"] == 3
    assert os.stat(tmp_path / "copied/checkpoint/step-000000003/MANIFEST.json").st_nlink == 1
    assert verify_bundle(tmp_path / "linked")["ok"] and verify_bundle(tmp_path / "copied")["ok"]


def test_a_flipped_byte_in_any_file_fails_verify_and_names_the_file(bundle, tmp_path):
    pristine = _copy(bundle, tmp_path)
    lay = BundleLayout(pristine)
    files = [lay.rel(f) for f in regular_files(pristine)[0]]
    assert len(files) == 17
    for rel in files:
        size = (pristine / rel).stat().st_size
        for at in (0, size // 2, size - 1):
            damaged = tmp_path / "damaged"
            shutil.rmtree(damaged, ignore_errors=True)
            shutil.copytree(pristine, damaged)
            _flip(damaged / rel, at)
            report = verify_bundle(damaged)
            files_check = report["checks"][0]
            assert not report["ok"] and not files_check["ok"], (rel, at)
            assert any(p.startswith(rel + ":") for p in files_check["problems"]), (rel, at, files_check["problems"])


def test_missing_extra_and_linked_files_are_named(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    (b / "run/ledger.jsonl").unlink()
    (b / "notes.txt").write_text("added later")
    os.symlink("/etc/passwd", b / "data/link")
    problems = _problems(verify_bundle(b))
    assert "run/ledger.jsonl: missing (listed in MANIFEST.sha256)" in problems
    assert "notes.txt: not in MANIFEST.sha256 (added after the bundle was written)" in problems
    assert any(p.startswith("data/link: a symbolic link or special file") for p in problems)


def test_an_approval_removed_from_the_end_is_caught_by_the_recorded_head(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    log = b / "run/approvals.jsonl"
    log.write_text(log.read_text().splitlines()[0] + "\n")  # the chain alone cannot see this
    report = verify_bundle(b)
    approvals = report["checks"][2]
    assert not approvals["ok"] and any("the bundle recorded 2" in p for p in approvals["problems"])


def test_tar_round_trip_and_damage(demo_run, tmp_path):
    out = tmp_path / "demo.tar"
    summary = build_bundle(demo_run.root, out, tar=True)
    assert summary["format"] == "tar" and out.is_file()
    with tarfile.open(out) as tf:
        names = tf.getnames()
        assert names[0] == "demo" and all(n == "demo" or n.startswith("demo/") for n in names)
        assert all(m.isdir() or m.isreg() for m in tf.getmembers())
    report = verify_bundle(out)
    assert report["ok"] and report["format"] == "tar", _problems(report)
    assert not list(tmp_path.glob(".hpctrain-verify-*"))  # its scratch copy is gone
    # a flipped byte in a member's data
    with tarfile.open(out) as tf:
        member = tf.getmember("demo/run/metrics.jsonl")
        at = member.offset_data + 10
    damaged = tmp_path / "damaged.tar"
    shutil.copy(out, damaged)
    _flip(damaged, at)
    report = verify_bundle(damaged)
    assert not report["ok"] and any(p.startswith("run/metrics.jsonl: sha256 mismatch") for p in _problems(report))
    # damage in the first header: exit 1 naming the tar, not "bad input"
    shutil.copy(out, damaged)
    _flip(damaged, 100)
    assert hpctrain_main(["bundle", "verify", str(damaged)]) == 1
    # a member that is a link is refused by name and never followed
    evil = tmp_path / "evil.tar"
    with tarfile.open(out) as src, tarfile.open(evil, "w") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        link = tarfile.TarInfo("demo/data/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        dst.addfile(link)
    problems = _problems(verify_bundle(evil))
    assert "data/escape: a link in the tar; not unpacked" in problems


def test_never_overwrites_out_and_leaves_nothing_behind(demo_run, tmp_path, capsys):
    for existing in (tmp_path / "empty-dir", tmp_path / "file.tar"):
        if existing.suffix:
            existing.write_text("keep me")
        else:
            existing.mkdir()
        argv = ["bundle", str(demo_run.root), "-o", str(existing)] + (["--tar"] if existing.suffix else [])
        assert hpctrain_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "already exists; pass --force to replace it" in err
    assert (tmp_path / "file.tar").read_text() == "keep me" and not any((tmp_path / "empty-dir").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-dir", "file.tar"]
    # a failure half way leaves no temporary behind either
    with pytest.raises(UsageError):
        build_bundle(demo_run.root, tmp_path / "x", step=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-dir", "file.tar"]


def test_bad_input_is_exit_2_with_one_line(demo_run, bundle, tmp_path, capsys):
    cases = [
        (["bundle", str(tmp_path / "nope"), "-o", str(tmp_path / "o")], "is not a directory"),
        (["bundle", str(tmp_path), "-o", str(tmp_path / "o")], "not a run"),
        (["bundle", str(demo_run.root), "-o", str(tmp_path / "o"), "--step", "4"], "--step 4 is not a committed"),
        (["bundle", str(demo_run.root)], "the following arguments are required: -o/--output"),
        (["bundle", "verify", str(tmp_path / "nope")], "does not exist"),
        (["bundle", "verify", str(demo_run.root)], "not an hpctrain bundle"),
        (["bundle", "verify", str(demo_run.metrics)], "neither a bundle directory nor a tar"),
    ]
    for argv, message in cases:
        assert hpctrain_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("hpctrain bundle: error: ") and message in err, err


def test_verify_cli_report_json_and_exit_1(bundle, tmp_path, capsys):
    assert hpctrain_main(["bundle", "verify", str(bundle), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["record"]["checkpoint"]["step"] == 6
    b = _copy(bundle, tmp_path)
    _flip(b / "checkpoint/step-000000006/rank-00001-of-00002.shard", 999)
    assert hpctrain_main(["bundle", "verify", str(b)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "rank-00001-of-00002.shard: sha256 mismatch" in " ".join(out.split())
    # recorded text is shown as text: the reason's markup is printed, not interpreted
    env = {**os.environ, "COLUMNS": "250"}
    shown = subprocess.run(
        [sys.executable, "-m", "hpctrain", "bundle", "verify", str(bundle)], capture_output=True, text=True, env=env
    )
    assert shown.returncode == 0 and "loss falls [red]as expected[/red]" in shown.stdout


def test_identity_change_between_attempts_is_shown_not_failed(run_copy, tmp_path):
    from hpctrain.ledger import Ledger

    Ledger(run_copy).append(
        {"event": "start", "time": 2e9, "job_id": "", "restart_count": 1, "checkpoint_dir": str(run_copy.checkpoints)}
    )
    run_copy.identity_attempt("", 1).write_text(json.dumps(identity_record("attempt", "", 1, seed=1)))
    approve(run_copy, decision="approved", by="a", reason="b")
    report = verify_bundle(Path(build_bundle(run_copy.root, tmp_path / "b")["bundle"]))
    identity = report["checks"][3]
    assert report["ok"] and identity["ok"], _problems(report)
    assert any("the identity changed between attempts" in w for w in identity["warnings"])


def test_an_edited_manifest_is_caught_by_its_recomputed_identity(bundle, tmp_path):
    pytest.importorskip("hpctrain.identity")
    b = _copy(bundle, tmp_path)
    path = b / "identity/local-r0.json"
    doc = json.loads(path.read_text())
    doc["config"]["seed"] = 1234  # and re-list the file, as a careful forger would
    path.write_text(json.dumps(doc))
    from hpctrain.bundle._io import hash_file
    from hpctrain.bundle.build import file_list_text

    listed = [line.split("  ", 1) for line in (b / "MANIFEST.sha256").read_text().splitlines()[:-1]]
    entries = [(rel, hash_file(path)[0] if rel == "identity/local-r0.json" else sha) for sha, rel in listed]
    (b / "MANIFEST.sha256").write_text(file_list_text(entries))
    report = verify_bundle(b)
    assert report["checks"][0]["ok"]  # the file list agrees: only the identity check can tell
    assert any("recomputed" in p and "the manifest was edited" in p for p in report["checks"][3]["problems"])


def test_login_path_never_imports_torch(bundle, demo_run, tmp_path):
    code = (
        "import sys\nfrom hpctrain.__main__ import main\n"
        f"assert main(['bundle', 'verify', {str(bundle)!r}, '--json']) == 0\n"
        f"assert main(['bundle', {str(demo_run.root)!r}, '-o', {str(tmp_path / 'b')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def _as_another_run(ckpt_dir: Path, identity: str) -> None:
    """Make the checkpoints another run's: their manifests carry another run identity (nothing else changes)."""
    for m in ckpt_dir.glob("step-*/MANIFEST.json"):
        doc = json.loads(m.read_text())
        doc["identity"] = identity
        m.unlink()  # a hard link of the demo's: write a new file, never through the link
        m.write_text(json.dumps(doc))


def _moved_demo(demo_run, tmp_path: Path):
    """The demo run moved with mv from old/ to new/ (its ledger names old/checkpoints still); another run at old/."""
    new = tmp_path / "new"
    shutil.copytree(demo_run.root, new)
    old = tmp_path / "old"
    lines = [json.loads(line) for line in (new / "train/ledger.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec.get("checkpoint_dir"):
            rec["checkpoint_dir"] = str(old / "checkpoints")
    (new / "train/ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    shutil.copytree(demo_run.root, old)
    _as_another_run(old / "checkpoints", "f" * 64)
    return new, old


def test_a_moved_run_bundles_its_own_checkpoint_never_the_run_now_at_its_old_path(demo_run, tmp_path, capsys):
    """Before: bundle packed the checkpoint of the run now at the recorded path, and verify passed."""
    new, old = _moved_demo(demo_run, tmp_path)
    summary = build_bundle(new, tmp_path / "b")
    assert verify_bundle(tmp_path / "b")["ok"]
    ck = summary["checkpoint"]
    assert ck["source"] == str((new / "checkpoints/step-000000006").resolve()) and ck["source_dir"] == "run directory"
    assert ck["run_identity"] != "f" * 64 and ck["ownership"].startswith("checked")
    assert any("belongs to run ffffffffffff" in n for n in summary["notes"])
    # only the other run's checkpoints left: refused in one line, nothing written; --checkpoint-dir names ours
    shutil.move(str(new / "checkpoints"), tmp_path / "ours")
    assert hpctrain_main(["bundle", str(new), "-o", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "belongs to run ffffffffffff" in err and "--checkpoint-dir DIR" in err
    assert not (tmp_path / "c").exists()
    argv = ["bundle", str(new), "-o", str(tmp_path / "c"), "--checkpoint-dir", str(tmp_path / "ours")]
    assert hpctrain_main(argv) == 0 and verify_bundle(tmp_path / "c")["ok"]
    assert (
        hpctrain_main(["bundle", str(new), "-o", str(tmp_path / "d"), "--checkpoint-dir", str(old / "checkpoints")])
        == 2
    )
    assert "belongs to run ffffffffffff" in capsys.readouterr().err


def test_out_inside_the_run_or_around_it_is_refused_and_nothing_is_written(run_copy, tmp_path, capsys):
    (tmp_path / "link").symlink_to(run_copy.root)
    before = sorted(p.relative_to(run_copy.root) for p in run_copy.root.rglob("*"))
    for out, what in (
        (run_copy.root / "bundle", "is inside the run directory"),
        (tmp_path / "link" / "deeper" / "bundle", "is inside the run directory"),
        (run_copy.checkpoints / "bundle", "is inside the run directory"),
    ):
        assert hpctrain_main(["bundle", str(run_copy.root), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and what in err, err
    assert sorted(p.relative_to(run_copy.root) for p in run_copy.root.rglob("*")) == before
    # a checkpoint directory outside the run: the bundle is not written into it either
    outside = tmp_path / "ckpts"
    shutil.move(str(run_copy.checkpoints), outside)
    argv = ["bundle", str(run_copy.root), "--checkpoint-dir", str(outside), "-o", str(outside / "b")]
    assert hpctrain_main(argv) == 2 and "is inside the run's checkpoint directory" in capsys.readouterr().err
    assert not (outside / "b").exists() and not list(outside.glob(".b.tmp-*"))


def test_a_format_1_identity_is_a_named_warning_not_a_silent_pass(bundle):
    """Issue 28 group 3: records from before the snapshot binding verify, and the report says what is weaker."""
    report = verify_bundle(bundle)
    identity = next(c for c in report["checks"] if c["check"] == "identity")
    assert report["ok"] and identity["ok"]
    (warning,) = [w for w in identity["warnings"] if "format 1" in w]
    assert (
        "identity/submit.json" in warning and "code/snapshot.tar.gz is checked against its recorded sha256" in warning
    )


def test_a_compressed_bundle_tar_is_streamed_not_unpacked(bundle, tmp_path, monkeypatch):
    """Issue 28 group 6: a .tar.gz verifies without unpacking it; a member over its recorded size is refused at its
    header; nothing is written beside the archive and the scratch is the records alone."""
    out = tmp_path / "b.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(str(bundle), arcname="b")
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    report = verify_bundle(out)
    assert report["ok"] and report["format"] == "tar", _problems(report)
    shards = sum(f.stat().st_size for f in (bundle / "checkpoint").rglob("*.shard"))
    assert report["archive"]["scratch_bytes"] < sum(f.stat().st_size for f in regular_files(bundle)[0]) - shards
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar.gz", "tmp"] and not any(private.iterdir())
    grown = tmp_path / "grown.tar.gz"
    with tarfile.open(out) as src, tarfile.open(grown, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if m.name == "b/run/metrics.jsonl":
                data += b"\n" * 100_000
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    problems = _problems(verify_bundle(grown))
    assert any(p.startswith("run/metrics.jsonl: ") and "the bundle recorded" in p for p in problems), problems
