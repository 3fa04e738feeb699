"""What ``python -m hpctrain reproduce`` takes from a bundle: the verified bundle itself, its code rebuilt into
the new run, its checkpoint placed where the Trainer resumes from it, the CPU threads its ranks ran with.

Login node, no torch; nothing of the bundle is imported or executed here (the code is unpacked and hashed).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.bundle.layout import BundleLayout
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import read_json

__all__ = ["Opened", "open_bundle", "need", "identity_source", "restore_code", "place_checkpoint", "recorded_threads"]


# ---------------------------------------------------------------------------------------------- the bundle
@dataclass
class Opened:
    """A verified bundle: its directory (a tar's unpacked copy), records, and the verify report."""

    shown: Path
    root: Path
    report: tp.Dict[str, tp.Any]
    record: tp.Dict[str, tp.Any]
    scratch: tp.Optional[Path] = None
    warnings: tp.List[str] = field(default_factory=list)

    @property
    def layout(self) -> BundleLayout:
        return BundleLayout(self.root)

    def close(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def open_bundle(path: Path, scratch_parent: tp.Optional[Path] = None, *, checkpoint: bool = True) -> Opened:
    """Verify ``path`` (a bundle directory or its tar, streamed: nothing is unpacked before it verifies) and read
    its record. A tar that verified is then unpacked into a private scratch directory in ``scratch_parent`` (else
    the system's temporary directory): every member but, without ``checkpoint``, the checkpoint's files, each
    checked against the verified file list as it is written.
    UsageError when it is not a bundle; HpctrainError naming the first failed check."""
    from hpctrain.bundle.verify import extract_verified, verify_bundle

    if not os.path.lexists(path):
        raise UsageError(f"BUNDLE {path} does not exist")
    scratch = None
    root = path
    report = verify_bundle(path)  # a directory, or a tar streamed; UsageError when it is neither
    if not path.is_dir() and report["ok"]:
        where = scratch_parent if scratch_parent is not None and scratch_parent.is_dir() else None
        scratch = Path(tempfile.mkdtemp(prefix=".hpctrain-reproduce-", dir=where))
        try:
            keep = (lambda rel: True) if checkpoint else (lambda rel: not rel.startswith(BundleLayout.CHECKPOINT + "/"))
            root = extract_verified(path, scratch, report, include=keep)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    opened = Opened(shown=path, root=root, report=report, record={}, scratch=scratch)
    if not report["ok"]:
        opened.close()
        failed = [(c["check"], p) for c in report["checks"] for p in c["problems"]]
        check, first = failed[0] if failed else ("bundle", "failed")
        more = f" (+{len(failed) - 1} more problem(s))" if len(failed) > 1 else ""
        raise HpctrainError(
            f"BUNDLE {path} does not verify: {check}: {first}{more}; python -m hpctrain bundle verify {path} "
            "shows every check"
        )
    opened.warnings = [f"{c['check']}: {w}" for c in report["checks"] for w in c["warnings"]]
    opened.record = read_json(opened.layout.record, []) or {}
    return opened


def need(opened: Opened, path: Path, what: str) -> tp.Dict[str, tp.Any]:
    """The JSON record ``path`` of the bundle, which reproduce cannot do without: HpctrainError naming it."""
    problems: tp.List[str] = []
    doc = read_json(path, problems)
    if doc is None:
        why = problems[0] if problems else "missing"
        raise HpctrainError(f"BUNDLE {opened.shown}: {opened.layout.rel(path)} ({what}): {why}; cannot reproduce")
    return doc


def identity_source(opened: Opened) -> tp.Dict[str, tp.Any]:
    """The newest attempt's identity record (what the data fingerprint and runtime come from)."""
    rel = (opened.record.get("parts") or {}).get("identity_source")
    if isinstance(rel, str) and rel and ".." not in rel.split("/"):
        doc = read_json(opened.root / rel, [])
        if doc is not None:
            return doc
    return read_json(opened.layout.identity_submit, []) or {}


# ---------------------------------------------------------------------------------------------- the code
def _entry_root(code: tp.Mapping[str, tp.Any], repo: tp.Mapping[str, tp.Any], tree: Path) -> Path:
    """The directory of the rebuilt tree the entry's module is imported from (its package's parent)."""
    from hpctrain._entry import import_root, split_entry

    module = split_entry(str(code.get("entry")))[0]
    if repo.get("kind") == "files":
        return tree
    entry_file, root = code.get("entry_file"), repo.get("root")
    if not isinstance(entry_file, str) or not isinstance(root, str):
        raise HpctrainError("the recorded code names no entry file inside its repository; cannot run it from the tree")
    try:
        rel = import_root(entry_file, module).relative_to(root)
    except (IndexError, ValueError):
        raise HpctrainError(f"the entry file {entry_file} is not inside its recorded repository {root}") from None
    return tree / rel


def restore_code(opened: Opened, dest: Path) -> tp.Dict[str, tp.Any]:
    """Rebuild the snapshot into ``dest`` and check it: the snapshot's sha256 against the submit record's, every
    file hash against the recorded code section. Returns ``{"repositories", "code_path", "cwd", "notes"}``."""
    from hpctrain._entry import module_file, split_entry
    from hpctrain.bundle._io import hash_file
    from hpctrain.identity.snapshot import restore_snapshot

    lay = opened.layout
    submit = need(opened, lay.identity_submit, "the identity manifest at submit: the recorded code")
    code = submit.get("code") if isinstance(submit.get("code"), dict) else {}
    repos = code.get("repositories") if isinstance(code.get("repositories"), dict) else {}
    entry_repo = repos.get("entry") if isinstance(repos.get("entry"), dict) else {}
    if entry_repo.get("kind") not in ("git", "files"):
        why = entry_repo.get("reason") or entry_repo.get("kind") or "not recorded"
        raise HpctrainError(f"the run's code was not captured at submit ({shorten(why, 200)}): nothing to rebuild")
    if not lay.code_snapshot.is_file():
        raise HpctrainError(f"BUNDLE {opened.shown} holds no {lay.rel(lay.code_snapshot)}: nothing to rebuild from")
    want = (code.get("snapshot") or {}).get("sha256") if isinstance(code.get("snapshot"), dict) else None
    got, _ = hash_file(lay.code_snapshot)
    notes: tp.List[str] = []
    if want is None:
        notes.append("the submit record names no snapshot sha256: the snapshot is checked by its file hashes only")
    elif got != want:
        raise HpctrainError(
            f"{lay.rel(lay.code_snapshot)}: sha256 {got[:16]}... is not the {want[:16]}... the submission recorded"
        )
    results = restore_snapshot(lay.code_snapshot, dest, recorded=repos)
    problems = [p for r in results.values() for p in r["problems"]]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise HpctrainError(f"the rebuilt code is not the recorded code: {problems[0]}{more}")
    notes += [n for r in results.values() for n in r["notes"]]
    tree = Path(results["entry"]["tree"])
    module = split_entry(str(code.get("entry")))[0]
    code_path = _entry_root(code, entry_repo, tree)
    if module_file(code_path, module) is None:
        raise HpctrainError(f"the rebuilt tree holds no module {module} under {code_path}")
    if module.split(".")[0] == "hpctrain":
        notes.append(
            "the entry is part of hpctrain, which every task imports before the entry: it runs from the installed "
            "hpctrain (the environment table says whether that differs from the recorded one)"
        )
    # the job starts where the run was submitted from, translated into the rebuilt tree when it lay inside it
    cwd = None
    submission = read_json(lay.submission, []) or {}
    old_cwd = submission.get("cwd") if isinstance(submission.get("cwd"), str) else None
    if old_cwd and entry_repo.get("kind") == "git" and isinstance(entry_repo.get("root"), str):
        rel = os.path.relpath(old_cwd, entry_repo["root"])
        if not rel.startswith("..") and (tree / rel).is_dir():
            cwd = os.path.normpath(tree / rel)
    elif old_cwd and entry_repo.get("kind") == "files":
        if os.path.normpath(old_cwd) == os.path.dirname(str(entry_repo.get("root") or "").rstrip("/")):
            cwd = str(code_path)
    newest = identity_source(opened).get("code")
    moved = (newest.get("vs_submit") or {}) if isinstance(newest, dict) else {}
    if moved and not moved.get("same", True):
        notes.append(
            "the newest attempt ran code that differs from the submitted snapshot ("
            + "; ".join(str(d) for d in moved.get("differences", [])[:3])
            + "): the snapshot rebuilds the submitted code"
        )
    return {
        "snapshot_sha256": got,
        "repositories": results,
        "code_path": str(code_path),
        "cwd": cwd,
        "entry": code.get("entry"),
        "notes": notes,
    }


def place_checkpoint(opened: Opened, ckpt_dir: Path) -> tp.Dict[str, tp.Any]:
    """Hard-link (else copy) the bundled checkpoint into ``ckpt_dir`` and verify the copy: the checkpoint's own
    verify, and its manifest's sha256 against the bundle's record."""
    from hpctrain.approvals import checkpoint_identity
    from hpctrain.bundle._io import link_or_copy, regular_files
    from hpctrain.ckpt import verify as verify_checkpoint
    from hpctrain.errors import CheckpointFormatError

    ck = opened.record.get("checkpoint") if isinstance(opened.record.get("checkpoint"), dict) else {}
    rel = str(ck.get("dir") or "")
    src = opened.root / rel
    if not rel.startswith(f"{BundleLayout.CHECKPOINT}/") or not src.is_dir():
        raise HpctrainError(f"BUNDLE {opened.shown}: no bundled checkpoint ({rel or 'none recorded'})")
    dst = ckpt_dir / src.name
    if os.path.lexists(dst):
        raise UsageError(f"{dst} exists already; reproduce into a new run directory")
    files, _ = regular_files(src)
    how = "hardlink"
    for f in files:
        if link_or_copy(f, dst / f.relative_to(src)) == "copy":
            how = "copy"
    try:
        manifest = verify_checkpoint(dst)
        sha = checkpoint_identity(dst)
    except CheckpointFormatError as exc:
        raise HpctrainError(f"the placed checkpoint {dst} does not verify: {exc}") from None
    if sha != ck.get("manifest_sha256"):
        raise HpctrainError(f"the placed checkpoint {dst}: manifest sha256 {sha[:16]}... is not the bundled one")
    return {"path": str(dst), "step": manifest.get("step"), "world_size": manifest.get("world_size"), "how": how}


def recorded_threads(ident: tp.Mapping[str, tp.Any]) -> tp.Tuple[tp.Optional[int], str]:
    """The intra-op CPU threads each rank of the recorded attempt ran with, and how that is known: recorded
    (``attempt.cpu_threads``), else what :func:`hpctrain.runtime.process_group.cpu_threads` chose from the
    recorded job (``SLURM_CPUS_PER_TASK``; a local job: the machine's CPUs over its ranks), else unknown.
    A different count can change float sums (a GEMM splits its reductions by thread), so a reproduction pins it."""
    att = ident.get("attempt") if isinstance(ident.get("attempt"), dict) else {}
    runtime = ident.get("runtime") if isinstance(ident.get("runtime"), dict) else {}
    slurm = runtime.get("slurm") if isinstance(runtime.get("slurm"), dict) else {}
    value = att.get("cpu_threads")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, "recorded"
    cpt = str(slurm.get("SLURM_CPUS_PER_TASK") or "")
    if cpt.isdigit() and int(cpt) > 0:
        return int(cpt), f"the recorded job's SLURM_CPUS_PER_TASK={cpt}"
    count = (runtime.get("cpu") or {}).get("count") if isinstance(runtime.get("cpu"), dict) else None
    world = att.get("world_size")
    if att.get("launcher") in ("submitit-local", "single") and isinstance(count, int) and isinstance(world, int):
        return max(1, count // max(1, world)), f"{count} CPUs of its machine over its {world} local rank(s)"
    return None, "not recorded"
