"""The Python client (clients/python) against the OpenAPI document the node
serves: every route (path and method), every member of a schedule and of
what the calls take, and every error code the server has is one the client
has too. A route, a field or a code added to the server and not to the
client fails here; so does one the client has and the server no longer."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
from bucket_scheduler_client import ERRORS, ROUTES, AsyncClient, Client, models
from bucket_scheduler_client import _core as client_core

from node import config as node_config
from node.api.app import build_app
from node.api.openapi import ERROR_CODES, document
from node.process import Node

# Each model of the client, and where the document describes its members.
MODELS: dict[type, tuple[str, ...]] = {
    models.Schedule: ("components", "schemas", "Schedule"),
    models.HttpTarget: ("components", "schemas", "HttpTarget"),
    models.Recurrence: ("components", "schemas", "Recurrence"),
    models.RetryPolicy: ("components", "schemas", "RetryPolicy"),
    models.FlowControl: ("components", "schemas", "FlowControl"),
    models.Occurrence: ("components", "schemas", "Occurrence"),
    models.Attempt: ("components", "schemas", "Attempt"),
    models.BatchItem: ("components", "schemas", "BatchResult"),
    models.BatchError: ("components", "schemas", "Error", "properties", "error"),
}
# Models of a route's 200: (path, method).
ANSWERS: dict[type, tuple[str, str]] = {
    models.Page: ("/v1/schedules", "get"),
    models.History: ("/v1/schedules/{schedule_id}/history", "get"),
    models.BulkResult: ("/v1/schedules:cancel", "post"),
    models.BatchResult: ("/v1/schedules:batch", "post"),
}


def _at(doc: dict[str, Any], where: tuple[str, ...]) -> dict[str, Any]:
    node = doc
    for key in where:
        node = node[key]
    return node


def _ok_schema(doc: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path][method]["responses"]["200"]["content"][
        "application/json"
    ]["schema"]
    return schema


def _schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(doc["components"]["schemas"][name])


def _routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m, p) for p, item in doc["paths"].items() for m in item if m != "parameters"}


def _query(doc: dict[str, Any], path: str, method: str) -> set[str]:
    item = doc["paths"][path]
    parameters = [*item.get("parameters", []), *item[method].get("parameters", [])]
    return {p["name"] for p in parameters if p["in"] == "query"}


def differences(doc: dict[str, Any], codes: tuple[str, ...]) -> dict[str, set[Any]]:
    """What the document (and the server's codes) has that the client lacks,
    and the reverse, by kind; empty sets when they agree."""
    found: dict[str, set[Any]] = {
        "routes": _routes(doc) ^ set(client_core.ROUTES),
        "error codes": set(codes) ^ set(ERRORS),
    }
    for model, where in MODELS.items():
        found[model.__name__] = set(_at(doc, where)["properties"]) ^ set(
            models.wire_names(model).values()
        )
    for model, (path, method) in ANSWERS.items():
        found[model.__name__] = set(_ok_schema(doc, path, method)["properties"]) ^ set(
            models.wire_names(model).values()
        )
    found["create"] = set(_schema(doc, "NewSchedule")["properties"]) ^ set(
        client_core.CREATE_FIELDS.values()
    )
    found["patch"] = set(_schema(doc, "SchedulePatch")["properties"]) ^ set(
        client_core.PATCH_FIELDS.values()
    )
    found["selector"] = set(_schema(doc, "Selector")["properties"]) ^ set(
        client_core.SELECTOR_FIELDS.values()
    )
    found["list"] = _query(doc, "/v1/schedules", "get") ^ set(client_core.LIST_PARAMETERS.values())
    found["history"] = _query(doc, "/v1/schedules/{schedule_id}/history", "get") ^ {
        "tenant",
        "limit",
    }
    return {kind: diff for kind, diff in found.items() if diff}


def test_the_client_has_every_route_field_parameter_and_error_code() -> None:
    assert differences(document(), ERROR_CODES) == {}


def test_the_routes_the_client_knows_are_those_the_node_serves() -> None:
    config = node_config.load({"node_id": "doc", "chaos_mode": "on", "gossip_unsigned": "on"}, {})
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in build_app(Node(config)).router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    assert served == set(ROUTES), served ^ set(ROUTES)


def _planted(what: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    doc, codes = copy.deepcopy(document()), ERROR_CODES
    if what == "route":
        doc["paths"]["/v1/schedules/{schedule_id}"]["put"] = {"responses": {}}
    elif what == "path":
        doc["paths"]["/v1/schedules/{schedule_id}:snooze"] = {"post": {"responses": {}}}
    elif what == "schedule field":
        doc["components"]["schemas"]["Schedule"]["properties"]["snoozedAt"] = {}
    elif what == "create field":
        doc["components"]["schemas"]["NewSchedule"]["properties"]["snooze"] = {}
    elif what == "list parameter":
        doc["paths"]["/v1/schedules"]["get"]["parameters"].append(
            {"name": "snoozed", "in": "query"}
        )
    elif what == "error code":
        codes = (*codes, "snoozed")
    return doc, codes


@pytest.mark.parametrize(
    "what",
    ["route", "path", "schedule field", "create field", "list parameter", "error code"],
)
def test_a_route_field_or_code_added_to_the_server_alone_is_found(what: str) -> None:
    doc, codes = _planted(what)
    assert differences(doc, codes) != {}


def test_every_route_is_a_method_of_both_clients_with_the_same_parameters() -> None:
    for name in set(ROUTES.values()):
        sync, awaited = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(sync).parameters.keys() == (
            inspect.signature(awaited).parameters.keys()
        ), name
        assert inspect.iscoroutinefunction(awaited) or inspect.isasyncgenfunction(awaited), name
        assert not inspect.iscoroutinefunction(sync), name


def test_the_typed_fields_are_the_wire_names_they_map() -> None:
    assert set(client_core.NewSchedule.__annotations__) == set(client_core.CREATE_FIELDS)
    assert set(client_core.SchedulePatch.__annotations__) == set(client_core.PATCH_FIELDS)
    selector = set(client_core.Selector.__annotations__) | {"dry_run"}
    assert selector == set(client_core.SELECTOR_FIELDS)
    listing = set(client_core.ListFilters.__annotations__) | {"limit", "after", "counts"}
    assert listing == set(client_core.LIST_PARAMETERS)
