"""What ``bundle verify`` checks against: ``MANIFEST.sha256`` parsed (its last line, the sha256 of the lines
above it, checked), a path inside the bundle, and one check's report (:data:`Check`) with its failures."""

from __future__ import annotations

import hashlib
import re
import typing as tp
from pathlib import PurePosixPath

from hpctrain.bundle.build import SELF_LINE
from hpctrain.bundle.layout import BundleLayout

__all__ = ["Check", "new_check", "fail", "safe_rel", "parse_listing"]

_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")


Check = tp.Dict[str, tp.Any]


def new_check(name: str) -> Check:
    return {"check": name, "ok": True, "detail": "", "problems": [], "warnings": []}


def fail(c: Check, problem: str) -> None:
    c["ok"] = False
    c["problems"].append(problem)


def safe_rel(rel: tp.Any) -> tp.Optional[str]:
    """A path inside the bundle, or None: relative, no ``..``, no empty or odd components."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("..", ".", "") for part in p.parts):
        return None
    return p.as_posix()


def parse_listing(raw: bytes) -> tp.Tuple[tp.Dict[str, str], tp.List[str]]:
    """``({path: sha256}, problems)`` of ``MANIFEST.sha256``'s bytes, its last line (the sha256 of the lines
    above it) checked."""
    problems: tp.List[str] = []
    listed: tp.Dict[str, str] = {}
    if not raw:
        return listed, problems
    name = BundleLayout.FILE_LIST
    text = raw.decode("utf-8", errors="replace")
    body, _, last = text.rstrip("\n").rpartition("\n")
    body = body + "\n" if body else ""
    expected = hashlib.sha256(body.encode("utf-8", errors="replace")).hexdigest()
    if not last.startswith(SELF_LINE) or last[len(SELF_LINE) :].strip() != expected or "\ufffd" in text:
        problems.append(f"{name}: edited or damaged (its last line, the sha256 of the list, does not match)")
    for n, line in enumerate(body.splitlines(), start=1):
        m = _LINE.match(line)
        rel = safe_rel(m.group(2)) if m else None
        if m is None or rel is None:
            problems.append(f"{name} line {n}: not '<sha256>  <path inside the bundle>' (damaged)")
            continue
        if rel in listed:
            problems.append(f"{name} line {n}: {rel} listed twice")
        listed[rel] = m.group(1)
    return listed, problems
