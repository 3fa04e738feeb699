"""Data fingerprints: the cheap tier (structure), the sampled content tier (labelled as a sample), its cache,
the full hash and its CLI, and record_data refusing a changed input on resume (one line) unless accepted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.data import fingerprint as fp
from hpctrain.data.synth import make_dataset
from hpctrain.errors import UsageError
from hpctrain.identity import current_identity, record_data
from hpctrain.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gz(tmp_path):
    return make_dataset(tmp_path / "train.h5", 640, shape=(2, 4, 4), chunk_samples=32, compression="gzip")


@pytest.fixture
def contig(tmp_path):
    return make_dataset(tmp_path / "contig.h5", 900, shape=(3, 8, 8))


def test_cheap_tier_is_metadata_only(gz, monkeypatch):
    calls = []
    monkeypatch.setattr(fp, "_sample_dataset", lambda *a, **k: calls.append(a))
    cheap = fp.cheap_fingerprint(gz)
    assert calls == [] and cheap["format"] == "hdf5" and cheap["size"] == os.path.getsize(gz)
    x = cheap["structure"]["/x"]
    assert x["shape"] == [640, 2, 4, 4] and x["dtype"] == "<f4" and x["chunks"] == [32, 2, 4, 4]
    assert x["layout"] == "chunked" and [f[3] for f in x["filters"]] == ["deflate"]
    assert cheap["structure"]["/"]["attrs"]["synth_version"] == 2


def test_content_tier_is_a_labelled_sample(gz):
    content = fp.content_fingerprint(gz)
    assert content["kind"] == "sample" and content["params"]["k"] == fp.SAMPLE_K
    x = content["datasets"]["/x"]
    assert x["method"] == "raw chunks" and x["of"] == 20 and x["sampled"] == fp.SAMPLE_K + 2
    assert "chunk_index_sha256" in x
    assert fp.sample_indices(20, 8) == [0, 2, 4, 6, 8, 11, 13, 15, 17, 19]
    assert fp.content_fingerprint(gz)["sha256"] == content["sha256"]  # deterministic


def test_a_changed_byte_inside_a_sampled_chunk_is_detected(gz):
    before = fp.fingerprint_files([gz])[0]
    with h5py.File(gz, "r+") as f:
        x = f["x"][0]
        x[1, 2, 3] += 1.0
        f["x"][0] = x  # sample 0 lives in chunk 0: always sampled
    after = fp.fingerprint_files([gz])[0]
    changes, _ = fp.compare(before, after)
    assert changes and "sampled content of '/x' differs" in changes[-1]
    assert after["cheap"]["structure_sha256"] == before["cheap"]["structure_sha256"]


def test_a_changed_byte_in_contiguous_data_is_detected(contig):
    before = fp.fingerprint_files([contig])[0]
    with h5py.File(contig, "r") as f:
        offset = f["x"].id.get_offset()
    assert before["content"]["datasets"]["/x"]["method"] == "raw blocks"
    with open(contig, "r+b") as f:  # one byte of the first block (always sampled), in place
        f.seek(offset + 10)
        b = f.read(1)
        f.seek(offset + 10)
        f.write(bytes([b[0] ^ 1]))
    changes, _ = fp.compare(before, fp.fingerprint_files([contig])[0])
    assert changes == ["sampled content of '/x' differs"]


def test_a_sample_is_not_the_file(tmp_path):
    """The documented limit: a change in an unsampled chunk of uncompressed data is not seen by the sample
    (its stored size is unchanged), and full_hash sees it."""
    path = make_dataset(tmp_path / "u.h5", 3200, shape=(4,), chunk_samples=10)  # 320 chunks, 10 sampled
    before = fp.fingerprint_files([path])[0]
    full = fp.full_hash(path)
    with h5py.File(path, "r+") as f:
        f["x"][15] = f["x"][15] + 1  # chunk 1: not among 0, 35, 71, ...
    after = fp.fingerprint_files([path])[0]
    assert after["content"]["sha256"] == before["content"]["sha256"]
    assert fp.full_hash(path)["sha256"] != full["sha256"]


def test_a_changed_shape_is_a_structure_change(tmp_path, gz):
    before = fp.fingerprint_files([gz])[0]
    make_dataset(gz, 700, shape=(2, 4, 4), chunk_samples=32, compression="gzip")
    changes, _ = fp.compare(before, fp.fingerprint_files([gz])[0])
    assert any("'/x' shape [640,2,4,4] -> [700,2,4,4]" in c for c in changes), changes


def test_links_and_virtual_datasets_are_in_the_structure(tmp_path):
    src = make_dataset(tmp_path / "src.h5", 50, shape=(2,))
    main = tmp_path / "main.h5"
    with h5py.File(main, "w") as f:
        f["ext"] = h5py.ExternalLink("src.h5", "/x")
        f["soft"] = h5py.SoftLink("/ext")
        layout = h5py.VirtualLayout(shape=(50, 2), dtype="f4")
        layout[:] = h5py.VirtualSource("src.h5", "x", shape=(50, 2))
        f.create_virtual_dataset("vds", layout)
        f["dangling"] = h5py.ExternalLink("missing.h5", "/x")
    cheap = fp.cheap_fingerprint(str(main))
    s = cheap["structure"]
    assert s["/ext"]["type"] == "external link" and s["/ext"]["file"] == "src.h5"
    assert s["/ext"]["dataset"]["reads_files"] == {
        os.path.realpath(src): {"size": os.path.getsize(src), "mtime_ns": os.stat(src).st_mtime_ns}
    }
    assert s["/soft"]["target"] == "/ext" and s["/dangling"]["dangling"] is True
    assert s["/vds"]["layout"] == "virtual" and s["/vds"]["virtual_sources"] == [["src.h5", "x"]]
    content = fp.content_fingerprint(str(main), cheap)
    assert (
        content["datasets"]["/vds"]["method"] == "row slices" and content["datasets"]["/ext"]["method"] == "raw blocks"
    )


def test_the_cache_avoids_rereading(gz, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache.json")
    first = fp.fingerprint_files([gz], cache_path=cache)[0]
    assert not first["cached"] and first["content"]["bytes_read"] > 0

    def no_reads(*a, **k):
        raise AssertionError("the content tier was read again")

    monkeypatch.setattr(fp, "_sample_dataset", no_reads)
    second = fp.fingerprint_files([gz], cache_path=cache)[0]
    assert second["cached"] and second["content"] == first["content"]
    os.utime(gz, ns=(os.stat(gz).st_atime_ns, os.stat(gz).st_mtime_ns + 10**9))  # a touch: cheap tier changed
    monkeypatch.undo()
    third = fp.fingerprint_files([gz], cache_path=cache)[0]
    assert not third["cached"] and third["content"]["sha256"] == first["content"]["sha256"]
    changes, notes = fp.compare(first, third)
    assert changes == [] and notes and notes[0].startswith("mtime_ns")


def test_a_file_that_is_not_hdf5_is_sampled_as_bytes(tmp_path):
    path = tmp_path / "tokens.bin"
    path.write_bytes(np.arange(3 << 20, dtype=np.uint8).tobytes())
    rec = fp.fingerprint_files([str(path)])[0]
    assert rec["cheap"]["format"] == "raw" and rec["content"]["datasets"]["<bytes>"]["of"] == 3


# --------------------------------------------------------------------------------------------- record_data
def test_record_data_refuses_a_changed_input_with_one_line_and_accepts_it_when_asked(gz, tmp_path):
    run = tmp_path / "run"
    first = record_data(run, "5", 0, [gz])
    rec = json.loads(RunDir(run).identity_attempt("5", 0).read_text())
    assert rec["data"]["files"][0]["content"]["kind"] == "sample" and first.sections["data"]
    same = record_data(run, "5", 1, [gz])  # a requeue on the same data: cached, same identity
    assert same.identity == first.identity and same.changed == ()
    assert json.loads(RunDir(run).identity_attempt("5", 1).read_text())["data"]["content_cached"] is True
    make_dataset(gz, 700, shape=(2, 4, 4), chunk_samples=32, compression="gzip")  # regenerated, longer
    with pytest.raises(UsageError) as err:
        record_data(run, "5", 2, [gz], accept_hint="--accept-data-change")
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{gz}: the input data changed since attempt 5-r1 (")
    assert "'/x' shape [640,2,4,4] -> [700,2,4,4]" in line and line.endswith(
        "--accept-data-change trains on it anyway (the acceptance is recorded)"
    )
    refused = json.loads(RunDir(run).identity_attempt("5", 2).read_text())
    assert refused["data"] is None and refused["data_refused"]["compared_with"] == "5-r1"
    with pytest.raises(UsageError):  # still refused: the refused attempt did not become the baseline
        record_data(run, "5", 3, [gz])
    accepted = record_data(run, "5", 4, [gz], accept_change=True)
    rec = json.loads(RunDir(run).identity_attempt("5", 4).read_text())
    assert rec["data"]["accepted_change"]["from_attempt"] == "5-r1" and rec["data"]["accepted_change"]["by"]
    assert accepted.data_change_accepted and accepted.changed == ("data",) and accepted.identity != first.identity
    after = record_data(run, "5", 5, [gz])  # the accepted data is the new baseline
    assert after.changed == () and after.identity == accepted.identity
    assert current_identity(run, "5", 5).identity == after.identity


def test_record_data_sees_a_changed_byte_and_added_files(gz, tmp_path):
    run = tmp_path / "run"
    record_data(run, "1", 0, [gz])
    with h5py.File(gz, "r+") as f:
        f["y"][0] = f["y"][0] + 1
    with pytest.raises(UsageError, match=r"sampled content of '/y' differs"):
        record_data(run, "1", 1, [gz])
    other = make_dataset(tmp_path / "extra.h5", 10, shape=(2,))
    with pytest.raises(UsageError, match=r"extra.h5: the input data changed .*input files added extra.h5"):
        record_data(run, "1", 2, [gz, other], accept_hint="x")


def test_a_copy_staged_elsewhere_is_the_same_data(gz, tmp_path):
    run = tmp_path / "run"
    a = record_data(run, "1", 0, [gz])
    staged = tmp_path / "nvme"
    staged.mkdir()
    copy = shutil.copy2(gz, staged / "train.h5")
    b = record_data(run, "1", 1, [copy])
    assert b.identity == a.identity and b.changed == ()
    notes = json.loads(RunDir(run).identity_attempt("1", 1).read_text())["data"]["compared_with"]["notes"]
    assert any(n.startswith("train.h5: path") for n in notes)


# --------------------------------------------------------------------------------------------- full hash + CLI
def test_full_hash_is_sha256sum(gz):
    full = fp.full_hash(gz)
    assert full["kind"] == "full" and full["sha256"] == hashlib.sha256(Path(gz).read_bytes()).hexdigest()
    assert full["size"] == os.path.getsize(gz)


def data_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_data_hash_cli(gz, contig, tmp_path):
    proc = data_cli("hash", gz, contig, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    if shutil.which("sha256sum"):
        assert proc.stdout == subprocess.run(["sha256sum", gz, contig], capture_output=True, text=True).stdout
    js = data_cli("hash", "--json", gz, cwd=tmp_path)
    files = json.loads(js.stdout)["files"]
    assert files[0]["sha256"] == hashlib.sha256(Path(gz).read_bytes()).hexdigest() and files[0]["kind"] == "full"
    bad = data_cli("hash", gz, str(tmp_path / "missing.h5"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert (
        bad.stderr.strip()
        == f"hpctrain data: error: data hash: {tmp_path / 'missing.h5'}: no such file; check the path"
    )
    assert data_cli("hash", str(tmp_path), cwd=tmp_path).returncode == 2


def test_many_files_keep_the_record_small(tmp_path, monkeypatch):
    from hpctrain.identity import manifest as mf

    monkeypatch.setattr(mf, "STRUCTURE_FILES_LIMIT", 1)
    a = make_dataset(tmp_path / "a.h5", 10, shape=(2,))
    b = make_dataset(tmp_path / "b.h5", 10, shape=(2,))
    run = tmp_path / "run"
    record_data(run, "1", 0, [a, b])
    rec = json.loads(RunDir(run).identity_attempt("1", 0).read_text())
    assert all(f["cheap"]["structure"] is None and f["cheap"]["structure_omitted"] for f in rec["data"]["files"])
    make_dataset(b, 12, shape=(2,))
    with pytest.raises(
        UsageError, match=r"b.h5: the input data changed since attempt 1-r0 \(HDF5 structure changed; size "
    ):
        record_data(run, "1", 1, [a, b])
