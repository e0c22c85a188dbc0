"""Network namespaces for chaos partitions: a split cuts only the paths
between the halves, an isolation cuts the node off everything, healing
restores both, and closing leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from chaos.network import Namespaces, probe, sweep

REASON = probe()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"network namespaces unavailable here: {REASON}"
)

LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 9000))
server.listen()
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9000), timeout=1).close()
    print("reached")
except OSError as exc:
    print("cut", type(exc).__name__)
"""


def reaches(net: Namespaces, source: str | None, host: str) -> bool:
    argv = [sys.executable, "-c", CONNECT, host]
    if source is not None:
        argv = net.wrap(source, argv)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return out.startswith("reached")


def own_namespaces(net: Namespaces) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(net.tag + "-")]


def test_split_isolate_heal_and_close() -> None:
    sweep()
    net = Namespaces()
    servers: list[subprocess.Popen[str]] = []
    try:
        hosts = {name: net.add(name) for name in ("a", "b", "c")}
        assert len(own_namespaces(net)) == 3
        for name in ("b", "c"):
            server = subprocess.Popen(
                net.wrap(name, [sys.executable, "-c", LISTEN]), stdout=subprocess.PIPE, text=True
            )
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline() == "listening\n"
        assert reaches(net, "a", hosts["b"]) and reaches(net, None, hosts["b"])

        net.split([{"a"}, {"b", "c"}])
        assert not reaches(net, "a", hosts["b"])
        assert reaches(net, "c", hosts["b"])  # same half
        assert reaches(net, None, hosts["b"])  # the servers' side reaches both halves

        net.heal()
        assert reaches(net, "a", hosts["b"])

        net.isolate("b")
        assert not reaches(net, None, hosts["b"]) and not reaches(net, "a", hosts["b"])
        assert reaches(net, "a", hosts["c"])
        net.heal()
        deadline = time.monotonic() + 10  # the link needs a moment to come up
        while not reaches(net, "a", hosts["b"]):
            assert time.monotonic() < deadline, "b unreachable after the link came back"
    finally:
        for server in servers:
            server.kill()
            server.wait()
        net.close()
    assert own_namespaces(net) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{net.tag}v" not in links and f"{net.tag}br" not in links
