"""Network namespaces for chaos partitions: a split cuts only the paths
between the halves, an isolation cuts the node off everything, a cut from
the store (or the broker) only that server's address, healing restores
each, and closing leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from chaos.lab.network import Namespaces, probe, sweep

REASON = probe()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable here: {REASON}"),
    pytest.mark.servers,  # listeners in namespaces of their own
]

LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1] if len(sys.argv) > 1 else "0.0.0.0", 9000))
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


def listen(net: Namespaces, name: str | None, address: str = "0.0.0.0") -> subprocess.Popen[str]:
    """A TCP server on port 9000 in the node's namespace (None: the root one)."""
    argv = [sys.executable, "-c", LISTEN, address]
    server = subprocess.Popen(
        net.wrap(name, argv) if name else argv, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline() == "listening\n"
    return server


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
            servers.append(listen(net, name))
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


def test_a_joining_node_never_moves_the_bridge_s_mac() -> None:
    """Left to the kernel, the bridge takes the lowest MAC of its ports: a
    node joining with a lower one moved it, and the others' cached ARP
    entries for the servers' addresses went stale for seconds."""
    sweep()
    net = Namespaces()
    try:
        for name in ("a", "b", "c", "d", "e", "f"):
            net.add(name)
            sysfs = f"/sys/class/net/{net.bridge}/"
            with open(sysfs + "address") as address, open(sysfs + "addr_assign_type") as kind:
                assert (address.read().strip(), kind.read().strip()) == (net.bridge_mac, "3")
    finally:
        net.close()


def test_a_cut_from_the_store_or_the_broker_takes_that_server_only() -> None:
    sweep()
    net = Namespaces()
    servers: list[subprocess.Popen[str]] = []
    try:
        hosts = {name: net.add(name) for name in ("a", "b")}
        assert len({net.server_host, net.store_host, net.broker_host, *hosts.values()}) == 5
        servers.append(listen(net, "b"))  # a peer
        # The database, the broker and the runner, each on its own address
        # of the bridge in the root namespace.
        for address in (net.store_host, net.broker_host, net.server_host):
            servers.append(listen(net, None, address))
        every = {"peer": hosts["b"], "store": net.store_host, "broker": net.broker_host,
                 "runner": net.server_host}  # fmt: skip

        def reached(source: str) -> set[str]:
            return {what for what, host in every.items() if reaches(net, source, host)}

        assert reached("a") == set(every)

        store = net.cut_server("a", "store")
        assert reached("a") == {"peer", "broker", "runner"}
        assert reached("b") == set(every)  # only a was cut
        broker = net.cut_server("a", "broker")
        assert reached("a") == {"peer", "runner"}
        net.uncut(store)  # each cut heals on its own
        assert reached("a") == {"peer", "store", "runner"}
        net.uncut(broker)
        assert reached("a") == set(every)

        # A split and a store cut at once: undoing the split leaves the cut.
        split = net.split([{"a"}, {"b"}])
        store = net.cut_server("a", "store")
        assert reached("a") == {"broker", "runner"}
        net.uncut(split)
        assert reached("a") == {"peer", "broker", "runner"}
        net.heal()  # everything
        assert reached("a") == set(every)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        net.close()
    assert own_namespaces(net) == []
