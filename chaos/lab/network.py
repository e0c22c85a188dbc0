"""Real network partitions for chaos runs: every node process in its own
network namespace, linked to a bridge by a veth pair, as pods are.

* The database, the broker, the webhook receiver and the chaos runner stay
  in the root namespace and reach the nodes over the bridge, which holds
  four addresses: the runner's (the bridge's own, ``.1``, which the root
  namespace's packets to the nodes come from), the database's (``.2``),
  the broker's (``.3``) and the receiver's (``.4``). Each server listening
  on an address of its own lets a node lose one of them and nothing else.
* Isolating a node takes its link down: a cut cable. The node loses its
  peers, the database and the broker at once, and so does anyone calling it.
* Splitting the cluster routes each half's packets for the other half to an
  address no one answers, so they vanish silently, as across a broken
  switch; both halves still reach the database and the broker. (This
  kernel has no tc actions and no netfilter tools, so a route is the cut.)
* Cutting a node from the database (or the broker) routes its packets for
  that server's address the same way: it keeps its peers, the runner and
  the other server.

Every cut is undone on its own (``uncut``, ``reconnect``), so faults that
overlap in time heal independently; ``heal`` undoes them all.

Needs root and iproute2. ``probe()`` says why namespaces cannot be used, and
the runner then falls back to the nodes' in-process gossip filter.

Everything this module creates carries the creating process id in its name,
so ``sweep()`` can remove what a killed run left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from node.ops.embedded import pid_alive

PREFIX = "chaos"
NODE_HTTP_PORT = 8080  # each node has its own namespace, so all use the same ports
NODE_GOSSIP_PORT = 7946
_OWNED = re.compile(rf"^{PREFIX}(\d+)")


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message has its output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def probe() -> str | None:
    """None when namespaces work here, else the reason they do not."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "not root: creating network namespaces needs CAP_SYS_ADMIN"
    name = f"{PREFIX}{os.getpid()}probe"
    added = _ip("netns", "add", name, check=False)
    if added.returncode != 0:
        return f"`ip netns add` failed: {added.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def sweep() -> list[str]:
    """Delete namespaces and bridges left by chaos runs whose process is gone."""
    removed = []
    namespaces = _ip("netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
    for kind, names in (("netns", namespaces), ("link", links)):
        for name in names:
            owner = _OWNED.match(name)
            if owner and not pid_alive(int(owner.group(1))):
                _ip(kind, "del", name, check=False)
                removed.append(name)
    return removed


class Namespaces:
    """One bridge, and a namespace per node attached to it."""

    kind = "network namespaces"

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = self.tag + "br"
        pid = os.getpid()
        # Locally administered (02:), unique to this run's process.
        self.bridge_mac = "02:5c:" + ":".join(
            f"{pid >> shift & 0xFF:02x}" for shift in (24, 16, 8, 0)
        )
        self.subnet = _free_subnet()
        # The bridge's own (first, primary) address: what the root
        # namespace's packets to the nodes come from (the runner's calls).
        self.server_host = f"{self.subnet}.1"
        self.store_host = f"{self.subnet}.2"  # the database listens here
        self.broker_host = f"{self.subnet}.3"  # the broker listens here
        self.receiver_host = f"{self.subnet}.4"  # the webhook receiver listens here
        self.hosts: dict[str, str] = {}  # node name -> address
        self._index: dict[str, int] = {}
        self._cut_routes: set[tuple[str, str]] = set()  # (node, address cut off)
        _ip("link", "add", self.bridge, "type", "bridge")
        # Its MAC set once, never the kernel's choice: a bridge left to it
        # takes the lowest MAC of its ports, so a node joining with a lower
        # one changed it, and the other nodes' cached ARP entries for the
        # servers' addresses pointed at a port until probed again: the store
        # "timed out" for 5 s on three nodes of four at the join of
        # `everything` (half the runs, by the new port's random MAC).
        _ip("link", "set", self.bridge, "address", self.bridge_mac)
        for host in (self.server_host, self.store_host, self.broker_host, self.receiver_host):
            _ip("addr", "add", f"{host}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _netns(self, name: str) -> str:
        return f"{self.tag}-{self._index[name]}"

    def _veth(self, name: str) -> str:
        return f"{self.tag}v{self._index[name]}"  # at most 15 characters for pids < 2**22

    def add(self, name: str) -> str:
        """The node's namespace and link (kept across restarts); its address."""
        if name in self.hosts:
            return self.hosts[name]
        index = len(self._index) + 10
        self._index[name] = index
        netns, veth, host = self._netns(name), self._veth(name), f"{self.subnet}.{index}"
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{host}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def wrap(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's namespace (``ip netns exec`` execs
        it in place, so the pid and its signals are the node's own)."""
        return ["ip", "netns", "exec", self._netns(name), *argv]

    def isolate(self, name: str) -> None:
        _ip("link", "set", self._veth(name), "down")

    def reconnect(self, name: str) -> None:
        _ip("link", "set", self._veth(name), "up")

    def split(self, groups: Iterable[Iterable[str]]) -> list[tuple[str, str]]:
        """No packet between members of different groups, either way.
        Returns the routes cut, for ``uncut``."""
        sides = [sorted(g) for g in groups]
        cut = []
        for i, side in enumerate(sides):
            for other in sides[i + 1 :]:
                for a in side:
                    for b in other:
                        cut.append(self._cut(a, self.hosts[b]))
                        cut.append(self._cut(b, self.hosts[a]))
        return cut

    def cut_server(self, name: str, server: str) -> list[tuple[str, str]]:
        """The node loses the database (``server`` "store") or the broker
        ("broker") only. Returns the route cut, for ``uncut``."""
        hosts = {"store": self.store_host, "broker": self.broker_host}
        return [self._cut(name, hosts[server])]

    def _cut(self, source: str, address: str) -> tuple[str, str]:
        # Via an address on the bridge that no one holds: ARP goes
        # unanswered and the packets are dropped without an error.
        _ip(
            "-n", self._netns(source), "route", "replace",
            f"{address}/32", "via", f"{self.subnet}.254",
        )  # fmt: skip
        self._cut_routes.add((source, address))
        return source, address

    def uncut(self, routes: Iterable[tuple[str, str]]) -> None:
        """Undo the cuts ``split`` or ``cut_server`` made, and only those."""
        for source, address in routes:
            if (source, address) in self._cut_routes:
                _ip("-n", self._netns(source), "route", "del", f"{address}/32", check=False)
                self._cut_routes.discard((source, address))

    def heal(self) -> None:
        self.uncut(sorted(self._cut_routes))
        for name in self.hosts:
            self.reconnect(name)

    def close(self) -> None:
        for name in self.hosts:
            # Deleting one end of a veth pair deletes both, at once; a
            # namespace's own links go only when the kernel gets to it.
            _ip("link", "del", self._veth(name), check=False)
            _ip("netns", "del", self._netns(name), check=False)
        _ip("link", "del", self.bridge, check=False)


def _free_subnet() -> str:
    """A /24 in 10.213.0.0/16 no interface here uses yet."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout
    for third in [os.getpid() % 250 + 1, *range(1, 251)]:
        subnet = f"10.213.{third}"
        if f" {subnet}." not in used:
            return subnet
    raise NetworkError("no free /24 left in 10.213.0.0/16")
