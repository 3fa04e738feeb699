"""Seeded, time-bounded fuzzing of damaged checkpoints: manifest and shard-header mutations (types, sizes,
nesting, names, bit flips with the crc32 recomputed), truncation and special files in place of files.

For every case: each ``ckpt ls|verify|digest|gc --dry-run`` (in-process through ``run_main``, and some as
real subprocesses) ends within a bound with exit 0/1/2, at most one error line, no traceback; restore
loads the good older step (or the damaged one only when ``verify`` accepts it) or raises HpctrainError
with the caller's model untouched (the scheduler is put back too; the optimizer is not checked here);
``verify`` rejects whatever restore rejects.

``HPCTRAIN_FUZZ_SEED`` / ``HPCTRAIN_FUZZ_CASES`` / ``HPCTRAIN_FUZZ_SECONDS`` change the run (defaults 0, 200, 40).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import os
import random
import shutil
import subprocess
import sys
import time
import typing as tp
import zlib
from pathlib import Path

import pytest

from hpctrain._cli import run_main
from hpctrain.ckpt import Checkpointer
from hpctrain.ckpt import cli as ckpt_cli
from hpctrain.ckpt._index import verify_dir
from hpctrain.ckpt._reader import read_header
from hpctrain.errors import CheckpointFormatError, HpctrainError
from tests.ckpt import damage
from tests.ckpt import workers as w
from tests.fuzzing import bounded

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("HPCTRAIN_FUZZ_SEED", "0"))
CASES = int(os.environ.get("HPCTRAIN_FUZZ_CASES", "200"))
SECONDS = float(os.environ.get("HPCTRAIN_FUZZ_SECONDS", "40"))
COMMAND_BOUND_S = 10
STEP2 = "step-000000002"
SHARD0 = "rank-00000-of-00002.shard"

ODD_VALUES: tp.List[tp.Any] = [
    None,
    True,
    False,
    -1,
    0,
    1 << 70,
    1.5,
    float("nan"),
    "",
    "x" * 300,
    "../../etc/passwd",
    [],
    {},
    [1, "a", None],
    {"__tensor__": "model/fc1.weight"},
    {"__tensor__": "nope"},
    {"__dict__": [[[1, [2]], 3]]},
    {"__tuple__": "abc"},
    damage.nested(150),
]


def _paths(obj: tp.Any, prefix: tp.Tuple[tp.Any, ...] = (), out: tp.Optional[list] = None, depth: int = 0) -> list:
    """Every (container path) in a JSON value, bounded in depth (the RNG lists are long: sample a few)."""
    out = [] if out is None else out
    out.append(prefix)
    if depth > 8:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            _paths(v, prefix + (k,), out, depth + 1)
    elif isinstance(obj, list):
        for i in sorted({0, len(obj) - 1, len(obj) // 2}) if obj else []:
            _paths(obj[i], prefix + (i,), out, depth + 1)
    return out


def _mutate_json(rng: random.Random, obj: tp.Any) -> tp.Any:
    """Replace, delete or retype one value somewhere in ``obj`` (returns the new object)."""
    obj = copy.deepcopy(obj)
    paths = [p for p in _paths(obj) if p]
    if not paths:
        return rng.choice(ODD_VALUES)
    path = rng.choice(paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    action = rng.random()
    if action < 0.2 and isinstance(parent, dict):
        del parent[key]
    elif action < 0.3 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + rng.choice([-1, 1, 64, -(1 << 40), 1 << 40])
    elif action < 0.35 and isinstance(parent, dict):
        parent[rng.choice(["__tensor__", "__dict__", "__tuple__", "as", "extra-key"])] = rng.choice(ODD_VALUES)
    else:
        parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
    return obj


def _flip_json_bytes(rng: random.Random, raw: bytes, lo: int, hi: int) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(lo, hi)
        data[i] = rng.choice(b'{}[]",:0123456789-eE.tfn \x00\xff')
    return bytes(data)


def _fix_crc(step_dir: Path, rank: int) -> None:
    m = damage.manifest(step_dir)
    raw = (step_dir / m["shards"][rank]["file"]).read_bytes()
    m["shards"][rank].update(bytes=len(raw), crc32=zlib.crc32(raw))
    damage.write_manifest(step_dir, m)


def mutate(rng: random.Random, step: Path) -> str:
    """Damage ``step`` one way; return the kind of damage."""
    kind = rng.choice(
        ["manifest-json", "manifest-json", "header-json", "header-json", "header-json", "manifest-bytes"]
        + ["header-bytes", "header-bytes", "truncate", "special", "raw-nesting"]
    )
    rank = rng.randrange(2)
    shard = step / f"rank-{rank:05d}-of-00002.shard"
    if kind == "manifest-json":
        damage.write_manifest(step, _mutate_json(rng, damage.manifest(step)))
    elif kind == "header-json":
        damage.rewrite_shard(step, rank, lambda h: _mutate_json(rng, h))
    elif kind == "manifest-bytes":
        raw = (step / "MANIFEST.json").read_bytes()
        (step / "MANIFEST.json").write_bytes(_flip_json_bytes(rng, raw, 0, len(raw)))
    elif kind == "header-bytes":  # same size, crc32 recomputed: only the structural checks can tell
        h = read_header(shard)
        raw = shard.read_bytes()
        shard.write_bytes(_flip_json_bytes(rng, raw, 16, h.data_start - 1))
        _fix_crc(step, rank)
    elif kind == "truncate":
        raw = shard.read_bytes()
        shard.write_bytes(raw[: rng.randrange(len(raw))])
        if rng.random() < 0.5:
            _fix_crc(step, rank)
    elif kind == "raw-nesting":
        target = rng.choice(["manifest", "header"])
        deep = ("[" * 50_000 + "]" * 50_000).encode()
        if target == "manifest":
            (step / "MANIFEST.json").write_bytes(deep)
        else:
            import struct

            shard.write_bytes(struct.pack("<8sQ", b"HPCKSHD1", len(deep)) + deep)
            _fix_crc(step, rank)
    else:
        target = rng.choice([shard, step / "MANIFEST.json"])
        target.unlink()
        how = rng.choice(["fifo", "symlink", "dir", "dangling"])
        kind += "-" + how
        if how == "fifo":
            os.mkfifo(target)
        elif how == "symlink":
            target.symlink_to(step.parent / "step-000000001" / target.name)
        elif how == "dir":
            target.mkdir()
        else:
            target.symlink_to(step / "nowhere")
    return kind


def run_cli_in_process(argv: tp.List[str]) -> tp.Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with bounded(COMMAND_BOUND_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_main(ckpt_cli.main, "ckpt", argv)
    return code, out.getvalue(), err.getvalue()


def check_cli_output(argv: tp.List[str], code: int, stderr: str) -> None:
    assert code in (0, 1, 2), (argv, code, stderr)
    assert "Traceback" not in stderr and stderr.count("\n") <= 1, (argv, stderr)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A valid 2-rank checkpoint (steps 1 and 2), written by two real processes once."""
    from tests.multiproc import run_world

    d = tmp_path_factory.mktemp("fuzz-template")
    run_world(w.save_steps, 2, str(d), [1, 2])
    verify_dir(d / STEP2)
    return d


def test_fuzzed_checkpoints_never_crash_hang_or_disagree(template, tmp_path):
    rng = random.Random(SEED)
    found: tp.Counter[str] = collections.Counter()
    kinds: tp.Counter[str] = collections.Counter()
    deadline = time.monotonic() + SECONDS
    cases = 0
    fresh_model = w.build(999, 0)
    base_model = w.state_hash(fresh_model[0])
    for case in range(CASES):
        if time.monotonic() > deadline:
            break
        d = tmp_path / f"case-{case}"
        shutil.copytree(template, d, symlinks=True)
        kind = mutate(rng, d / STEP2)
        kinds[kind.split("-")[0]] += 1
        for argv in (["ls", str(d), "--json"], ["verify", str(d)], ["digest", str(d)], ["gc", str(d)]):
            if argv[0] == "gc":
                argv += ["--keep", "1", "--dry-run"]
            code, _, err = run_cli_in_process(argv)
            check_cli_output(argv, code, err)
        if case % 40 == 0:  # a real process now and then: the exit code and stderr as a user sees them
            r = subprocess.run(
                [sys.executable, "-m", "hpctrain", "ckpt", "verify", str(d)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=60,
            )
            check_cli_output(["verify (subprocess)"], r.returncode, r.stderr)
        try:
            with bounded(COMMAND_BOUND_S):
                verify_dir(d / STEP2)
            verify_ok = True
        except CheckpointFormatError:
            verify_ok = False
        model, opt, sched = w.build(999, 0)
        try:
            with bounded(COMMAND_BOUND_S):
                ck = Checkpointer(w.cfg(str(d)))
                res = ck.restore(model=model, optimizer=opt, scheduler=sched)
                ck.close()
        except HpctrainError as exc:
            assert "does not fit" in str(exc), (kind, exc)
            assert w.state_hash(model) == base_model, (kind, str(exc), "model touched by a failed restore")
            found["restore raised HpctrainError, model untouched"] += 1
        else:
            assert res is not None and res.step in (1, 2), kind
            if res.step == 2:
                assert verify_ok, (kind, "restore loaded a step that verify rejects")
                found["damage loadable (verify OK, restore loaded it)"] += 1
            else:
                assert not verify_ok, (kind, "restore rejected a step that verify accepts")
                found["rejected by verify and restore (fell back to step 1)"] += 1
        cases += 1
        shutil.rmtree(d, ignore_errors=True)
    print(f"\nfuzz: seed {SEED}, {cases} cases; damage kinds {dict(kinds)}; outcomes {dict(found)}")
    assert cases >= min(CASES, 50)
