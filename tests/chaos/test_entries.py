"""A fixed step entry of a scenario file, read field by field: the
defaults each action gets, and the target and restart checks."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.scenario import GARBAGE_RATE, ScenarioError, Step, parse


def only_step(entry: dict[str, Any]) -> Step:
    (step,) = parse("t", {"nodes": 3, "duration": 60, "rate": 5, "timeline": [entry]}).steps
    return step


def test_a_node_fault_targets_a_random_node_and_a_server_fault_none() -> None:
    assert only_step({"at": 1, "do": "kill"}).target == "random"
    assert only_step({"at": 1, "do": "crash-store", "for": 2}).target == ""


def test_a_flood_without_a_rate_sends_the_default_one() -> None:
    assert only_step({"at": 1, "do": "garbage-gossip", "for": 3}).rate == GARBAGE_RATE
    assert only_step({"at": 1, "do": "garbage-gossip", "for": 3, "rate": 7}).rate == 7.0
    assert only_step({"at": 1, "do": "pause", "for": 3}).rate == 0.0


@pytest.mark.parametrize(
    ("entry", "refusal"),
    [
        ({"at": 1, "do": "stop", "target": ""}, "target must be a node name or 'random'"),
        ({"at": 1, "do": "stop", "target": 3}, "target must be a node name or 'random'"),
        ({"at": 1, "do": "kill", "restart": "yes"}, "restart must be true or false"),
    ],
)
def test_an_empty_target_or_a_restart_that_is_no_boolean_is_refused(
    entry: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ScenarioError) as caught:
        only_step(entry)
    assert str(caught.value).endswith(refusal)
