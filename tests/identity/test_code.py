"""The code section: git state of a dirty tree (binary change, untracked files), credentials, the fallback
outside git, and a snapshot that rebuilds the working tree without the repository."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from hpctrain.identity import code as codemod
from hpctrain.identity.code import Git, capture_code, capture_repository, strip_credentials
from hpctrain.identity.snapshot import write_snapshot

from .conftest import git


def make_dirty(repo: Path) -> None:
    (repo / "mypkg" / "train.py").write_text("def main(ctx):\n    return 2  # edited\n")
    blob = bytearray((repo / "mypkg" / "blob.bin").read_bytes())
    blob[100] ^= 0xFF  # a binary change
    (repo / "mypkg" / "blob.bin").write_bytes(bytes(blob))
    (repo / "mypkg" / "new_helper.py").write_text("Y = 3\n")  # untracked
    (repo / "notes.bin").write_bytes(b"\x00\xff" * 10)  # untracked binary
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.dat").write_bytes(b"x" * 100)  # ignored: not listed
    (repo / "run.log").write_text("ignored too\n")


def test_clean_tree(repo):
    rec = capture_repository(repo / "mypkg" / "train.py")
    assert rec["kind"] == "git" and rec["root"] == str(repo.resolve())
    assert rec["commit"] == git(repo, "rev-parse", "HEAD").strip() and rec["branch"] == "main"
    assert not rec["dirty"] and rec["dirty_files"] == [] and rec["untracked"] == [] and rec["modified"] == []
    assert rec["diff"]["bytes"] == 0 and rec["diff"]["sha256"] == hashlib.sha256(b"").hexdigest()


def test_dirty_tree_with_untracked_files_and_a_binary_change(repo):
    make_dirty(repo)
    rec = capture_repository(repo / "mypkg" / "train.py")
    assert rec["dirty"] is True
    assert rec["dirty_files"] == ["mypkg/blob.bin", "mypkg/new_helper.py", "mypkg/train.py", "notes.bin"]
    diff = rec["diff"]["text"]
    assert "GIT binary patch" in diff and "+    return 2  # edited" in diff
    assert (
        rec["diff"]["sha256"] == hashlib.sha256(rec["_diff"]).hexdigest() == hashlib.sha256(diff.encode()).hexdigest()
    )
    untracked = {u["path"]: u for u in rec["untracked"]}
    assert set(untracked) == {"mypkg/new_helper.py", "notes.bin"}  # ignored files are not listed
    assert untracked["notes.bin"]["sha256"] == hashlib.sha256(b"\x00\xff" * 10).hexdigest()
    assert untracked["notes.bin"]["stored"] and rec["untracked_content_limit_bytes"] == codemod.UNTRACKED_CONTENT_LIMIT
    modified = {m["path"]: m for m in rec["modified"]}
    assert modified["mypkg/blob.bin"]["status"] == "M"
    assert (
        modified["mypkg/blob.bin"]["sha256"] == hashlib.sha256((repo / "mypkg" / "blob.bin").read_bytes()).hexdigest()
    )
    assert not any(k.startswith("_") for k in codemod.public_code({"repositories": {"e": rec}})["repositories"]["e"])


def test_untracked_files_above_the_limit_are_listed_and_hashed_not_stored(repo):
    (repo / "big.txt").write_bytes(b"b" * 5000)
    (repo / "small.txt").write_bytes(b"s" * 10)
    rec = capture_repository(repo, keep_bytes=1000)
    untracked = {u["path"]: u for u in rec["untracked"]}
    assert untracked["big.txt"]["stored"] is False and untracked["small.txt"]["stored"] is True
    assert untracked["big.txt"]["sha256"] == hashlib.sha256(b"b" * 5000).hexdigest()
    assert rec["untracked_content_limit_bytes"] == 1000 and set(rec["_untracked"]) == {"small.txt"}


def test_snapshot_rebuilds_the_dirty_tree_without_the_repository(repo, tmp_path):
    make_dirty(repo)
    (repo / "mypkg" / "gone.py").write_text("")
    git(repo, "add", "mypkg/gone.py")
    git(repo, "commit", "-q", "-m", "second")
    (repo / "mypkg" / "gone.py").unlink()  # a deletion
    code = capture_code("mypkg.train:main", argv=["-m", "hpctrain.submit"], entry_args=["--lr", "1"])
    out = tmp_path / "code.tar.gz"
    info = write_snapshot(out, code)
    assert info["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest() and info["bytes"] == out.stat().st_size
    rebuilt = tmp_path / "rebuilt"
    with tarfile.open(out) as tar:
        tar.extractall(rebuilt, filter="data")
    tree = rebuilt / "entry" / "tree"
    assert (tree / "mypkg" / "train.py").read_text() == "def main(ctx):\n    return 1\n"  # HEAD
    assert (rebuilt / "entry" / "untracked" / "notes.bin").read_bytes() == b"\x00\xff" * 10
    # 1. without git: overlay the changed files, delete the deleted ones, add the untracked ones
    manifest = __import__("json").loads((rebuilt / "entry" / "MANIFEST.json").read_text())
    for m in manifest["modified"]:
        target = tree / m["path"]
        if m["status"] == "D":
            target.unlink()
        else:
            target.write_bytes((rebuilt / "entry" / "worktree" / m["path"]).read_bytes())
    for u in manifest["untracked"]:
        (tree / u["path"]).write_bytes((rebuilt / "entry" / "untracked" / u["path"]).read_bytes())
    for rel in ("mypkg/train.py", "mypkg/blob.bin", "mypkg/new_helper.py", "notes.bin"):
        assert (tree / rel).read_bytes() == (repo / rel).read_bytes(), rel
    assert not (tree / "mypkg" / "gone.py").exists()
    # 2. with git: the binary diff applies to the archived commit
    other = tmp_path / "with-git"
    with tarfile.open(out) as tar:
        tar.extractall(other, filter="data")
    subprocess.run(
        ["git", "apply", "--binary", str(other / "entry" / "diff.patch")], cwd=other / "entry" / "tree", check=True
    )
    assert (other / "entry" / "tree" / "mypkg" / "blob.bin").read_bytes() == (repo / "mypkg" / "blob.bin").read_bytes()
    assert "text" not in manifest["diff"]  # the diff is diff.patch, not repeated in the tar's manifest


@pytest.mark.parametrize(
    "url, clean",
    [
        ("https://user:s3cr3t@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://ghp_TOKEN@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://gitlab.example.org/g/r.git?private_token=abc", "https://gitlab.example.org/g/r.git"),
        ("ssh://git:pw@host:2222/r.git", "ssh://git@host:2222/r.git"),
        ("ssh://git@host/r.git", "ssh://git@host/r.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
    ],
)
def test_credentials_are_stripped(url, clean):
    assert strip_credentials(url) == clean


def test_remote_url_is_recorded_without_credentials(repo):
    git(repo, "remote", "add", "origin", "https://alice:hunter2@git.example.org/alice/proj.git")
    git(repo, "remote", "add", "backup", "https://tok@backup.example.org/p.git")
    rec = capture_repository(repo)
    assert rec["remote_url"] == "https://git.example.org/alice/proj.git"
    assert rec["remotes"] == {
        "origin": "https://git.example.org/alice/proj.git",
        "backup": "https://backup.example.org/p.git",
    }
    assert "hunter2" not in str(rec) and "tok@" not in str(rec)


def test_outside_git_the_package_files_are_hashed(package):
    code = capture_code("plainpkg.train:main")
    rec = code["repositories"]["entry"]
    assert rec["kind"] == "files" and rec["root"] == str((package / "plainpkg").resolve())
    assert "not a git repository" in rec["reason"]
    assert [f["path"] for f in rec["files"]] == ["__init__.py", "sub/util.py", "train.py"]  # sorted, no __pycache__
    again = capture_code("plainpkg.train:main")["repositories"]["entry"]
    assert again["sha256"] == rec["sha256"]
    (package / "plainpkg" / "sub" / "util.py").write_text("X = 2\n")
    assert capture_code("plainpkg.train:main")["repositories"]["entry"]["sha256"] != rec["sha256"]


def test_a_missing_git_is_not_a_repository(repo):
    code = capture_code("mypkg.train:main", git=Git(executable="/nonexistent/git"))
    assert code["repositories"]["entry"]["kind"] == "files"
    assert "not found" in code["repositories"]["entry"]["reason"]


def test_a_package_git_ignores_is_hashed_as_files(repo, monkeypatch):
    site = repo / "ignored" / "site"
    (site / "vpkg").mkdir(parents=True)
    (site / "vpkg" / "__init__.py").write_text("")
    (site / "vpkg" / "m.py").write_text("def main(ctx): pass\n")
    monkeypatch.syspath_prepend(str(site))
    rec = capture_code("vpkg.m:main")["repositories"]["entry"]
    assert rec["kind"] == "files" and "ignored by the git repository" in rec["reason"]


def test_snapshot_of_package_files(package, tmp_path):
    code = capture_code("plainpkg.train:main")
    out = tmp_path / "snap.tar.gz"
    write_snapshot(out, code)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert "entry/files/sub/util.py" in names and "entry/MANIFEST.json" in names
        assert tar.extractfile("entry/files/train.py").read() == (package / "plainpkg" / "train.py").read_bytes()


def test_git_timeout_is_bounded(repo):
    slow = Git(timeout_s=0.000001)
    res = slow.run(repo, "status")
    assert not res.ok and "took more than" in res.stderr


def test_capture_is_binary_safe_for_non_utf8_text(repo):
    (repo / "mypkg" / "train.py").write_bytes(b"# caf\xe9 in latin-1\ndef main(ctx):\n    return 1\n")
    rec = capture_repository(repo)
    assert "base64" in rec["diff"] and "text" not in rec["diff"]
    assert io.BytesIO(__import__("base64").b64decode(rec["diff"]["base64"])).read() == rec["_diff"]


def test_run_directories_inside_the_repository_are_not_untracked_code(repo):
    run = repo / "runs" / "exp-1"
    (run / "train").mkdir(parents=True)
    (run / "submission.json").write_text("{}")
    (run / "train" / "metrics.jsonl").write_text("{}\n")
    (repo / "runs" / "notes.md").write_text("mine\n")  # not in a run directory: listed
    rec = capture_repository(repo)
    assert [u["path"] for u in rec["untracked"]] == ["runs/notes.md"]
    assert rec["untracked_run_dirs_skipped"] == ["runs/exp-1"]
