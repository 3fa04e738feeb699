"""Ways to damage a checkpoint directory that its own checksums cannot catch (crafted, not random, files)."""

from __future__ import annotations

import json
import typing as tp
import zlib
from pathlib import Path

from hpctrain.ckpt._format import encode_header
from hpctrain.ckpt._reader import read_header


def manifest(step_dir: Path) -> tp.Dict[str, tp.Any]:
    return json.loads((step_dir / "MANIFEST.json").read_text())


def write_manifest(step_dir: Path, m: tp.Any) -> None:
    (step_dir / "MANIFEST.json").write_text(json.dumps(m))


def rewrite_shard(step_dir: Path, rank: int, mutate: tp.Callable[[tp.Dict[str, tp.Any]], tp.Any]) -> None:
    """Replace shard ``rank``'s header with ``mutate(header)`` (its return value, or the header mutated in
    place), keep the data bytes, and fix the manifest's size and crc32 so that only a structural check
    can tell."""
    m = manifest(step_dir)
    rec = m["shards"][rank]
    path = step_dir / rec["file"]
    h = read_header(path)
    data = path.read_bytes()[h.data_start :]
    new = mutate(h.header)
    raw = encode_header(h.header if new is None else new) + data
    path.write_bytes(raw)
    rec.update(bytes=len(raw), crc32=zlib.crc32(raw))
    write_manifest(step_dir, m)


def nested(depth: int, leaf: tp.Any = 0) -> tp.Any:
    out = leaf
    for _ in range(depth):
        out = [out]
    return out
