"""A throwaway git repository holding a user's training package (``mypkg.train:main``)."""

from __future__ import annotations

import subprocess
import typing as tp
from pathlib import Path

import pytest

GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed repository with ``mypkg/`` (an entry, a helper, a binary file) on ``sys.path``."""
    root = tmp_path / "userrepo"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "train.py").write_text("def main(ctx):\n    return 1\n")
    (root / "mypkg" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / ".gitignore").write_text("ignored/\n*.log\n")
    subprocess.run([*GIT, "init", "-q", str(root)], check=True)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The same package outside any git repository."""
    root = tmp_path / "plain"
    (root / "plainpkg" / "sub").mkdir(parents=True)
    (root / "plainpkg" / "__init__.py").write_text("")
    (root / "plainpkg" / "train.py").write_text("def main(ctx):\n    return 1\n")
    (root / "plainpkg" / "sub" / "util.py").write_text("X = 1\n")
    (root / "plainpkg" / "__pycache__").mkdir()
    (root / "plainpkg" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"junk")
    monkeypatch.syspath_prepend(str(root))
    return root


def fake_cfg(**kw: tp.Any) -> tp.Any:
    from hpctrain.submit.config import SubmitConfig

    kw.setdefault("entry", "mypkg.train:main")
    return SubmitConfig(**kw)
