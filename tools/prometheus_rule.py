"""Write docker/k8s/prometheusrule.yaml from docker/alerts.yml.

``python tools/prometheus_rule.py``: the Prometheus operator's PrometheusRule
(monitoring.coreos.com/v1) carrying the groups of docker/alerts.yml, copied
as text under ``spec:`` (comments and all, so the knobs read the same in
both). ``--check`` writes nothing and exits 1 when the manifest is not what
the rules make; tests/deploy/test_alert_rules.py runs it, so the two cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docker" / "alerts.yml"
MANIFEST = ROOT / "docker" / "k8s" / "prometheusrule.yaml"

HEADER = """\
# Generated from docker/alerts.yml by `python tools/prometheus_rule.py`: edit
# that file and run it again (tests/deploy/test_alert_rules.py checks they agree).
#
# The scheduler's recording and alert rules for the Prometheus operator. Not
# in kustomization.yaml, which must apply where the operator's CRDs are not
# installed: apply it on its own where they are,
#   kubectl apply -f docker/k8s/prometheusrule.yaml
# in the scheduler's namespace, with the labels your Prometheus's
# ruleSelector asks for. Runbooks: docs/runbooks.md.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: scheduler
  labels:
    app.kubernetes.io/name: bucket-scheduler
spec:
"""


def render(rules: str) -> str:
    """The manifest for a rule file: its ``groups:`` onwards, indented under ``spec:``."""
    lines = rules.splitlines()
    start = lines.index("groups:")
    return HEADER + "".join(f"  {line}\n" if line else "\n" for line in lines[start:])


def main(argv: list[str]) -> int:
    wanted = render(RULES.read_text())
    if argv == ["--check"]:
        if not MANIFEST.exists() or MANIFEST.read_text() != wanted:
            print(f"{MANIFEST.relative_to(ROOT)} differs from {RULES.relative_to(ROOT)}:")
            print("run python tools/prometheus_rule.py")
            return 1
        return 0
    if argv:
        print("usage: python tools/prometheus_rule.py [--check]")
        return 2
    MANIFEST.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
