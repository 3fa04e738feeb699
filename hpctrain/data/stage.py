"""Node-local staging (``submit --stage PATH...``): copy the inputs to each node's local storage at the start of an
attempt, verified against the data fingerprint, and let the loader read the local copies.

The batch script runs ``python -m hpctrain.data.stage`` as one srun step with one task per node, before the
training step (:func:`hpctrain.submit.staging.stage_setup`), so every node copies in parallel and each node reads
the shared file system once. Per file:

- **Reuse.** A marker written after the copy was verified records the source's identity (path, size, mtime,
  inode, device), the copy's size, its sha256 (of every byte copied) and its fingerprint essentials
  (:func:`hpctrain.data.fingerprint.essentials`). A copy is reused only when the source is unchanged and the
  copy passes the check ``verify`` names: ``full`` (default) re-reads the whole local copy and compares its
  sha256, so any damaged byte is seen; ``sample`` compares the size and the fingerprint's content tier (the
  first, last and 8 evenly spaced chunks), which misses a damaged byte outside the sampled chunks.
- **Copy.** The bytes are hashed as they are read and written to a temporary name (tmp, fsync, rename, fsync the
  directory: :func:`hpctrain._atomic.atomic_write_chunks`), so no partial file ever has the final name; the
  marker is removed before and written after. The copy's fingerprint (size, HDF5 structure, sampled content) must
  equal the source's, and the source must not have changed while it was read; otherwise the copy is removed and
  the step fails with one line.
- **Damage.** A copy that fails its check is deleted and fetched again, with one log line; it is never read.

What a node did is one record per Slurm attempt in the run directory (:meth:`hpctrain.rundir.RunDir.stage_record`:
bytes copied and reused, seconds, rate, per file ``reused``). The batch script exports
:data:`hpctrain.rundir.STAGE_ENV` (the run directory); :func:`local_files` maps a configured input path to this
node's verified copy (the loader calls it), and :func:`staged_map` gives the identity record its ``staged``
entries. Only the copying part imports numpy and h5py (through the fingerprint); the lookup is stdlib.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import time
import typing as tp
from pathlib import Path

from hpctrain._atomic import TMP_NAME, atomic_write_chunks, atomic_write_json
from hpctrain.errors import HpctrainError, UsageError
from hpctrain.rundir import STAGE_ENV, STAGE_SCHEMA, RunDir, read_json

__all__ = [
    "STAGE_SCHEMA",
    "MARKER_SCHEMA",
    "VERIFY_MODES",
    "node_name",
    "expand",
    "node_root",
    "stage_files",
    "stage",
    "staged_map",
    "local_files",
    "main",
]

MARKER_SCHEMA = "hpctrain.data.stage-marker/1"
VERIFY_MODES = ("full", "sample")
_READ = 8 << 20  # bytes per read of a copy: large sequential reads, as from Lustre
_VAR = re.compile(r"\$\{(\w+)(?::-([^${}]*))?\}|\$(\w+)")


def node_name() -> str:
    """This node's name as Slurm knows it (``SLURMD_NODENAME``), else the host name: the stage step and the loader
    must agree on it, and on the dev cluster the nodes share one host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def expand(path: str, environ: tp.Optional[tp.Mapping[str, str]] = None) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` (nested) expanded from ``environ``, as the shell does: the
    stage directory is resolved on the node (``$SLURM_TMPDIR`` is the node's). An unset variable is an error."""
    env = os.environ if environ is None else environ

    def one(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(3)
        value = env.get(name)
        if value:
            return value
        if m.group(2) is not None:
            return m.group(2)
        raise UsageError(f"--stage-dir {path!r}: ${name} is not set on node {node_name()}; give a path or a default")

    for _ in range(16):  # innermost first: ${A:-${B:-/tmp}}
        new = _VAR.sub(one, path)
        if new == path:
            break
        path = new
    return path


def node_root(stage_dir: str, run_dir: tp.Union[str, Path], node: tp.Optional[str] = None) -> Path:
    """This node's folder for this run: ``<stage dir>/<run name>-<hash of the run directory>/<node>``."""
    real = os.path.realpath(os.fspath(run_dir))
    key = f"{os.path.basename(real)[:64]}-{hashlib.sha256(real.encode()).hexdigest()[:12]}"
    return Path(expand(stage_dir)) / key / (node or node_name())


def _key(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def stage_files(sources: tp.Sequence[str], root: Path) -> tp.List[tp.Tuple[str, Path, Path]]:
    """``(source file, local copy, marker)`` of every file under ``sources`` (files, or directories walked in
    name order). Each source keeps its base name (the fingerprint's ``name``) under a folder named by its path."""
    out: tp.List[tp.Tuple[str, Path, Path]] = []
    for given in sources:
        src = os.path.realpath(given)
        base = root / "data" / _key(src) / os.path.basename(src)
        if os.path.isdir(src):
            for top, dirs, files in os.walk(src):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(top, name)
                    out.append((path, base / os.path.relpath(path, src), root / "verified" / f"{_key(path)}.json"))
        else:
            out.append((src, base, root / "verified" / f"{_key(src)}.json"))
    return out


def _source_id(path: str) -> tp.Dict[str, tp.Any]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"--stage {path}: cannot stat it on node {node_name()} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO inside a staged directory would block the copy forever
        raise UsageError(f"--stage {path}: not a regular file; stage directories of regular files only")
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "device": st.st_dev}


def _reader(path: str, digest: tp.Any) -> tp.Iterator[bytes]:
    with open(path, "rb", buffering=0) as f:
        while True:
            data = f.read(_READ)
            if not data:
                return
            digest.update(data)  # hashlib releases the GIL for large buffers
            yield data


def _sha256(path: Path) -> str:
    from hpctrain.data.fingerprint import full_hash

    return str(full_hash(str(path))["sha256"])


def _essentials(path: str) -> tp.Dict[str, tp.Any]:
    from hpctrain.data.fingerprint import cheap_fingerprint, content_fingerprint, essentials

    cheap = cheap_fingerprint(path)
    return essentials({"cheap": cheap, "content": content_fingerprint(path, cheap)})


def _check_copy(local: Path, marker: tp.Mapping[str, tp.Any], verify: str) -> str:
    """Why ``local`` is not the verified copy ``marker`` describes ('' when it is)."""
    try:
        size = local.stat().st_size
    except OSError as exc:
        return f"cannot stat it ({exc.strerror or exc})"
    if size != marker.get("size"):
        return f"size {size} bytes, verified copy had {marker.get('size')}"
    if verify == "full":
        digest = _sha256(local)
        want = str(marker.get("sha256"))
        return "" if digest == want else f"sha256 {digest[:12]}..., verified copy {want[:12]}..."
    return "" if _essentials(str(local)) == marker.get("essentials") else "its sampled fingerprint differs"


def _log(text: str) -> None:
    print(f"hpctrain stage: {node_name()}: {text}", flush=True)


def _copy(src: str, local: Path, marker_path: Path, before: tp.Dict[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    marker_path.unlink(missing_ok=True)  # no marker may ever describe a copy that is being replaced
    local.parent.mkdir(parents=True, exist_ok=True)
    for stale in local.parent.glob(f".{local.name}.tmp-*"):  # what a killed copy of this file left
        if TMP_NAME.match(stale.name):
            stale.unlink(missing_ok=True)
    expected = _essentials(src)
    digest = hashlib.sha256()
    size = atomic_write_chunks(local, _reader(src, digest), mode=0o444)
    if _source_id(src) != before:
        local.unlink(missing_ok=True)
        raise HpctrainError(
            f"--stage {src}: the file changed while node {node_name()} copied it; do not rewrite inputs under a job"
        )
    if size != before["size"] or _essentials(str(local)) != expected:
        local.unlink(missing_ok=True)
        raise HpctrainError(
            f"--stage {src}: the copy on node {node_name()} does not match the source's fingerprint (size, structure, "
            "sampled content); check the node-local disk"
        )
    marker = {"schema": MARKER_SCHEMA, "source": before, "local": str(local), "size": size,
              "sha256": digest.hexdigest(), "essentials": expected, "staged_at": time.time()}  # fmt: skip
    atomic_write_json(marker_path, marker)
    return marker


def stage(
    sources: tp.Sequence[str],
    *,
    run_dir: tp.Union[str, Path],
    stage_dir: str,
    verify: str = "full",
    job_id: tp.Optional[str] = None,
    restart_count: tp.Optional[int] = None,
) -> tp.Dict[str, tp.Any]:
    """Stage ``sources`` on this node (see the module docstring) and write this node's record; returns it."""
    if verify not in VERIFY_MODES:
        raise UsageError(f"--verify {verify!r}: use one of {', '.join(VERIFY_MODES)}")
    started = time.perf_counter()
    job_id = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", "")
    restart = restart_count if restart_count is not None else int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    root = node_root(stage_dir, run_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "verified").mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--stage-dir {stage_dir}: cannot create {root} on node {node_name()} ({exc.strerror or exc}); "
            "give a writable node-local directory"
        ) from None
    files = stage_files(sources, root)
    todo: tp.List[tp.Tuple[str, Path, Path, tp.Dict[str, tp.Any]]] = []
    entries: tp.List[tp.Dict[str, tp.Any]] = []
    verify_s = 0.0
    for src, local, marker_path in files:
        before = _source_id(src)
        marker = read_json(marker_path, []) if marker_path.exists() else None
        if marker is not None and marker.get("schema") == MARKER_SCHEMA and marker.get("source") == before:
            t0 = time.perf_counter()
            why = _check_copy(local, marker, verify)
            verify_s += time.perf_counter() - t0
            if not why:
                entries.append({"source": src, "local": str(local), "bytes": marker["size"], "reused": True,
                                "sha256": marker["sha256"], "seconds": round(time.perf_counter() - t0, 4)})  # fmt: skip
                continue
            _log(f"the local copy {local} failed verification ({why}): removed, fetching it again")
            local.unlink(missing_ok=True)
        elif marker is not None:
            _log(f"{src} changed since it was staged (or the marker is stale): fetching it again")
        todo.append((src, local, marker_path, before))
    need = sum(b["size"] for *_, b in todo)
    free = shutil.disk_usage(root).free
    if need > free:
        raise HpctrainError(
            f"--stage-dir {root}: {need / 1e9:.2f} GB to copy but {free / 1e9:.2f} GB free on node {node_name()}; "
            "free space or stage fewer inputs"
        )
    copy_s = 0.0
    for src, local, marker_path, before in todo:
        t0 = time.perf_counter()
        marker = _copy(src, local, marker_path, before)
        seconds = time.perf_counter() - t0
        copy_s += seconds
        entries.append({"source": src, "local": str(local), "bytes": marker["size"], "reused": False,
                        "sha256": marker["sha256"], "seconds": round(seconds, 4)})  # fmt: skip
    copied = sum(e["bytes"] for e in entries if not e["reused"])
    record = {
        "schema": STAGE_SCHEMA,
        "node": node_name(),
        "job_id": job_id,
        "restart_count": restart,
        "root": str(root),
        "verify": verify,
        "verified": True,
        "files": entries,
        "bytes_copied": copied,
        "bytes_reused": sum(e["bytes"] for e in entries if e["reused"]),
        "copy_seconds": round(copy_s, 4),
        "verify_seconds": round(verify_s, 4),
        "seconds": round(time.perf_counter() - started, 4),
        "copy_mb_per_s": round(copied / copy_s / 1e6, 1) if copy_s > 0 else None,
    }
    path = RunDir(run_dir).stage_record(job_id, restart, node_name())
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    reused = sum(1 for e in entries if e["reused"])
    rate = f" ({record['copy_mb_per_s']} MB/s)" if record["copy_mb_per_s"] else ""
    _log(
        f"{len(entries)} file(s): {len(entries) - reused} copied ({copied / 1e6:.1f} MB in {copy_s:.2f} s{rate}), "
        f"{reused} reused ({record['bytes_reused'] / 1e6:.1f} MB, {verify} check {verify_s:.2f} s) into {root}"
    )
    return record


# ---------------------------------------------------------------------------------------------- the node's copies
_CACHE: tp.Dict[str, tp.Dict[str, tp.Dict[str, tp.Any]]] = {}
_SAID: tp.Set[str] = set()


def staged_map(environ: tp.Optional[tp.Mapping[str, str]] = None) -> tp.Dict[str, tp.Dict[str, tp.Any]]:
    """``{real source path: file entry}`` of this node's stage record for this Slurm attempt; ``{}`` in a job that
    does not stage. A job that stages but whose record is missing says so once and reads the originals."""
    env = os.environ if environ is None else environ
    run_dir = env.get(STAGE_ENV)
    if not run_dir:
        return {}
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    path = RunDir(run_dir).stage_record(env.get("SLURM_JOB_ID", ""), int(env.get("SLURM_RESTART_COUNT") or 0), node)
    if str(path) in _CACHE:
        return _CACHE[str(path)]
    problems: tp.List[str] = []
    record = read_json(path, problems)
    found: tp.Dict[str, tp.Dict[str, tp.Any]] = {}
    if record is not None and record.get("schema") == STAGE_SCHEMA and record.get("verified") is True:
        found = {e["source"]: e for e in record.get("files", []) if isinstance(e, dict) and "source" in e}
    else:
        why = problems[0] if problems else f"no record {path}"
        print(f"hpctrain.data: warning: node-local staging: {why}; reading the original files", file=sys.stderr)
    _CACHE[str(path)] = found
    return found


def local_files(files: tp.Sequence[str], environ: tp.Optional[tp.Mapping[str, str]] = None) -> tp.List[str]:
    """``files`` with each one this node staged and verified replaced by its local copy (the loader's input)."""
    staged = staged_map(environ)
    if not staged:
        return list(files)
    out: tp.List[str] = []
    for f in files:
        entry = staged.get(os.path.realpath(f))
        ok = entry is not None and os.path.isfile(entry["local"]) and os.path.getsize(entry["local"]) == entry["bytes"]
        out.append(entry["local"] if ok and entry is not None else os.fspath(f))
        if entry is not None and str(f) not in _SAID:
            _SAID.add(str(f))
            what = f"the node-local copy {entry['local']}" if ok else "the original (its local copy is missing)"
            print(f"hpctrain.data: {f}: reading {what}", file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    from hpctrain._cli import ArgumentParser
    from hpctrain.defaults import DEFAULT_STAGE_DIR

    p = ArgumentParser(
        prog="python -m hpctrain.data.stage",
        description="Copy inputs to this node's local storage, verified (run by the batch script of submit --stage, "
        "one task per node).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="input files or directories (absolute)")
    p.add_argument("--run-dir", required=True, help="the run directory (the stage record is written there)")
    p.add_argument("--stage-dir", default=DEFAULT_STAGE_DIR, help="node-local directory (expanded on the node)")
    p.add_argument("--verify", choices=VERIFY_MODES, default="full", help="check of a copy reused (default full)")
    ns = p.parse_args(argv)
    stage(ns.paths, run_dir=ns.run_dir, stage_dir=ns.stage_dir, verify=ns.verify)
    return 0


if __name__ == "__main__":
    from hpctrain._cli import console_entry

    console_entry(main, "stage")
