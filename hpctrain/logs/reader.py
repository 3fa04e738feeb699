"""Read a run's per-rank log files: which file holds which rank of which attempt (stdlib only, login side).

Slurm writes one stdout and one stderr file per task (submitit's ``srun --output DIR/%j_%t_log.out``, the
submission's ``logs`` record). A requeued job keeps its job id, and submitit opens the files in append mode
(``#SBATCH --open-mode=append``), so **every attempt of a job is appended to the same file**. The attempts are
split again at the lines that start or end one:

* stdout: submitit's ``submitit INFO (<time>) - Starting with JobEnvironment(...)``, the first line of every
  attempt of every task; without submitit (the sbatch template, ``python -m hpctrain.launch``) hpctrain's join
  line ``hpctrain: rank R/W on HOST ... joined ...`` when the segment has one already;
* stderr: hpctrain's last line of every rank's attempt, ``hpctrain: rank R ends attempt N (cause)``
  (:func:`hpctrain.launch.ending.finish_attempt`), and what follows it in the same attempt (the deciding rank's
  decision line, submitit's error line, the traceback the interpreter prints, srun's and slurmstepd's lines);
  a timed line (submitit's, slurmstepd's) stamped after the next attempt's start (its rank records) starts it.

The k-th segment of a job's file is the k-th attempt of that job that has a folder ``ranks/<job>-r<n>/`` (the
restart counts in order: ``n`` = k unless an in-job restart numbered them otherwise). A run continued with
``submit --resume`` has one job per submission (``submissions/<n>.json``, then ``submission.json``), each with
its own files. Attempts are numbered over the whole run, oldest first, from 0 (:attr:`LogAttempt.index`).
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import re
import time
import typing as tp
from pathlib import Path

from hpctrain.rundir import RunDir, attempt_label, read_json

__all__ = [
    "LogFile",
    "LogAttempt",
    "RankLog",
    "Traceback",
    "run_jobs",
    "log_attempts",
    "first_traceback",
    "line_time",
    "interleave",
    "rank_errors",
    "split_out",
    "split_err",
]

PathLike = tp.Union[str, "os.PathLike[str]"]
STREAMS = ("out", "err")
READ_LIMIT = 256 << 20
"""Bytes read of one log file (a longer one is read from its end)."""

_SUBMITIT_START = re.compile(r"^submitit INFO \((?P<t>[^)]*)\) - Starting with JobEnvironment\(")
_JOIN = re.compile(r"^hpctrain: rank (?P<rank>\d+)/(?P<world>\d+) on (?P<host>\S+) .*\bjoined\b")
_END = re.compile(r"^hpctrain: rank (?P<rank>\d+) ends attempt (?P<n>\d+) \((?P<cause>[\w-]+)\)\s*$")
_SUBMITIT_TIME = re.compile(r"^submitit \w+ \((?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(?P<ms>\d+))?\)")
_STEPD_TIME = re.compile(r"\bAT (?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\b")
_HOSTNAME = re.compile(r"hostname=(?P<host>[^,)\s]+)")
_TB_START = "Traceback (most recent call last):"
_TB_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:: .*)?$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")
"""What torch.distributed puts before every line of an uncaught exception's traceback in a rank (``[rank1]: ``)."""


def _bare(line: str) -> str:
    return _RANK_PREFIX.sub("", line, count=1)


def line_time(line: str) -> tp.Optional[float]:
    """The Unix time a log line is stamped with (submitit's ``(2026-12-03 13:09:19,908)``, slurmstepd's
    ``AT 2026-12-03T13:10:25``; local time), None for an unstamped line."""
    m = _SUBMITIT_TIME.match(line)
    if m:
        try:
            t = time.mktime(time.strptime(m.group("t"), "%Y-%m-%d %H:%M:%S"))
        except (ValueError, OverflowError):
            return None
        return t + (int(m.group("ms")) / 1000.0 if m.group("ms") else 0.0)
    if line.startswith(("slurmstepd", "srun")):
        m = _STEPD_TIME.search(line)
        if m:
            try:
                return time.mktime(time.strptime(m.group("t"), "%Y-%m-%dT%H:%M:%S"))
            except (ValueError, OverflowError):
                return None
    return None


@dataclasses.dataclass
class LogFile:
    """One stream of one rank in one attempt: ``lines`` (without newlines) are lines ``first_line`` .. of ``path``."""

    rank: int
    stream: str
    path: Path
    lines: tp.List[str]
    first_line: int = 1
    mtime: tp.Optional[float] = None

    @property
    def last_line(self) -> int:
        return self.first_line + len(self.lines) - 1

    def summary(self) -> tp.Dict[str, tp.Any]:
        return {
            "stream": self.stream,
            "path": str(self.path),
            "first_line": self.first_line,
            "last_line": self.last_line,
            "line_count": len(self.lines),
        }


@dataclasses.dataclass
class RankLog:
    rank: int
    host: str
    files: tp.Dict[str, LogFile]


@dataclasses.dataclass
class LogAttempt:
    """One attempt of the run, as its log files show it."""

    index: int
    """0-based over the whole run, oldest first (what ``--attempt K`` names)."""
    job_id: str
    restart_count: int
    ranks: tp.Dict[int, RankLog]

    @property
    def label(self) -> str:
        return attempt_label(self.job_id, self.restart_count)


# ---------------------------------------------------------------------------------------------- files of the run
def run_jobs(run: tp.Union[PathLike, RunDir]) -> tp.List[tp.Dict[str, tp.Any]]:
    """The submission records of the run, oldest first (``submissions/<n>.json``, then ``submission.json``)."""
    paths = run if isinstance(run, RunDir) else RunDir(run)
    records: tp.List[tp.Dict[str, tp.Any]] = []
    n = 0
    while paths.previous_submission(n).exists() and n < 10000:
        rec = read_json(paths.previous_submission(n), [])
        if rec and rec.get("job_id"):
            records.append(rec)
        n += 1
    rec = read_json(paths.submission, [])
    if rec and rec.get("job_id"):
        records.append(rec)
    return records


def _template(paths: RunDir, record: tp.Mapping[str, tp.Any], stream: str) -> str:
    """The job's per-task log path with ``<rank>`` in it (the submission's ``logs`` record, else submitit's
    ``%j_%t_log.<stream>`` in ``RUN_DIR/logs``)."""
    logs = record.get("logs") if isinstance(record.get("logs"), dict) else {}
    given = logs.get("stdout" if stream == "out" else "stderr")
    job = str(record.get("job_id"))
    if isinstance(given, str) and given:
        if "<rank>" in given:
            return given
        name = os.path.basename(given)
        head = f"{job}_0_log."
        if name.startswith(head):  # submitit already filled %t with 0
            return os.path.join(os.path.dirname(given), f"{job}_<rank>_log.{name[len(head) :]}")
    return str(paths.logs / f"{job}_<rank>_log.{stream}")


def _rank_files(template: str) -> tp.Dict[int, Path]:
    folder, name = os.path.split(template)
    before, _, after = name.partition("<rank>")
    found: tp.Dict[int, Path] = {}
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return found
    for entry in entries:
        if entry.startswith(before) and entry.endswith(after) and len(entry) > len(before) + len(after):
            middle = entry[len(before) : len(entry) - len(after)]
            if middle.isdigit():
                found[int(middle)] = Path(folder) / entry
    return found


def _read_lines(path: Path) -> tp.Tuple[tp.List[str], int]:
    """``(lines, number of the first one)``; a file over :data:`READ_LIMIT` is read from its end."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            skip = max(0, size - READ_LIMIT)
            if skip:
                f.seek(skip)
            data = f.read(READ_LIMIT)
    except OSError:
        return [], 1
    first = 1
    if skip:
        first = -1  # unknown: a window of a huge file
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines, first


def split_out(lines: tp.Sequence[str]) -> tp.List[tp.Tuple[int, int]]:
    """``[(start, stop)]`` index ranges of the attempts in a stdout file (module docstring)."""
    starts: tp.List[int] = []
    joined = False
    for i, line in enumerate(lines):
        if _SUBMITIT_START.match(line):
            starts.append(i)
            joined = False
        elif _JOIN.match(line):
            if joined or not starts:
                starts.append(i)
            joined = True
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    return [(a, b) for a, b in zip(starts, starts[1:] + [len(lines)]) if b > a or len(lines) == 0]


def _in_tail(line: str, in_tb: bool) -> tp.Tuple[bool, bool]:
    """Whether ``line`` may still belong to the attempt that just ended (and whether a traceback is open)."""
    line = _bare(line)
    stripped = line.strip()
    if line.startswith(_TB_START) or stripped in _TB_CHAIN:
        return True, True
    if in_tb and (line.startswith((" ", "\t")) or not stripped):
        return True, True
    if in_tb and _EXC_LINE.match(line):  # the exception line closes the block (a chain may follow)
        return True, False
    if not stripped:
        return True, in_tb
    if line.startswith(("hpctrain: ", "submitit ", "srun: ", "slurmstepd")):
        return True, False
    return False, False


def split_err(
    lines: tp.Sequence[str], next_starts: tp.Sequence[tp.Optional[float]] = ()
) -> tp.List[tp.Tuple[int, int]]:
    """``[(start, stop)]`` index ranges of the attempts in a stderr file. ``next_starts[k]``: when attempt k + 1
    started (a timed line after it belongs to k + 1), None where unknown."""
    cuts: tp.List[int] = []
    i, n = 0, len(lines)
    while i < n:
        k = len(cuts)
        nxt = next_starts[k] if k < len(next_starts) else None
        t = line_time(lines[i])
        if nxt is not None and t is not None and t >= nxt and i > (cuts[-1] if cuts else 0):
            cuts.append(i)
            continue
        if _END.match(lines[i]):
            j, in_tb = i + 1, False
            while j < n:
                t = line_time(lines[j])
                if nxt is not None and t is not None and t >= nxt:
                    break
                if _END.match(lines[j]):
                    break
                ok, in_tb = _in_tail(lines[j], in_tb)
                if not ok:
                    break
                j += 1
            if j < n:
                cuts.append(j)
            i = j
            continue
        i += 1
    starts = [0] + cuts
    return list(zip(starts, starts[1:] + [n]))


def _host_of(paths: RunDir, job: str, restart: int, rank: int, lines: tp.Sequence[str]) -> str:
    rec = read_json(paths.rank_record(job, restart, rank), []) or {}
    if isinstance(rec.get("hostname"), str) and rec["hostname"]:
        return rec["hostname"]
    for line in lines[:50]:
        m = _JOIN.match(line)
        if m:
            return m.group("host")
        if _SUBMITIT_START.match(line):
            h = _HOSTNAME.search(line)
            if h:
                return h.group("host")
    return "?"


def _started(paths: RunDir, job: str, restart: int, rank: int) -> tp.Optional[float]:
    rec = read_json(paths.rank_record(job, restart, rank), []) or {}
    value = rec.get("started_at")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def log_attempts(run: tp.Union[PathLike, RunDir]) -> tp.List[LogAttempt]:
    """Every attempt of the run with the lines of each rank's stdout and stderr (module docstring), oldest first."""
    paths = run if isinstance(run, RunDir) else RunDir(run)
    out: tp.List[LogAttempt] = []
    for record in run_jobs(paths):
        job = str(record["job_id"])
        files = {s: _rank_files(_template(paths, record, s)) for s in STREAMS}
        ranks = sorted(set(files["out"]) | set(files["err"]))
        numbers = paths.attempt_numbers(job)
        per_rank: tp.Dict[int, tp.Dict[str, tp.List[tp.Tuple[int, tp.List[str], Path, tp.Optional[float]]]]] = {}
        count = 0
        for rank in ranks:
            per_rank[rank] = {}
            out_lines, out_first = _read_lines(files["out"][rank]) if rank in files["out"] else ([], 1)
            out_cuts = split_out(out_lines) if out_lines else []
            count = max(count, len(out_cuts), 1)
            restarts = _restarts(numbers, max(len(out_cuts), 1))
            nexts = [_started(paths, job, r, rank) for r in restarts[1:]]
            err_lines, err_first = _read_lines(files["err"][rank]) if rank in files["err"] else ([], 1)
            err_cuts = split_err(err_lines, nexts) if err_lines else []
            count = max(count, len(err_cuts))
            for stream, lines, first, cuts in (
                ("out", out_lines, out_first, out_cuts),
                ("err", err_lines, err_first, err_cuts),
            ):
                if rank not in files[stream]:
                    continue
                path = files[stream][rank]
                try:
                    mtime: tp.Optional[float] = os.path.getmtime(path)
                except OSError:
                    mtime = None
                per_rank[rank][stream] = [
                    (first + a if first > 0 else -1, list(lines[a:b]), path, mtime) for a, b in cuts
                ]
        restarts = _restarts(numbers, count)
        for k, restart in enumerate(restarts):
            ranks_here: tp.Dict[int, RankLog] = {}
            for rank, streams in per_rank.items():
                logs: tp.Dict[str, LogFile] = {}
                for stream, segments in streams.items():
                    if k < len(segments):
                        first, lines, path, mtime = segments[k]
                        logs[stream] = LogFile(rank, stream, path, lines, first, mtime)
                    elif k == len(restarts) - 1 and not segments:
                        logs[stream] = LogFile(rank, stream, path_of(files, stream, rank), [], 1, None)
                if logs:
                    seen = (logs.get("out").lines if "out" in logs else []) or []
                    ranks_here[rank] = RankLog(rank, _host_of(paths, job, restart, rank, seen), logs)
            out.append(LogAttempt(len(out), job, restart, ranks_here))
    return out


def path_of(files: tp.Mapping[str, tp.Mapping[int, Path]], stream: str, rank: int) -> Path:
    return files[stream][rank]


def _restarts(numbers: tp.Sequence[int], count: int) -> tp.List[int]:
    """The restart counts of ``count`` segments: the attempt folders' when they are as many, else 0, 1, ..."""
    if len(numbers) == count:
        return list(numbers)
    if len(numbers) > count:
        return list(numbers[:count])
    return list(range(count))


# ---------------------------------------------------------------------------------------------- tracebacks
@dataclasses.dataclass
class Traceback:
    rank: int
    host: str
    lines: tp.List[str]
    first_line: int
    path: str
    exception: str
    time: tp.Optional[float]
    """When the rank failed, by :attr:`time_from`."""
    time_from: str
    """``end record`` (the rank's ``end-rank-N.json``), ``log line`` (submitit's stamped error line), ``file mtime``."""
    cause: tp.Optional[str] = None
    """The rank's own end record's cause (``user_error``: its code raised; ``node_failure``: a peer failed)."""

    def summary(self) -> tp.Dict[str, tp.Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "exception": self.exception,
            "traceback": self.lines,
            "path": self.path,
            "first_line": self.first_line,
            "time": self.time,
            "time_from": self.time_from,
            "cause": self.cause,
        }


def first_traceback(lines: tp.Sequence[str]) -> tp.Optional[tp.Tuple[int, tp.List[str]]]:
    """``(index, lines)`` of the first Python traceback in ``lines`` (with its chained ones), None without one."""
    lines = [_bare(line) for line in lines]
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(_TB_START))
    except StopIteration:
        return None
    block: tp.List[str] = []
    i, in_tb = start, True
    while i < len(lines):
        line = lines[i]
        if line.startswith(_TB_START):
            in_tb = True
        elif in_tb and line.startswith((" ", "\t")):
            pass
        elif in_tb:
            block.append(line)  # the exception line
            in_tb = False
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].strip() in _TB_CHAIN:
                block.extend(lines[i + 1 : j + 1])
                i = j + 1
                continue
            break
        block.append(line)
        i += 1
    return start, block


def rank_errors(run: tp.Union[PathLike, RunDir], attempt: LogAttempt) -> tp.List[Traceback]:
    """The first traceback of every rank that raised in ``attempt``, the first to fail first: by its end record's
    time (``RUN_DIR/ranks/<job>-r<n>/end-rank-N.json``, written as the exception reached the Runner), else
    submitit's stamped error line, else the file's mtime; ranks whose own code raised (``user_error``) before
    ranks that failed because a peer did."""
    paths = run if isinstance(run, RunDir) else RunDir(run)
    found: tp.List[Traceback] = []
    for rank, log in sorted(attempt.ranks.items()):
        err = log.files.get("err")
        if err is None:
            continue
        tb = first_traceback(err.lines)
        if tb is None:
            continue
        index, block = tb
        end = read_json(paths.rank_end(attempt.job_id, attempt.restart_count, rank), []) or {}
        when, how = None, ""
        if isinstance(end.get("time"), (int, float)) and not isinstance(end.get("time"), bool):
            when, how = float(end["time"]), "end record"
        if when is None:
            stamped = [line_time(x) for x in err.lines[:index] if "ERROR" in x]
            stamped = [t for t in stamped if t is not None]
            if stamped:
                when, how = stamped[-1], "log line"
        if when is None and err.mtime is not None:
            when, how = err.mtime, "file mtime"
        found.append(
            Traceback(
                rank=rank,
                host=log.host,
                lines=block,
                first_line=err.first_line + index if err.first_line > 0 else -1,
                path=str(err.path),
                exception=block[-1] if block else "",
                time=when,
                time_from=how or "unknown",
                cause=end.get("cause") if isinstance(end.get("cause"), str) else None,
            )
        )
    found.sort(
        key=lambda t: (t.cause not in (None, "user_error"), t.time if t.time is not None else float("inf"), t.rank)
    )
    return found


# ---------------------------------------------------------------------------------------------- interleaving
def interleave(files: tp.Sequence[tp.Tuple[str, tp.Sequence[str]]]) -> tp.Iterator[tp.Tuple[str, str]]:
    """``(prefix, line)`` of several files merged: each file's lines stay in file order; across files, by the
    time of the newest stamped line seen in each (:func:`line_time`), ties in the order given. Unstamped files
    (or stretches) are interleaved in turn, line by line."""
    heap: tp.List[tp.Tuple[float, int, int, int]] = []
    stamps: tp.List[float] = [float("-inf")] * len(files)
    position = [0] * len(files)
    turn = 0

    def push(k: int) -> None:
        nonlocal turn
        lines = files[k][1]
        if position[k] >= len(lines):
            return
        t = line_time(lines[position[k]])
        if t is not None:
            stamps[k] = t
        heapq.heappush(heap, (stamps[k], turn, k, position[k]))
        turn += 1

    for k in range(len(files)):
        push(k)
    while heap:
        _, _, k, i = heapq.heappop(heap)
        yield files[k][0], files[k][1][i]
        position[k] = i + 1
        push(k)
