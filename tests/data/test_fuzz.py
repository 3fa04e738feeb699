"""Seeded, time-bounded fuzzing of HDF5 inputs: structure mutations (dtypes, shapes, chunking, filters, links,
external links, virtual datasets, groups, zero length, attributes) and damage (truncation, byte flips).

For every case:
- ``data inspect`` (in-process through ``hpctrain._cli.run_main``; a few as real subprocesses) ends within
  a bound with exit 0/1/2, at most one error line and no traceback;
- ``H5Loader`` either refuses the file with ``UsageError``/``HpctrainError`` at construction, or yields
  batches equal to what h5py reads for the same sample ids (an error while reading is accepted only where
  h5py cannot read those samples either).

``HPCTRAIN_FUZZ_CASES`` (default 240) and ``HPCTRAIN_FUZZ_SEED`` (default 0) scale and vary the run.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain._cli import run_main
from hpctrain.data import H5DataConfig, H5Loader
from hpctrain.data.cli import main as data_main
from hpctrain.errors import HpctrainError
from tests.fuzzing import bounded

ROOT = Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("HPCTRAIN_FUZZ_CASES", "240"))
SEED = int(os.environ.get("HPCTRAIN_FUZZ_SEED", "0"))
CASE_TIMEOUT_S = 20  # one case (inspect + loader) must end within this

DTYPES = ["f4", "f8", "f2", ">f4", "<i8", "u4", "u8", "i1", "b1", "c8", "f16", "S8", "compound", "vlen", "enum"]


def _dtype(name: str) -> tp.Any:
    if name == "compound":
        return np.dtype([("a", "f4"), ("b", "i4")])
    if name == "vlen":
        return h5py.string_dtype()
    if name == "enum":
        return h5py.enum_dtype({"a": 0, "b": 1}, basetype="i1")
    return np.dtype(name)


def _values(dt: tp.Any, shape: tp.Tuple[int, ...], rng: np.random.Generator) -> tp.Any:
    n = int(np.prod(shape, dtype=np.int64))
    if dt == h5py.string_dtype():
        return np.array([str(i) for i in range(n)], dtype=object).reshape(shape)
    if dt.fields is not None:
        out = np.zeros(shape, dtype=dt)
        out["a"] = rng.standard_normal(shape)
        return out
    base = np.arange(n).reshape(shape) % 100
    if dt.kind == "b":
        return (base % 2).astype(dt)
    return base.astype(dt)


def make_case(dirpath: Path, rng: np.random.Generator) -> tp.Tuple[Path, tp.List[str]]:
    """A small file from a valid base (contiguous, chunked, gzip) with a few random mutations; a draw
    that h5py cannot write (e.g. a filter on variable-length strings) is drawn again."""
    for _ in range(20):
        try:
            return _make_case(dirpath, rng)
        except (ValueError, TypeError):
            for p in dirpath.iterdir():
                p.unlink()
    raise AssertionError("no writable case in 20 draws")


def _make_case(dirpath: Path, rng: np.random.Generator) -> tp.Tuple[Path, tp.List[str]]:
    path = dirpath / "case.h5"
    muts: tp.List[str] = []
    n = int(rng.choice([0, 1, 7, 64, 130, 200]))
    shapes: tp.List[tp.Tuple[int, ...]] = [(), (4,), (70,), (3, 5)]
    sample = shapes[int(rng.integers(len(shapes)))] if rng.random() < 0.3 else (70,)
    base = str(rng.choice(["contiguous", "chunked", "gzip"]))
    dtx = str(rng.choice(DTYPES)) if rng.random() < 0.35 else "f4"
    muts += [f"base={base}", f"n={n}", f"sample={sample}", f"dtype={dtx}"]
    dt = _dtype(dtx)
    kw: tp.Dict[str, tp.Any] = {}
    if base != "contiguous" and n:
        rows = int(rng.integers(1, max(2, n)))
        chunk = (rows,) + sample
        if sample and rng.random() < 0.3:  # chunks that split a sample
            chunk = (rows,) + tuple(max(1, s // 2) for s in sample)
            muts.append("split-chunks")
        kw["chunks"] = chunk
        if base == "gzip":
            kw["compression"] = "gzip"
            if rng.random() < 0.3:
                kw["shuffle"] = True
                muts.append("shuffle")
            if rng.random() < 0.2:
                kw["fletcher32"] = True
                muts.append("fletcher32")
        elif rng.random() < 0.3:
            kw["compression"] = "lzf"
            muts.append("lzf")
    ny = n if rng.random() > 0.1 else max(0, n - 1)
    if ny != n:
        muts.append("ragged")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=_values(dt, (n,) + sample, rng), dtype=dt, **kw)
        if rng.random() < 0.1:
            f.create_group("y")
            muts.append("y-is-group")
        elif rng.random() < 0.05:
            f["y"] = np.int64(3)
            muts.append("y-scalar")
        else:
            f.create_dataset("y", data=np.arange(ny, dtype=np.int64))
        if rng.random() < 0.2:
            f["x"].attrs["note"] = "x" * int(rng.integers(1, 5000))
            f.attrs["big"] = np.arange(int(rng.integers(1, 2000)))
            muts.append("attrs")
        link = rng.random()
        if link < 0.08:
            with h5py.File(dirpath / "other.h5", "w") as g:
                g["decoy"] = np.full((500,), -1.0, np.float32)
                g.create_dataset("x", data=np.arange(max(n, 1) * 70, dtype=np.float32).reshape(-1, 70)[:n] + 0.5)
            f["x_link"] = h5py.ExternalLink("other.h5", "x")
            muts.append("external-link")
        elif link < 0.12:
            f["x_link"] = h5py.ExternalLink("missing.h5", "x")
            muts.append("dangling-external-link")
        elif link < 0.16:
            f["x_link"] = h5py.SoftLink("/x")
            muts.append("soft-link")
        elif link < 0.2 and n and sample and getattr(dt, "kind", "O") in "fiucb" and dt.fields is None:
            src = "case.h5" if rng.random() < 0.5 else "gone.h5"
            lay = h5py.VirtualLayout((n,) + sample, dt if dt.fields is None else "f4")
            lay[:] = h5py.VirtualSource(src if src == "gone.h5" else ".", "x", (n,) + sample)
            f.create_virtual_dataset("x_link", lay, fillvalue=0)
            muts.append(f"vds-{'missing' if src == 'gone.h5' else 'self'}")
    data = bytearray(path.read_bytes())
    damage = rng.random()
    if damage < 0.15 and len(data) > 16:
        cut = int(rng.integers(1, len(data)))
        data = data[:cut]
        muts.append(f"truncated@{cut}")
    elif damage < 0.4 and data:
        flips = int(rng.integers(1, 12))
        for pos in rng.integers(0, len(data), size=flips):
            data[int(pos)] ^= 1 << int(rng.integers(0, 8))
        muts.append(f"flips={flips}")
    path.write_bytes(bytes(data))
    return path, muts


def check_inspect(path: Path, muts: tp.List[str]) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_main(data_main, "data", ["inspect", str(path)])
    text = err.getvalue()
    assert code in (0, 1, 2), (muts, code, text)
    assert "Traceback" not in text and text.count("\n") <= 1, (muts, text)
    if code:
        assert text.startswith("hpctrain data: error: "), (muts, text)
    return code


def check_loader(path: Path, key: str, muts: tp.List[str], workers: int) -> str:
    cfg = H5DataConfig(
        files=[str(path)], keys=(key, "y"), global_batch_size=4, tail="pad", num_workers=workers, start_method="fork"
    )
    try:
        loader = H5Loader(cfg, rank=0, world_size=1)
    except HpctrainError as exc:
        assert "\n" not in str(exc), (muts, str(exc))
        return "refused"
    got: tp.List[tp.Dict[str, np.ndarray]] = []
    with loader:
        try:
            for i, batch in enumerate(loader):
                got.append({k: v.numpy().copy() for k, v in batch.items()})
                if i == 2:
                    break
            failed = None
        except HpctrainError as exc:
            assert "\n" not in str(exc) and "Traceback" not in str(exc), (muts, str(exc))
            failed = str(exc)
    ids = np.unique(np.concatenate([b["index"] for b in got])) if got else np.arange(0)
    if failed is not None:  # accepted only where h5py cannot read the dataset either
        try:
            with h5py.File(path, "r") as f:
                f[key][()], f["y"][()]
        except Exception:  # noqa: BLE001
            return "read-error"
        raise AssertionError(f"loader failed where h5py reads the data: {muts}: {failed}")
    try:
        with h5py.File(path, "r") as f:
            rows = {k: f[k][ids] for k in (key, "y")}  # h5py's read of exactly the delivered samples
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"loader returned samples h5py cannot read: {muts}: {exc}") from None
    ref = {k: np.zeros((int(ids.max()) + 1,) + v.shape[1:], v.dtype) for k, v in rows.items()} if len(ids) else {}
    for k in ref:
        ref[k][ids] = rows[k]
    if len(ids) and not _h5py_stable(path, (key, "y"), ids, ref):
        return "h5py-unstable"  # a damaged chunk of a filter without checksum decodes into uninitialised memory
    for b in got:
        for k in (key, "y"):
            np.testing.assert_array_equal(b[k], ref[k][b["index"]], err_msg=f"{muts} key {k}")
    return "read"


def _h5py_stable(path: Path, keys: tp.Sequence[str], ids: np.ndarray, ref: tp.Dict[str, np.ndarray]) -> bool:
    """Does h5py read the same values for these ids one row at a time as in one whole read?"""
    try:
        with h5py.File(path, "r") as f:
            for k in keys:
                rows = np.stack([f[k][int(i)] for i in ids])
                if not np.array_equal(rows, ref[k][ids], equal_nan=rows.dtype.kind in "fc"):
                    return False
    except Exception:  # noqa: BLE001
        return False
    return True


def test_fuzz_inspect_and_loader(tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    outcomes: tp.Dict[str, int] = {}
    for case in range(CASES):
        case_dir = tmp_path / f"c{case}"
        case_dir.mkdir()
        path, muts = make_case(case_dir, rng)
        with bounded(CASE_TIMEOUT_S):
            code = check_inspect(path, muts)
            key = "x_link" if any(m.endswith("link") or m.startswith("vds") for m in muts) else "x"
            how = check_loader(path, key, muts, workers=1 if case % 10 == 0 else 0)
        outcomes[f"inspect={code}"] = outcomes.get(f"inspect={code}", 0) + 1
        outcomes[how] = outcomes.get(how, 0) + 1
    print(f"fuzz: {CASES} cases, seed {SEED}: {dict(sorted(outcomes.items()))}")
    # the mutations must exercise both sides: files the loader reads and files it refuses
    assert outcomes.get("read", 0) > CASES // 10 and outcomes.get("refused", 0) > CASES // 10


@pytest.mark.parametrize("case", range(4))
def test_fuzz_inspect_as_a_real_process(tmp_path: Path, case: int) -> None:
    rng = np.random.default_rng([SEED, 1000 + case])
    for _ in range(3):  # pick a damaged case when the draw gives one
        path, muts = make_case(tmp_path, rng)
        if any(m.startswith(("flips", "truncated", "dangling")) for m in muts):
            break
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", "inspect", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode in (0, 1, 2), (muts, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") <= 1, (muts, proc.stderr)
