"""CHAOS_MODE=on: the in-process gossip filter that stands in for a network
partition where network namespaces are unavailable. Off, it does not exist."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from membership.messages import State
from tests.conftest import NodeFactory, NodeHandle, wait_until


def both_see(a: NodeHandle, b: NodeHandle, state: State) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        return sees(a, b) == sees(b, a) == state

    return condition


def sees(handle: NodeHandle, other: NodeHandle) -> State | None:
    assert handle.node.membership is not None
    for member in handle.node.membership.members():
        if member.id == other.node.config.node_id:
            return member.state
    return None


async def test_the_filter_endpoint_exists_only_in_chaos_mode(start_node: NodeFactory) -> None:
    plain = await start_node()
    status, body = await plain.request("PUT", "/v1/chaos/partition", json={"blocked": []})
    assert status == 404 and body["error"]["code"] == "not_found"


async def test_blocked_gossip_partitions_two_nodes_and_unblocking_heals(
    start_node: NodeFactory,
) -> None:
    a = await start_node(node_id="node-a", chaos_mode="on", membership_preset="fast")
    assert a.node.membership is not None
    b = await start_node(
        node_id="node-b",
        chaos_mode="on",
        membership_preset="fast",
        seeds=a.node.membership.address,
    )
    assert b.node.membership is not None
    await wait_until(both_see(a, b, State.ALIVE), 30, "the two to join")

    status, body = await a.request("PUT", "/v1/chaos/partition", json={"blocked": "x"})
    assert status == 400 and body["error"]["field"] == "blocked"
    for one, other in ((a, b), (b, a)):
        assert other.node.membership is not None
        address = other.node.membership.address
        status, body = await one.request("PUT", "/v1/chaos/partition", json={"blocked": [address]})
        assert (status, body) == (200, {"blocked": [address]})
    await wait_until(both_see(a, b, State.DEAD), 60, "each to declare the other dead")
    assert a.node.membership.transport.dropped["partitioned"] > 0

    for handle in (a, b):
        assert (await handle.request("PUT", "/v1/chaos/partition", json={"blocked": []}))[0] == 200
    await wait_until(both_see(a, b, State.ALIVE), 60, "the two to rejoin")
