"""The alert and recording rules (docker/alerts.yml): valid and passing their
own unit tests under promtool (docker/alerts.test.yml), loaded by the
compose Prometheus, each alert with a runbook section (docs/runbooks.md) and
a case where it fires and one where it must not, the operator's manifest
made from them, and every metric they read one a node exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from node.metrics import LATENESS_BUCKETS
from tests.conftest import (
    NodeFactory,
    metrics_read,
    recordings_read,
    undeclared,
)
from tests.helpers import ROOT

DOCKER = ROOT / "docker"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="no promtool on this machine: `make test` installs the distribution's "
    "prometheus package, which ships it (apt-get install prometheus), where it runs "
    "as root with apt",
)


def promtool(*args: str, cwd: Path = DOCKER) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in load(DOCKER / "alerts.yml")["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


# -- promtool -----------------------------------------------------------------------


@needs_promtool
def test_the_rules_are_valid() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The fast burn at 100 times the budget instead of 14.4: its firing case fails."""
    text = (DOCKER / "alerts.yml").read_text()
    assert text.count("14.4 * (1 - ") == 2
    (tmp_path / "alerts.yml").write_text(text.replace("14.4 * (1 - ", "100 * (1 - "))
    shutil.copy(DOCKER / "alerts.test.yml", tmp_path)
    result = promtool("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "SchedulerLatenessBudgetBurnFast" in result.stdout + result.stderr


@needs_promtool
def test_the_compose_prometheus_loads_the_rules() -> None:
    """promtool checks the configuration offline, the rule files it names
    included (found beside it, as in the container's /etc/prometheus)."""
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout
    assert load(DOCKER / "prometheus.yml")["rule_files"] == ["alerts.yml"]
    [job] = load(DOCKER / "prometheus.yml")["scrape_configs"]
    assert job["job_name"] == "scheduler"  # what the scrape-target alerts select
    volumes = load(DOCKER / "compose.yaml")["services"]["prometheus"]["volumes"]
    assert "./alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes


# -- every alert: labelled, documented, tested --------------------------------------


def runbook_anchors() -> dict[str, str]:
    """Section anchor -> heading, as GitHub and mkdocs make them."""
    headings = re.findall(r"^#{2,3} (.+)$", RUNBOOKS.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"): h for h in headings}


def test_every_alert_has_a_severity_a_summary_a_description_and_its_runbook() -> None:
    assert len({a["alert"] for a in alerts()}) >= 20
    for alert in alerts():
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        assert annotations["runbook_url"] == f"docs/runbooks.md#{alert['alert'].lower()}"


def test_every_alert_has_a_runbook_section_and_every_section_an_alert() -> None:
    anchors = runbook_anchors()
    for alert in alerts():
        anchor = alert["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"{alert['alert']}: no section #{anchor} in {RUNBOOKS}"
    sections = {h for h in anchors.values() if h.startswith("Scheduler")}
    assert sections == {a["alert"] for a in alerts()}


def test_every_alert_fires_in_a_case_and_stays_quiet_in_another() -> None:
    """At each severity it has, for the firing cases."""
    fired: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for case in load(DOCKER / "alerts.test.yml")["tests"]:
        for check in case.get("alert_rule_test", []):
            expected = check.get("exp_alerts") or []
            if not expected:
                quiet.add(check["alertname"])
            for alert in expected:
                assert alert["exp_annotations"], check["alertname"]
                fired.add((check["alertname"], alert["exp_labels"]["severity"]))
    wanted = {(a["alert"], a["labels"]["severity"]) for a in alerts()}
    assert wanted - fired == set(), "no case where these fire"
    assert {a["alert"] for a in alerts()} - quiet == set(), "no case where these stay quiet"


def test_the_lateness_sla_is_one_of_the_histograms_bounds() -> None:
    """Its value and its bound label agree, and name a bucket of
    scheduler_delivery_lateness_seconds as the rules find it (no ".0")."""
    [sla] = [r for r in rules() if r.get("record") == "scheduler:lateness_sla_seconds"]
    found = re.fullmatch(
        r'label_replace\(vector\(([\d.]+)\), "bound", "([\d.]+)", "", ""\)', sla["expr"]
    )
    assert found, sla["expr"]
    value, bound = found.groups()
    assert float(value) in LATENESS_BUCKETS
    assert bound == f"{float(value):g}"


def test_every_recording_rule_follows_level_metric_operations() -> None:
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z]+:[a-z_]+:[a-z0-9_]+|scheduler:[a-z_]+", rule["record"])


# -- the operator's manifest --------------------------------------------------------


def test_the_runbooks_table_lists_every_alert_as_the_rules_say() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "alerts_table.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    text = RUNBOOKS.read_text()
    for alert in alerts():
        assert f"| [{alert['alert']}](#{alert['alert'].lower()}) |" in text


def test_the_prometheus_rule_manifest_carries_the_same_groups() -> None:
    made = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "prometheus_rule.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stdout
    manifest = load(DOCKER / "k8s" / "prometheusrule.yaml")
    assert manifest["spec"]["groups"] == load(DOCKER / "alerts.yml")["groups"]


# -- the metrics they read ----------------------------------------------------------


async def test_every_metric_the_rules_read_is_one_a_node_exposes(
    start_node: NodeFactory,
) -> None:
    exprs = [rule["expr"] for rule in rules()]
    read = set().union(*map(metrics_read, exprs))
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert set().union(*map(recordings_read, exprs)) <= recorded
    handle = await start_node()
    status, text = await handle.request("GET", "/metrics")
    assert status == 200
    missing = undeclared(read, text)
    assert not missing, missing
    # What the rules select by label exists: the member states and drop reasons.
    assert set(re.findall(r'scheduler_members\{state="(\w+)"\}', text)) >= {"suspect", "dead"}
    reasons = set(re.findall(r'scheduler_gossip_dropped_packets_total\{reason="(\w+)"\}', text))
    assert reasons >= {"mac", "version", "partitioned"}
