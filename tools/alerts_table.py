"""Write the table of alerts at the top of docs/runbooks.md from docker/alerts.yml.

``python tools/alerts_table.py``: one row per alert (its severity, how long
its condition must hold, what it says, and a link to its runbook), between
the ``alerts-table`` markers. ``--check`` writes nothing and exits 1 when the
table is not what the rules make; tests/deploy/test_alert_rules.py runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docker" / "alerts.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
START = "<!-- alerts-table: made by tools/alerts_table.py from docker/alerts.yml -->\n"
END = "<!-- /alerts-table -->"


def table(rules: dict[str, Any]) -> str:
    rows = ["| alert | severity | for | what it says |", "| --- | --- | --- | --- |"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            rows.append(
                f"| [{name}](#{name.lower()}) | {rule['labels']['severity']} "
                f"| {rule.get('for', '-')} | {rule['annotations']['summary']} |"
            )
    return "\n".join(rows) + "\n"


def rendered(text: str, rules: dict[str, Any]) -> str:
    start = text.index(START) + len(START)
    end = text.index(END)
    return text[:start] + table(rules) + text[end:]


def main(argv: list[str]) -> int:
    text = RUNBOOKS.read_text()
    wanted = rendered(text, yaml.safe_load(RULES.read_text()))
    if "--check" in argv:
        if wanted != text:
            print(f"{RUNBOOKS} is stale: run python tools/alerts_table.py", file=sys.stderr)
            return 1
        return 0
    RUNBOOKS.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
