"""``python -m hpctrain logs RUN_DIR [--rank N | --all] [--attempt K] [--follow] [--errors] [--json]``.

The log of any rank of any attempt of a run (:mod:`hpctrain.logs.reader` finds and splits the files;
docs/logs.md). Default: rank 0 of the newest attempt, stdout then stderr.
"""

from __future__ import annotations

import sys
import time
import typing as tp
from pathlib import Path

from hpctrain import _cli
from hpctrain.errors import UsageError
from hpctrain.logs import reader

__all__ = ["build_parser", "main", "follow"]

SCHEMA = "hpctrain.logs/1"
POLL_S = 0.5
"""How often ``--follow`` reads the files again."""
QUEUE_POLL_S = 10.0
"""How often ``--follow`` asks Slurm whether the job is still in the queue (at most)."""
SETTLE_S = 2.0
"""After the run ended, how long the files must stay unchanged before ``--follow`` returns."""


def build_parser() -> _cli.ArgumentParser:
    p = _cli.command_parser(
        "logs",
        "The log of any rank of any attempt of a run: Slurm's per-task files, split into attempts (a requeued job\n"
        "appends every attempt to the same files). Default: rank 0's stdout and stderr of the newest attempt.",
    )
    _cli.add_run_dir(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=None, metavar="N", help="this rank's log (default 0)")
    which.add_argument("--all", action="store_true", help="every rank's lines, interleaved, prefixed [rank host]")
    p.add_argument(
        "--attempt",
        default=None,
        metavar="K",
        help="the attempt: its number over the run from 0 (a job's restart count), negative from the newest, or its "
        "label as status shows it (12-r1); default the newest",
    )
    p.add_argument("--stream", choices=("out", "err", "both"), default="both", help="stdout, stderr or both")
    p.add_argument(
        "--errors",
        action="store_true",
        help="the first traceback of each rank that raised, and which rank failed first (default: the newest "
        "attempt where one raised)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new lines, into the next attempt after a requeue, until the run ends (Ctrl-C stops)",
    )
    _cli.add_json_flag(p)
    return p


# ---------------------------------------------------------------------------------------------- choosing
def _check_run(run_dir: str) -> Path:
    from hpctrain.run import is_run_dir

    path = Path(run_dir)
    if not is_run_dir(path):
        raise UsageError(f"{run_dir} is not a run directory (made by python -m hpctrain.submit)")
    return path


def choose_attempt(attempts: tp.Sequence[reader.LogAttempt], spec: tp.Optional[str]) -> reader.LogAttempt:
    if not attempts:
        raise UsageError("the run has no log files yet (not submitted, or its job has not started)")
    if spec is None:
        return attempts[-1]
    text = str(spec).strip()
    if text.lstrip("-").isdigit():
        k = int(text)
        if -len(attempts) <= k < len(attempts):
            return attempts[k]
    for a in attempts:
        if a.label == text:
            return a
    shown = ", ".join(f"{a.index} ({a.label})" for a in attempts[-10:])
    raise UsageError(f"--attempt {text}: no such attempt; the run has {len(attempts)}: {shown}")


def _streams(stream: str) -> tp.Tuple[str, ...]:
    return ("out", "err") if stream == "both" else (stream,)


def _rank(attempt: reader.LogAttempt, rank: int) -> reader.RankLog:
    if rank not in attempt.ranks:
        have = ", ".join(str(r) for r in sorted(attempt.ranks)) or "none"
        raise UsageError(f"--rank {rank}: attempt {attempt.label} has no log of rank {rank} (ranks: {have})")
    return attempt.ranks[rank]


def _prefix(log: reader.RankLog, stream: str, streams: tp.Sequence[str]) -> str:
    return f"[{log.rank} {log.host}{' err' if stream == 'err' and len(streams) > 1 else ''}] "


# ---------------------------------------------------------------------------------------------- main
def main(argv: tp.Optional[tp.Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    run_dir = _check_run(args.run_dir)
    if args.follow and (args.json or args.errors):
        raise UsageError("--follow prints lines as they come: not with --json or --errors")
    if args.rank is not None and args.rank < 0:
        raise UsageError(f"--rank {args.rank}: a rank is 0 or more")
    attempts = reader.log_attempts(run_dir)
    if args.errors:
        return _errors(run_dir, attempts, args)
    if args.follow and not attempts and args.attempt is None:  # a pending job: wait for its first lines
        return follow(run_dir, reader.LogAttempt(0, "", 0, {}), ranks=[] if args.all else [args.rank or 0],
                      streams=_streams(args.stream), prefixed=args.all)  # fmt: skip
    attempt = choose_attempt(attempts, args.attempt)
    streams = _streams(args.stream)
    ranks = sorted(attempt.ranks) if args.all else [_rank(attempt, args.rank or 0).rank]
    if args.json:
        body: tp.Dict[str, tp.Any] = {
            "run_dir": str(run_dir),
            "attempt": _attempt_json(attempt),
            "attempts": [_attempt_json(a) for a in attempts],
            "ranks": [
                {
                    "rank": r,
                    "host": attempt.ranks[r].host,
                    "files": [
                        {**f.summary(), "lines": f.lines}
                        for s, f in sorted(attempt.ranks[r].files.items())
                        if s in streams
                    ],
                }
                for r in ranks
            ],
        }
        _cli.print_json(body, schema=SCHEMA)
        return 0
    if args.follow:
        return follow(run_dir, attempt, ranks=ranks, streams=streams, prefixed=args.all)
    _print_attempt(attempt, ranks, streams, prefixed=args.all)
    return 0


def _attempt_json(a: reader.LogAttempt) -> tp.Dict[str, tp.Any]:
    return {
        "index": a.index,
        "label": a.label,
        "job_id": a.job_id,
        "restart_count": a.restart_count,
        "ranks": sorted(a.ranks),
    }


def _print_attempt(
    attempt: reader.LogAttempt, ranks: tp.Sequence[int], streams: tp.Sequence[str], *, prefixed: bool
) -> None:
    out = sys.stdout
    if prefixed:
        files = [
            (_prefix(attempt.ranks[r], s, streams), attempt.ranks[r].files[s].lines)
            for r in ranks
            for s in streams
            if s in attempt.ranks[r].files
        ]
        print(f"hpctrain logs: attempt {attempt.index} ({attempt.label}), {len(ranks)} ranks", file=sys.stderr)
        for prefix, line in reader.interleave(files):
            out.write(prefix + line + "\n")
        out.flush()
        return
    log = attempt.ranks[ranks[0]]
    for s in streams:
        f = log.files.get(s)
        if f is None:
            continue
        where = f"lines {f.first_line}-{f.last_line}" if f.lines and f.first_line > 0 else f"{len(f.lines)} lines"
        if len(streams) > 1:
            print(f"==> {f.path} (attempt {attempt.index} {attempt.label}, rank {log.rank} on {log.host}, {where}) <==")
        for line in f.lines:
            out.write(line + "\n")
    out.flush()


def _errors(run_dir: Path, attempts: tp.Sequence[reader.LogAttempt], args: tp.Any) -> int:
    if args.attempt is not None:
        chosen = [choose_attempt(attempts, args.attempt)]
    else:
        chosen = list(reversed(attempts))
    attempt, found = (chosen[0] if chosen else None), []
    for a in chosen:
        found = reader.rank_errors(run_dir, a)
        if found:
            attempt = a
            break
    if args.rank is not None:
        found = [t for t in found if t.rank == args.rank]
    if attempt is None:
        raise UsageError("the run has no log files yet (not submitted, or its job has not started)")
    first = found[0] if found else None
    if args.json:
        _cli.print_json(
            {
                "run_dir": str(run_dir),
                "attempt": _attempt_json(attempt),
                "first_failed": None
                if first is None
                else {"rank": first.rank, "host": first.host, "by": first.time_from},
                "errors": [t.summary() for t in found],
            },
            schema=SCHEMA,
        )
        return 0
    if first is None:
        where = f"attempt {attempt.index} ({attempt.label})" if args.attempt is not None else "any attempt"
        print(f"no rank raised in {where}: no traceback in the ranks' stderr")
        return 0
    others = ", ".join(str(t.rank) for t in found[1:])
    print(
        f"attempt {attempt.index} ({attempt.label}): rank {first.rank} on {first.host} failed first "
        f"(by its {first.time_from}"
        + (f"; ranks {others} raised after it" if others else "; no other rank raised")
        + f"): {first.exception}"
    )
    for t in found:
        stamp = time.strftime("%H:%M:%S", time.localtime(t.time)) if t.time is not None else "?"
        print(f"\n==> rank {t.rank} on {t.host} ({t.path} line {t.first_line}; {t.time_from} {stamp}) <==")
        for line in t.lines:
            print(line)
    return 0


# ---------------------------------------------------------------------------------------------- --follow
def _run_over(run_dir: Path, slurm: tp.Any, state: tp.Dict[str, tp.Any]) -> bool:
    """Whether the run has ended: its newest attempt's exit record says it was not requeued, or its job has left
    Slurm's queue (asked at most every :data:`QUEUE_POLL_S`)."""
    from hpctrain.ledger import Ledger
    from hpctrain.run import attempts

    ledger = attempts(Ledger(run_dir).records())
    jobs = reader.run_jobs(run_dir)
    job = jobs[-1] if jobs else {}
    newest = ledger[-1] if ledger else None
    if (
        newest is not None
        and newest.exit is not None
        and not newest.requeued
        and newest.job_id == str(job.get("job_id"))
    ):
        return True
    if job.get("cluster") == "slurm" and job.get("job_id"):
        now = time.monotonic()
        if now - state.get("asked", float("-inf")) >= QUEUE_POLL_S:
            state["asked"] = now
            try:
                if slurm is None:
                    from hpctrain._slurm import SlurmCommands

                    slurm = SlurmCommands()
                state["gone"] = slurm.job_state(str(job["job_id"])).source != "squeue"
            except Exception:  # noqa: BLE001 - no Slurm here: the ledger alone says when
                state["gone"] = False
        return bool(state.get("gone"))
    return False


def follow(
    run_dir: Path,
    attempt: reader.LogAttempt,
    *,
    ranks: tp.Sequence[int] = (0,),
    streams: tp.Sequence[str] = ("out", "err"),
    prefixed: bool = False,
    out: tp.Optional[tp.TextIO] = None,
    poll_s: tp.Optional[float] = None,
    settle_s: tp.Optional[float] = None,
    slurm: tp.Any = None,
    stop: tp.Any = None,
) -> int:
    """Print ``attempt``'s lines of ``ranks``, then every line appended since, into later attempts (the same files
    after a requeue, the next job's after ``submit --resume``), until the run ended (:func:`_run_over`) and the
    files stayed unchanged for ``settle_s``; or ``stop`` (a ``threading.Event``) is set."""
    out = out or sys.stdout
    poll_s = POLL_S if poll_s is None else poll_s
    settle_s = SETTLE_S if settle_s is None else settle_s
    printed: tp.Dict[Path, int] = {}  # file -> lines printed
    index = attempt.index
    state: tp.Dict[str, tp.Any] = {}
    quiet_since: tp.Optional[float] = None
    wanted = list(ranks)
    while True:
        attempts = reader.log_attempts(run_dir)
        news = 0
        for a in attempts[index:]:
            files: tp.List[tp.Tuple[str, tp.List[str]]] = []
            for r in wanted if wanted else sorted(a.ranks):
                log = a.ranks.get(r)
                if log is None:
                    continue
                for s in streams:
                    f = log.files.get(s)
                    if f is None:
                        continue
                    done = printed.get(f.path, 0)
                    start = max(0, (f.first_line - 1) if f.first_line > 0 else 0)
                    fresh = f.lines[max(0, done - start) :] if done > start else f.lines
                    if fresh:
                        files.append((_prefix(log, s, streams) if prefixed else "", fresh))
                        printed[f.path] = start + len(f.lines)
            if files and a.index != index:
                print(f"hpctrain logs: attempt {a.index} ({a.label})", file=sys.stderr, flush=True)
                index = a.index
            for prefix, line in reader.interleave(files):
                out.write(prefix + line + "\n")
                news += 1
        if prefixed and attempts and attempts[-1].index >= index:
            wanted = sorted(attempts[-1].ranks)  # a later attempt may have another world size
        out.flush()
        now = time.monotonic()
        if news:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        if stop is not None and stop.is_set():
            return 0
        if quiet_since is not None and now - quiet_since >= settle_s and _run_over(run_dir, slurm, state):
            return 0
        time.sleep(poll_s)
