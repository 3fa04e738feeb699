"""hpctrain._slurm: how SlurmCommands reads what the Slurm client commands print, through its runner seam.

:class:`Scripted` answers each command with canned text, as the real tool prints it, and keeps the argv asked for:
these tests check the parsing and the questions asked, not the fake (``hpctrain.testing.FakeSlurm`` is tested
where the code that uses it is). Slurm itself is exercised on the dev cluster (tests/cluster).
"""

from __future__ import annotations

import typing as tp

import pytest

from hpctrain._slurm import SlurmCommandError, SlurmCommands, format_time, parse_time
from hpctrain.errors import UsageError
from hpctrain.testing import FakeSlurm


class Scripted(SlurmCommands):
    """Answers by program name: a string, or an exception to raise; every argv is kept in :attr:`calls`."""

    def __init__(self, **answers: tp.Union[str, Exception]) -> None:
        self.answers = answers
        self.calls: tp.List[tp.List[str]] = []

    def run(self, argv: tp.Sequence[str], timeout: float = 30.0) -> str:
        self.calls.append(list(argv))
        answer = self.answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_partitions_names_each_once_and_the_starred_default():
    names, default = Scripted(sinfo="debug*\nlow\nhigh\nlow\n").partitions()
    assert names == ["debug", "low", "high"] and default == "debug"
    assert Scripted(sinfo="a\nb\n").partitions() == (["a", "b"], None)


def test_job_state_from_squeue_keeps_the_pending_reason():
    slurm = Scripted(squeue="PENDING||0:00|Resources\n")
    assert slurm.job_state("7") == ("PENDING", "", "0:00", "squeue", "Resources")
    assert not slurm.job_state("7").terminal
    assert Scripted(squeue="RUNNING|node1|1:02|None\n").job_state("7").reason == ""


def test_job_state_out_of_the_queue_is_sacct_s_last_row_first_word():
    slurm = Scripted(squeue="", sacct="REQUEUED|node1|00:01:00\nCANCELLED by 1000|node2|00:00:09\n")
    state = slurm.job_state("7")
    assert (state.state, state.nodes, state.source, state.terminal) == ("CANCELLED", "node2", "sacct", True)


def test_job_state_a_forgotten_job_is_read_from_sacct_and_other_squeue_errors_raise():
    forgotten = SlurmCommandError("squeue failed: slurm_load_jobs error: Invalid job id specified")
    assert Scripted(squeue=forgotten, sacct="TIMEOUT|n1|1:00\n").job_state("7").state == "TIMEOUT"
    with pytest.raises(SlurmCommandError, match="slurmctld"):
        Scripted(squeue=SlurmCommandError("squeue: is slurmctld up?")).job_state("7")
    no_accounting = Scripted(squeue="", sacct=SlurmCommandError("accounting storage is disabled"))
    assert no_accounting.job_state("7") == ("UNKNOWN", "", "", "", "")


def test_job_runs_one_sacct_call_for_all_jobs_with_times_and_the_asked_id():
    out = (
        "41|41|NODE_FAIL|2026-12-03T08:00:00|2026-12-03T08:05:00|00:05:00|n1|0:0\n"
        "41|41|RUNNING|2026-12-03T08:06:00|Unknown|00:01:00|n2|0:0\n"
        "57|50_3|COMPLETED by 0|Unknown|Unknown|00:00:00|None assigned|0:0\n"
        "short|row\n"
    )
    slurm = Scripted(sacct=out)
    runs = slurm.job_runs(["41", "50_3", ""])
    assert len(slurm.calls) == 1 and slurm.calls[0][slurm.calls[0].index("-j") + 1] == "41,50_3"
    assert [(r.job_id, r.state) for r in runs] == [("41", "NODE_FAIL"), ("41", "RUNNING"), ("50_3", "COMPLETED")]
    assert runs[0].end - runs[0].start == 300 and runs[1].end is None and runs[2].start is None
    assert Scripted().job_runs([]) == [] and Scripted(sacct=SlurmCommandError("x")).past_runs("41") == []


def test_queue_states_one_squeue_call_and_absent_jobs_left_out():
    slurm = Scripted(squeue="41|RUNNING|n1|1:00|None\n50_3|PENDING||0:00|Priority\n")
    states = slurm.queue_states(["41", "50_3", "60"])
    assert set(states) == {"41", "50_3"} and states["50_3"].reason == "Priority" and states["41"].reason == ""
    assert len(slurm.calls) == 1 and Scripted().queue_states([]) == {}


@pytest.mark.parametrize("limit, seconds", [("1:00:00", 3600), ("UNLIMITED", None), ("INVALID", None)])
def test_running_job_gives_the_state_and_the_time_limit(limit, seconds):
    assert Scripted(squeue=f"RUNNING|{limit}\n").running_job("7") == ("RUNNING", seconds)


def test_running_job_unknown_to_squeue():
    assert Scripted(squeue="").running_job("7") == ("", None)
    assert Scripted(squeue=SlurmCommandError("x")).running_job("7") == ("", None)


def test_job_info_node_states_and_partition_nodes():
    info = Scripted(scontrol="JobId=7 JobState=PENDING Restarts=1 ExcNodeList=n1\n").job_info("7")
    assert info == {"JobId": "7", "JobState": "PENDING", "Restarts": "1", "ExcNodeList": "n1"}
    assert Scripted(scontrol=SlurmCommandError("x")).job_info("7") == {}
    states = Scripted(sinfo="n1|IDLE\nn1|idle\nn2|down*\n").node_states(["n1", "n2"])
    assert states == {"n1": "idle", "n2": "down*"} and Scripted().node_states([]) == {}
    nodes = "n1|gpu,a100\nn2|gpu\nn3|(null)\n"
    assert Scripted(sinfo=nodes).partition_nodes("p", "gpu&a100") == ["n1"]
    assert Scripted(sinfo=nodes).partition_nodes("p", "gpu") == ["n1", "n2"]
    assert Scripted(sinfo=nodes).partition_nodes("p", "gpu|a100") == ["n1", "n2", "n3"]  # not interpreted


def test_config_value_and_max_array_size():
    slurm = Scripted(scontrol="MaxArraySize            = 1001\nPriorityType = priority/multifactor\n")
    assert slurm.config_value("PriorityType") == "priority/multifactor" and slurm.config_value("Nope") is None
    assert slurm.max_array_size() == 1001
    assert Scripted(scontrol="MaxArraySize = (null)\n").max_array_size() is None


def test_the_commands_that_act_ask_what_they_say():
    slurm = Scripted(scancel="", scontrol="")
    slurm.cancel("7")
    slurm.signal("7")
    slurm.hold("7")
    slurm.release("7")
    slurm.exclude_nodes("7", ["n1", "n2"])
    assert slurm.calls == [
        ["scancel", "7"],
        ["scancel", "--signal=USR2", "7"],
        ["scontrol", "hold", "7"],
        ["scontrol", "release", "7"],
        ["scontrol", "update", "JobId=7", "ExcNodeList=n1,n2"],
    ]


def test_a_missing_command_is_a_slurm_command_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(SlurmCommandError, match="not on PATH"):
        SlurmCommands().run(["squeue"])
    fake = FakeSlurm()
    fake.missing.add("sacct")
    with pytest.raises(SlurmCommandError, match="not on PATH"):
        fake.job_runs(["7"])


@pytest.mark.parametrize(
    "text, seconds",
    [("10", 600), ("1:30", 90), ("01:00:00", 3600), ("1-0", 86400), ("1-2:03", 93780), ("2-00:00:01", 172801)],
)
def test_parse_time_accepts_what_sbatch_accepts(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "1:60", "1:60:00", "1-24", "abc", "1:2:3:4", "9" * 20])
def test_parse_time_refuses_what_is_not_a_time_naming_the_option(text):
    with pytest.raises(UsageError, match="--limit"):
        parse_time(text, "--limit")


def test_format_time_is_what_squeue_shows_and_round_trips():
    assert format_time(59) == "00:00:59" and format_time(86400 + 3661) == "1-01:01:01"
    for seconds in (60, 3599, 86400, 200000):
        assert parse_time(format_time(seconds)) == seconds
