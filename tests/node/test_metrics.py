"""The node's metrics (node/metrics.py): the HTTP targets' series, whose
host label a tenant chooses, and the series by tenant, whose label a caller
chooses with AUTH off: both must stay bounded. The build's version."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from node.metrics import HTTP_TARGET_RESULTS, HostLabels, NodeMetrics
from node.store.tenants import TenantStore
from node.tenants.model import Tenant
from node.version import DISTRIBUTION
from tests.conftest import NodeFactory, NodeHandle, metric_samples, unique, wait_until


class OpenCircuits:
    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts

    def open_hosts(self) -> Iterable[str]:
        return list(self.hosts)


def test_the_first_hosts_are_named_and_the_rest_are_other() -> None:
    labels = HostLabels(2)
    assert [labels(h) for h in ("a:80", "b:80", "c:80", "a:80", "d:80")] == [
        "a:80",
        "b:80",
        "other",
        "a:80",
        "other",
    ]


def test_http_target_requests_are_bounded_by_host() -> None:
    metrics = NodeMetrics()
    metrics.http_hosts = HostLabels(2)
    for index in range(5):
        metrics.http_target(f"h{index}:443", "delivered")
    metrics.http_target("h0:443", "circuit_open")
    counts = metric_samples(metrics, "scheduler_http_target_requests_total")
    assert counts == {
        ("h0:443", "delivered"): 1,
        ("h1:443", "delivered"): 1,
        ("other", "delivered"): 3,
        ("h0:443", "circuit_open"): 1,
    }
    assert "circuit_open" in HTTP_TARGET_RESULTS


def test_open_circuits_by_host() -> None:
    metrics = NodeMetrics()
    metrics.http_hosts = HostLabels(2)
    circuits = OpenCircuits([])
    metrics.watch_circuits(circuits)
    metrics.http_target("up:443", "delivered")
    circuits.hosts = ["down:443", "x:443", "y:443"]
    # Named hosts: 1 open, 0 closed; the hosts past the limit counted as other.
    assert metric_samples(metrics, "scheduler_http_target_circuit_open") == {
        ("up:443",): 0,
        ("down:443",): 1,
        ("other",): 2,
    }
    assert b"scheduler_http_target_circuit_open" in metrics.render()


def test_build_info_names_the_installed_version() -> None:
    installed = metadata_version()
    assert metric_samples(NodeMetrics(), "scheduler_build_info") == {(installed,): 1}
    assert b'scheduler_build_info{version="' + installed.encode() + b'"} 1.0' in (
        NodeMetrics().render()
    )


def test_series_by_tenant_name_registered_tenants_and_default_and_the_rest_other() -> None:
    metrics = NodeMetrics()
    metrics.delivery_outcome("delivered", ["acme", "default", "stranger"])
    metrics.held_back("acme", 2)
    metrics.tenant_labels.known(["acme"])
    metrics.delivery_outcome("delivered", ["acme", "default", "stranger", "other-stranger"])
    metrics.delivery_outcome("retried", [])
    metrics.held_back("acme", 3)
    metrics.held_back("stranger", 4)
    assert metric_samples(metrics, "scheduler_tenant_deliveries_total") == {
        # acme and stranger before acme was known to be registered, then two strangers
        ("other", "delivered"): 4,
        ("default", "delivered"): 2,
        ("acme", "delivered"): 1,
    }
    # The outcome's total is the same, and exists at 0.
    assert metric_samples(metrics, "scheduler_deliveries_total") == {
        ("delivered",): 7,
        ("retried",): 0,
    }
    # Flow control's series by tenant keeps to the same rule.
    assert metric_samples(metrics, "scheduler_flow_held_back_total") == {
        ("other",): 6,
        ("acme",): 3,
    }


async def scrape(node: NodeHandle) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> labels -> value, as the node's /metrics says."""
    status, text = await node.request("GET", "/metrics")
    assert status == 200
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = sample.value
    return found


async def test_a_node_counts_deliveries_by_registered_tenant_and_the_rest_as_other(
    start_node: NodeFactory, mongo: Any
) -> None:
    tenants = TenantStore(mongo)
    await tenants.prepare()
    await tenants.add(Tenant(name="acme"), datetime.now(UTC))
    node = await start_node()
    topic = unique("by-tenant")
    now = datetime.now(UTC).isoformat()
    for index, tenant in enumerate(["acme", "acme", "stranger", "default"]):
        body = {"id": f"t{index}", "tenant": tenant, "topic": topic, "executeAt": now, "payload": 1}
        status, _ = await node.request("POST", "/v1/schedules", json=body)
        assert status == 201

    async def delivered() -> bool:
        total = (await scrape(node)).get("scheduler_deliveries_total", {})
        return total.get((("outcome", "delivered"),), 0) == 4

    await wait_until(delivered, within=60, what="the four deliveries")
    by_tenant = (await scrape(node))["scheduler_tenant_deliveries_total"]
    assert {
        dict(labels)["tenant"]: value
        for labels, value in by_tenant.items()
        if dict(labels)["outcome"] == "delivered"
    } == {"acme": 2, "other": 1, "default": 1}
    assert (await scrape(node))["scheduler_build_info"] == {(("version", metadata_version()),): 1}


async def test_a_node_forecasts_what_its_views_hold_due_soon(start_node: NodeFactory) -> None:
    node = await start_node()
    windows = {(("window", w),) for w in ("60s", "300s", "3600s")}
    assert (await scrape(node))["scheduler_due_within"] == dict.fromkeys(windows, 0)
    soon = (datetime.now(UTC) + timedelta(seconds=45)).isoformat()
    body = {"id": "soon", "topic": unique("soon"), "executeAt": soon, "payload": 1}
    assert (await node.request("POST", "/v1/schedules", json=body))[0] == 201

    async def forecast() -> bool:
        return (await scrape(node))["scheduler_due_within"] == dict.fromkeys(windows, 1)

    await wait_until(forecast, within=40, what="the schedule in the forecast")
    assert (await scrape(node))["scheduler_due_backlog"] == {(): 0}


def metadata_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
