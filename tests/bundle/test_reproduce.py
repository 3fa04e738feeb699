"""``python -m hpctrain reproduce``: a user's run rebuilt from its bundle alone, on CPU, bit for bit.

The user's entry lives in a git repository of its own with an uncommitted change and an untracked file that
both matter (the learning rate comes from the untracked file, through the uncommitted import); the run trains on
``data synth``'s learnable data. After bundling, the bundle is moved away, the run directory and the repository
are deleted and the data file moves: reproduce must rebuild the code from the snapshot, find the data by name,
and reach the same losses, from scratch (locally, and once through the dev Slurm cluster) and in the replay drill
from the bundled checkpoint."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import typing as tp
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir, read_jsonl

GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]
ENV = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
ARGS = ["--steps", "30", "--log-every", "5", "--ckpt-every", "10", "--batch-size", "32", "--workers", "0", "--quiet"]
COMMITTED = 'from hpctrain.examples import demo\n\nLR = "0.5"\n\n\ndef main(ctx):\n'
DIRTY = "from hpctrain.examples import demo\nfrom lrconf import LR  # uncommitted: an untracked file decides\n\n\n"
DIRTY += "def main(ctx):\n"
BODY = '    object.__setattr__(ctx, "args", ("--lr", LR, *ctx.args))\n    return demo.main(ctx)\n'


def hpctrain(*args: str, cwd: tp.Optional[Path] = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def losses(run_dir: Path) -> tp.Dict[int, float]:
    records, problems = read_jsonl(RunDir(run_dir).metrics)
    assert problems == []
    return {r["step"]: r["loss"] for r in records if r.get("kind") == "interval"}


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> tp.Dict[str, tp.Any]:
    """The original run (local, 1 rank, 30 steps, checkpoints at 10/20/30), its loss curve, and its bundle of step
    20 moved elsewhere; the run directory and the repository are gone, the data file moved."""
    base = tmp_path_factory.mktemp("orig")
    data = base / "data.h5"
    got = hpctrain("data", "synth", str(data), "--samples", "2000", "--shape", "3,8,8", "--compression", "gzip")
    assert got.returncode == 0, got.stderr
    repo = base / "repo"
    repo.mkdir()
    (repo / "mymod.py").write_text(COMMITTED + BODY)
    (repo / ".gitignore").write_text("__pycache__/\nruns/\n")
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "lr 0.5"], check=True)
    (repo / "mymod.py").write_text(DIRTY + BODY)  # an uncommitted change ...
    (repo / "lrconf.py").write_text('LR = "0.3"\n')  # ... and an untracked file, both needed to run
    run = base / "run"
    sub = subprocess.run(
        [sys.executable, "-m", "hpctrain.submit", "--cluster", "local", "--nodes", "1", "--entry", "mymod:main",
         "--run-dir", str(run), "--", "--data", str(data), *ARGS],
        cwd=repo, env=ENV, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stdout + sub.stderr
    curve = losses(run)
    assert sorted(curve) == [5, 10, 15, 20, 25, 30] and curve[30] < curve[5]  # learnable data: the loss falls
    got = hpctrain("bundle", str(run), "-o", str(base / "bundle"), "--step", "20")
    assert got.returncode == 0, got.stderr
    got = hpctrain("bundle", str(run), "-o", str(base / "bundle-last"))  # the newest: step 30, the last
    assert got.returncode == 0, got.stderr
    got = hpctrain("bundle", str(run), "-o", str(base / "bundle.tar"), "--step", "20", "--tar")
    assert got.returncode == 0, got.stderr
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    bundle = elsewhere / "bundle"
    shutil.move(str(base / "bundle"), bundle)
    shutil.move(str(base / "bundle-last"), elsewhere / "bundle-last")
    shutil.move(str(base / "bundle.tar"), elsewhere / "bundle.tar")
    (elsewhere / "data").mkdir()
    moved = elsewhere / "data" / "data.h5"
    shutil.move(str(data), moved)
    shutil.rmtree(run)
    shutil.rmtree(repo)
    return {"bundle": bundle, "data": moved, "curve": curve, "old_data": str(data), "root": elsewhere}


def reproduce(original, *args: str, run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """reproduce in a fresh interpreter (cwd: nowhere near the original), reporting whether it imported torch."""
    argv = ["reproduce", str(original["bundle"]), "--data", str(original["data"]), "--run-dir", str(run_dir), *args]
    code = (
        "import sys\nfrom hpctrain.__main__ import main\n"
        f"rc = main({argv!r})\nprint('TORCH_IMPORTED', 'torch' in sys.modules, file=sys.stderr)\nsys.exit(rc)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=original["root"], env=ENV, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def from_scratch(original) -> tp.Dict[str, tp.Any]:
    run = original["root"] / "again"
    got = reproduce(original, "--cluster", "local", "--json", run_dir=run)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "TORCH_IMPORTED False" in got.stderr  # the login-node process never imports torch
    return {"run": run, "report": json.loads(got.stdout)}


def test_reproduce_from_scratch_reaches_the_recorded_loss_curve_bit_for_bit(original, from_scratch):
    run, report = from_scratch["run"], from_scratch["report"]
    assert losses(run) == original["curve"]  # every interval, exactly (read independently of reproduce's compare)
    comparison = report["comparison"]
    assert comparison["ok"] and comparison["compared"] == 6 and comparison["differ"] == 0
    assert [r["step"] for r in comparison["rows"]] == [5, 10, 15, 20, 25, 30]
    # the code came from the snapshot: the uncommitted import and the untracked file, in a re-created git commit
    tree = RunDir(run).reproduced_code / "entry"
    assert (tree / "lrconf.py").read_text() == 'LR = "0.3"\n'
    diff = subprocess.run(["git", "-C", str(tree), "diff", "HEAD"], capture_output=True, text=True).stdout
    assert '-LR = "0.5"' in diff and "+from lrconf import LR" in diff
    entry = report["code"]["repositories"]["entry"]
    assert entry["problems"] == [] and entry["diff_matches"] and entry["checked"] == 2
    # the job ran from that tree (in the tree's equivalent of the submission's directory), not from anything installed
    submission = json.loads(RunDir(run).submission.read_text())
    assert submission["config"]["code_path"] == str(tree) and submission["cwd"] == str(tree)
    assert submission["config"]["entry_args"][:2] == ["--data", str(original["data"])]  # the moved data file
    assert report["args"]["rewrites"][0] == {
        "from": original["old_data"],
        "to": str(original["data"]),
        "why": "input file",
    }
    assert report["data"]["matched"] == "by name" and report["data"]["files"][0]["content"] == "same (sampled)"
    assert {r["what"]: r["status"] for r in report["environment"]["rows"]}["python"] == "same"
    # the same data; the config names the moved data file, the code's commit is the re-created one
    assert report["identity"]["same"][:1] == ["data"] and {"code", "config"} <= set(report["identity"]["differ"])


def test_compare_later_and_a_changed_loss_is_named(original, from_scratch, tmp_path):
    got = hpctrain("reproduce", "compare", str(from_scratch["run"]))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "loss matches: 6 interval(s) bit-exact" in got.stdout
    copy = tmp_path / "copy"
    shutil.copytree(from_scratch["run"], copy, symlinks=True)
    lines = RunDir(copy).metrics.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for rec in records:
        if rec.get("kind") == "interval" and rec["step"] == 15:
            rec["loss"] = float(rec["loss"]) + 1e-7
    RunDir(copy).metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    got = hpctrain("reproduce", "compare", str(copy), "--json")
    assert got.returncode == 1
    result = json.loads(got.stdout)
    assert result["differ"] == 1 and [r["step"] for r in result["rows"] if r["equal"] is False] == [15]
    got = hpctrain("reproduce", "compare", str(copy), "--tolerance", "1e-6")
    assert got.returncode == 0, got.stdout


def test_replay_drill_from_the_bundled_checkpoint_matches_step_by_step(original):
    run = original["root"] / "drill"
    got = reproduce(original, "--steps", "10", "--json", run_dir=run)  # the recorded cluster: local
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "TORCH_IMPORTED False" in got.stderr
    report = json.loads(got.stdout)
    rows = report["comparison"]["rows"]
    assert [(r["step"], r["equal"]) for r in rows] == [(25, True), (30, True)]
    assert {s: loss for s, loss in losses(run).items()} == {25: original["curve"][25], 30: original["curve"][30]}
    start = [r for r in read_jsonl(RunDir(run).ledger)[0] if r.get("event") == "start"][0]
    assert start["resumed_from_step"] == 20  # from the bundled checkpoint, placed and verified
    assert report["checkpoint_placed"]["step"] == 20 and Path(report["checkpoint_placed"]["path"]).parent == (
        RunDir(run).checkpoints
    )
    # --steps is the total step count: the bundled step 20 + 10
    assert report["args"]["submitted"][report["args"]["submitted"].index("--steps") + 1] == "30"


@pytest.mark.slurm
def test_reproduce_through_the_dev_slurm_cluster(original):
    run = original["root"] / "on-slurm"
    got = reproduce(original, "--cluster", "slurm", "--follow", "--time", "5", "--json", run_dir=run, timeout=420)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    report = json.loads(got.stdout)
    assert report["submission"]["cluster"] == "slurm" and report["comparison"]["ok"]
    assert losses(run) == original["curve"]
    hosts = [r.get("hosts") for r in read_jsonl(RunDir(run).ledger)[0] if r.get("event") == "start"]
    assert hosts and hosts[0][0].startswith("node")  # it ran on a cluster node


def test_changed_data_is_refused_with_one_line(original, tmp_path):
    import h5py

    changed = tmp_path / "data.h5"
    shutil.copy(original["data"], changed)
    with h5py.File(changed, "r+") as f:  # one attribute: the cheap tier (HDF5 structure) catches it
        f["x"].attrs["edited"] = 1
    run = tmp_path / "refused"
    got = hpctrain("reproduce", str(original["bundle"]), "--data", str(changed), "--run-dir", str(run))
    assert got.returncode == 1
    (line,) = got.stderr.strip().splitlines()
    assert line.startswith(f"hpctrain reproduce: error: --data {changed}: does not match the recorded data.h5")
    assert "'/x' attrs.edited" in line
    assert not run.exists()  # nothing written, nothing submitted


def test_changed_content_that_keeps_the_structure_is_refused(original, tmp_path):
    import h5py
    import numpy as np

    changed = tmp_path / "data.h5"
    shutil.copy(original["data"], changed)
    with h5py.File(changed, "r+") as f:  # the first chunk (always sampled) of the labels, same shape and dtype
        y = f["y"]
        y[0] = (int(y[0]) + 1) % 10
        assert y.dtype == np.int64
    got = hpctrain("reproduce", str(original["bundle"]), "--data", str(changed), "--run-dir", str(tmp_path / "r"))
    assert got.returncode == 1
    (line,) = got.stderr.strip().splitlines()
    assert "does not match the recorded data.h5" in line and ("sampled content of '/y'" in line or "size" in line)


def test_tampered_bundle_and_not_a_bundle_are_refused(original, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(original["bundle"], bundle)
    snap = bundle / "code" / "snapshot.tar.gz"
    raw = bytearray(snap.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    snap.write_bytes(bytes(raw))
    got = hpctrain("reproduce", str(bundle), "--data", str(original["data"]), "--run-dir", str(tmp_path / "r"))
    assert got.returncode == 1
    (line,) = got.stderr.strip().splitlines()
    assert "does not verify: files: code/snapshot.tar.gz: sha256 mismatch" in line
    assert not (tmp_path / "r").exists()
    got = hpctrain("reproduce", str(tmp_path), "--data", str(original["data"]))
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1 and "not an hpctrain bundle" in got.stderr


def test_bad_input_is_one_line_before_any_work(original, tmp_path):
    common = ["--data", str(original["data"]), "--run-dir", str(tmp_path / "r")]
    got = hpctrain("reproduce", str(original["bundle"]), *common, "--nodes", "0")
    assert got.returncode == 2 and got.stderr.strip().splitlines() == [
        "hpctrain reproduce: error: --nodes 0 must be at least 1"
    ]
    got = hpctrain("reproduce", str(original["bundle"]), "--run-dir", str(tmp_path / "r"))
    assert got.returncode == 2 and "--data: the run read 1 input file(s), data.h5: give a path for each" in got.stderr
    got = hpctrain("reproduce", str(original["root"] / "bundle-last"), *common, "--steps", "5")
    assert got.returncode == 2 and "the recorded metrics have no interval after it" in got.stderr  # nothing to compare
    got = hpctrain("reproduce", str(original["bundle"]), *common, "--entry", "other:main")
    assert got.returncode == 2 and "unrecognized arguments: --entry" in got.stderr  # the entry is the recorded one
    assert not (tmp_path / "r").exists()


def test_a_run_dir_inside_the_bundle_or_around_it_is_refused_and_nothing_is_written(original, tmp_path):
    """Before: --run-dir inside the bundle wrote the run into it, and the bundle no longer verified."""
    bundle = tmp_path / "bundle"
    shutil.copytree(original["bundle"], bundle)
    before = sorted(p.relative_to(bundle) for p in bundle.rglob("*"))
    (tmp_path / "link").symlink_to(bundle)  # the same bundle through a symlink
    (tmp_path / "around").mkdir()
    for run_dir, what in (
        (bundle / "again", "is inside the bundle"),
        (tmp_path / "link" / "nested" / "again", "is inside the bundle"),
        (bundle, "is inside the bundle"),
        (tmp_path, "contains the bundle"),
    ):
        got = hpctrain("reproduce", str(bundle), "--data", str(original["data"]), "--run-dir", str(run_dir))
        assert got.returncode == 2, got.stdout + got.stderr
        (line,) = got.stderr.strip().splitlines()
        assert line.startswith("hpctrain reproduce: error: --run-dir ") and what in line, line
    assert sorted(p.relative_to(bundle) for p in bundle.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["around", "bundle", "link"]
    got = hpctrain("bundle", "verify", str(bundle))
    assert got.returncode == 0, got.stdout[-2000:]


def test_a_tar_bundle_dry_run_rebuilds_the_code_and_writes_nothing(original, tmp_path):
    run = tmp_path / "dry"
    got = hpctrain(
        "reproduce", str(original["root"] / "bundle.tar"), "--data", str(original["data"]), "--run-dir", str(run),
        "--dry-run", "--cluster", "slurm", "--nodes", "2", "--json",
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    report = json.loads(got.stdout)  # --json: the report alone on stdout
    assert report["code"]["repositories"]["entry"]["problems"] == [] and report["data"]["matched"] == "by name"
    assert "#SBATCH --nodes=2" in got.stderr  # the dry run's script; the flag overrides the recorded --nodes 1
    assert any("world size 2 differs" in n for n in report["notes"])
    assert not run.exists() and not list(tmp_path.glob(".hpctrain-reproduce-*"))


# ---------------------------------------------------------------------------------------------- the pieces
def test_the_threads_each_rank_ran_with():
    from hpctrain.bundle.unpack import recorded_threads

    local = {"attempt": {"launcher": "submitit-local", "world_size": 2}, "runtime": {"cpu": {"count": 8}}}
    assert recorded_threads(local)[0] == 4
    slurm = {"attempt": {"launcher": "slurm", "world_size": 8}, "runtime": {"slurm": {"SLURM_CPUS_PER_TASK": "6"}}}
    assert recorded_threads(slurm) == (6, "the recorded job's SLURM_CPUS_PER_TASK=6")
    assert recorded_threads({"attempt": {"launcher": "slurm"}, "runtime": {"cpu": {"count": 8}}})[0] is None
    assert recorded_threads({"attempt": {"cpu_threads": 3}}) == (3, "recorded")


def test_restore_snapshot_of_package_files_outside_git(tmp_path, monkeypatch):
    from hpctrain.identity.code import capture_code
    from hpctrain.identity.snapshot import restore_snapshot, write_snapshot

    root = tmp_path / "plain"
    (root / "plainpkg" / "sub").mkdir(parents=True)
    (root / "plainpkg" / "__init__.py").write_text("")
    (root / "plainpkg" / "train.py").write_text("def main(ctx):\n    return 1\n")
    (root / "plainpkg" / "sub" / "util.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(root))
    code = capture_code("plainpkg.train:main")
    assert code["repositories"]["entry"]["kind"] == "files"
    snap = tmp_path / "code.tar.gz"
    write_snapshot(snap, code)
    got = restore_snapshot(snap, tmp_path / "out", recorded=code["repositories"])
    assert got["entry"]["problems"] == [] and got["entry"]["checked"] == 3
    assert (tmp_path / "out" / "entry" / "plainpkg" / "sub" / "util.py").read_text() == "X = 1\n"
    # a record that does not match what the snapshot holds is named
    wrong = json.loads(json.dumps(code["repositories"], default=str))
    wrong["entry"]["sha256"] = "0" * 64
    got = restore_snapshot(snap, tmp_path / "out2", recorded=wrong)
    assert "the rebuilt package files hash to" in got["entry"]["problems"][0]


def test_restore_snapshot_never_writes_into_git_or_outside_the_tree(tmp_path):
    from hpctrain.identity.snapshot import restore_snapshot

    snap = tmp_path / "forged.tar.gz"
    manifest = {"kind": "git", "commit": None, "modified": [{"path": "../escape.py", "status": "M", "sha256": "x"}]}
    with tarfile.open(snap, "w:gz") as tar:
        for name, data in (
            ("entry/MANIFEST.json", json.dumps(manifest).encode()),
            ("entry/tree/.git/config", b"[core]\n\tfsmonitor = touch /tmp/pwned\n"),
            ("entry/worktree/../escape.py", b"x"),
            ("entry/tree/ok.py", b"print(1)\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    got = restore_snapshot(snap, tmp_path / "out", init_git=False)
    assert (tmp_path / "out" / "entry" / "ok.py").exists()
    assert not (tmp_path / "out" / "entry" / ".git").exists() and not (tmp_path / "out" / "escape.py").exists()
    assert any("outside the tree" in p for p in got["entry"]["problems"])
    assert any(".git" in n for n in got["entry"]["notes"]) or not (tmp_path / "out" / "entry" / ".git").exists()


def test_data_mapping_and_argument_rewriting():
    from hpctrain.bundle import inputs
    from hpctrain.errors import UsageError

    rec = [{"cheap": {"name": "a.h5", "path": "/old/a.h5"}}, {"cheap": {"name": "b.h5", "path": "/old/b.h5"}}]
    pairs, how = inputs.map_files(rec, ["/new/b.h5", "/new/a.h5"])
    assert how == "by name" and [p for _, p in pairs] == ["/new/a.h5", "/new/b.h5"]
    pairs, how = inputs.map_files(rec, ["/new/x.h5", "/new/y.h5"])
    assert how.startswith("by order") and [p for _, p in pairs] == ["/new/x.h5", "/new/y.h5"]
    with pytest.raises(UsageError, match="1 path"):
        inputs.map_files(rec, ["/new/a.h5"])
    args, done = inputs.rewrite_args(
        ["--data", "a.h5", "--eval=/old/b.h5", "--ckpt-dir", "/runs/r1/ck", "--lr", "0.1"],
        {"/old/a.h5": "/new/a.h5", "/old/b.h5": "/new/b.h5"},
        cwd="/old",
        old_run="/runs/r1",
        new_run="/runs/r2",
    )
    assert args == ["--data", "/new/a.h5", "--eval=/new/b.h5", "--ckpt-dir", "/runs/r2/ck", "--lr", "0.1"]
    assert [d["why"] for d in done] == ["input file", "input file", "inside the original run directory"]
    assert inputs.with_total_steps(["--steps", "30", "--x"], 25) == (["--steps", "25", "--x"], "30")
    assert inputs.with_total_steps(["--steps=30"], 25) == (["--steps=25"], "30")
    assert inputs.with_total_steps(["--x"], 25) == (["--x", "--steps", "25"], None)


def test_loss_comparison_rows():
    from hpctrain.bundle.loss_intervals import compare, expected_intervals, intervals

    recorded = intervals(
        [
            {"kind": "interval", "step": 5, "steps": 5, "loss": 2.0},
            {"kind": "interval", "step": 10, "steps": 5, "loss": 1.5},
            {"kind": "interval", "step": 10, "steps": 5, "loss": 1.25},  # a redone step: the last record counts
            {"kind": "eval", "step": 10, "loss": 9.0},
            {"kind": "interval", "step": 15, "steps": 5, "loss": None},
            {"kind": "interval", "step": 20, "steps": 5, "loss": 1.0},
        ]
    )
    expected = expected_intervals(recorded, 5, 20)
    assert [e["step"] for e in expected] == [10, 15, 20] and expected[0]["loss"] == 1.25
    same = compare(
        expected, {10: {"steps": 5, "loss": 1.25}, 15: {"steps": 5, "loss": None}, 20: {"steps": 5, "loss": 1.0}}
    )
    assert same["ok"] and same["compared"] == 3
    off = compare(expected, {10: {"steps": 3, "loss": 1.0}, 20: {"steps": 5, "loss": 1.0000001}})
    assert not off["ok"] and off["differ"] == 1 and off["missing"] == 1 and off["not_comparable"] == 1
    assert compare(expected, {10: {"steps": 5, "loss": 1.25}, 15: {"loss": None}, 20: {"loss": 1.0000001}},
                   tolerance=1e-6)["ok"]  # fmt: skip


def test_an_edited_code_snapshot_with_its_hashes_fixed_up_is_refused(original, tmp_path):
    """Issue 28 group 3: a committed file edited inside the snapshot, the snapshot's sha256 fixed in the identity
    records and MANIFEST.sha256: verify fails naming the snapshot, reproduce refuses in one line, submits nothing."""
    import hashlib

    from hpctrain.bundle.build import file_list_text

    bundle = tmp_path / "bundle"
    shutil.copytree(original["bundle"], bundle)
    assert not any(
        "format 1" in w for c in json.loads(hpctrain("bundle", "verify", str(bundle), "--json").stdout)["checks"]
        for w in c["warnings"]
    )  # fmt: skip
    snap = bundle / "code" / "snapshot.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(snap, "r:gz") as src, tarfile.open(fileobj=buf, mode="w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if m.name == "entry/tree/mymod.py":  # the committed file, as git archive holds it
                data = data.replace(b'LR = "0.5"', b'LR = "5.0"')
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    snap.write_bytes(buf.getvalue())
    sha = hashlib.sha256(buf.getvalue()).hexdigest()
    for rec in (bundle / "identity").glob("*.json"):
        doc = json.loads(rec.read_text())
        if isinstance((doc.get("code") or {}).get("snapshot"), dict):
            doc["code"]["snapshot"]["sha256"] = sha
            rec.write_text(json.dumps(doc))
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256")
    entries = [(p.relative_to(bundle).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]
    (bundle / "MANIFEST.sha256").write_text(file_list_text(entries))
    got = hpctrain("bundle", "verify", str(bundle), "--json")
    assert got.returncode == 1
    problems = [p for c in json.loads(got.stdout)["checks"] for p in c["problems"]]
    assert any(p.startswith("code/snapshot.tar.gz: its content hashes to") for p in problems), problems
    got = hpctrain("reproduce", str(bundle), "--data", str(original["data"]), "--run-dir", str(tmp_path / "r"))
    assert got.returncode == 1
    (line,) = got.stderr.strip().splitlines()
    assert "does not verify: identity: code/snapshot.tar.gz: its content hashes to" in line
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob(".hpctrain-reproduce-*"))
