"""The recorded environment of a run against this one: Python, hpctrain (version and code), torch, every
installed distribution. Login node, no torch: torch's installed version comes from its metadata here, the
recorded one from the run's rank 0 (which had imported it).
"""

from __future__ import annotations

import platform
import typing as tp

__all__ = ["environment_diff", "render_environment"]


def _python(runtime: tp.Mapping[str, tp.Any]) -> tp.Optional[str]:
    py = runtime.get("python") if isinstance(runtime.get("python"), dict) else {}
    if not py.get("version"):
        return None
    return f"{py.get('implementation') or 'Python'} {py.get('version')}"


def _code_label(repo: tp.Mapping[str, tp.Any]) -> tp.Optional[str]:
    kind = repo.get("kind")
    if kind == "git":
        dirty = (
            f" + uncommitted changes (diff {str((repo.get('diff') or {}).get('sha256'))[:12]})"
            if repo.get("dirty")
            else ""
        )
        untracked = f", {repo.get('untracked_count')} untracked" if repo.get("untracked_count") else ""
        return f"git {str(repo.get('commit'))[:12]}{dirty}{untracked}"
    if kind == "files":
        return f"files sha256 {str(repo.get('sha256'))[:12]}"
    return None


def _status(recorded: tp.Any, current: tp.Any) -> str:
    if recorded is None and current is None:
        return "unknown"
    if current is None:
        return "missing"
    if recorded is None:
        return "new"
    return "same" if recorded == current else "different"


def _hpctrain_repo(code: tp.Mapping[str, tp.Any]) -> tp.Dict[str, tp.Any]:
    repos = code.get("repositories") if isinstance(code.get("repositories"), dict) else {}
    repo = repos.get("hpctrain") if isinstance(repos.get("hpctrain"), dict) else {}
    if repo.get("kind") == "same":
        repo = repos.get(str(repo.get("same_as"))) or {}
    return dict(repo)


def environment_diff(
    runtime: tp.Optional[tp.Mapping[str, tp.Any]], code: tp.Optional[tp.Mapping[str, tp.Any]]
) -> tp.Dict[str, tp.Any]:
    """``{"rows": [{"what", "recorded", "current", "status"}], "distributions": [...], "counts": {...}}``.

    ``status``: ``same``, ``different``, ``missing`` (recorded, not here), ``new`` (here, not recorded),
    ``unknown``. ``rows`` are Python, hpctrain, hpctrain's code, torch; ``distributions`` every distribution of
    either side (name, recorded and current version, status)."""
    from pathlib import Path

    import hpctrain
    from hpctrain.identity.code import capture_files, capture_repository, code_essentials
    from hpctrain.identity.runtime import distributions

    runtime = dict(runtime or {})
    recorded_dists = runtime.get("distributions") if isinstance(runtime.get("distributions"), dict) else {}
    current_dists = distributions()
    torch_rec = runtime.get("torch") if isinstance(runtime.get("torch"), dict) else {}
    rows: tp.List[tp.Dict[str, tp.Any]] = []

    def row(what: str, recorded: tp.Any, current: tp.Any, status: tp.Optional[str] = None) -> None:
        rows.append(
            {"what": what, "recorded": recorded, "current": current, "status": status or _status(recorded, current)}
        )

    row("python", _python(runtime), f"{platform.python_implementation()} {platform.python_version()}")
    row("hpctrain", runtime.get("hpctrain"), hpctrain.__version__)
    recorded_repo = _hpctrain_repo(code or {})
    package = Path(hpctrain.__file__).resolve().parent
    here = capture_repository(package)
    if here["kind"] == "none":  # installed, not a checkout: its files, as a submission records them
        here = capture_files(package, reason=here["reason"])
    if recorded_repo:
        same = code_essentials({"repositories": {"h": recorded_repo}}) == code_essentials({"repositories": {"h": here}})
        row("hpctrain code", _code_label(recorded_repo), _code_label(here), "same" if same else "different")
    row("torch", torch_rec.get("version") or recorded_dists.get("torch"), current_dists.get("torch"))
    if torch_rec.get("cuda") or torch_rec.get("gpus"):
        gpus = torch_rec.get("gpus") or []
        names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")})
        row(
            "CUDA / GPUs (rank 0's node)",
            f"CUDA {torch_rec.get('cuda')}, {len(gpus)} GPU(s) {', '.join(names)}".strip(),
            "probed on the nodes, not here (no torch on the login node)",
            "unknown",
        )
    dists = []
    for name in sorted(set(recorded_dists) | set(current_dists)):
        rec, cur = recorded_dists.get(name), current_dists.get(name)
        dists.append({"name": name, "recorded": rec, "current": cur, "status": _status(rec, cur)})
    counts: tp.Dict[str, int] = {}
    for d in dists:
        counts[d["status"]] = counts.get(d["status"], 0) + 1
    return {"rows": rows, "distributions": dists, "counts": counts, "recorded_distributions": len(recorded_dists)}


_STYLE = {"same": "green", "different": "red", "missing": "red", "new": "yellow", "unknown": "yellow"}


def render_environment(diff: tp.Mapping[str, tp.Any], console: tp.Any, *, limit: int = 40) -> None:
    """One table: the main rows, then every distribution that is not the same (up to ``limit``), then a count of
    the ones that are. Recorded text is escaped."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="environment: recorded (the run) vs here")
    for col in ("what", "recorded", "here", ""):
        table.add_column(col, overflow="fold")

    def add(what: str, rec: tp.Any, cur: tp.Any, status: str) -> None:
        style = _STYLE.get(status, "")
        table.add_row(
            escape(what),
            escape("-" if rec is None else str(rec)),
            escape("-" if cur is None else str(cur)),
            f"[{style}]{status}[/]" if style else status,
        )

    for r in diff["rows"]:
        add(r["what"], r["recorded"], r["current"], r["status"])
    odd = [d for d in diff["distributions"] if d["status"] != "same"]
    for d in odd[:limit]:
        add(f"  {d['name']}", d["recorded"], d["current"], d["status"])
    if len(odd) > limit:
        table.add_row(f"  ... {len(odd) - limit} more", "", "", "(--json lists them)")
    counts = diff["counts"]
    table.add_row(
        "distributions",
        f"{diff['recorded_distributions']} recorded",
        ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        "[green]same[/]" if set(counts) <= {"same"} else "[yellow]see above[/]",
    )
    console.print(table)
