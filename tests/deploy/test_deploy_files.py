"""The deployment files, checked offline (no Docker engine, no cluster here):
the compose file against the compose-spec schema, the Kubernetes manifests
against the bundled Kubernetes schemas (strict: no unknown field; the
PrometheusRule, a custom resource, against the operator's schema as
strictly), and both against the node itself: every setting they pass
exists, the probes hit real routes, the ports are the ones the node binds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from node import config as node_config
from node.api.app import build_app
from node.process import Node
from tests.conftest import (
    NodeFactory,
    metrics_read,
    recordings_read,
    undeclared,
)
from tests.helpers import ROOT

DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
KUBERNETES = "1.37.0"
SETTINGS = {s.env for s in node_config.SETTINGS}
# Custom resources: their CRDs are not among the Kubernetes schemas, so each
# kind is checked against a schema of its own here instead.
PROMETHEUS_RULE = ("monitoring.coreos.com/v1", "PrometheusRule")
CUSTOM_KINDS = {PROMETHEUS_RULE}
# Not applied by the kustomization, and why.
APPLIED_APART = {
    "secret.example.yaml": "an example: the real secret is made by hand",
    "prometheusrule.yaml": "needs the Prometheus operator's CRD, which a cluster may not have",
}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def by_kind(kind: str) -> dict[str, Any]:
    [doc] = [doc for _, doc in manifests() if doc["kind"] == kind]
    return doc


def compose_valid(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", path],
        capture_output=True,
        text=True,
        check=False,
    )


# -- compose ----------------------------------------------------------------------


def test_the_compose_file_follows_the_compose_spec_and_a_typo_would_not(tmp_path: Path) -> None:
    assert compose_valid(DOCKER / "compose.yaml").returncode == 0
    broken = tmp_path / "compose.yaml"
    broken.write_text((DOCKER / "compose.yaml").read_text().replace("healthcheck:", "helthcheck:"))
    result = compose_valid(broken)
    assert result.returncode != 0 and "helthcheck" in result.stdout


def test_compose_runs_three_nodes_that_find_each_other_by_one_name() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    nodes = {name: s for name, s in services.items() if name.startswith("scheduler-")}
    assert len(nodes) == 3
    assert len({s["environment"]["NODE_ID"] for s in nodes.values()}) == 3
    seed_host = nodes["scheduler-1"]["environment"]["SEEDS"].split(":")[0]
    for service in nodes.values():
        assert seed_host in service["networks"]["default"]["aliases"]
        assert set(service["environment"]) <= SETTINGS
        assert service["depends_on"]["mongo"]["condition"] == "service_healthy"
    # Majority writes and transactions need a replica set; Kafka without ZooKeeper.
    assert "--replSet" in services["mongo"]["command"]
    assert "replicaSet=rs0" in nodes["scheduler-1"]["environment"]["MONGO_URI"]
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["dns_sd_configs"][0]["names"] == [seed_host]


# -- the image ----------------------------------------------------------------------


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", "--no-color", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- Kubernetes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "doc"),
    # A custom resource (the PrometheusRule) is no kind the Kubernetes
    # schemas know: it is checked against its own schema below.
    [(n, d) for n, d in manifests() if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_built_in_manifest_is_valid_kubernetes(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_strict_validation_catches_a_misplaced_field() -> None:
    statefulset = by_kind("StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES, strict=True)


def test_kustomization_applies_everything_but_what_is_applied_apart() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    names = {name for name, _ in manifests()}
    assert set(APPLIED_APART) <= names
    assert set(kustomization["resources"]) == names - set(APPLIED_APART)


# The operator's PrometheusRule (prometheusrules.monitoring.coreos.com, its
# openAPIV3Schema), stricter in one way: an unknown field is an error here,
# where the API server would prune it silently (a misspelt "annotations"
# would vanish, runbook and all).
DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": PROMETHEUS_RULE[0]},
        "kind": {"const": PROMETHEUS_RULE[1]},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string", "minLength": 1}, "labels": STRINGS},
        },
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "limit": {"type": "integer"},
                            "labels": STRINGS,
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "record": {"type": "string", "minLength": 1},
                                        "alert": {"type": "string", "minLength": 1},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": DURATION},
                                        "keep_firing_for": {"type": "string", "pattern": DURATION},
                                        "labels": STRINGS,
                                        "annotations": STRINGS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def test_the_prometheus_rule_has_the_operators_shape() -> None:
    rule = by_kind(PROMETHEUS_RULE[1])
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    names = [group["name"] for group in rule["spec"]["groups"]]
    assert len(names) == len(set(names))
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "bucket-scheduler"


def test_the_prometheus_rule_schema_catches_a_misplaced_field() -> None:
    rule = by_kind(PROMETHEUS_RULE[1])
    alert = next(r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r)
    alert["anotations"] = alert.pop("annotations")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    alert["annotations"] = alert.pop("anotations")
    alert["record"] = "both:alert_and_record"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)


def test_the_pods_get_only_settings_the_node_knows() -> None:
    container = by_kind("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    given = {e["name"] for e in container["env"]}
    given |= set(by_kind("ConfigMap")["data"]) | set(by_kind("Secret")["stringData"])
    # Not node settings but read by the preStop hook, which must use them.
    hook_only = {"ADMIN_API_KEY"}
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert all(f'"{name}"' in pre_stop for name in hook_only)
    assert given <= SETTINGS | hook_only, given - SETTINGS - hook_only
    assert {"NODE_ID", "ADVERTISE_HOST", "SEEDS", "MONGO_URI", "KAFKA_BOOTSTRAP"} <= given
    # The seed is the headless Service, which must list pods before they are ready.
    gossip = by_kind("ConfigMap")["data"]["SEEDS"].split(":")[0]
    services = {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == "Service"}
    assert services[gossip]["spec"]["clusterIP"] == "None"
    assert services[gossip]["spec"]["publishNotReadyAddresses"] is True
    assert by_kind("StatefulSet")["spec"]["serviceName"] == gossip


def test_probes_ports_and_image_match_the_node() -> None:
    defaults = {s.env: s.default for s in node_config.SETTINGS}
    http_port = int(defaults["HTTP_BIND"].rsplit(":", 1)[1])
    gossip_port = int(defaults["GOSSIP_BIND"].rsplit(":", 1)[1])
    pod = by_kind("StatefulSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ports = {(p["containerPort"], p["protocol"]) for p in container["ports"]}
    assert ports == {(http_port, "TCP"), (gossip_port, "UDP"), (gossip_port, "TCP")}

    config = node_config.load(
        {"node_id": "probe", "mongo_uri": "mongodb://127.0.0.1:1/", "gossip_unsigned": "on"}, {}
    )
    routes = {r.resource.canonical for r in build_app(Node(config)).router.routes() if r.resource}
    probes = [container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe")]
    probes.append(container["readinessProbe"]["httpGet"]["path"])
    assert set(probes) <= routes and container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    # preStop drains the node through its own API before SIGTERM.
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    compile(command[2], "preStop", "exec")  # the image has Python and nothing else
    pre_stop = command[2]
    drain = re.search(r"http://127\.0\.0\.1:(\d+)(/v1/admin/drain)", pre_stop)
    assert drain and int(drain[1]) == http_port and drain[2] in routes

    dockerfile = (DOCKER / "Dockerfile").read_text()
    exposed = set(re.findall(r"(\d+)/(tcp|udp)", dockerfile.split("EXPOSE", 1)[1].splitlines()[0]))
    assert exposed == {
        (str(http_port), "tcp"),
        (str(gossip_port), "udp"),
        (str(gossip_port), "tcp"),
    }
    assert re.search(r"^USER (?!root|0\b)\S+", dockerfile, re.M)
    assert "/healthz" in dockerfile.split("HEALTHCHECK", 1)[1]


# -- Grafana ------------------------------------------------------------------------


def test_the_gossip_port_admits_only_the_schedulers_own_pods() -> None:
    """The NetworkPolicy selects the scheduler's pods and lets gossip (both
    protocols) in from those pods alone, and HTTP in from anywhere; nothing
    else reaches them. Its ports are the node's defaults."""
    defaults = {s.env: s.default for s in node_config.SETTINGS}
    http_port = int(defaults["HTTP_BIND"].rsplit(":", 1)[1])
    gossip_port = int(defaults["GOSSIP_BIND"].rsplit(":", 1)[1])
    policy = by_kind("NetworkPolicy")["spec"]
    pods = by_kind("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"].items() <= pods.items()
    by_ports = {
        frozenset((p["port"], p["protocol"]) for p in rule["ports"]): rule.get("from")
        for rule in policy["ingress"]
    }
    gossip = frozenset({(gossip_port, "UDP"), (gossip_port, "TCP")})
    assert set(by_ports) == {gossip, frozenset({(http_port, "TCP")})}
    [peers] = by_ports[gossip]
    assert peers["podSelector"]["matchLabels"].items() <= pods.items()
    assert by_ports[frozenset({(http_port, "TCP")})] is None  # HTTP: from anywhere


async def test_every_metric_the_dashboard_queries_is_one_a_node_exposes(
    start_node: NodeFactory,
) -> None:
    """Or a recording rule of docker/alerts.yml (the SLA, the lateness and
    the outcomes the alerts read too)."""
    import json

    dashboard = json.loads((DOCKER / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queried = set().union(*map(metrics_read, exprs))
    assert len(queried) >= 10
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    recorded = {
        rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule
    }
    assert set().union(*map(recordings_read, exprs)) <= recorded
    handle = await start_node()
    status, text = await handle.request("GET", "/metrics")
    assert status == 200
    missing = undeclared(queried, text)
    assert not missing, missing
