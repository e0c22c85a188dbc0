"""The OpenAPI document at /v1/openapi.json: valid OpenAPI 3.1, and it covers
every route and every error code the code has (and nothing it lacks); its
statuses and label limits are the model's; and what a real node answers to
the schedule verbs, PATCH, the list filters, If-Match and the bulk cancel
is what the document says of them."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from multidict import CIMultiDict
from openapi_spec_validator import validate

from node import config as node_config
from node.api.app import build_app
from node.api.openapi import ERROR_CODES, document
from node.process import Node
from node.schedule.model import LABEL_NAME, MAX_LABEL_VALUE_BYTES, MAX_LABELS, Status
from tests.conftest import NodeFactory, NodeHandle
from tests.helpers import ROOT

NODE_SOURCE = ROOT / "node"


def routes(chaos_mode: str) -> set[tuple[str, str]]:
    config = node_config.load(
        {"node_id": "doc", "chaos_mode": chaos_mode, "gossip_unsigned": "on"}, {}
    )
    return {
        (route.method.lower(), route.resource.canonical)
        for route in build_app(Node(config)).router.routes()
        if route.resource is not None and route.method != "HEAD"
    }


def documented() -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in document()["paths"].items()
        for method in item
        if method != "parameters"
    }


def test_the_document_is_valid_openapi() -> None:
    validate(document())


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    assert routes("off") <= documented(), routes("off") - documented()
    assert documented() == routes("on"), documented() ^ routes("on")


def test_every_error_code_in_the_code_is_documented_and_none_is_stale() -> None:
    source = "\n".join(p.read_text() for p in NODE_SOURCE.rglob("*.py") if p.name != "openapi.py")
    # Every error class that reaches a caller: its code, then its status.
    used = set(re.findall(r'code="([a-z_]+)", status_hint=\d{3}', source))
    used |= set(re.findall(r'\d{3}: "([a-z_]+)"', source))  # aiohttp's refusals
    used |= set(re.findall(r'"code": "([a-z_]+)"', source))
    used |= set(re.findall(r'\.get\(\s*exc\.status, "([a-z_]+)"', source))
    assert {"not_found", "conflict", "invalid_request", "store_unavailable"} <= used
    assert used == set(ERROR_CODES), used ^ set(ERROR_CODES)


async def test_the_node_serves_it(start_node: NodeFactory) -> None:
    status, body = await (await start_node()).request("GET", "/v1/openapi.json")
    assert status == 200 and body == document()


# -- the document against the model, and against what a real node answers ----

SCHEDULE_PATHS = (
    "/v1/schedules/{schedule_id}:pause",
    "/v1/schedules/{schedule_id}:resume",
    "/v1/schedules/{schedule_id}:trigger",
    "/v1/schedules/{schedule_id}:retry",
)


def test_statuses_and_label_limits_come_from_the_model() -> None:
    doc = document()
    statuses = [s.value for s in Status]
    assert {"PAUSED", "EXPIRED"} <= set(statuses)
    assert doc["components"]["schemas"]["Schedule"]["properties"]["status"]["enum"] == statuses
    [status] = [p for p in doc["paths"]["/v1/schedules"]["get"]["parameters"]
                if p["name"] == "status"]  # fmt: skip
    assert status["schema"]["enum"] == statuses
    listed = doc["paths"]["/v1/schedules"]["get"]["responses"]["200"]["content"]
    counts = listed["application/json"]["schema"]["properties"]["counts"]
    assert list(counts["properties"]) == statuses
    for schema in ("NewSchedule", "SchedulePatch", "Selector"):
        labels = doc["components"]["schemas"][schema]["properties"]["labels"]
        assert labels["maxProperties"] == MAX_LABELS
        assert labels["propertyNames"]["pattern"] == LABEL_NAME.pattern
        assert labels["additionalProperties"]["maxLength"] == MAX_LABEL_VALUE_BYTES


def test_every_write_to_one_schedule_takes_if_match_and_answers_its_etag() -> None:
    paths = document()["paths"]
    writes = [(path, "post") for path in SCHEDULE_PATHS]
    writes += [("/v1/schedules/{schedule_id}", "patch"), ("/v1/schedules/{schedule_id}", "delete")]
    for path, method in writes:
        operation = paths[path][method]
        assert "If-Match" in [p["name"] for p in operation["parameters"]], (path, method)
        assert "412" in operation["responses"] and "409" in operation["responses"], (path, method)
        assert "ETag" in operation["responses"]["200"]["headers"], (path, method)
    assert "ETag" in paths["/v1/schedules/{schedule_id}"]["get"]["responses"]["200"]["headers"]
    created = paths["/v1/schedules"]["post"]["responses"]  # a create's answer is one too
    assert "ETag" in created["201"]["headers"] and "ETag" in created["200"]["headers"]


class Conformance:
    """Calls a real node and checks each answer against the document: its
    status is documented for the operation, and its body and headers match
    what the document says of that status (a schedule's view has no field
    the document lacks)."""

    def __init__(self, handle: NodeHandle) -> None:
        self.handle = handle
        self.doc = document()
        # Stricter than the document, which lets views grow: a field the
        # node shows must at least be documented.
        self.components = copy.deepcopy(self.doc["components"])
        self.components["schemas"]["Schedule"]["additionalProperties"] = False

    async def call(
        self, method: str, template: str, path: str | None = None, **kwargs: Any
    ) -> tuple[int, Any, CIMultiDict[str]]:
        url = self.handle.url + (path or template)
        async with self.handle.session.request(method, url, **kwargs) as response:
            status, headers = response.status, CIMultiDict(response.headers)
            body = await response.json(content_type=None)
        responses = self.doc["paths"][template][method.lower()]["responses"]
        assert str(status) in responses, (method, path, status, body)
        documented = responses[str(status)]
        schema = documented["content"]["application/json"]["schema"]
        Draft202012Validator(
            {**schema, "components": self.components},
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        ).validate(body)
        for name, header in documented.get("headers", {}).items():
            if name in headers:
                Draft202012Validator(header["schema"]).validate(headers[name])
        return status, body, headers


async def test_the_node_answers_the_new_verbs_as_documented(start_node: NodeFactory) -> None:
    api = Conformance(await start_node())
    one = "/v1/schedules/{schedule_id}"
    far = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    new = {"topic": "doc-verbs", "executeAt": far, "payload": {"n": 1},
           "labels": {"team": "a", "tier/x": ""}, "expireAfter": "PT90M"}  # fmt: skip
    status, created, _ = await api.call("POST", "/v1/schedules", json={**new, "id": "v1"})
    assert status == 201 and created["version"] == 1 and created["labels"] == new["labels"]
    assert created["expireAfter"] == "PT1H30M" and created["deadline"] > far
    await api.call("POST", "/v1/schedules", json={**new, "id": "v2"})

    status, view, headers = await api.call("GET", one, "/v1/schedules/v1")
    assert status == 200 and headers["ETag"] == '"1"'
    change = {"labels": {"team": "b"}, "key": "k", "expireAfter": None}
    status, _, _ = await api.call(
        "PATCH", one, "/v1/schedules/v1", json=change, headers={"If-Match": '"7"'}
    )
    assert status == 412
    status, view, headers = await api.call(
        "PATCH", one, "/v1/schedules/v1", json=change, headers={"If-Match": '"1"'}
    )
    assert status == 200 and headers["ETag"] == '"2"' and view["version"] == 2
    assert view["labels"] == {"team": "b"} and view["key"] == "k" and "expireAfter" not in view
    assert (await api.call("PATCH", one, "/v1/schedules/v1", json={}))[0] == 400
    assert (await api.call("PATCH", one, "/v1/schedules/v1", json={"payload": None}))[0] == 400
    status, _, _ = await api.call(
        "PATCH",
        one,
        "/v1/schedules/v1",
        json={"expireAfter": "PT1M", "recurrence": {"every": "PT1H"}},
    )
    assert status == 400

    verb = "/v1/schedules/{schedule_id}:"
    status, view, headers = await api.call("POST", verb + "pause", "/v1/schedules/v1:pause")
    assert status == 200 and view["status"] == "PAUSED" and headers["ETag"] == '"3"'
    status, error, _ = await api.call("POST", verb + "trigger", "/v1/schedules/v1:trigger")
    assert status == 409 and error["error"]["code"] == "invalid_state"
    status, error, _ = await api.call("POST", verb + "retry", "/v1/schedules/v1:retry")
    assert status == 409 and error["error"]["code"] == "invalid_state"
    status, error, _ = await api.call(
        "POST", verb + "resume", "/v1/schedules/v1:resume", headers={"If-Match": "3"}
    )
    assert status == 400 and error["error"]["field"] == "If-Match"
    status, error, _ = await api.call(
        "POST", verb + "resume", "/v1/schedules/v1:resume", data=b"{}"
    )
    assert status == 413
    status, view, _ = await api.call("POST", verb + "resume", "/v1/schedules/v1:resume")
    assert status == 200 and view["status"] == "PENDING"
    status, _, _ = await api.call("POST", verb + "pause", "/v1/schedules/missing:pause")
    assert status == 404

    status, page, _ = await api.call(
        "GET", "/v1/schedules", params=[("label", "team=a"), ("counts", "true")]
    )
    assert status == 200 and [s["id"] for s in page["schedules"]] == ["v2"]
    assert page["counts"]["PENDING"] == 1
    status, answer, _ = await api.call(
        "POST", "/v1/schedules:cancel", json={"labels": {"team": "a"}}
    )
    assert status == 200 and answer == {"matched": 1, "changed": 1, "more": False, "cancelled": 1}
    assert (await api.call("POST", "/v1/schedules:cancel", json={"dueBefore": far}))[0] == 400
    status, view, headers = await api.call("DELETE", one, "/v1/schedules/v2")
    assert (
        status == 200
        and view["status"] == "CANCELLED"
        and headers["ETag"] == f'"{view["version"]}"'
    )

    status, view, _ = await api.call("POST", verb + "trigger", "/v1/schedules/v1:trigger")
    assert status == 200 and view["executeAt"] < far


async def test_the_if_match_pattern_is_what_the_node_takes(start_node: NodeFactory) -> None:
    node = await start_node()
    far = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    status, _ = await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "m", "topic": "doc-match", "executeAt": far, "payload": 1},
    )
    assert status == 201
    [if_match] = [p for p in document()["paths"][SCHEDULE_PATHS[1]]["post"]["parameters"]
                  if p["name"] == "If-Match"]  # fmt: skip
    pattern = re.compile(if_match["schema"]["pattern"])
    # resume of a PENDING schedule changes nothing: only the condition is judged.
    taken = ['"1"', "*", '"2"', '"000000000000000001"']
    refused = ["1", 'W/"1"', '"a"', '""', '"1", "2"', '"1234567890123456789"', '"-1"']
    for value in taken + refused:
        assert bool(pattern.search(value)) == (value in taken), value
        status, body = await node.request(
            "POST", "/v1/schedules/m:resume", headers={"If-Match": value}
        )
        if value in taken:
            assert status in (200, 412), (value, body)
        else:
            assert status == 400 and body["error"]["field"] == "If-Match", (value, body)


async def test_every_documented_list_filter_and_cancel_field_is_taken(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    due = datetime.now(UTC) + timedelta(hours=1)
    for n in range(2):
        status, _ = await node.request(
            "POST",
            "/v1/schedules",
            json={"id": f"f-{n}", "topic": "doc-filters", "executeAt": due.isoformat(),
                  "payload": 1, "key": "k", "labels": {"team": "a"}},
        )  # fmt: skip
        assert status == 201
    window = {
        "dueAfter": (due - timedelta(minutes=1)).isoformat().replace("+00:00", "Z"),
        "dueBefore": (due + timedelta(minutes=1)).isoformat().replace("+00:00", "Z"),
    }
    examples = {
        "tenant": "default", "status": "PENDING", "limit": "1", "label": "team=a",
        "topic": "doc-filters", "key": "k", "counts": "true", "view": "full", **window,
        "destination": "kafka",
    }  # fmt: skip
    parameters = document()["paths"]["/v1/schedules"]["get"]["parameters"]
    # host: an http target's (tests/node/delivery/test_http_delivery.py lists by it).
    queries = {p["name"] for p in parameters if p["in"] == "query"}
    assert queries == {*examples, "after", "host"}
    status, first = await node.request("GET", "/v1/schedules", params=examples)
    assert status == 200 and len(first["schedules"]) == 1 and first["next"], first
    assert first["counts"]["PENDING"] == 2
    status, rest = await node.request(
        "GET", "/v1/schedules", params={**examples, "after": first["next"]}
    )
    assert status == 200 and [s["id"] for s in rest["schedules"]] == ["f-1"]

    cancel = {"labels": {"team": "a"}, "key": "k", "idPrefix": "f-", "topic": "doc-filters",
              "destination": "kafka", "status": ["PENDING", "PAUSED"],
              "dueBefore": window["dueBefore"], "tenant": "default"}  # fmt: skip
    fields = document()["components"]["schemas"]["Selector"]["properties"]
    # host: an http target's, dryRun: a count (tests/node/delivery/test_http_delivery.py uses both).
    assert set(fields) == {*cancel, "host", "dryRun"}
    status, answer = await node.request(
        "POST", "/v1/schedules:cancel", json={**cancel, "dryRun": True}
    )
    assert status == 200 and answer == {"matched": 2, "changed": 0, "more": False, "dryRun": True}
    status, answer = await node.request("POST", "/v1/schedules:cancel", json=cancel)
    assert status == 200 and answer == {"matched": 2, "changed": 2, "more": False, "cancelled": 2}
