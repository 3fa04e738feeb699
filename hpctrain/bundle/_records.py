"""Reading what the identity manifests hold, defensively (another module writes them; fields may be absent).

An identity record (:attr:`hpctrain.rundir.RunDir.identity_submit`,
:meth:`hpctrain.rundir.RunDir.identity_attempt`, written by ``hpctrain.identity``) is a JSON object with a
top-level ``identity`` (sha256 of the canonical manifest) and the sections ``code``, ``config``, ``data``,
``runtime`` and ``ownership``. Everything here accepts a missing or odd section and returns nothing for it.
"""

from __future__ import annotations

import math
import re
import typing as tp
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "section",
    "read_ownership",
    "code_repo",
    "hpctrain_code",
    "distributions",
    "requirements_lock",
    "slurm_environment",
    "data_files",
    "http_url",
    "version_of",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*$")
_SCP = re.compile(r"^(?:[^@/\s]+@)?([A-Za-z0-9.-]+):(?!//)([^\s]+)$")


def section(record: tp.Optional[tp.Mapping[str, tp.Any]], name: str) -> tp.Dict[str, tp.Any]:
    value = (record or {}).get(name)
    return dict(value) if isinstance(value, dict) else {}


def _text(value: tp.Any, limit: int = 500) -> tp.Optional[str]:
    if isinstance(value, str) and value.strip():
        return value.strip()[:limit]
    return None


def read_ownership(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Optional[str]]:
    """The ``ownership`` section an identity record holds, as its writer
    (:func:`hpctrain.identity.ownership_record`) writes it: ``owner``, ``owner_source`` (``config`` or
    ``user``), ``team``, ``notes`` (at most submit's ``MAX_NOTES_CHARS``); None for what is absent."""
    from hpctrain.submit.config import MAX_NOTES_CHARS

    own = section(record, "ownership")
    source = own.get("owner_source")
    return {
        "owner": _text(own.get("owner"), 200),
        "owner_source": source if source in ("config", "user") else None,
        "team": _text(own.get("team"), 200),
        "notes": _text(own.get("notes"), MAX_NOTES_CHARS),
    }


def _repositories(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Dict[str, tp.Any]]:
    repos = section(record, "code").get("repositories")
    return {k: dict(v) for k, v in repos.items() if isinstance(v, dict)} if isinstance(repos, dict) else {}


def code_repo(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """The user's code as recorded: the entry's repository (``kind`` git: commit, branch, ``remote_url``,
    dirty; ``kind`` files: the package files' ``sha256``), with ``entry`` (``module:function``) added."""
    code = section(record, "code")
    repo = _repositories(record).get("entry", {})
    entry = code.get("entry") if isinstance(code.get("entry"), str) else None
    return {**repo, "entry": entry}


def hpctrain_code(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, tp.Any]:
    """hpctrain's own repository record (the entry's when they are one repository)."""
    repos = _repositories(record)
    repo = repos.get("hpctrain", {})
    if repo.get("kind") == "same":
        repo = repos.get(str(repo.get("same_as")), {})
    return repo


def http_url(remote: tp.Any) -> tp.Optional[str]:
    """An http(s) URL for a git remote (``git@host:org/repo.git`` becomes ``https://host/org/repo``), with
    any credentials removed; None for a remote that is not on the web (a path, ``file://``)."""
    if not isinstance(remote, str) or not remote.strip():
        return None
    remote = remote.strip()
    m = _SCP.match(remote)
    if m and "://" not in remote:
        remote = f"https://{m.group(1)}/{m.group(2)}"
    parts = urlsplit(remote)
    if parts.scheme in ("ssh", "git", "git+ssh") and parts.hostname:
        parts = parts._replace(scheme="https")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port and parts.scheme != "https" else "")
    path = parts.path[:-4] if parts.path.endswith(".git") else parts.path
    return urlunsplit((parts.scheme, host, path, "", ""))


def version_of(value: tp.Any) -> tp.Optional[str]:
    """A version string from ``"2.3.0"`` or ``{"version": "2.3.0", ...}``."""
    if isinstance(value, dict):
        value = value.get("version")
    return _text(value, 100)


def distributions(runtime: tp.Mapping[str, tp.Any]) -> tp.Dict[str, str]:
    """name -> version of the recorded installed distributions (a dict, a list of {name, version}, or a list
    of ``name==version``); names and versions that could not be a requirement line are left out."""
    raw = next((runtime.get(k) for k in ("distributions", "packages", "installed") if runtime.get(k)), None)
    pairs: tp.List[tp.Tuple[tp.Any, tp.Any]] = []
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict):
                pairs.append((item.get("name"), item.get("version")))
            elif isinstance(item, str) and "==" in item:
                pairs.append(tuple(item.split("==", 1)))  # type: ignore[arg-type]
    out: tp.Dict[str, str] = {}
    for name, version in pairs:
        if isinstance(name, str) and isinstance(version, str) and _NAME.match(name) and _VERSION.match(version):
            out[name] = version
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_lock(record: tp.Optional[tp.Mapping[str, tp.Any]], source: str) -> tp.Optional[str]:
    """The text of ``requirements.lock`` for the record's distributions; None when it recorded none."""
    runtime = section(record, "runtime")
    dists = distributions(runtime)
    if not dists:
        return None
    python = runtime.get("python")
    python = python.get("version") if isinstance(python, dict) else python
    head = [
        f"# the distributions installed where the run ran, from {source}",
        f"# Python {python}" if isinstance(python, str) else "# Python: not recorded",
        "# pip install -r requirements.lock   (on a GPU cluster install your site's torch build first)",
        "# hpctrain and your own packages, when installed from a work tree, come from code/snapshot.tar.gz",
    ]
    body = [f"{name}=={dists[name]}" for name in sorted(dists, key=_normal)]
    return "\n".join(head + body) + "\n"


def _scalar(value: tp.Any) -> tp.Optional[str]:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value[:2000]
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    return None


def slurm_environment(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.Dict[str, str]:
    """Every ``SLURM_*`` variable the record holds: in ``runtime`` itself or one mapping below it (a
    ``slurm`` mapping whose keys lack the prefix gets it back, upper-cased)."""
    runtime = section(record, "runtime")
    out: tp.Dict[str, str] = {}
    candidates: tp.List[tp.Tuple[str, tp.Mapping[str, tp.Any]]] = [("", runtime)]
    candidates += [(k, v) for k, v in runtime.items() if isinstance(v, dict)]
    for where, mapping in candidates:
        for key, value in mapping.items():
            if not isinstance(key, str):
                continue
            name = key if key.startswith("SLURM_") else None
            if name is None and where.lower() == "slurm" and re.match(r"^[A-Za-z0-9_]+$", key):
                name = "SLURM_" + key.upper()
            text = _scalar(value)
            if name and text is not None:
                out.setdefault(name, text)
    return dict(sorted(out.items()))


def data_files(record: tp.Optional[tp.Mapping[str, tp.Any]]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The fingerprinted input files: ``{"path", "size", "content", "sampled"}`` each, where ``content`` is the
    content tier's sha256 (``sampled``: over a deterministic sample of chunks, not the whole file)."""
    data = (record or {}).get("data")
    items = data.get("files") if isinstance(data, dict) else None
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        cheap = item.get("cheap") if isinstance(item.get("cheap"), dict) else item
        path = _text(cheap.get("path"), 4096)
        if not path:
            continue
        content = item.get("content") if isinstance(item.get("content"), dict) else {}
        digest = content.get("sha256") if isinstance(content.get("sha256"), str) else None
        size = cheap.get("size")
        out.append(
            {
                "path": path,
                "size": size if isinstance(size, int) and not isinstance(size, bool) else None,
                "content": digest,
                "sampled": content.get("kind") == "sample",
            }
        )
    return out
