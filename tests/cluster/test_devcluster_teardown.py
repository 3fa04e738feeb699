"""``tests/cluster/devcluster down`` is idempotent and survives a half-removed cluster.

The shared dev cluster stays up: every test builds its own namespaces, veths and bridge under a
random ``DEVCLUSTER_PREFIX`` (``devcluster net-up``: no daemons, no /etc/hosts or /etc/slurm change,
no bridge address, node addresses only inside its own namespaces, no traffic sent), breaks them by
hand, and tears them down with the script's real ``down``. Needs root and ``ip netns``; skips otherwise.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import typing as tp
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "devcluster"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _netns_reason() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not on PATH"
    probe = f"htprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()[:200]}"
    _ip("netns", "delete", probe)
    return ""


class Net:
    """One test's private cluster network: names, the script's environment, what is left."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = "ht" + secrets.token_hex(3)  # 8 chars: bridge ht1a2b3cbr0 fits IFNAMSIZ
        self.base = tmp_path / "devcluster"
        self.env = dict(os.environ, DEVCLUSTER_PREFIX=self.prefix, DEVCLUSTER_DIR=str(self.base))
        self.env.pop("DEVCLUSTER_NODES", None)
        self.procs: tp.List[subprocess.Popen] = []

    def run(self, cmd: str, nodes: int = 4, path: tp.Optional[str] = None) -> subprocess.CompletedProcess:
        env = dict(self.env, DEVCLUSTER_NODES=str(nodes))
        if path:
            env["PATH"] = path + os.pathsep + env["PATH"]
        return subprocess.run([str(SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=120)

    def namespaces(self) -> tp.List[str]:
        out = _ip("netns", "list").stdout.split("\n")
        return sorted(n.split()[0] for n in out if n.startswith(f"{self.prefix}-node"))

    def links(self) -> tp.List[str]:
        names = (line.split(": ")[1].split("@")[0] for line in _ip("-o", "link", "show").stdout.splitlines())
        return sorted(n for n in names if n.startswith(self.prefix))

    def left(self) -> tp.List[str]:
        return self.namespaces() + self.links()

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for name in self.namespaces():
            _ip("netns", "delete", name)
        for name in self.links():
            _ip("link", "delete", name)


@pytest.fixture
def net(tmp_path: Path) -> tp.Iterator[Net]:
    reason = _netns_reason()
    if reason:
        pytest.skip(reason)
    n = Net(tmp_path)
    try:
        yield n
    finally:
        n.cleanup()


def _up(net: Net, nodes: int) -> None:
    r = net.run("net-up", nodes)
    assert r.returncode == 0, r.stderr
    p = net.prefix
    assert net.namespaces() == sorted(f"{p}-node{i}" for i in range(1, nodes + 1))
    assert net.links() == sorted([f"{p}br0"] + [f"{p}v{i}" for i in range(1, nodes + 1)])
    # the node side is eth0 inside its namespace, with its address there only
    assert f"10.78.0.{10 + nodes}/24" in _ip("-n", f"{p}-node{nodes}", "-o", "addr", "show", "eth0").stdout
    assert "inet " not in _ip("-o", "addr", "show", f"{p}br0").stdout


def _down_ok(net: Net, nodes: int = 4) -> None:
    r = net.run("down", nodes)
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().endswith("devcluster: down") and "error" not in r.stderr
    assert net.left() == []


def test_down_twice_removes_everything_and_the_second_is_a_no_op(net):
    _up(net, 3)
    _down_ok(net)
    _down_ok(net)


def test_down_after_a_partial_teardown_goes_through_every_node(net, tmp_path):
    _up(net, 4)
    p = net.prefix
    # a "slurmd" daemon by pid file (the script checks /proc/PID/comm) and an orphan inside node 3
    fake = tmp_path / "bin" / "slurmd"
    fake.parent.mkdir()
    shutil.copy(shutil.which("sleep"), fake)
    daemon = subprocess.Popen([str(fake), "300"])
    orphan = subprocess.Popen(["nsenter", f"--net=/run/netns/{p}-node3", "sleep", "300"])
    net.procs += [daemon, orphan]
    (net.base / "run").mkdir(parents=True)
    (net.base / "run" / "slurmd-node1.pid").write_text(f"{daemon.pid}\n")
    deadline = time.monotonic() + 10
    while _ip("netns", "pids", f"{p}-node3").stdout.split() != [str(orphan.pid)]:
        assert time.monotonic() < deadline, "the orphan did not enter its namespace"
        time.sleep(0.05)
    # the state the issue saw: a namespace deleted a moment ago (its veth peer goes asynchronously),
    # another node's veth already gone while its namespace stays
    assert _ip("netns", "delete", f"{p}-node2").returncode == 0
    assert _ip("link", "delete", f"{p}v4").returncode == 0
    # and `down` with fewer nodes than `net-up` made still finds all of them
    _down_ok(net, nodes=2)
    assert daemon.wait(timeout=10) != 0 and orphan.wait(timeout=10) != 0
    _down_ok(net)


@pytest.mark.slow  # down looks again for 5 s before it calls the bridge a leftover
def test_down_exits_1_and_names_what_truly_remains(net, tmp_path):
    _up(net, 2)
    p = net.prefix
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ip").write_text(
        "#!/bin/bash\n"
        f'if [ "$1 $2 $3" = "link delete {p}br0" ]; then\n'
        '  echo "RTNETLINK answers: Operation not permitted" >&2; exit 2\n'
        "fi\n"
        f'exec {shutil.which("ip")} "$@"\n'
    )
    (shim / "ip").chmod(0o755)
    r = net.run("down", 2, path=str(shim))
    assert r.returncode == 1
    assert f"devcluster: error: down left: bridge {p}br0 (run down again;" in r.stderr
    assert net.left() == [f"{p}br0"]  # everything else went
    _down_ok(net)


@pytest.mark.parametrize("prefix", ["hp", "hpct", "sl", "Bad", "toolongname"])
def test_a_prefix_that_names_the_real_cluster_or_is_malformed_is_refused(prefix):
    env = dict(os.environ, DEVCLUSTER_PREFIX=prefix)
    r = subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "DEVCLUSTER_PREFIX" in r.stderr


def test_up_and_status_refuse_a_prefix():
    env = dict(os.environ, DEVCLUSTER_PREFIX="htx")
    for cmd in ("up", "status"):
        r = subprocess.run([str(SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "unset DEVCLUSTER_PREFIX" in r.stderr
