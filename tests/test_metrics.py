"""The node's metrics (node/metrics.py): the HTTP targets' series, whose
host label a tenant chooses and so must stay bounded."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata

from node.metrics import HTTP_TARGET_RESULTS, HostLabels, NodeMetrics
from node.version import DISTRIBUTION
from tests.conftest import metric_samples


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
    try:
        installed = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        installed = "0+unknown"
    assert metric_samples(NodeMetrics(), "scheduler_build_info") == {(installed,): 1}
    assert b'scheduler_build_info{version="' + installed.encode() + b'"} 1.0' in (
        NodeMetrics().render()
    )
