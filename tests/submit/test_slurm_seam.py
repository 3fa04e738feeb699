import pytest

from hpctrain._slurm import SlurmCommandError
from hpctrain.submit.follow import LogTail, follow
from hpctrain.testing import FakeSlurm


def test_partitions_and_default():
    names, default = FakeSlurm(["debug*", "low", "high"]).partitions()
    assert names == ["debug", "low", "high"] and default == "debug"


def test_job_state_moves_from_squeue_to_sacct():
    fake = FakeSlurm()
    fake.queue["7"] = ["PENDING", "RUNNING"]
    fake.final["7"] = "COMPLETED"
    seen = [fake.job_state("7") for _ in range(3)]
    assert [(s.state, s.source, s.terminal, s.reason) for s in seen] == [
        ("PENDING", "squeue", False, "Priority"),
        ("RUNNING", "squeue", False, ""),
        ("COMPLETED", "sacct", True, ""),
    ]


def test_a_job_squeue_no_longer_knows_is_read_from_sacct():
    fake = FakeSlurm()
    fake.forgotten.add("11")  # squeue: "Invalid job id specified" after MinJobAge
    fake.final["11"] = "TIMEOUT"
    state = fake.job_state("11")
    assert (state.state, state.source, state.terminal) == ("TIMEOUT", "sacct", True)


def test_job_state_without_accounting_is_unknown_not_an_error():
    fake = FakeSlurm()
    fake.accounting = False
    state = fake.job_state("8")
    assert (state.state, state.terminal) == ("UNKNOWN", False)


def test_cancelled_by_uid_is_normalised():
    fake = FakeSlurm()
    fake.cancel("9")
    assert fake.job_state("9").state == "CANCELLED"


def test_log_tail_returns_whole_lines_only(tmp_path):
    log = tmp_path / "a.log"
    tail = LogTail(log)
    assert tail.read_lines() == []  # not created yet
    log.write_text("one\ntw")
    assert tail.read_lines() == ["one"]
    with log.open("a") as f:
        f.write("o\nthree\n")
    assert tail.read_lines() == ["two", "three"]
    with log.open("a") as f:
        f.write("tail-without-newline")
    assert tail.read_lines() == [] and tail.flush() == ["tail-without-newline"]


def test_follow_streams_log_until_terminal_state(tmp_path):
    from rich.console import Console

    fake = FakeSlurm()
    fake.queue["5"] = ["PENDING", "RUNNING", "RUNNING"]
    fake.final["5"] = "FAILED"
    log = tmp_path / "5_0_log.out"
    writes = iter(["", "step 1\n", "step 2\nlast line"])

    def sleep(_):
        text = next(writes, "")
        with log.open("a") as f:
            f.write(text)

    console = Console(record=True, width=120, force_terminal=False)
    final = follow("5", log, lambda: fake.job_state("5"), poll_s=0, console=console, sleep=sleep)
    out = console.export_text()
    assert final.state == "FAILED"
    assert out.index("step 1") < out.index("step 2") < out.index("last line")


def test_job_runs_reads_every_run_of_each_job_in_one_sacct_call():
    """sacct 22.05's ``-D -X -P -n`` rows (as the dev cluster prints them for a job requeued after NODE_FAIL)."""
    fake = FakeSlurm()
    fake.history["2"] = [
        {"State": "NODE_FAIL", "Start": "2026-12-03T08:09:27", "End": "2026-12-03T08:09:34", "NodeList": "node4"},
        {"State": "CANCELLED by 0", "Start": "2026-12-03T08:09:46", "End": "Unknown", "NodeList": "node4"},
    ]
    fake.history["5"] = [{"State": "PENDING", "NodeList": "None assigned", "ExitCode": "0:0"}]
    runs = fake.job_runs(["2", "5"])
    assert [c for c in fake.calls if c[0] == "sacct"] == [
        ["sacct", "-D", "-X", "-n", "-P", "-j", "2,5", "-o", "JobIDRaw,JobID,State,Start,End,Elapsed,NodeList,ExitCode"]
    ]
    assert [(r.job_id, r.state, r.nodes) for r in runs] == [
        ("2", "NODE_FAIL", "node4"),
        ("2", "CANCELLED", "node4"),
        ("5", "PENDING", "None assigned"),
    ]
    assert runs[0].end - runs[0].start == 7 and runs[1].end is None and runs[2].start is None
    assert fake.past_runs("2") == [("NODE_FAIL", "node4"), ("CANCELLED", "node4")]  # the same reader


def test_job_runs_without_accounting_raises_and_past_runs_is_empty():
    fake = FakeSlurm()
    fake.accounting = False
    with pytest.raises(SlurmCommandError, match="accounting storage is disabled"):
        fake.job_runs(["2"])
    assert fake.past_runs("2") == []


def test_job_state_given_the_runs_does_not_ask_sacct_again():
    fake = FakeSlurm()
    fake.history["3"] = ["NODE_FAIL|node1", "TIMEOUT|node2"]
    runs = fake.job_runs(["3"])
    fake.calls.clear()
    state = fake.job_state("3", runs=runs)
    assert (state.state, state.nodes, state.source, state.terminal) == ("TIMEOUT", "node2", "sacct", True)
    assert fake.job_state("4", runs=runs).state == "UNKNOWN"  # none of its runs: unknown, sacct not asked
    assert [c[0] for c in fake.calls] == ["squeue", "squeue"]
