"""``python -m hpctrain logs`` on a synthetic run directory: per-rank files of 2 attempts appended into the same
files (as Slurm does for a requeued job), --all prefixes, --errors, --follow across a requeue.

The real files of a real run are read on the dev cluster (tests/cluster/test_logs_cancel.py).
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from hpctrain.__main__ import main as hpctrain_main
from hpctrain.ledger import Ledger
from hpctrain.logs import cli, reader

JOB = "12"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + ",000"


def _attempt_out(rank: int, host: str, t: float, n: int) -> str:
    return (
        f"submitit INFO ({_stamp(t)}) - Starting with JobEnvironment(job_id={JOB}, hostname={host}, "
        f"local_rank={rank % 2}(2), node={rank // 2}(2), global_rank={rank}(4))\n"
        f"hpctrain: rank {rank}/4 on {host} (node {rank // 2}, local {rank % 2}, cpu, gloo, 1 cpu threads) joined "
        f"node1:20020 in 1.00s; calling x:main\n" + "".join(f"attempt {n} rank {rank} line {i}\n" for i in range(3))
    )


TRACE = [
    "Traceback (most recent call last):",
    '  File "/x/entry.py", line 3, in main',
    "    raise ValueError('boom')",
    "ValueError: boom at rank {rank}",
]


def make_run(root: Path, *, fail_ranks=(), t0: float = 1_800_000_000.0) -> Path:
    """A Slurm run of 4 ranks on 2 hosts, 2 attempts of job 12 (requeued once), all in one file per rank."""
    run = root / "run"
    (run / "logs").mkdir(parents=True)
    (run / "submission.json").write_text(
        json.dumps({"job_id": JOB, "cluster": "slurm", "world_size": 4, "logs": {
            "stdout": str(run / "logs" / f"{JOB}_0_log.out"), "stderr": str(run / "logs" / f"{JOB}_0_log.err")}})
    )  # fmt: skip
    for restart, start in ((0, t0), (1, t0 + 100)):
        for rank in range(4):
            d = run / "ranks" / f"{JOB}-r{restart}"
            d.mkdir(parents=True, exist_ok=True)
            host = f"node{1 + rank // 2}"
            (d / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "hostname": host, "started_at": start}))
    for rank in range(4):
        host = f"node{1 + rank // 2}"
        out = _attempt_out(rank, host, t0, 0) + _attempt_out(rank, host, t0 + 100, 1)
        (run / "logs" / f"{JOB}_{rank}_log.out").write_text(out)
        err = [f"warning of attempt 0 rank {rank}", f"hpctrain: rank {rank} ends attempt 0 (stopped)"]
        if rank == 0:
            err += ["hpctrain: attempt 0 ended by preemption at step 5: requeued after preemption (1 of 3)"]
        err += ["srun: forcing job termination", f"slurmstepd-{host}: error: *** STEP 12.0 ON {host} CANCELLED AT "
                f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(t0 + 50))} DUE TO JOB REQUEUE ***"]  # fmt: skip
        err += [f"warning of attempt 1 rank {rank}"]
        if rank in fail_ranks:
            err += [f"hpctrain: rank {rank} ends attempt 1 (user_error)"]
            err += [f"submitit ERROR ({_stamp(t0 + 150 + rank)}) - Submitted job triggered an exception"]
            err += [f"[rank{rank}]: " + line.format(rank=rank) for line in TRACE]  # torch's prefix
            end = run / "ranks" / f"{JOB}-r1" / f"end-rank-{rank}.json"
            # rank 3 fails first by its end record, although it is a higher rank and later in file order
            end.write_text(json.dumps({"rank": rank, "cause": "user_error", "time": t0 + 160 - rank}))
        (run / "logs" / f"{JOB}_{rank}_log.err").write_text("\n".join(err) + "\n")
    return run


def test_attempts_are_split_per_rank_and_stream(tmp_path):
    run = make_run(tmp_path)
    attempts = reader.log_attempts(run)
    assert [a.label for a in attempts] == ["12-r0", "12-r1"]
    for a in attempts:
        assert sorted(a.ranks) == [0, 1, 2, 3]
        for rank, log in a.ranks.items():
            assert log.host == f"node{1 + rank // 2}"
            out = log.files["out"].lines
            assert out[0].startswith("submitit INFO") and out[-1] == f"attempt {a.restart_count} rank {rank} line 2"
            err = log.files["err"].lines
            assert err[0] == f"warning of attempt {a.restart_count} rank {rank}"
    assert attempts[1].ranks[0].files["out"].first_line == 6
    zero = attempts[0].ranks[0].files["err"].lines
    assert zero[-1].startswith("slurmstepd-node1") and "attempt 0 ended by preemption" in zero[2]


def test_default_is_rank_0_of_the_newest_attempt(tmp_path, capsys):
    run = make_run(tmp_path)
    assert hpctrain_main(["logs", str(run)]) == 0
    out = capsys.readouterr().out
    assert "attempt 1 rank 0 line 2" in out and "attempt 0 rank 0" not in out and "rank 1 line" not in out
    assert hpctrain_main(["logs", str(run), "--attempt", "0", "--rank", "2", "--stream", "out"]) == 0
    out = capsys.readouterr().out
    assert "attempt 0 rank 2 line 0" in out and "attempt 1" not in out and "==>" not in out
    assert hpctrain_main(["logs", str(run), "--attempt", "12-r1", "--rank", "3", "--stream", "err"]) == 0
    assert capsys.readouterr().out.strip() == "warning of attempt 1 rank 3"


def test_all_prefixes_every_rank_and_json(tmp_path, capsys):
    run = make_run(tmp_path)
    assert hpctrain_main(["logs", str(run), "--all", "--stream", "out"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for rank in range(4):
        host = f"node{1 + rank // 2}"
        assert f"[{rank} {host}] attempt 1 rank {rank} line 2" in lines
    assert all(line.startswith("[") for line in lines) and len(lines) == 4 * 5
    assert hpctrain_main(["logs", str(run), "--all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "hpctrain.logs/1" and doc["attempt"]["label"] == "12-r1"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3] and len(doc["attempts"]) == 2


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    run = make_run(tmp_path)
    assert hpctrain_main(["logs", str(run), "--rank", "7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no log of rank 7" in err and "ranks: 0, 1, 2, 3" in err
    assert hpctrain_main(["logs", str(run), "--attempt", "5"]) == 2
    assert "no such attempt" in capsys.readouterr().err
    assert hpctrain_main(["logs", str(tmp_path / "nope")]) == 2
    assert hpctrain_main(["logs", str(run), "--follow", "--json"]) == 2


def test_errors_names_the_rank_that_failed_first(tmp_path, capsys):
    run = make_run(tmp_path, fail_ranks=(1, 3))
    assert hpctrain_main(["logs", str(run), "--errors"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("attempt 1 (12-r1): rank 3 on node2 failed first (by its end record")
    assert "ValueError: boom at rank 3" in out and "ValueError: boom at rank 1" in out
    assert hpctrain_main(["logs", str(run), "--errors", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_failed"] == {"rank": 3, "host": "node2", "by": "end record"}
    assert [e["rank"] for e in doc["errors"]] == [3, 1]
    assert doc["errors"][0]["traceback"] == [x.format(rank=3) for x in TRACE]


def test_errors_without_end_records_go_by_the_stamped_line(tmp_path):
    run = make_run(tmp_path, fail_ranks=(1, 3))
    for rank in (1, 3):
        (run / "ranks" / f"{JOB}-r1" / f"end-rank-{rank}.json").unlink()
    found = reader.rank_errors(run, reader.log_attempts(run)[-1])
    assert [t.rank for t in found] == [1, 3] and found[0].time_from == "log line"


def test_follow_continues_into_the_next_attempt(tmp_path):
    run = make_run(tmp_path)
    # start from attempt 0 of a run still going: then a third attempt is appended and the run ends
    attempts = reader.log_attempts(run)
    sink = io.StringIO()
    printed = threading.Event()
    done = threading.Event()

    class Out(io.StringIO):
        def write(self, s):
            sink.write(s)
            if "attempt 1 rank 0 line 2" in s:
                printed.set()
            return len(s)

    def writer():
        assert printed.wait(60)
        out = run / "logs" / f"{JOB}_0_log.out"
        with open(out, "a") as f:
            f.write(_attempt_out(0, "node1", time.time(), 2))
        (run / "ranks" / f"{JOB}-r2").mkdir()
        Ledger(run).append({"event": "start", "job_id": JOB, "restart_count": 2, "time": time.time()})
        Ledger(run).append({"event": "exit", "job_id": JOB, "restart_count": 2, "cause": "finished", "requeued": False})
        done.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    rc = cli.follow(run, attempts[0], ranks=[0], streams=["out"], out=Out(), poll_s=0.05, settle_s=0.2)
    thread.join(60)
    assert rc == 0 and done.is_set()
    text = sink.getvalue()
    for n in (0, 1, 2):
        assert f"attempt {n} rank 0 line 2" in text
    assert text.count("attempt 0 rank 0 line 0") == 1 and text.count("attempt 1 rank 0 line 0") == 1


@pytest.mark.parametrize("lines", [[], ["only a line"]])
def test_files_without_markers_are_one_attempt(tmp_path, lines):
    assert reader.split_out(lines) == [(0, len(lines))]
    assert reader.split_err(lines) == [(0, len(lines))]


def test_follow_of_a_job_that_has_not_started_waits_for_its_first_lines(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "submission.json").write_text(json.dumps({"job_id": JOB, "cluster": "local", "world_size": 1}))
    monkeypatch.setattr(cli, "POLL_S", 0.05)
    monkeypatch.setattr(cli, "SETTLE_S", 0.2)
    seen = threading.Event()

    def writer():
        (run / "logs" / f"{JOB}_0_log.out").write_text(_attempt_out(0, "node1", time.time(), 0))
        Ledger(run).append({"event": "exit", "job_id": JOB, "restart_count": 0, "cause": "finished", "requeued": False})
        seen.set()

    timer = threading.Timer(0.3, writer)
    timer.start()
    assert hpctrain_main(["logs", str(run), "--follow", "--stream", "out"]) == 0
    timer.join(30)
    assert seen.is_set() and "attempt 0 rank 0 line 2" in capsys.readouterr().out
