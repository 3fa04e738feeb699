"""hpctrain._procs: who runs this, and whether a recorded pid still runs here."""

from __future__ import annotations

import os

from hpctrain._procs import pid_alive, user_name


def test_user_name_is_the_login_name_else_the_uid(monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    assert user_name() == "alice"

    def no_passwd_entry():
        raise KeyError("getpwuid(): uid not found")

    monkeypatch.setattr("getpass.getuser", no_passwd_entry)
    assert user_name() == f"uid {os.getuid()}"  # a container without the user in /etc/passwd is still someone


def test_pid_alive_answers_for_this_process_and_refuses_group_pids():
    assert pid_alive(os.getpid()) is True
    for pid in (0, -1, True, "12", 2**40):
        assert pid_alive(pid) is None  # not a process id: no answer, never a signal to a group
