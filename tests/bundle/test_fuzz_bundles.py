"""Seeded fuzz of damaged and tampered bundles, as a directory and as a tar (plain and gzip-compressed).

Every case ends in one of two ways: ``bundle verify`` fails and a problem (one line) names the damaged or
tampered file, or (only for a mutation that changes nothing) it passes. Never a traceback, never more than
:data:`SCRATCH_BOUND` bytes of scratch, nothing left behind, every case within a hard time bound.

The bundle is of the demo run (tests/bundle/conftest.py) with identity records of format 2 (the code snapshot's
content hash bound into the identity), built once per module; each case changes a copy."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import tarfile
import typing as tp
from pathlib import Path

import pytest

from hpctrain.approvals import approve
from hpctrain.bundle import verify as verify_mod
from hpctrain.bundle._io import regular_files
from hpctrain.bundle.build import build_bundle, file_list_text
from hpctrain.bundle.layout import BundleLayout
from hpctrain.bundle.verify import verify_bundle
from hpctrain.errors import HpctrainError
from hpctrain.identity.manifest import IDENTITY_FORMAT, identity_hash, section_digests, snapshot_digest
from hpctrain.rundir import RunDir
from tests.bundle.conftest import DEMO_ARGS
from tests.fuzzing import bounded

SCRATCH_BOUND = 4 << 20
"""The most scratch one verify may write for this small bundle (its records; never shards or the snapshot)."""
CASE_SECONDS = 20
SEEDS = range(3)


# ---------------------------------------------------------------------------------------------- the bundle
def _bind(rec: tp.Dict[str, tp.Any], digest: tp.Mapping[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    rec = dict(rec, identity_format=IDENTITY_FORMAT)
    keys = ("sha256", "bytes", "content_sha256")
    rec["code"] = dict(rec["code"], snapshot={"path": "identity/code.tar.gz", **{k: digest[k] for k in keys}})
    rec["identity_sections"] = section_digests(rec)
    rec["identity"] = identity_hash(rec)
    return rec


@pytest.fixture(scope="module")
def base(demo_run, tmp_path_factory) -> tp.Dict[str, tp.Any]:
    root = tmp_path_factory.mktemp("fuzz")
    run = RunDir(root / "run")
    shutil.copytree(demo_run.root, run.root)
    lines = [json.loads(line) for line in run.ledger.read_text().splitlines()]
    for rec in lines:
        if rec.get("checkpoint_dir"):
            rec["checkpoint_dir"] = str(run.checkpoints)
    run.ledger.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    digest = snapshot_digest(run.code_snapshot)
    for path in run.identity.glob("*.json"):
        rec = json.loads(path.read_text())
        if rec.get("schema") == "hpctrain.identity/1" and "code" in rec:
            path.write_text(json.dumps(_bind(rec, digest)))
    sub = json.loads(run.submission.read_text())
    sub["config"] = {"entry": "hpctrain.examples.demo:main", "entry_args": list(DEMO_ARGS)}
    run.submission.write_text(json.dumps(sub))
    run.approvals.unlink()  # approvals name the run identity: made again for the new one
    approve(run, decision="approved", by="Grace Hopper", reason="fuzz base")
    out = root / "base.bundle"
    build_bundle(run.root, out, copy=True)
    report = verify_bundle(out)
    assert report["ok"], [p for c in report["checks"] for p in c["problems"]]
    assert not any("format 1" in w for c in report["checks"] for w in c["warnings"])
    ck_dirs = sorted(p.name for p in (out / "checkpoint").iterdir())
    others = sorted(p for p in run.checkpoints.iterdir() if p.is_dir() and p.name not in ck_dirs)
    assert ck_dirs and others
    return {"dir": out, "ckpt": ck_dirs[0], "other_ckpt": others[0], "root": root}


def _listed(bundle: Path) -> tp.List[str]:
    lay = BundleLayout(bundle)
    return sorted(lay.rel(f) for f in regular_files(bundle)[0] if lay.rel(f) != lay.FILE_LIST)


def _fix_manifest(bundle: Path) -> None:
    """Rewrite MANIFEST.sha256 for what the bundle holds now (the tamperer's "hashes fixed up")."""
    lay = BundleLayout(bundle)
    entries = [(rel, hashlib.sha256((bundle / rel).read_bytes()).hexdigest()) for rel in _listed(bundle)]
    lay.file_list.write_text(file_list_text(entries))


def _pack(src: Path, out: Path, *, gz: bool = False, extra: tp.Sequence[tp.Tuple[tarfile.TarInfo, bytes]] = ()) -> None:
    """A bundle directory as a tar (top directory ``bundle``), sorted; ``extra`` members appended."""
    with tarfile.open(out, "w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(str(src), arcname="bundle", recursive=False)
        for f in sorted(Path(d) / n for d, ds, ns in os.walk(src) for n in ns + ds):
            tf.add(str(f), arcname="bundle/" + f.relative_to(src).as_posix(), recursive=False)
        for info, data in extra:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)


def _listing(path: Path) -> tp.Any:
    """What a tar holds (names, kinds, contents) as a reference reader sees it; None when it cannot be read."""
    try:
        with tarfile.open(path, "r:*") as tf:
            out = []
            for m in tf:
                f = tf.extractfile(m) if m.isreg() else None
                out.append((m.name, m.type, m.linkname, hashlib.sha256(f.read()).hexdigest() if f else None))
            return out
    except Exception:  # noqa: BLE001 - any failure: the mutation changed something
        return None


def _edit_snapshot(path: Path) -> None:
    """A committed file inside the code snapshot edited (the snapshot re-written, as a tamperer would)."""
    buf = io.BytesIO()
    with tarfile.open(path, "r:gz") as src, tarfile.open(fileobj=buf, mode="w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if data is not None and m.name.endswith(".py"):
                data = data.replace(b"the user code", b"the edited code")
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    path.write_bytes(buf.getvalue())


def _rewrite_json(path: Path, change: tp.Callable[[tp.Dict[str, tp.Any]], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------- the mutations
Expect = tp.Tuple[str, tp.List[str]]  # ("fail", names one of which a problem must contain) or ("pass", [])


def _mutate_dir(kind: str, rng: random.Random, b: Path, base: tp.Mapping[str, tp.Any]) -> Expect:
    lay = BundleLayout(b)
    files = _listed(b)
    snap = lay.rel(lay.code_snapshot)
    records = sorted(r for r in files if r.startswith("identity/"))
    if kind == "flip":
        rel = rng.choice(files + [lay.FILE_LIST])
        data = bytearray((b / rel).read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (b / rel).write_bytes(bytes(data))
        return "fail", [rel]
    if kind == "truncate":
        rel = rng.choice(files)
        data = (b / rel).read_bytes()
        (b / rel).write_bytes(data[: rng.randrange(len(data))])
        return "fail", [rel]
    if kind in ("snapshot-edit", "snapshot-edit-deep"):
        _edit_snapshot(b / snap)
        digest = snapshot_digest(b / snap)
        for rel in records:  # the snapshot's sha256 fixed in every record...

            def fix(doc: tp.Dict[str, tp.Any]) -> None:
                doc["code"]["snapshot"]["sha256"] = digest["sha256"]
                if kind == "snapshot-edit-deep":  # ...and its content hash too: the identity no longer matches
                    doc["code"]["snapshot"]["content_sha256"] = digest["content_sha256"]

            _rewrite_json(b / rel, fix)
        _fix_manifest(b)
        return "fail", [snap] if kind == "snapshot-edit" else records
    if kind == "identity-edit":
        rel = rng.choice(records)
        edits = [
            lambda d: d["config"]["entry_args"].append("--lr=9"),
            lambda d: d["runtime"]["python"].update(version="3.99.0"),
            lambda d: d["code"]["repositories"]["entry"].update(commit="f" * 40),
            lambda d: d["data"]["files"][0]["cheap"].update(size=1),
            lambda d: d.update(identity_format=1),
        ]
        _rewrite_json(b / rel, rng.choice(edits))
        _fix_manifest(b)
        return "fail", [rel]
    if kind == "identity-edit-deep":  # the newest record edited and its identity recomputed, bundle.json fixed
        rel = [r for r in records if not r.endswith("submit.json")][-1]
        _rewrite_json(b / rel, lambda d: d["config"]["entry_args"].append("--lr=9"))
        doc = json.loads((b / rel).read_text())
        doc["identity_sections"], doc["identity"] = section_digests(doc), identity_hash(doc)
        (b / rel).write_text(json.dumps(doc))

        def fix_record(rec: tp.Dict[str, tp.Any]) -> None:
            rec["run_identity"] = doc["identity"]
            for item in rec["identity_records"]:
                if item["file"] == rel:
                    item["identity"] = doc["identity"]

        _rewrite_json(lay.record, fix_record)
        _fix_manifest(b)
        return "fail", [lay.rel(lay.approvals)]  # the approval was made for the identity before the edit
    if kind == "shard-swap":  # a shard of another checkpoint (same shapes, other values), hashes fixed
        ck = b / "checkpoint" / base["ckpt"]
        shards = sorted(p.name for p in ck.iterdir() if p.name != "MANIFEST.json")
        name = rng.choice(shards)
        shutil.copyfile(base["other_ckpt"] / name, ck / name)
        _fix_manifest(b)
        return "fail", [f"checkpoint/{base['ckpt']}"]
    if kind == "extra":
        rel = rng.choice(["data/extra.txt", "run/notes.json", "checkpoint/evil.bin"])
        (b / rel).parent.mkdir(parents=True, exist_ok=True)
        (b / rel).write_bytes(rng.randbytes(64))
        return "fail", [rel]
    if kind == "missing":
        rel = rng.choice(files)
        (b / rel).unlink()
        return "fail", [rel]
    if kind == "symlink":
        rel = rng.choice(files)
        outside = b.parent / "outside.bin"
        shutil.copyfile(b / rel, outside)
        (b / rel).unlink()
        (b / rel).symlink_to(outside)
        return "fail", [rel]
    if kind == "submission-edit":
        _rewrite_json(lay.submission, lambda d: d["config"]["entry_args"].append("--evil"))
        _fix_manifest(b)
        return "fail", [lay.rel(lay.submission)]
    if kind == "noop":
        rel = rng.choice(files)
        (b / rel).write_bytes((b / rel).read_bytes())  # the same bytes, a new mtime
        os.utime(b, (1, 1))
        return "pass", []
    raise AssertionError(kind)


DIR_KINDS = [
    "flip",
    "truncate",
    "snapshot-edit",
    "snapshot-edit-deep",
    "identity-edit",
    "identity-edit-deep",
    "shard-swap",
    "extra",
    "missing",
    "symlink",
    "submission-edit",
    "noop",
]
PACKED_KINDS = ["snapshot-edit", "identity-edit", "shard-swap", "extra", "missing", "noop"]
"""Directory mutations packed into a tar: the tar's own checks (streamed) must find the same."""


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = ""
) -> tp.Tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    return info, data


def _mutate_tar(kind: str, rng: random.Random, work: Path, base: tp.Mapping[str, tp.Any]) -> tp.Tuple[Path, Expect]:
    src = work / "src.bundle"
    shutil.copytree(base["dir"], src)
    gz = kind.startswith("tgz")
    out = work / ("bundle.tar.gz" if gz else "bundle.tar")
    files = _listed(src)
    if kind.startswith("packed-"):
        expect = _mutate_dir(kind[len("packed-") :], rng, src, base)
        _pack(src, out, gz=rng.random() < 0.5)
        return out, expect
    if kind in ("tar-flip", "tgz-flip", "tar-truncate", "tgz-truncate"):
        _pack(src, out, gz=gz)
        before = _listing(out)
        data = bytearray(out.read_bytes())
        if kind.endswith("flip"):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(len(data))]
        out.write_bytes(bytes(data))
        return out, (("pass", []) if _listing(out) == before else ("fail", [out.name, *files]))
    rel = rng.choice(files)
    extra: tp.List[tp.Tuple[tarfile.TarInfo, bytes]] = []
    if kind == "tar-symlink":
        extra.append(_member(f"bundle/{rel}.link", tarfile.SYMTYPE, link=rng.choice(["/etc/passwd", "../../x", rel])))
        names = [f"{rel}.link"]
    elif kind == "tar-hardlink":
        extra.append(_member("bundle/data/hard", tarfile.LNKTYPE, link=f"bundle/{rel}"))
        names = ["data/hard"]
    elif kind == "tar-device":
        extra.append(_member("bundle/data/dev", tarfile.CHRTYPE))
        names = ["data/dev"]
    elif kind == "tar-path":
        name = rng.choice(["/etc/cron.d/x", "bundle/../escape", "../escape", "other/x"])
        extra.append(_member(name, data=b"x"))
        names = [name]
    elif kind == "tar-duplicate":
        extra.append(_member(f"bundle/{rel}", data=b"a second copy"))
        names = [rel]
    elif kind == "tar-extra":
        extra.append(_member("bundle/data/extra.bin", data=rng.randbytes(100)))
        names = ["data/extra.bin"]
    elif kind == "tar-oversized":  # a listed member replaced by one larger than the bundle recorded
        grown = (src / rel).read_bytes() + rng.randbytes(rng.randrange(1, 5000))
        (src / rel).write_bytes(grown)
        names = [rel]
    elif kind == "tar-missing":
        (src / rel).unlink()
        names = [rel]
    else:
        raise AssertionError(kind)
    _pack(src, out, gz=gz, extra=extra)
    return out, ("fail", names)


TAR_KINDS = [
    "tar-flip",
    "tgz-flip",
    "tar-truncate",
    "tgz-truncate",
    "tar-symlink",
    "tar-hardlink",
    "tar-device",
    "tar-path",
    "tar-duplicate",
    "tar-extra",
    "tar-oversized",
    "tar-missing",
    *[f"packed-{k}" for k in PACKED_KINDS],
]


# ---------------------------------------------------------------------------------------------- the oracle
@pytest.fixture
def scratch_meter(tmp_path, monkeypatch) -> tp.Dict[str, int]:
    """verify's scratch goes to a temporary directory of the test's own; its size is taken before removal."""
    tmp = tmp_path / "system-tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    seen = {"max": 0, "calls": 0}
    real = shutil.rmtree

    def measured(path: tp.Any, *args: tp.Any, **kwargs: tp.Any) -> None:
        if Path(path).is_dir() and tmp in Path(path).parents:
            size = sum(f.stat().st_size for f in regular_files(Path(path))[0])
            seen["max"], seen["calls"] = max(seen["max"], size), seen["calls"] + 1
        real(path, *args, **kwargs)

    monkeypatch.setattr(verify_mod.shutil, "rmtree", measured)
    seen["dir"] = tmp  # type: ignore[assignment]
    return seen


def _judge(path: Path, expect: Expect, meter: tp.Mapping[str, tp.Any]) -> None:
    verdict, names = expect
    beside = sorted(p.name for p in path.parent.iterdir())
    with bounded(CASE_SECONDS):
        try:
            report = verify_bundle(path)
        except HpctrainError as exc:  # a tar damaged before its first member, or not a bundle at all
            msg = str(exc)
            assert "\n" not in msg and verdict == "fail", (expect, msg)
            assert str(path) in msg or any(n in msg for n in names), (expect, msg)
            report = None
    assert sorted(p.name for p in path.parent.iterdir()) == beside  # nothing written beside the bundle
    assert not any(Path(meter["dir"]).iterdir())  # nor left in the temporary directory
    assert meter["max"] <= SCRATCH_BOUND, meter["max"]
    if report is None:
        return
    problems = [p for c in report["checks"] for p in c["problems"]]
    assert all(isinstance(p, str) and "\n" not in p for p in problems), problems
    if report.get("archive"):
        assert report["archive"]["scratch_bytes"] <= SCRATCH_BOUND
    if verdict == "pass":
        assert report["ok"], problems
        return
    assert not report["ok"], f"{expect}: verify passed"
    assert any(any(n in p for n in names) for p in problems), (expect, problems)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", DIR_KINDS)
def test_a_damaged_or_tampered_bundle_directory_fails_naming_the_file(kind, seed, base, tmp_path, scratch_meter):
    b = tmp_path / "case" / "b.bundle"
    b.parent.mkdir()
    shutil.copytree(base["dir"], b)
    expect = _mutate_dir(kind, random.Random(f"{kind}-{seed}"), b, base)
    _judge(b, expect, scratch_meter)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", TAR_KINDS)
def test_a_damaged_or_tampered_bundle_tar_fails_naming_the_file(kind, seed, base, tmp_path, scratch_meter):
    work = tmp_path / "work"
    work.mkdir()
    path, expect = _mutate_tar(kind, random.Random(f"{kind}-{seed}"), work, base)
    case = tmp_path / "case"
    case.mkdir()
    shutil.move(str(path), case / path.name)
    shutil.rmtree(work)
    _judge(case / path.name, expect, scratch_meter)


def test_an_intact_bundle_passes_in_every_form(base, tmp_path, scratch_meter):
    for gz in (False, True):
        out = tmp_path / ("b.tar.gz" if gz else "b.tar")
        _pack(base["dir"], out, gz=gz)
        report = verify_bundle(out)
        assert report["ok"], [p for c in report["checks"] for p in c["problems"]]
        assert report["format"] == "tar" and report["archive"]["scratch_bytes"] <= SCRATCH_BOUND


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: tp.Any) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def test_a_compressed_tar_with_a_huge_member_is_refused_at_its_header(base, tmp_path, scratch_meter):
    """A few hundred KB of gzip holding a member of hundreds of MB (of zeros): refused before its data is read,
    whether it comes before the file list (the ratio bound) or after it (not in the list), with no scratch."""
    huge = 320 << 20
    for first in (True, False):
        out = tmp_path / f"bomb-{first}.tar.gz"
        info = tarfile.TarInfo("bundle/zeros.bin")
        info.size = huge
        with tarfile.open(out, "w:gz", compresslevel=1) as tf:
            if first:
                tf.addfile(info, io.BufferedReader(_Zeros(huge), 1 << 20))
            tf.add(str(base["dir"]), arcname="bundle")
            if not first:
                tf.addfile(info, io.BufferedReader(_Zeros(huge), 1 << 20))
        assert out.stat().st_size < huge // 100
        with bounded(CASE_SECONDS):
            report = verify_bundle(out)
        problems = [p for c in report["checks"] for p in c["problems"]]
        assert not report["ok"] and any(p.startswith("zeros.bin: ") for p in problems), problems
        assert report["archive"]["bytes_read"] < huge and report["archive"]["scratch_bytes"] <= SCRATCH_BOUND
        assert scratch_meter["max"] <= SCRATCH_BOUND


def test_extract_verified_writes_only_what_verified_and_only_what_is_asked(base, tmp_path):
    """What reproduce unpacks from a tar: after verify, only the members asked for, each checked as it is
    written; a tar swapped after its verify is refused (nothing of it is used)."""
    from hpctrain.bundle.verify import extract_verified

    out = tmp_path / "b.tar"
    _pack(base["dir"], out)
    report = verify_bundle(out)
    assert report["ok"]
    dest = tmp_path / "x"
    dest.mkdir()
    top = extract_verified(out, dest, report, include=lambda rel: not rel.startswith("checkpoint/"))
    got = sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file())
    assert got == sorted(r for r in [*_listed(base["dir"]), "MANIFEST.sha256"] if not r.startswith("checkpoint/"))
    assert (top / "bundle.json").read_bytes() == (base["dir"] / "bundle.json").read_bytes()
    # swapped after the verify: another metrics file (its hash fixed in the list) -> refused
    src = tmp_path / "src"
    shutil.copytree(base["dir"], src)
    (src / "run" / "metrics.jsonl").write_text("{}\n")
    _fix_manifest(src)
    out.unlink()
    _pack(src, out)
    dest2 = tmp_path / "y"
    dest2.mkdir()
    with pytest.raises(HpctrainError, match="changed since it was verified"):
        extract_verified(out, dest2, report)
    with pytest.raises(HpctrainError, match="not verified"):
        extract_verified(out, dest2, dict(report, ok=False))
