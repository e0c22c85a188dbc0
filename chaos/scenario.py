"""Chaos scenarios as data: a JSON file names the starting cluster, the load
and a timeline of faults; ``python -m chaos run NAME`` plays it.

A file looks like::

    {
      "description": "one line for `python -m chaos list`",
      "nodes": 3,                     # node processes at the start
      "duration": 60,                 # seconds of load
      "rate": 50,                     # schedules posted per second
      "timeline": [
        {"at": 10, "do": "start"},                        # one more node
        {"at": 20, "do": "kill", "target": "random"},     # SIGKILL
        {"at": 30, "do": "stop", "target": "node-1"},     # graceful leave
        {"at": 40, "do": "pause", "target": "random", "for": 15},  # SIGSTOP, SIGCONT
        {"at": 42, "do": "isolate", "target": "random", "for": 12},  # link down
        {"at": 44, "do": "split", "for": 10},             # halves cut apart
        {"at": 45, "do": "crash-store", "for": 5},        # database SIGKILL, restart
        {"at": 48, "do": "crash-broker", "for": 5},       # Kafka SIGKILL, restart
        {"at": 12, "every": 10, "until": 50, "do": "kill", "target": "random",
         "restart": true}                                 # a node dies every 10 s
      ]
    }

Validation happens at load time, so a typo in a scenario fails before any
process starts, naming the file, the entry and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).parent / "scenarios"
ACTIONS = (
    "start", "kill", "stop", "pause", "restart", "isolate", "split",
    "crash-store", "pause-broker", "crash-broker",
)  # fmt: skip
# Which fields each action takes besides at/every/until/do.
FIELDS: dict[str, set[str]] = {
    "start": set(),
    "kill": {"target", "restart"},
    "stop": {"target"},
    "pause": {"target", "for"},
    "restart": {"target"},
    # Cut the node's network link for "for" seconds: peers, database, broker.
    "isolate": {"target", "for"},
    # Two halves that cannot reach each other for "for" seconds; both still
    # reach the database and the broker.
    "split": {"for"},
    "crash-store": {"for"},  # SIGKILL the database, restart it after "for" seconds
    # SIGSTOP Kafka for "for" seconds: unreachable, nothing lost. (A crash
    # would not do on the embedded Tansu, which keeps topics in memory: it
    # would lose records the scheduler had delivered.)
    "pause-broker": {"for"},
    # SIGKILL Kafka, restart it after "for" seconds. The run's broker then
    # keeps its topics in a disk-backed S3 store (chaos/objectstore.py).
    "crash-broker": {"for"},
}


class ScenarioError(ValueError):
    """A scenario file that cannot be played; the message says where."""


@dataclass(frozen=True)
class Step:
    """One fault at ``at`` seconds after the load began."""

    at: float
    do: str
    target: str = "random"  # a node name, or "random" among the running ones
    lasting: float = 0.0  # a pause, or a store outage, in seconds
    restart: bool = False  # after a kill: start a fresh node with the same name

    @property
    def partitions(self) -> bool:
        return self.do in ("isolate", "split")

    @property
    def label(self) -> str:
        if self.do == "start":
            return "start a node"
        if self.do == "crash-store":
            return f"crash the store for {self.lasting:g} s"
        if self.do == "pause-broker":
            return f"pause the broker for {self.lasting:g} s"
        if self.do == "crash-broker":
            return f"crash the broker for {self.lasting:g} s"
        if self.do == "split":
            return f"split the cluster for {self.lasting:g} s"
        what = f"{self.do} {self.target}"
        if self.do in ("pause", "isolate"):
            what += f" for {self.lasting:g} s"
        return what + (" and restart" if self.restart else "")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    duration: float
    rate: float
    steps: tuple[Step, ...]

    def scaled(self, *, nodes: int | None, duration: float | None, rate: float | None) -> Scenario:
        """The same faults at the same share of a longer or shorter run."""
        factor = 1.0 if duration is None else duration / self.duration
        return Scenario(
            self.name,
            self.description,
            nodes or self.nodes,
            duration or self.duration,
            rate or self.rate,
            tuple(Step(s.at * factor, s.do, s.target, s.lasting, s.restart) for s in self.steps),
        )


def available() -> dict[str, Path]:
    return {path.stem: path for path in sorted(SCENARIO_DIR.glob("*.json"))}


def load(name_or_path: str) -> Scenario:
    path = Path(name_or_path)
    if not path.suffix:
        known = available()
        if name_or_path not in known:
            raise ScenarioError(
                f"no scenario {name_or_path!r}; known: {', '.join(known) or 'none'}"
            )
        path = known[name_or_path]
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return parse(path.stem, data, where=str(path))


def parse(name: str, data: Any, *, where: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: must be a JSON object")
    unknown = set(data) - {"description", "nodes", "duration", "rate", "timeline"}
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    nodes = _number(data, "nodes", where, low=1, high=20, integer=True)
    duration = _number(data, "duration", where, low=1, high=3600)
    rate = _number(data, "rate", where, low=0.1, high=10_000)
    timeline = data.get("timeline", [])
    if not isinstance(timeline, list):
        raise ScenarioError(f"{where}: timeline must be a list")
    steps: list[Step] = []
    for index, entry in enumerate(timeline):
        steps.extend(_steps(entry, f"{where}: timeline[{index}]", duration))
    return Scenario(
        name,
        str(data.get("description", "")),
        int(nodes),
        duration,
        rate,
        tuple(sorted(steps, key=lambda s: s.at)),
    )


def _steps(entry: Any, where: str, duration: float) -> list[Step]:
    if not isinstance(entry, dict):
        raise ScenarioError(f"{where}: must be an object")
    do = entry.get("do")
    if do not in ACTIONS:
        raise ScenarioError(f"{where}: 'do' must be one of {', '.join(ACTIONS)}, got {do!r}")
    unknown = set(entry) - {"at", "every", "until", "do"} - FIELDS[do]
    if unknown:
        raise ScenarioError(f"{where}: {do} takes no {', '.join(sorted(unknown))}")
    at = _number(entry, "at", where, low=0, high=duration)
    target = entry.get("target", "random" if "target" in FIELDS[do] else "")
    if not isinstance(target, str) or (not target and "target" in FIELDS[do]):
        raise ScenarioError(f"{where}: target must be a node name or 'random'")
    lasting = _number(entry, "for", where, low=0.1, high=3600) if "for" in FIELDS[do] else 0.0
    restart = entry.get("restart", False)
    if not isinstance(restart, bool):
        raise ScenarioError(f"{where}: restart must be true or false")
    times = [at]
    if "every" in entry:
        every = _number(entry, "every", where, low=1, high=3600)
        until = (
            _number(entry, "until", where, low=at, high=duration) if "until" in entry else duration
        )
        while times[-1] + every <= until:
            times.append(times[-1] + every)
    elif "until" in entry:
        raise ScenarioError(f"{where}: 'until' needs 'every'")
    return [Step(t, do, target, lasting, restart) for t in times]


def _number(
    data: dict[str, Any], key: str, where: str, *, low: float, high: float, integer: bool = False
) -> float:
    if key not in data:
        raise ScenarioError(f"{where}: missing {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: {key} must be a number, got {value!r}")
    if integer and not isinstance(value, int):
        raise ScenarioError(f"{where}: {key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ScenarioError(f"{where}: {key} must be between {low:g} and {high:g}, got {value}")
    return float(value)
