"""hpctrain._output: the one writer of the files and directories a user names (``-o``, ``--plot``, ``OUT.h5``).

Files are replaced atomically; a symlink's target is written and the link stays; a device, FIFO or
``/dev/stdout`` is written through, never replaced (run as root, ``-o /dev/full`` once replaced the device
node); bad names are one line. The tests touch ``/dev/null`` and ``/dev/full`` only by opening them for
writing, through symlinks in a temporary directory, and check the devices are still devices afterwards.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpctrain._atomic import TMP_NAME
from hpctrain._output import check_output_parent, output_dir, output_file, write_output
from hpctrain.errors import HpctrainError, UsageError
from tests.report.synth import make_run


def _no_tmp(directory: Path) -> None:
    assert [p.name for p in directory.iterdir() if TMP_NAME.match(p.name)] == []


def _is_char_device(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


# ---- regular files --------------------------------------------------------------------------------------
def test_a_new_file_is_written_atomically_and_nothing_else_is_left(tmp_path):
    out = write_output(tmp_path / "r.html", "héllo")
    assert out.kind == "file" and out.size == len("héllo".encode())
    assert (tmp_path / "r.html").read_text() == "héllo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_an_existing_file_is_replaced_and_keeps_its_permissions(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old")
    path.chmod(0o600)
    write_output(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600
    _no_tmp(tmp_path)


def test_overwrite_false_refuses_an_existing_file_with_the_hint(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old")
    with pytest.raises(UsageError, match=r"r\.html already exists; pass --force"):
        write_output(path, b"new", overwrite=False, hint="pass --force")
    assert path.read_text() == "old"


def test_a_symlink_to_a_file_writes_the_target_and_stays_a_link(tmp_path):
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    out = write_output(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new" and out.path == target
    _no_tmp(tmp_path)
    _no_tmp(tmp_path / "sub")


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.html"
    link.symlink_to("made.html")
    write_output(link, b"x")
    assert link.is_symlink() and (tmp_path / "made.html").read_bytes() == b"x"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "r.html"
    path.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HpctrainError, match=r"cannot write .*r\.html: No space left on device"):
        write_output(path, b"new")
    monkeypatch.undo()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_write_with_puts_a_produced_file_in_place_or_leaves_nothing(tmp_path):
    path = tmp_path / "d.h5"
    out = output_file(path)
    out.write_with(lambda tmp: tmp.write_bytes(b"produced"))
    assert path.read_bytes() == b"produced" and out.size == 8

    def fail(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(HpctrainError, match="Input/output error"):
        output_file(path).write_with(fail)
    assert path.read_bytes() == b"produced" and sorted(p.name for p in tmp_path.iterdir()) == ["d.h5"]


# ---- refused names --------------------------------------------------------------------------------------
def test_a_parent_that_is_a_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "x.html"
    with pytest.raises(UsageError) as exc:
        output_file(bad)
    assert str(exc.value) == f"cannot write {bad}: {tmp_path / 'file'} is not a directory; choose another path"
    with pytest.raises(UsageError, match="is not a directory"):
        output_file(tmp_path / "file" / "deeper" / "x.html")


def test_a_missing_parent_and_a_directory_are_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no does not exist; create it first"):
        output_file(tmp_path / "no" / "x.html")
    with pytest.raises(UsageError, match="it is a directory; give a file name"):
        output_file(tmp_path)
    with pytest.raises(UsageError, match="an empty output path"):
        output_file("")


def test_a_symlink_loop_is_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UsageError, match="cannot write .*loop: Too many levels of symbolic links"):
        output_file(loop)


# ---- devices, FIFOs, descriptors: written through, never replaced -------------------------------------
def test_a_symlink_to_dev_null_is_written_through_and_both_survive(tmp_path):
    link = tmp_path / "null.html"
    link.symlink_to("/dev/null")
    out = write_output(link, b"x" * 100_000)
    assert out.kind == "stream" and out.size == 100_000
    assert link.is_symlink() and os.readlink(link) == "/dev/null" and _is_char_device("/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null.html"]


def test_dev_full_is_one_enospc_error_and_stays_a_device(tmp_path):
    link = tmp_path / "full.html"
    link.symlink_to("/dev/full")
    with pytest.raises(HpctrainError) as exc:
        write_output(link, b"data")
    assert str(exc.value) == f"cannot write {link}: No space left on device"
    assert link.is_symlink() and os.readlink(link) == "/dev/full" and _is_char_device("/dev/full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.html"]


def _fifo_reader(fifo: Path) -> tuple:
    got: list = []

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, got = _fifo_reader(fifo)
    data = os.urandom(300_000)  # more than a pipe holds: the reader must be draining while it is written
    out = write_output(fifo, data)
    thread.join(10)
    assert out.kind == "stream" and got == [data]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_write_with_copies_a_produced_file_through_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, got = _fifo_reader(fifo)
    output_file(fifo).write_with(lambda tmp: tmp.write_bytes(b"h5 bytes"))
    thread.join(10)
    assert got == [b"h5 bytes"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_stdout_writes_the_descriptor(capfd):
    out = write_output("/dev/stdout", b"to stdout\n")
    assert out.kind == "stream" and out.to_stdout
    assert capfd.readouterr().out == "to stdout\n"


def test_dev_fd_n_and_a_link_to_it_write_that_descriptor(tmp_path):
    r, w = os.pipe()
    try:
        link = tmp_path / "fd-link"
        link.symlink_to(f"/dev/fd/{w}")
        write_output(f"/proc/self/fd/{w}", b"one ")
        write_output(link, b"two")
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"one two"
        assert link.is_symlink()
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


# ---- output directories -----------------------------------------------------------------------------------
def test_output_dir_refusals_and_links(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"cannot write .*file/tb: .*file is not a directory"):
        output_dir(tmp_path / "file" / "tb")
    with pytest.raises(UsageError, match="it exists and is not a directory"):
        output_dir(tmp_path / "file")
    with pytest.raises(UsageError, match="already exists; choose a new one"):
        output_dir(tmp_path, exist_ok=False, hint="choose a new one")
    with pytest.raises(UsageError, match="does not exist"):
        output_dir(tmp_path / "a" / "b")
    assert output_dir(tmp_path / "a" / "b", parents=True) == tmp_path / "a" / "b"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert output_dir(tmp_path / "link") == tmp_path / "real"


def test_check_output_parent(tmp_path):
    (tmp_path / "file").write_text("")
    check_output_parent(tmp_path / "new" / "deeper" / "out", parents=True)
    with pytest.raises(UsageError, match="file is not a directory"):
        check_output_parent(tmp_path / "file" / "sub" / "out", parents=True)


# ---- the commands that write a named output (the ones without a test module of their own here) ------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "command",
    [
        ["bundle", "{run}", "-o", "{bad}/bundle"],
        ["export-tensorboard", "{run}", "-o", "{bad}/tb"],
        ["report", "{run}", "-o", "{bad}/r.html"],
        ["data", "synth", "{bad}/d.h5", "--samples", "4"],
    ],
)
def test_an_output_under_a_file_is_one_line_exit_2(tmp_path, command):
    bad = tmp_path / "file"
    bad.write_text("")
    run = tmp_path / "run"
    make_run(run)
    res = _cli(*(a.format(run=run, bad=bad) for a in command))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"cannot write {bad}/" in res.stderr and f"{bad} is not a directory" in res.stderr, res.stderr
    assert bad.read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]
