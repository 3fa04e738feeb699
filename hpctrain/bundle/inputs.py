"""The data and arguments of a reproduction: map the recorded input files to the paths given, check each
against its fingerprint, and rewrite the recorded entry arguments that named the old paths.

Login node: numpy and h5py (the fingerprint's), no torch. The fingerprints are the run's identity records'
``data`` section (:func:`hpctrain.identity.record_data`, :mod:`hpctrain.data.fingerprint`).
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from hpctrain._files import shorten
from hpctrain.errors import HpctrainError, UsageError

__all__ = ["recorded_files", "map_files", "check_files", "rewrite_args", "with_total_steps", "STEPS_FLAG"]

STEPS_FLAG = "--steps"
"""How a replay tells the entry how far to train: ``--steps`` is the **total** step count (the demo's
convention, and the Trainer's ``TrainConfig.steps``): a replay of K steps from the bundled step S passes S + K."""


def recorded_files(data: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The fingerprints of the run's input files (``data.files`` of an identity record), in order."""
    files = (data or {}).get("files")
    if not isinstance(files, list):
        return []
    return [f for f in files if isinstance(f, dict) and isinstance(f.get("cheap"), dict)]


def _name(fp: tp.Mapping[str, tp.Any]) -> str:
    cheap = fp.get("cheap") or {}
    return str(cheap.get("name") or os.path.basename(str(cheap.get("path") or "")))


def map_files(
    recorded: tp.Sequence[tp.Mapping[str, tp.Any]], given: tp.Sequence[str]
) -> tp.Tuple[tp.List[tp.Tuple[tp.Mapping[str, tp.Any], str]], str]:
    """``([(recorded fingerprint, given path)], how)``: by file name when the names on both sides are distinct
    and the same set (``"by name"``), else by position when the counts agree (``"by order"``). Anything else
    is one UsageError line that names the recorded files."""
    names = [_name(f) for f in recorded]
    listing = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
    if not recorded:
        if given:
            raise UsageError("--data: the bundle records no input data files (an entry without HDF5 data); drop --data")
        return [], "none recorded"
    if not given:
        raise UsageError(f"--data: the run read {len(recorded)} input file(s), {listing}: give a path for each")
    base = [os.path.basename(p) for p in given]
    if len(set(names)) == len(names) and len(set(base)) == len(base) and set(names) == set(base):
        by_name = dict(zip(base, given))
        return [(f, by_name[n]) for f, n in zip(recorded, names)], "by name"
    if len(given) == len(recorded):
        return list(zip(recorded, given)), "by order (the file names differ from the recorded ones)"
    raise UsageError(
        f"--data: {len(given)} path(s) for the {len(recorded)} input file(s) the run read ({listing}); give one "
        "per file, with the recorded names (or in the recorded order)"
    )


def check_files(pairs: tp.Sequence[tp.Tuple[tp.Mapping[str, tp.Any], str]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """Check each given file against its recorded fingerprint: the cheap tier first (format, size, HDF5
    structure; metadata only), then the sampled content tier with the recorded parameters. A mismatch is one
    HpctrainError line naming the file and what differs; a missing file one UsageError line."""
    from hpctrain.data import fingerprint as fp

    out: tp.List[tp.Dict[str, tp.Any]] = []
    for old, path in pairs:
        cheap = fp.cheap_fingerprint(path)
        label = (
            f"--data {path}: does not match the recorded {_name(old)} (read as {(old.get('cheap') or {}).get('path')})"
        )
        changes, _ = fp.compare(old, {"cheap": cheap, "content": None})
        if changes:
            raise HpctrainError(f"{label}: {_changes(changes)}")
        recorded_content = old.get("content") if isinstance(old.get("content"), dict) else None
        entry: tp.Dict[str, tp.Any] = {
            "name": _name(old),
            "recorded_path": (old.get("cheap") or {}).get("path"),
            "path": cheap["path"],
            "size": cheap["size"],
            "format": cheap["format"],
            "cheap": "same",
            "content": "not recorded",
        }
        if recorded_content is not None:
            params = recorded_content.get("params") or {}
            content = fp.content_fingerprint(
                path,
                cheap,
                k=int(params.get("k", fp.SAMPLE_K)),
                block_bytes=int(params.get("block_bytes", fp.BLOCK_BYTES)),
            )
            changes, _ = fp.compare(old, {"cheap": cheap, "content": content})
            if changes:
                raise HpctrainError(f"{label}: {_changes(changes)}")
            entry.update(content="same (sampled)", content_sha256=content["sha256"], bytes_read=content["bytes_read"])
        out.append(entry)
    return out


def _changes(changes: tp.Sequence[str]) -> str:
    text = "; ".join(changes[:3]) + (f"; {len(changes) - 3} more" if len(changes) > 3 else "")
    return shorten(" ".join(text.split()), 400)


def _same_path(arg: str, old: str, cwd: tp.Optional[str]) -> bool:
    if not arg or "\x00" in arg:
        return False
    full = arg if os.path.isabs(arg) else os.path.join(cwd or "/", arg)
    return os.path.normpath(full) == os.path.normpath(old)


def rewrite_args(
    args: tp.Sequence[str],
    paths: tp.Mapping[str, str],
    *,
    cwd: tp.Optional[str],
    old_run: tp.Optional[str],
    new_run: str,
    why: str = "input file",
) -> tp.Tuple[tp.List[str], tp.List[tp.Dict[str, str]]]:
    """The recorded entry arguments with every argument that named a recorded input file (``paths``: old
    absolute path -> new one; an argument relative to the submission's ``cwd`` counts) replaced by the new
    path, and every path inside the original run directory moved into the new one. ``--opt=value`` forms too.
    Returns ``(arguments, [{"from", "to", "why"}])``."""
    out: tp.List[str] = []
    done: tp.List[tp.Dict[str, str]] = []
    for arg in args:
        prefix, value = "", arg
        if arg.startswith("-") and "=" in arg:
            prefix, _, value = arg.partition("=")
            prefix += "="
        new, because = None, why
        for old, repl in paths.items():
            if _same_path(value, old, cwd):
                new = repl
                break
        if new is None and old_run and value:
            full = value if os.path.isabs(value) else os.path.join(cwd or "/", value)
            rel = os.path.relpath(os.path.normpath(full), os.path.normpath(old_run))
            if (os.path.isabs(value) or os.sep in value) and not rel.startswith(".."):
                new, because = os.path.normpath(os.path.join(new_run, rel)), "inside the original run directory"
        if new is None:
            out.append(arg)
        else:
            out.append(prefix + new)
            done.append({"from": arg, "to": prefix + new, "why": because})
    return out, done


def with_total_steps(args: tp.Sequence[str], total: int) -> tp.Tuple[tp.List[str], tp.Optional[str]]:
    """``args`` with ``--steps`` (the total step count) set to ``total``: replaced where given (the last one,
    as argparse reads it), else appended. Returns ``(arguments, the value it had, or None)``."""
    out = list(args)
    for i in range(len(out) - 1, -1, -1):
        if out[i] == STEPS_FLAG and i + 1 < len(out):
            old = out[i + 1]
            out[i + 1] = str(total)
            return out, old
        if out[i].startswith(STEPS_FLAG + "="):
            old = out[i].split("=", 1)[1]
            out[i] = f"{STEPS_FLAG}={total}"
            return out, old
    return out + [STEPS_FLAG, str(total)], None


def absolute(paths: tp.Sequence[str]) -> tp.List[str]:
    return [str(Path(p).expanduser().absolute()) for p in paths]
