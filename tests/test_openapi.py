"""The OpenAPI document at /v1/openapi.json: valid OpenAPI 3.1, and it covers
every route and every error code the code has (and nothing it lacks)."""

from __future__ import annotations

import re
from pathlib import Path

from openapi_spec_validator import validate

from node import config as node_config
from node.api.app import build_app
from node.api.openapi import ERROR_CODES, document
from node.process import Node
from tests.conftest import NodeFactory

NODE_SOURCE = Path(__file__).parent.parent / "node"


def routes(chaos_mode: str) -> set[tuple[str, str]]:
    config = node_config.load({"node_id": "doc", "chaos_mode": chaos_mode}, {})
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
