"""Every test file in tests/ is collected by the README's test command.

pytest silently skips folders named in its default ``norecursedirs`` (``dist``, ``build``, ``*.egg``,
dot-folders, ...): a whole package of tests once went uncollected that way. This runs the README's
test command in collect-only mode and fails naming any ``tests/**/test_*.py`` it does not collect.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_test_command_collects_every_test_file():
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q" in readme, "the README no longer names the test command this guard runs"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = {line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line}
    on_disk = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts)
    }
    missing = sorted(on_disk - collected)
    assert not missing, f"test files the README's test command never collects: {missing}"
    assert "tests/test_collection.py" in collected
