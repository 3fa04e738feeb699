"""Seeded, time-bounded fuzzing of ``status`` over damaged run directories (issue 17 §2).

Each case builds the complete run of :mod:`tests.status.rundirs` and damages it one to three ways: a special
file in place of a record (FIFO, directory, symlink loop, dangling link, a link to ``/dev/zero`` or
``/proc/self/mem``), ``train/`` or the checkpoint directory replaced, truncation, byte flips, a field of a
record set to a wrong type, a non-finite or huge number, rich markup or terminal controls, or deep nesting
(a whole line or a field). Then ``status RUN`` and ``status RUN --json`` run in process, each under a time
bound (a FIFO fails the case instead of hanging the suite), and every case must:

- exit 0, or exit 2 with one ``hpctrain status: error:`` line; never a traceback;
- with ``--json``, print standard JSON (``json.loads(..., parse_constant=reject)``);
- still show what was not damaged: the metrics' last interval and evaluation, the ledger's starts, the
  committed checkpoint, the job state from (fake) Slurm;
- name a record file replaced by a special file in a warning.

``HPCTRAIN_FUZZ_SEED`` / ``HPCTRAIN_FUZZ_CASES`` / ``HPCTRAIN_FUZZ_SECONDS`` change the run (defaults 0, 250,
60; the default is about 7 s of CPU, 13 s on a loaded 2-core VM). Case ``n`` of seed ``s`` draws from
``Random(f"{s}-{n}")``: a failure names both, and ``HPCTRAIN_FUZZ_CASE=n`` reruns that case alone.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import time
import typing as tp
from pathlib import Path

import pytest

from tests.status.rundirs import CKPT_STEP, LAST_STEP, LEDGER, MANIFEST, METRICS, N_RECORDS, SUBMISSION, build, status

SEED = int(os.environ.get("HPCTRAIN_FUZZ_SEED", "0"))
CASES = int(os.environ.get("HPCTRAIN_FUZZ_CASES", "250"))
SECONDS = float(os.environ.get("HPCTRAIN_FUZZ_SECONDS", "60"))
ONLY = os.environ.get("HPCTRAIN_FUZZ_CASE")

RECORD_FILES = {"submission": SUBMISSION, "ledger": LEDGER, "metrics": METRICS, "manifest": MANIFEST}
SPECIALS = ["fifo", "dir", "loop", "dangling", "devzero", "procmem"]
ODD_VALUES: tp.List[tp.Any] = [
    None,
    True,
    False,
    -1,
    0,
    2**63,
    2**64,
    1.5,
    -0.0,
    "",
    "x",
    "1e3",
    "NaN",
    "x" * 5000,
    "[/]",
    "[bold red]boom",
    "[link=file:///etc/passwd]x[/link]",
    "\x1b[2J\x1b]0;owned\x07",
    ":warning:",
    "trailing\\",
    "\u202eevil",
    "a\x00b",
    "-h",
    [],
    {},
    [1, "a", None],
    ["node1", 2],
    {"min": 1},
    {"min": "1", "median": None, "max": [], "max_rank": -1},
]
# raw JSON tokens json.dumps would not write (or not like this)
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e300", "-1e300", "1e400", "1" + "0" * 400, "-" + "9" * 30]
_MARKER = "\x01raw\x01"


def _paths(obj: tp.Any, prefix: tp.Tuple[tp.Any, ...] = (), out: tp.Optional[list] = None, depth: int = 0) -> list:
    """Every container path in a JSON value (bounded depth)."""
    out = [] if out is None else out
    out.append(prefix)
    if depth < 4:
        if isinstance(obj, dict):
            for k, v in obj.items():
                _paths(v, prefix + (k,), out, depth + 1)
        elif isinstance(obj, list):
            for i in range(min(len(obj), 3)):
                _paths(obj[i], prefix + (i,), out, depth + 1)
    return out


def _set_field(rng: random.Random, rec: tp.Dict[str, tp.Any]) -> tp.Tuple[str, tp.Optional[str]]:
    """Damage one field of ``rec`` in place; returns (kind, raw token to put at the marker or None)."""
    path = rng.choice([p for p in _paths(rec) if p])
    parent: tp.Any = rec
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    action = rng.random()
    if action < 0.15 and isinstance(parent, dict):
        del parent[key]
        return "field-missing", None
    if action < 0.45:
        parent[key] = _MARKER
        return "field-raw", rng.choice(RAW_VALUES)
    if action < 0.55:
        parent[key] = _MARKER
        depth = rng.choice([40, 300, 900])
        return "field-deep", "[" * depth + "]" * depth
    parent[key] = rng.choice(ODD_VALUES)
    return "field-type", None


def _dump(rec: tp.Any, raw: tp.Optional[str]) -> str:
    text = json.dumps(rec)
    return text.replace(json.dumps(_MARKER), raw) if raw is not None else text


def _replace(path: Path, how: str) -> None:
    """Put a special file of kind ``how`` where ``path`` (a file, a directory or nothing) is."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        path.mkdir()
    elif how == "loop":
        path.symlink_to(path.name)
    elif how == "dangling":
        path.symlink_to("nowhere")
    elif how == "devzero":
        path.symlink_to("/dev/zero")
    elif how == "procmem":
        path.symlink_to("/proc/self/mem")
    elif how == "file":
        path.write_text("not a directory\n")


def damage(rng: random.Random, run: Path) -> tp.Tuple[str, str, str]:
    """Damage ``run`` one way; returns (kind, target, detail)."""
    kind = rng.choice(["special"] * 3 + ["field"] * 5 + ["truncate", "bytes", "line-deep", "train", "ckptdir"])
    target = rng.choice(list(RECORD_FILES))
    path = run / RECORD_FILES[target]
    if kind == "train":
        how = rng.choice(["file", "fifo", "loop", "dangling"])
        _replace(run / "train", how)
        return kind, "ledger+metrics", how
    if kind == "ckptdir":
        how = rng.choice(["file", "fifo", "loop", "dangling", "devzero"])
        _replace(run / "checkpoints", how)
        return kind, "manifest", how
    if not path.is_file() or path.is_symlink():  # an earlier damage of this case replaced it
        return "none", target, "already replaced"
    if kind == "special":
        how = rng.choice(SPECIALS)
        _replace(path, how)
        return kind, target, how
    raw = path.read_bytes()
    if not raw:  # an earlier truncation emptied it
        return "none", target, "empty"
    if kind == "truncate":
        path.write_bytes(raw[: rng.randrange(len(raw))])
        return kind, target, ""
    if kind == "bytes":
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.choice(b'{}[]",:0123456789-eE.tfnNI \x00\xff\n')
        path.write_bytes(bytes(data))
        return kind, target, ""
    try:
        lines = raw.decode().splitlines()
        records = [json.loads(line) for line in lines]
    except (ValueError, RecursionError):  # an earlier byte flip or deep line: leave it
        return "none", target, "not JSON any more"
    i = rng.randrange(len(records))
    if kind == "line-deep":
        depth = rng.choice([500, 990, 1200, 100_000])
        lines[i] = rng.choice(["[", '{"a":']) * depth
        lines[i] += ("]" if lines[i].startswith("[") else "}") * depth
        path.write_text("\n".join(lines) + "\n")
        return kind, target, f"depth {depth}"
    if not isinstance(records[i], dict):
        return "none", target, "not an object"
    sub, token = _set_field(rng, records[i])
    lines[i] = _dump(records[i], token)
    path.write_text("\n".join(lines) + ("\n" if target in ("ledger", "metrics") else ""))
    return sub, target, f"record {i}"


def check_intact(damaged: tp.Set[str], out: str, report: tp.Dict[str, tp.Any]) -> tp.List[str]:
    """What was not damaged must still be shown (text ``out`` and the --json ``report``); returns what held."""
    held = []
    if "metrics" not in damaged:
        assert report["last_interval"]["step"] == LAST_STEP and report["last_eval"]["step"] == LAST_STEP
        assert f"interval to step {LAST_STEP}" in out
        held.append("metrics")
    if "ledger" not in damaged:
        assert report["starts"] == 2 and len(report["ledger"]) == N_RECORDS
        assert "starts     2 (1 restart)" in out
        held.append("ledger")
        if "manifest" not in damaged:
            assert report["checkpoint"]["step"] == CKPT_STEP, report["checkpoint"]
            assert f"checkpoint step {CKPT_STEP} committed" in out
            held.append("checkpoint")
    if "submission" not in damaged:
        assert report["job"]["state"] == "COMPLETED" and report["job"]["source"] == "sacct"
        assert "COMPLETED" in out
        held.append("job")
    return held


def test_fuzzed_run_dirs_never_hang_crash_or_hide_intact_parts(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    kinds: tp.Counter[str] = collections.Counter()
    outcomes: tp.Counter[str] = collections.Counter()
    deadline = time.monotonic() + SECONDS
    cases = 0
    for case in [int(ONLY)] if ONLY else range(CASES):
        if time.monotonic() > deadline:
            break
        rng = random.Random(f"{SEED}-{case}")
        run = build(tmp_path / f"case-{case}")
        applied = [damage(rng, run) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        damaged = {t for _, target, _ in applied for t in target.split("+")}
        where = f"seed {SEED} case {case} (HPCTRAIN_FUZZ_CASE={case}): {applied}"
        try:
            text = status(capsys, run)
            js = status(capsys, run, "--json")
            assert text.code == js.code, (text.err, js.err)
            if js.code == 2:  # nothing left that says it is a run directory
                outcomes["usage error (nothing readable left)"] += 1
            else:
                report = js.report
                assert report is not None
                train_gone = any(kind == "train" for kind, _, _ in applied)
                for kind, target, how in applied:
                    if train_gone and target in ("ledger", "metrics"):
                        continue  # train/ itself is the one warning
                    if kind == "special" and target != "manifest" and how != "dangling":
                        name = Path(RECORD_FILES[target]).name
                        assert any(name in p for p in report["problems"]), (name, report["problems"])
                held = check_intact(damaged, text.out, report)
                outcomes["report, problems shown" if report["problems"] else "report, no problem seen"] += 1
                outcomes[f"intact parts shown: {len(held)}"] += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised with the case that reproduces it
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            pytest.fail(f"{where}: {type(exc).__name__}: {str(exc)[:1500]}")
        for kind, _, _ in applied:
            kinds[kind] += 1
        cases += 1
        for child in (run / "train", run / "checkpoints"):  # FIFOs and links go with rmtree
            if child.is_symlink() or child.is_file():
                child.unlink()
        shutil.rmtree(run, ignore_errors=True)
    print(f"\nstatus fuzz: seed {SEED}, {cases} cases; damage kinds {dict(kinds)}; outcomes {dict(outcomes)}")
    assert cases >= min(CASES, 100) or ONLY
