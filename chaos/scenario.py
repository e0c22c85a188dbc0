"""Chaos scenarios as data: a JSON file names the starting cluster, the load
and a timeline of faults; ``python -m chaos run NAME`` plays it.

A file looks like::

    {
      "description": "one line for `python -m chaos list`",
      "nodes": 3,                     # node processes at the start
      "duration": 60,                 # seconds of load
      "rate": 50,                     # schedules posted per second
      "auth": false,                  # true: AUTH=on, every call with an admin key
      "http_share": 0.25,             # of the schedules, delivered by HTTP (default 0)
      "cluster_keys": false,          # true: a fresh CLUSTER_KEYS key signs gossip
      "timeline": [
        {"at": 10, "do": "start"},                        # one more node
        {"at": 20, "do": "kill", "target": "random"},     # SIGKILL
        {"at": 30, "do": "stop", "target": "node-1"},     # graceful leave
        {"at": 40, "do": "pause", "target": "random", "for": 15},  # SIGSTOP, SIGCONT
        {"at": 42, "do": "isolate", "target": "random", "for": 12},  # link down
        {"at": 44, "do": "split", "for": 10},             # halves cut apart
        {"at": 45, "do": "crash-store", "for": 5},        # database SIGKILL, restart
        {"at": 48, "do": "crash-broker", "for": 5},       # Kafka SIGKILL, restart
        {"at": 50, "do": "cut-store", "target": "random", "for": 10},  # that link only
        {"at": 52, "do": "skew-clock", "target": "random", "seconds": 30},
        {"at": 54, "do": "garbage-gossip", "target": "random", "for": 10, "rate": 100},
        {"at": 56, "do": "receiver-down", "for": 20},     # SIGKILL, restart
        {"at": 58, "do": "receiver-503", "for": 10, "retry_after": 5},
        {"at": 60, "do": "receiver-slow", "for": 10},     # answers after 30 s
        {"at": 62, "do": "receiver-400", "for": 5},       # refuses for good
        {"at": 12, "every": 10, "until": 50, "do": "kill", "target": "random",
         "restart": true},                                # a node dies every 10 s
        {"at": 10, "every": 9, "until": 590, "do": "any", "kinds": ["kill", "pause"],
         "for": 15}                                       # drawn per seed (``Draw``)
      ]
    }

Validation happens at load time, so a typo in a scenario fails before any
process starts, naming the file, the entry and the field.

An ``any`` entry is a ``Draw``: at each of its times the run's seed picks
one of ``kinds`` with parameters of its own (``Draw.steps``), so one file
yields many timelines, each the same for the same seed. The drawing keeps
faults from piling up: at most one node paused, isolated, cut off or
flooded at a time (a split counts as one), one fault of the database and
one of the broker at a time, one node joining, leaving or restarting at a
time, and the node count between 3 and 5 (a stop waits until a node can
go, a start until there is room).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).parent / "scenarios"
ACTIONS = (
    "start", "kill", "stop", "pause", "restart", "isolate", "split",
    "crash-store", "pause-broker", "crash-broker",
    "cut-store", "cut-broker", "skew-clock", "garbage-gossip",
    "receiver-down", "receiver-503", "receiver-slow", "receiver-400",
)  # fmt: skip
# The faults of the webhook receiver (``chaos/lab/receiver.py``): only in a
# scenario that delivers a share of its schedules by HTTP.
RECEIVER_STEPS = ("receiver-down", "receiver-503", "receiver-slow", "receiver-400")
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
    # keeps its topics in a disk-backed S3 store (chaos/lab/objectstore.py).
    "crash-broker": {"for"},
    # The node loses its route to the database only (or the broker only) for
    # "for" seconds; it keeps its peers and the other server. Needs network
    # namespaces: skipped without them.
    "cut-store": {"target", "for"},
    "cut-broker": {"target", "for"},
    # Restart the node (gracefully) with its wall clock "seconds" off
    # (CHAOS_CLOCK_SKEW); it stays off until a later step restarts it.
    "skew-clock": {"target", "seconds"},
    # Hostile datagrams and push-pull streams at the node's gossip port for
    # "for" seconds, "rate" datagrams a second (default 100).
    "garbage-gossip": {"target", "for", "rate"},
    # The receiver killed (connection refused), restarted after "for" seconds.
    "receiver-down": {"for"},
    # For "for" seconds the receiver answers 503 with Retry-After
    # "retry_after" seconds (default 5), or answers only after 30 s, or
    # answers 400 (refused for good: those schedules end DELIVERY_FAILED).
    "receiver-503": {"for", "retry_after"},
    "receiver-slow": {"for"},
    "receiver-400": {"for"},
}
# Node faults that last: the node is out of the picture (or under attack)
# until they end, so no other step picks it meanwhile.
LASTING_NODE_FAULTS = ("pause", "isolate", "cut-store", "cut-broker", "garbage-gossip")
GARBAGE_RATE = 100.0  # datagrams a second, when a garbage-gossip step names none
RETRY_AFTER = 5  # seconds, when a receiver-503 step names none

# -- drawing (``any``) --------------------------------------------------------------
# What each kind holds while it runs: one "node" fault at a time (a node
# paused, isolated, cut off or flooded, or the cluster split), one fault of
# the "store" and one of the "broker", and one node joining, leaving or
# restarting ("churn").
HOLDS: dict[str, tuple[str, ...]] = {
    "pause": ("node",),
    "isolate": ("node",),
    "split": ("node",),
    "garbage-gossip": ("node",),
    "cut-store": ("node", "store"),
    "cut-broker": ("node", "broker"),
    "crash-store": ("store",),
    "pause-broker": ("broker",),
    "crash-broker": ("broker",),
    "kill": ("churn",),
    "restart": ("churn",),
    "skew-clock": ("churn",),
    "stop": ("churn",),
    "start": ("churn",),
    **{kind: ("receiver",) for kind in RECEIVER_STEPS},
}
# Seconds a kind keeps holding after its outage ends: the cluster takes the
# node back, or moves its buckets, before the next fault of the same sort.
RECOVERY = {"node": 10.0, "store": 5.0, "broker": 5.0, "receiver": 5.0}
CHURN = 8.0  # a node starting (or leaving) is ready (or gone) within this
MIN_NODES, MAX_NODES = 3, 5  # drawn starts and stops keep the count in between
DRAW_LONGEST = 15.0  # the longest node outage drawn, when an ``any`` names none
# The shortest spacing a scaled-down ``any`` keeps (``Scenario.scaled``).
MIN_EVERY = 4.0


# The labels of the steps that hit no node, each followed by its length.
WHOLE_LABELS = {
    "crash-store": "crash the store",
    "pause-broker": "pause the broker",
    "crash-broker": "crash the broker",
    "split": "split the cluster",
    "receiver-down": "take the receiver down",
    "receiver-slow": "receiver answers slowly",
    "receiver-400": "receiver answers 400",
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
    skew: float = 0.0  # skew-clock: seconds the node's wall clock runs off
    rate: float = 0.0  # garbage-gossip: datagrams a second
    retry_after: int = 0  # receiver-503: the Retry-After it answers with

    @property
    def partitions(self) -> bool:
        return self.do in ("isolate", "split")

    @property
    def needs_namespaces(self) -> bool:
        """Cuts links: real ones where network namespaces work."""
        return self.partitions or self.do in ("cut-store", "cut-broker")

    @property
    def label(self) -> str:
        if self.do == "start":
            return "start a node"
        if self.do in WHOLE_LABELS:
            return f"{WHOLE_LABELS[self.do]} for {self.lasting:g} s"
        if self.do == "receiver-503":
            return f"receiver answers 503 (Retry-After {self.retry_after} s) for {self.lasting:g} s"
        node = "a random node" if self.target == "random" else self.target
        if self.do in ("cut-store", "cut-broker"):
            server = "store" if self.do == "cut-store" else "broker"
            return f"cut {node} from the {server} for {self.lasting:g} s"
        if self.do == "skew-clock":
            return f"restart {node} with its clock {self.skew:+g} s off"
        if self.do == "garbage-gossip":
            return f"garbage gossip at {node} for {self.lasting:g} s"
        what = f"{self.do} {self.target}"
        if self.do in ("pause", "isolate"):
            what += f" for {self.lasting:g} s"
        return what + (" and restart" if self.restart else "")


@dataclass(frozen=True)
class Draw:
    """An ``any`` entry: at ``at``, then every ``every`` s until ``until``,
    a step of one of ``kinds`` drawn by the run's seed (``steps``)."""

    at: float
    every: float  # 0: once
    until: float
    kinds: tuple[str, ...]
    longest: float = DRAW_LONGEST  # the longest node outage or flood drawn

    @property
    def times(self) -> list[float]:
        times = [self.at]
        while self.every and times[-1] + self.every <= self.until + 1e-9:
            times.append(round(times[-1] + self.every, 6))
        return times

    def steps(self, rng: random.Random, *, nodes: int, fixed: Sequence[Step] = ()) -> list[Step]:
        """One step per time, or none where nothing may start then.

        The kinds are dealt like cards: shuffled, one deck after another, so
        every kind comes up once per ``len(kinds)`` steps. A kind that may
        not start now (what it would hold is busy then, or the node count
        forbids it) waits at the head of the queue and the next one that
        may goes first. ``fixed`` steps of the scenario hold what they hold
        too, and their starts, stops and kills count."""
        held: dict[str, list[tuple[float, float]]] = {}  # what -> intervals held
        for fixed_step in fixed:
            _hold(held, fixed_step)
        low, high = min(MIN_NODES, nodes), max(MAX_NODES, nodes)
        changes = [(s.at, _count_change(s)) for s in fixed if _count_change(s)]
        queue: list[str] = []
        drawn: list[Step] = []
        for at in self.times:
            if len(queue) < len(self.kinds):
                queue.extend(_shuffled(rng, self.kinds))
            count = nodes + sum(change for when, change in changes if when <= at)
            step = self._next(rng, queue, held, at, forbidden=_forbidden(count, low, high))
            if step is None:
                continue
            _hold(held, step)
            if _count_change(step):
                changes.append((at, _count_change(step)))
            drawn.append(step)
        return drawn

    def _next(
        self,
        rng: random.Random,
        queue: list[str],
        held: dict[str, list[tuple[float, float]]],
        at: float,
        *,
        forbidden: Collection[str],
    ) -> Step | None:
        """The step of the first kind in ``queue`` that may start at ``at``,
        its kind taken off the queue; None when no kind may."""
        draw = partial(self._one, rng, at=at)
        step = _first_free(queue, held, forbidden, draw)
        if step is None:
            # Every kind waiting is blocked: deal the kinds not waiting (they
            # go behind the blocked ones, so those keep their turn).
            queue.extend(_shuffled(rng, [k for k in self.kinds if k not in queue]))
            step = _first_free(queue, held, forbidden, draw)
        return step

    def _one(self, rng: random.Random, kind: str, at: float) -> Step:
        """A step of ``kind`` with parameters of its own."""
        longest = self.longest

        def seconds(low: float, high: float) -> float:
            return round(rng.uniform(low, max(low, high)), 1)

        if kind == "kill":
            return Step(at, kind, restart=True)
        if kind in ("pause", "isolate", "split", "cut-store", "cut-broker"):
            return Step(at, kind, lasting=seconds(min(6.0, longest), longest))
        if kind == "garbage-gossip":
            return Step(at, kind, lasting=seconds(min(6.0, longest), longest), rate=GARBAGE_RATE)
        if kind in ("crash-store", "crash-broker"):
            return Step(at, kind, target="", lasting=seconds(2.0, min(6.0, longest)))
        if kind == "pause-broker":
            return Step(at, kind, target="", lasting=seconds(3.0, min(10.0, longest)))
        if kind == "skew-clock":
            return Step(at, kind, skew=rng.choice((-1, 1)) * rng.randint(5, 60))
        if kind in RECEIVER_STEPS:
            retry_after = rng.randint(1, 10) if kind == "receiver-503" else 0
            return Step(at, kind, "", seconds(5.0, longest), retry_after=retry_after)
        if kind == "start":
            return Step(at, kind, target="")
        return Step(at, kind)  # stop, restart: a random node


def _shuffled(rng: random.Random, kinds: Sequence[str]) -> list[str]:
    deck = list(kinds)
    rng.shuffle(deck)
    return deck


def _forbidden(count: int, low: int, high: int) -> tuple[str, ...]:
    """The kinds the node count forbids: a stop at ``low``, a start at ``high``."""
    return (("stop",) if count <= low else ()) + (("start",) if count >= high else ())


def _first_free(
    queue: list[str],
    held: dict[str, list[tuple[float, float]]],
    forbidden: Collection[str],
    draw: Callable[[str], Step],
) -> Step | None:
    """The first step drawn from ``queue`` that holds nothing busy, its kind
    taken off the queue (a kind ``forbidden`` is passed over undrawn)."""
    for index, kind in enumerate(queue):
        if kind in forbidden:
            continue
        candidate = draw(kind)
        if not _busy(held, candidate):
            del queue[index]
            return candidate
    return None


def _holding(step: Step) -> list[tuple[str, float]]:
    """What ``step`` holds, and until when (from its start)."""
    return [
        (what, step.at + step.lasting + RECOVERY.get(what, CHURN))
        for what in HOLDS.get(step.do, ())
    ]


def _busy(held: dict[str, list[tuple[float, float]]], step: Step) -> bool:
    """True when something ``step`` would hold is held then already."""
    return any(
        start < until and step.at < end
        for what, until in _holding(step)
        for start, end in held.get(what, [])
    )


def _hold(held: dict[str, list[tuple[float, float]]], step: Step) -> None:
    for what, until in _holding(step):
        held.setdefault(what, []).append((step.at, until))


def _count_change(step: Step) -> int:
    """How the step changes the number of nodes."""
    if step.do == "start":
        return 1
    if step.do == "stop" or (step.do == "kill" and not step.restart):
        return -1
    return 0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    duration: float
    rate: float
    steps: tuple[Step, ...]
    draws: tuple[Draw, ...] = ()
    auth: bool = False  # AUTH=on: every call with an admin tenant's API key
    cluster_keys: bool = False  # CLUSTER_KEYS: gossip (and wake-up hints) signed
    # Of the load's schedules, the share delivered by HTTP to the run's
    # receiver instead of to the topic (0: no receiver runs).
    http_share: float = 0.0

    def scaled(self, *, nodes: int | None, duration: float | None, rate: float | None) -> Scenario:
        """The same faults at the same share of a longer or shorter run.
        Outages keep their length (a pause must still outlast the lease), so
        an ``any`` keeps its spacing at MIN_EVERY at least: a shorter run
        draws fewer steps."""
        factor = 1.0 if duration is None else duration / self.duration
        return replace(
            self,
            nodes=nodes or self.nodes,
            duration=duration or self.duration,
            rate=rate or self.rate,
            steps=tuple(replace(s, at=s.at * factor) for s in self.steps),
            draws=tuple(
                replace(
                    d,
                    at=d.at * factor,
                    until=d.until * factor,
                    every=max(d.every * factor, MIN_EVERY) if d.every else 0.0,
                )
                for d in self.draws
            ),
        )

    def timeline(self, seed: int) -> tuple[Step, ...]:
        """Every step of a run with this seed: the fixed ones and the drawn
        ones, in time order. The same seed draws the same timeline."""
        rng = random.Random(f"timeline {seed}")
        drawn = [
            step
            for draw in self.draws
            for step in draw.steps(rng, nodes=self.nodes, fixed=self.steps)
        ]
        return tuple(sorted([*self.steps, *drawn], key=lambda s: s.at))


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


TOP_FIELDS = {
    "description", "nodes", "duration", "rate", "timeline", "auth", "cluster_keys", "http_share",
}  # fmt: skip


def parse(name: str, data: Any, *, where: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: must be a JSON object")
    unknown = set(data) - TOP_FIELDS
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    nodes = _number(data, "nodes", where, low=1, high=20, integer=True)
    duration = _number(data, "duration", where, low=1, high=3600)
    rate = _number(data, "rate", where, low=0.1, high=10_000)
    http_share = _number(data, "http_share", where, low=0, high=1) if "http_share" in data else 0.0
    switches = {key: data.get(key, False) for key in ("auth", "cluster_keys")}
    for key, value in switches.items():
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: {key} must be true or false, got {value!r}")
    timeline = data.get("timeline", [])
    if not isinstance(timeline, list):
        raise ScenarioError(f"{where}: timeline must be a list")
    steps: list[Step] = []
    draws: list[Draw] = []
    for index, entry in enumerate(timeline):
        at = f"{where}: timeline[{index}]"
        if isinstance(entry, dict) and entry.get("do") == "any":
            draws.append(_draw(entry, at, duration))
        else:
            steps.extend(_steps(entry, at, duration))
    _receiver_needed(steps, draws, http_share, where)
    return Scenario(
        name,
        str(data.get("description", "")),
        int(nodes),
        duration,
        rate,
        tuple(sorted(steps, key=lambda s: s.at)),
        tuple(draws),
        auth=switches["auth"],
        cluster_keys=switches["cluster_keys"],
        http_share=http_share,
    )


def _receiver_needed(
    steps: Sequence[Step], draws: Sequence[Draw], http_share: float, where: str
) -> None:
    """A receiver fault needs a receiver: a run with an http share."""
    kinds = {s.do for s in steps} | {kind for d in draws for kind in d.kinds}
    wanted = sorted(kinds & set(RECEIVER_STEPS))
    if wanted and not http_share:
        raise ScenarioError(f"{where}: {', '.join(wanted)} needs an http_share above 0")


def _times(entry: dict[str, Any], where: str, duration: float) -> tuple[float, float, float]:
    """(at, every, until) of an entry; every 0 when it happens once."""
    at = _number(entry, "at", where, low=0, high=duration)
    if "every" in entry:
        every = _number(entry, "every", where, low=1, high=3600)
        until = (
            _number(entry, "until", where, low=at, high=duration) if "until" in entry else duration
        )
        return at, every, until
    if "until" in entry:
        raise ScenarioError(f"{where}: 'until' needs 'every'")
    return at, 0.0, at


def _steps(entry: Any, where: str, duration: float) -> list[Step]:
    do = _action(entry, where)
    at, every, until = _times(entry, where, duration)
    target = _target(entry, where, do)
    lasting = _number(entry, "for", where, low=0.1, high=3600) if "for" in FIELDS[do] else 0.0
    restart = entry.get("restart", False)
    if not isinstance(restart, bool):
        raise ScenarioError(f"{where}: restart must be true or false")
    skew = _skew(entry, where) if do == "skew-clock" else 0.0
    rate = _rate(entry, where) if do == "garbage-gossip" else 0.0
    retry_after = _retry_after(entry, where) if do == "receiver-503" else 0
    times = [at]
    while every and times[-1] + every <= until:
        times.append(times[-1] + every)
    return [Step(t, do, target, lasting, restart, skew, rate, retry_after) for t in times]


def _action(entry: Any, where: str) -> str:
    """The entry's ``do``, once the entry is an object naming an action and
    only the fields that action takes."""
    if not isinstance(entry, dict):
        raise ScenarioError(f"{where}: must be an object")
    do = entry.get("do")
    if do not in ACTIONS:
        raise ScenarioError(f"{where}: 'do' must be one of {', '.join(ACTIONS)} or any, got {do!r}")
    unknown = set(entry) - {"at", "every", "until", "do"} - FIELDS[do]
    if unknown:
        raise ScenarioError(f"{where}: {do} takes no {', '.join(sorted(unknown))}")
    return str(do)


def _target(entry: dict[str, Any], where: str, do: str) -> str:
    """A node name, or "random" (the default) for an action that takes a
    target; "" for one that does not."""
    target = entry.get("target", "random" if "target" in FIELDS[do] else "")
    if not isinstance(target, str) or (not target and "target" in FIELDS[do]):
        raise ScenarioError(f"{where}: target must be a node name or 'random'")
    return target


def _skew(entry: dict[str, Any], where: str) -> float:
    skew = _number(entry, "seconds", where, low=-86400, high=86400)
    if skew == 0:
        raise ScenarioError(f"{where}: seconds must not be 0 (no skew)")
    return skew


def _rate(entry: dict[str, Any], where: str) -> float:
    if "rate" not in entry:
        return GARBAGE_RATE
    return _number(entry, "rate", where, low=1, high=10_000)


def _retry_after(entry: dict[str, Any], where: str) -> int:
    if "retry_after" not in entry:
        return RETRY_AFTER
    return int(_number(entry, "retry_after", where, low=1, high=3600, integer=True))


def _draw(entry: dict[str, Any], where: str, duration: float) -> Draw:
    unknown = set(entry) - {"at", "every", "until", "do", "kinds", "for"}
    if unknown:
        raise ScenarioError(f"{where}: any takes no {', '.join(sorted(unknown))}")
    at, every, until = _times(entry, where, duration)
    kinds = entry.get("kinds")
    if not isinstance(kinds, list) or not kinds:
        raise ScenarioError(f"{where}: kinds must be a non-empty list of actions")
    for kind in kinds:
        if kind not in ACTIONS:
            raise ScenarioError(
                f"{where}: kinds: {kind!r} is no action; one of {', '.join(ACTIONS)}"
            )
    if len(set(kinds)) != len(kinds):
        raise ScenarioError(f"{where}: kinds: each kind once")
    longest = _number(entry, "for", where, low=1, high=3600) if "for" in entry else DRAW_LONGEST
    return Draw(at, every, until, tuple(kinds), longest)


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
