"""Every test file in tests/ is collected by the README's test command.

pytest silently skips folders named in its default ``norecursedirs`` (``dist``, ``build``, ``*.egg``,
dot-folders, ...): a whole package of tests once went uncollected that way. This runs the README's
test command in collect-only mode and fails naming any ``tests/**/test_*.py`` it does not collect.

``tools/test`` (what CI runs) runs the same suite as two sessions side by side, ``-m serial`` and
``-m "not serial"``: the same run also checks that the tests sharing the one dev cluster are exactly the
``serial`` ones, so that no two of them ever run at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_test_command_collects_every_test_file(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q" in readme, "the README no longer names the test command this guard runs"
    marks = tmp_path / "marks.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.collected_marks",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HPCTRAIN_COLLECTED_MARKS": str(marks)},
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

    # tools/test's two sessions: every test that uses the one dev cluster (slurm, or under tests/cluster) is in the
    # serial one, and only those
    items = [json.loads(line) for line in marks.read_text().splitlines()]
    assert len(items) == sum("::" in line for line in proc.stdout.splitlines())
    shares_cluster = {i["id"] for i in items if "slurm" in i["marks"] or i["id"].startswith("tests/cluster/")}
    serial = {i["id"] for i in items if "serial" in i["marks"]}
    assert shares_cluster and serial == shares_cluster, sorted(serial ^ shares_cluster)[:5]
    assert any(i["id"].startswith("tests/cluster/test_devcluster_") for i in items if i["id"] in serial)
    # the tests that compare measured timings with a prediction run last (conftest.py), when the other session has
    # most likely ended
    measuring = ["measures" in i["marks"] for i in items]
    assert any(measuring) and measuring == sorted(measuring), "a `measures` test is collected before another test"
    tools_test = (ROOT / "tools" / "test").read_text()
    assert '-m serial >"$serial_log"' in tools_test and '-m "not serial" ||' in tools_test
