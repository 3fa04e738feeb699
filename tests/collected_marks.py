"""A pytest plugin for tests/test_collection.py (``-p tests.collected_marks``): writes every selected item's node
id and marker names, one JSON object per line, to the file named by ``HPCTRAIN_COLLECTED_MARKS``."""

from __future__ import annotations

import json
import os


def pytest_collection_finish(session):
    with open(os.environ["HPCTRAIN_COLLECTED_MARKS"], "w") as f:
        for item in session.items:
            f.write(json.dumps({"id": item.nodeid, "marks": sorted({m.name for m in item.iter_markers()})}) + "\n")
