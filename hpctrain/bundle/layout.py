"""The names inside a bundle: one owner, as :class:`hpctrain.rundir.RunDir` is for a run directory.

::

    BUNDLE/ro-crate-metadata.json          RO-Crate 1.1, Process Run Crate 0.5: what ran, when, by whom, on what
    BUNDLE/ro-crate-preview.html           the same for a browser (self-contained, offline)
    BUNDLE/README.md                       how to verify and reproduce
    BUNDLE/bundle.json                     the bundle's own record: where each part is, the chosen checkpoint,
                                           the run identity, the approval chain's count and head
    BUNDLE/MANIFEST.sha256                 sha256 of every other file (``sha256sum -c`` reads it), and of itself
    BUNDLE/run/submission.json             what was submitted (and run/submission-<n>.json: earlier ones)
    BUNDLE/run/sbatch.sh                   the exact sbatch script (Slurm runs)
    BUNDLE/run/ledger.jsonl                one record per start, end and exit of each attempt
    BUNDLE/run/metrics.jsonl               the loss curve and step measurements
    BUNDLE/run/approvals.jsonl             the hash-chained approval log
    BUNDLE/identity/submit.json            the identity manifest at submit
    BUNDLE/identity/<job>-r<restart>.json  the identity manifest of each attempt
    BUNDLE/code/snapshot.tar.gz            the code snapshot (git archive + diff + untracked, or package files)
    BUNDLE/environment/requirements.lock   name==version of every distribution the run's Python had
    BUNDLE/data/fingerprint.json           the data fingerprint (not the data)
    BUNDLE/data/content-cache.json         the content-tier fingerprints the run had computed
    BUNDLE/checkpoint/<step dir>/          the chosen committed checkpoint, as the checkpointer wrote it
"""

from __future__ import annotations

import os
import re
import typing as tp
from pathlib import Path

from hpctrain.rundir import RunDir, attempt_label  # the run's own file names, kept in the bundle's run/ folder

__all__ = ["BundleLayout", "BUNDLE_SCHEMA", "ARCHIVE_SUFFIXES"]

BUNDLE_SCHEMA = "hpctrain.bundle/1"
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
"""Names of a bundle written as one archive (``bundle --tar`` writes a plain ``.tar``; the others are a user's
compressed copy of one: ``bundle verify`` and ``reproduce`` stream them all)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class BundleLayout:
    """The paths of one bundle directory. Cheap; touches nothing on disk."""

    METADATA = "ro-crate-metadata.json"
    PREVIEW = "ro-crate-preview.html"
    README = "README.md"
    RECORD = "bundle.json"
    FILE_LIST = "MANIFEST.sha256"
    RUN = "run"
    IDENTITY = "identity"
    CODE = "code"
    ENVIRONMENT = "environment"
    DATA = "data"
    CHECKPOINT = "checkpoint"

    def __init__(self, root: tp.Union[str, "os.PathLike[str]"]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"BundleLayout({str(self.root)!r})"

    def rel(self, path: Path) -> str:
        """``path`` relative to the bundle, with ``/`` (how the file list and the crate name it)."""
        return Path(path).relative_to(self.root).as_posix()

    @property
    def metadata(self) -> Path:
        return self.root / self.METADATA

    @property
    def preview(self) -> Path:
        return self.root / self.PREVIEW

    @property
    def readme(self) -> Path:
        return self.root / self.README

    @property
    def record(self) -> Path:
        return self.root / self.RECORD

    @property
    def file_list(self) -> Path:
        return self.root / self.FILE_LIST

    @property
    def submission(self) -> Path:
        return self.root / self.RUN / RunDir.SUBMISSION

    def previous_submission(self, n: int) -> Path:
        return self.root / self.RUN / f"submission-{n}.json"

    @property
    def sbatch_script(self) -> Path:
        return self.root / self.RUN / RunDir.SBATCH

    @property
    def ledger(self) -> Path:
        return self.root / self.RUN / RunDir.LEDGER

    @property
    def metrics(self) -> Path:
        return self.root / self.RUN / RunDir.METRICS

    @property
    def approvals(self) -> Path:
        return self.root / self.RUN / RunDir.APPROVALS

    @property
    def identity_submit(self) -> Path:
        return self.root / self.IDENTITY / "submit.json"

    def identity_attempt(self, job_id: str, restart_count: int) -> Path:
        return self.root / self.IDENTITY / f"{attempt_label(_UNSAFE.sub('_', job_id), int(restart_count))}.json"

    @property
    def code_snapshot(self) -> Path:
        return self.root / self.CODE / "snapshot.tar.gz"

    @property
    def requirements_lock(self) -> Path:
        return self.root / self.ENVIRONMENT / "requirements.lock"

    @property
    def data_fingerprint(self) -> Path:
        return self.root / self.DATA / "fingerprint.json"

    @property
    def data_cache(self) -> Path:
        return self.root / self.DATA / "content-cache.json"

    def checkpoint(self, name: str) -> Path:
        """The bundled checkpoint; ``name`` is the source directory's own name (hpctrain.ckpt owns it)."""
        if not name or _UNSAFE.search(name) or name in (".", ".."):
            raise ValueError(f"not a checkpoint directory name: {name!r}")
        return self.root / self.CHECKPOINT / name
