"""``tests/cluster/devcluster link RATE[,DELAY]`` shapes the links between nodes, not loopback.

Like test_devcluster_teardown.py, every test builds its own namespaces, veths and bridge under a
random ``DEVCLUSTER_PREFIX`` (``devcluster net-up``: 10.78.0.x only inside its own namespaces), so the
shared dev cluster and the tests running on it are never shaped. Real traffic, no mocks: a small TCP
echo/sink server in node 2's namespace, a client in node 1's (or in node 1 over its loopback).
Needs root, ``ip netns`` and ``tc``; skips otherwise. The delay test also needs the kernel's netem
qdisc (sch_netem) and skips without it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "devcluster"
RATE_MBIT = 100
DELAY_MS = 2

PROBE = r"""
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(8); print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = c.recv(1)
        if kind == b"p":
            while (b := c.recv(1)):
                c.sendall(b)
        elif kind == b"t":
            n, got = int.from_bytes(c.recv(8), "big"), 0
            while got < n and (b := c.recv(1 << 20)):
                got += len(b)
            c.sendall(b"k")
        c.close()
c = socket.create_connection((host, port), timeout=30); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode == "rtt":
    c.sendall(b"p"); rtts = []
    for _ in range(50):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
    print(json.dumps({"rtt_ms": sorted(rtts)[len(rtts) // 2] * 1e3}))
else:
    n = int(sys.argv[4]); buf = b"\0" * (1 << 16)
    c.sendall(b"t" + n.to_bytes(8, "big")); t = time.perf_counter(); sent = 0
    while sent < n:
        sent += c.send(buf[: n - sent])
    c.recv(1); dt = time.perf_counter() - t
    print(json.dumps({"mbit_s": n * 8 / dt / 1e6}))
"""


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _reason() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    for tool in ("ip", "nsenter", "tc"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not found"
    probe = f"htprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()[:200]}"
    _ip("netns", "delete", probe)
    return ""


def _netem_ok() -> bool:
    probe = f"htprobe{secrets.token_hex(3)}"
    if _ip("netns", "add", probe).returncode != 0:
        return False
    try:
        r = subprocess.run(
            ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], capture_output=True
        )
        return r.returncode == 0
    finally:
        _ip("netns", "delete", probe)


class Net:
    """A private 2-node network (``net-up``), the probe server in node 2, and the script's commands."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = "hl" + secrets.token_hex(3)
        self.env = dict(
            os.environ, DEVCLUSTER_PREFIX=self.prefix, DEVCLUSTER_DIR=str(tmp_path / "dc"), DEVCLUSTER_NODES="2"
        )
        self.probe = tmp_path / "probe.py"
        self.probe.write_text(PROBE)
        self.servers: tp.List[subprocess.Popen] = []

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=60)

    def ns(self, i: int) -> str:
        return f"{self.prefix}-node{i}"

    def serve(self, node: int, host: str, port: int) -> None:
        p = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns(node)}", sys.executable, str(self.probe), "serve", host, str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.servers.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    def measure(self, node: int, mode: str, host: str, port: int, *extra: str) -> float:
        cmd = [
            "nsenter",
            f"--net=/run/netns/{self.ns(node)}",
            sys.executable,
            str(self.probe),
            mode,
            host,
            str(port),
            *extra,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        return next(iter(json.loads(out).values()))

    def rtt_ms(self) -> float:  # node 1 -> node 2 over the veths and bridge
        return self.measure(1, "rtt", "10.78.0.12", 5001)

    def mbit_s(self, nbytes: int) -> float:
        return self.measure(1, "tput", "10.78.0.12", 5001, str(nbytes))

    def qdiscs(self) -> str:
        host = subprocess.run(["tc", "qdisc", "show", "dev", f"{self.prefix}v1"], capture_output=True, text=True).stdout
        node = subprocess.run(
            ["tc", "-n", self.ns(1), "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
        ).stdout
        return host + node

    def cleanup(self) -> None:
        for p in self.servers:
            p.kill()
            p.wait(timeout=10)
        self.run("down")
        for i in (1, 2):
            _ip("netns", "delete", self.ns(i))
        for name in (f"{self.prefix}v1", f"{self.prefix}v2", f"{self.prefix}br0"):
            _ip("link", "delete", name)


@pytest.fixture
def net(tmp_path: Path) -> tp.Iterator[Net]:
    reason = _reason()
    if reason:
        pytest.skip(reason)
    n = Net(tmp_path)
    try:
        r = n.run("net-up")
        assert r.returncode == 0, r.stderr
        n.serve(2, "10.78.0.12", 5001)
        n.serve(1, "127.0.0.1", 5002)  # node 1's own loopback
        yield n
    finally:
        n.cleanup()


def test_rate_shapes_node_to_node_but_not_loopback_and_off_restores(net: Net) -> None:
    base = net.mbit_s(20_000_000)
    assert base > 3 * RATE_MBIT, f"unshaped veth only {base:.0f} Mbit/s: too slow to see the shaping"
    r = net.run("link", f"{RATE_MBIT}mbit")
    assert r.returncode == 0, r.stderr
    assert "htb 1:" in net.qdiscs() and net.qdiscs().count("htb 1:") == 2
    assert net.run("link").stdout.startswith(f"link: {RATE_MBIT}mbit ")
    shaped = net.mbit_s(4_000_000)
    assert 0.75 * RATE_MBIT <= shaped <= 1.25 * RATE_MBIT, f"{shaped:.1f} Mbit/s under a {RATE_MBIT}mbit link"
    loop = net.measure(1, "tput", "127.0.0.1", 5002, "20000000")
    assert loop > 5 * RATE_MBIT, f"loopback inside node 1 ran at {loop:.0f} Mbit/s"
    r = net.run("link", "off")
    assert r.returncode == 0, r.stderr
    assert "htb" not in net.qdiscs() and net.run("link").stdout.strip() == "link: unshaped"
    after = net.mbit_s(20_000_000)
    assert after > 3 * RATE_MBIT, f"after link off still only {after:.0f} Mbit/s"
    print(
        f"unshaped {base:.0f} Mbit/s, {RATE_MBIT}mbit: {shaped:.1f} Mbit/s,",
        f"loopback {loop:.0f} Mbit/s, off {after:.0f} Mbit/s",
    )


def test_delay_adds_two_delays_to_the_round_trip(net: Net) -> None:
    if not _netem_ok():
        r = net.run("link", f"{RATE_MBIT}mbit,{DELAY_MS}ms")
        assert r.returncode == 1 and "no netem qdisc" in r.stderr and "nothing changed" in r.stderr, r.stderr
        assert "htb" not in net.qdiscs() and net.run("link").stdout.strip() == "link: unshaped"
        pytest.skip(f"kernel {os.uname().release} has no netem qdisc (sch_netem): no delay to measure")
    base = net.rtt_ms()
    r = net.run("link", f"{RATE_MBIT}mbit,{DELAY_MS}ms")
    assert r.returncode == 0, r.stderr
    assert "netem" in net.qdiscs()
    shaped = net.rtt_ms()
    loop = net.measure(1, "rtt", "127.0.0.1", 5002)
    assert 0.8 * 2 * DELAY_MS <= shaped - base <= 1.5 * 2 * DELAY_MS, f"rtt {base:.3f} -> {shaped:.3f} ms"
    assert loop < DELAY_MS / 2, f"loopback rtt {loop:.3f} ms under a {DELAY_MS}ms link"
    assert net.run("link", "off").returncode == 0
    assert net.rtt_ms() < base + DELAY_MS / 2
    print(f"rtt unshaped {base:.3f} ms, {RATE_MBIT}mbit,{DELAY_MS}ms: {shaped:.3f} ms, loopback {loop:.3f} ms")


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("100furlongs", "unknown unit"),
        ("-5mbit", "negative"),
        ("100mbit,-2ms", "negative"),
        ("garbage", "not a number"),
        ("0mbit", "above 0"),
        ("100mbit,2", "unknown unit"),
        ("100mbit,2ms,3", "more than one comma"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_changes_nothing(net: Net, spec: str, names: str) -> None:
    assert net.run("link", "200mbit").returncode == 0
    before = net.qdiscs()
    r = net.run("link", spec)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "e.g. 'link 200mbit,1ms'" in lines[0], r.stderr
    assert net.qdiscs() == before and net.run("link").stdout.startswith("link: 200mbit ")
