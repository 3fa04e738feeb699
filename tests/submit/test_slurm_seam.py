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
