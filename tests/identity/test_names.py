"""File names are bytes: a name that is not UTF-8 (Latin-1 ``café.txt``), one with a newline, one starting with
``-`` and a very long path are recorded losslessly (``path`` + ``path_hex``), keep every record valid UTF-8 JSON,
and round-trip through the code snapshot and its reader byte for byte."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

from hpctrain.identity.code import capture_code, dirty_summary, name_of, public_code
from hpctrain.identity.snapshot import restore_snapshot, write_snapshot

from .conftest import fake_cfg, git

LATIN = b"caf\xe9.txt"  # café.txt in ISO-8859-1: not UTF-8
CHANGED = b"mypkg/donn\xe9es.py"
LONG = "/".join(["d" * 200] * 6) + "/" + "f" * 200 + ".txt"  # 1,410 bytes, each part within NAME_MAX


def write(root: Path, rel: bytes, data: bytes) -> None:
    path = os.path.join(os.fsencode(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def odd_tree(repo: Path) -> None:
    write(repo, CHANGED, b"A = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "latin-1 name")
    write(repo, CHANGED, b"A = 2\n")  # a changed tracked file whose name is not UTF-8
    write(repo, LATIN, b"latin-1 name\n")  # an untracked one
    write(repo, b"new\nline.txt", b"newline\n")
    write(repo, b"-rf", b"dash\n")
    write(repo, os.fsencode(LONG), b"long\n")
    os.symlink(LATIN, os.path.join(os.fsencode(repo), b"link-to-cafe"))  # a link whose target is not UTF-8


def test_odd_names_are_recorded_losslessly_as_utf8_json(repo):
    odd_tree(repo)
    public = public_code(capture_code("mypkg.train:main"))
    text = json.dumps(public, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError before
    rec = json.loads(text)["repositories"]["entry"]
    untracked = {u["path"]: u for u in rec["untracked"]}
    assert untracked["caf\\xe9.txt"]["path_hex"] == LATIN.hex()
    assert os.fsencode(name_of(untracked["caf\\xe9.txt"])) == LATIN
    assert {"new\nline.txt", "-rf", LONG} <= set(untracked) and "path_hex" not in untracked["-rf"]
    assert os.fsencode(name_of(untracked["link-to-cafe"], "symlink")) == LATIN
    modified = {m["path"]: m for m in rec["modified"]}
    assert (
        modified["mypkg/donn\\xe9es.py"]["path_hex"] == CHANGED.hex()
        and modified["mypkg/donn\\xe9es.py"]["status"] == "M"
    )
    assert "caf\\xe9.txt" in rec["dirty_files"]
    (line,) = dirty_summary(public)[:1]
    assert "\n" not in line and "new\\nline.txt" in line  # a message stays one line


def test_odd_names_round_trip_through_the_snapshot(repo, tmp_path):
    odd_tree(repo)
    code = capture_code("mypkg.train:main")
    out = tmp_path / "code.tar.gz"
    write_snapshot(out, code)
    with tarfile.open(out) as tar:
        names = {os.fsencode(n) for n in tar.getnames()}
    assert b"entry/untracked/" + LATIN in names and b"entry/worktree/" + CHANGED in names
    assert b"entry/tree/" + CHANGED in names
    with tarfile.open(out) as tar:  # the snapshot's own record is valid JSON naming the bytes
        manifest = json.loads(tar.extractfile("entry/MANIFEST.json").read().decode("utf-8"))
    assert LATIN.hex() in {u.get("path_hex") for u in manifest["untracked"]}
    results = restore_snapshot(out, tmp_path / "rebuilt")
    entry = results["entry"]
    assert entry["problems"] == [], entry["problems"]
    tree = os.fsencode(tmp_path / "rebuilt" / "entry")
    for rel, data in ((LATIN, b"latin-1 name\n"), (CHANGED, b"A = 2\n"), (b"new\nline.txt", b"newline\n")):
        with open(os.path.join(tree, rel), "rb") as f:
            assert f.read() == data, rel
    with open(os.path.join(tree, b"-rf"), "rb") as f, open(os.path.join(tree, os.fsencode(LONG)), "rb") as g:
        assert f.read() == b"dash\n" and g.read() == b"long\n"
    assert os.readlink(os.path.join(tree, b"link-to-cafe")) == LATIN
    assert entry["diff_matches"] is True


def test_a_package_outside_git_with_a_latin1_name_round_trips(package, tmp_path):
    write(package, b"plainpkg/caf\xe9.py", b"X = 1\n")
    code = capture_code("plainpkg.train:main")
    json.dumps(public_code(code), ensure_ascii=False).encode("utf-8")
    out = tmp_path / "snap.tar.gz"
    write_snapshot(out, code)
    results = restore_snapshot(out, tmp_path / "rebuilt")
    assert results["entry"]["problems"] == []
    with open(os.path.join(os.fsencode(results["entry"]["package_root"]), b"caf\xe9.py"), "rb") as f:
        assert f.read() == b"X = 1\n"


def test_capture_submit_keeps_the_identity_with_a_latin1_name(repo, tmp_path):
    from hpctrain.identity import capture_submit

    write(repo, LATIN, b"latin-1 name\n")
    m = capture_submit(fake_cfg(), [], tmp_path / "run")
    assert m["written"] and m["identity"]
    on_disk = json.loads((tmp_path / "run" / "identity" / "submit.json").read_text(encoding="utf-8"))
    assert LATIN.hex() in {u.get("path_hex") for u in on_disk["code"]["repositories"]["entry"]["untracked"]}
