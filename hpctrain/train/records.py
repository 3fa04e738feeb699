"""What training leaves in the run directory, and how to read it back without torch.

::

    RUN_DIR/train/metrics.jsonl   one record per log interval (and per evaluation), rank 0 appends
    RUN_DIR/train/ledger.jsonl    one record per start and per end of the training process group

Writers are on the nodes (:mod:`hpctrain.train.metrics`, :mod:`hpctrain.train.trainer`); readers are on
the login node (``python -m hpctrain status``), so this module is stdlib only. The schemas are in
docs/train.md.
"""

from __future__ import annotations

import json
import os
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import atomic_write_text

__all__ = [
    "METRICS_SCHEMA",
    "LEDGER_SCHEMA",
    "metrics_path",
    "ledger_path",
    "append_ledger",
    "read_jsonl",
    "process_start_time",
]

METRICS_SCHEMA = "hpctrain.train.metrics/1"
LEDGER_SCHEMA = "hpctrain.train.ledger/1"


def metrics_path(run_dir: tp.Union[str, os.PathLike]) -> Path:
    return Path(run_dir) / "train" / "metrics.jsonl"


def ledger_path(run_dir: tp.Union[str, os.PathLike]) -> Path:
    return Path(run_dir) / "train" / "ledger.jsonl"


def append_ledger(run_dir: tp.Union[str, os.PathLike], record: tp.Mapping[str, tp.Any]) -> None:
    """Append one record to the ledger atomically: the whole (small) file is rewritten through tmp + fsync +
    rename, so a crash leaves the old ledger or the new one, never a torn line. Rank 0 only."""
    path = ledger_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    if old and not old.endswith("\n"):
        old += "\n"
    line = json.dumps({"schema": LEDGER_SCHEMA, **record}, sort_keys=True)
    atomic_write_text(path, old + line + "\n")


def read_jsonl(
    path: tp.Union[str, os.PathLike], *, tail_bytes: tp.Optional[int] = None
) -> tp.Tuple[tp.List[tp.Dict[str, tp.Any]], tp.List[str]]:
    """The records of a JSONL file and one message per line that is not a JSON object.

    ``tail_bytes`` reads only the end of the file (a long run's metrics grow without bound; the login
    node wants the last intervals): the first, probably partial, line of that window is skipped.
    A missing file gives ``([], [])``.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            start = 0
            if tail_bytes is not None:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - tail_bytes)
                f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return [], []
    lines = data.split(b"\n")
    first_line = 1
    if start > 0:
        lines, first_line = lines[1:], 0  # line numbers are unknown inside a window: count from its start
    records: tp.List[tp.Dict[str, tp.Any]] = []
    problems: tp.List[str] = []
    for n, raw in enumerate(lines, start=first_line):
        if not raw.strip():
            continue
        where = f"{path.name} line {n}" if start == 0 else f"{path.name} (last {tail_bytes} bytes) line {n}"
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            unfinished = n == len(lines) - 1 + first_line and not data.endswith(b"\n")
            why = "unfinished last line (being written, or the writer died)" if unfinished else f"not JSON ({exc})"
            problems.append(f"{where}: {why}; skipped")
            continue
        if not isinstance(rec, dict):
            problems.append(f"{where}: a JSON {type(rec).__name__}, not an object; skipped")
            continue
        records.append(rec)
    return records, problems


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: /proc), so that the ledger can say how long the
    start-up took (interpreter, imports, rendezvous, restore) before the first step. Falls back to now."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); the split starts at field 3
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
