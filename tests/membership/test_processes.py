"""The gossip layer in real processes on loopback: crash, pause, starvation."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from bench.membership_bench import RealCluster
from node.ops import embedded

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def free_base(count: int) -> int:
    # Below the ephemeral range: the suite's store and broker clients take
    # ephemeral ports all the time, and one taken between the check and an
    # agent's bind left that agent dead on arrival.
    return embedded.consecutive_free_ports(count, (socket.SOCK_STREAM, socket.SOCK_DGRAM))


@pytest.fixture
def cluster_factory():  # type: ignore[no-untyped-def]
    clusters: list[RealCluster] = []

    def make(size: int, preset: str) -> RealCluster:
        cluster = RealCluster(size, preset, free_base(size))
        clusters.append(cluster)
        assert cluster.wait(cluster.all_alive, 60), "agents did not form one cluster"
        # all_alive judges the running agents only: one that could not bind
        # its port would make a later wait on its view fail for nothing.
        exited = {m: a.process.poll() for m, a in cluster.agents.items()}
        assert all(code is None for code in exited.values()), f"agents exited: {exited}"
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def deaths(cluster: RealCluster) -> list[tuple[str, str]]:
    return [
        (observer, line["member"]) for observer, line in cluster.pump() if line["kind"] == "dead"
    ]


def test_killed_member_is_declared_dead_by_all_and_nobody_else(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(5, "fast")
    cluster.agents["a3"].kill()
    others = ["a0", "a1", "a2", "a4"]
    assert cluster.wait(lambda: all(cluster.views[o].get("a3") == "dead" for o in others), 60), {
        o: (cluster.views[o].get("a3"), cluster.agents[o].process.poll()) for o in others
    }
    dead = {member for _observer, member in deaths(cluster)}
    assert dead <= {"a3"}
    assert all(
        cluster.views[o].get(m) in ("joined", "alive") for o in others for m in others if o != m
    )


def test_member_paused_shorter_than_the_suspicion_timeout_is_not_declared_dead(
    cluster_factory,  # type: ignore[no-untyped-def]
) -> None:
    # lan: the suspicion timeout here is at least 4 s; the pause is 1 s.
    cluster = cluster_factory(5, "lan")
    paused = cluster.agents["a2"].process.pid
    os.kill(paused, signal.SIGSTOP)
    time.sleep(1.0)
    os.kill(paused, signal.SIGCONT)
    # Past the minimum suspicion timeout: a suspicion from the pause either
    # was refuted (views show it alive again) or would have fired by now.
    deadline = time.monotonic() + 10
    seen: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        seen.extend(deaths(cluster))
        time.sleep(0.05)
    assert seen == []
    assert cluster.all_alive()


def test_cpu_starved_member_gets_no_healthy_peer_declared_dead(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """Lifeguard: a member that runs 100 ms of every 400 ms misses acks, but
    its stretched timeouts and unconfirmed suspicions kill nobody."""
    cluster = cluster_factory(5, "lan")
    starved = cluster.agents["a1"].process.pid
    seen: list[tuple[str, str]] = []
    for _ in range(40):
        os.kill(starved, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(starved, signal.SIGCONT)
        time.sleep(0.1)
        seen.extend(deaths(cluster))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen.extend(deaths(cluster))
        time.sleep(0.05)
    assert [(o, m) for o, m in seen if m != "a1"] == []
    assert cluster.wait(cluster.all_alive, 30)
