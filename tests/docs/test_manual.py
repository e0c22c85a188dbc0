"""The manual (docs/) against the code: the API page lists every route and
every error code the OpenAPI document has, with each code's status as its
error class suggests it, and its receiver's check of a delivery takes what a
node signs; the session and figures checks are in
test_readme_session.py and test_figures.py, the settings table's in
test_config.py."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import standardwebhooks

from node import errors
from node.api.openapi import ERROR_CODES, document
from node.schedule.webhook import build_call, new_secret, secret_key, signed_headers
from tests.helpers import ROOT, fenced_blocks

API_PAGE = ROOT / "docs" / "api.md"


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def listed_routes(text: str) -> set[tuple[str, str]]:
    """(method, path) of every route the API page's table names. A cell may
    name several: "`POST /v1/schedules/{id}:pause`, `:resume`" (a verb on the
    same path) and "`GET /healthz`, `/readyz`" (another path, same method)."""
    found = set()
    for row in table_rows(text, "| call | meaning |"):
        method, base = "", ""
        for name in re.findall(r"`([^`]+)`", row[0]):
            if " " in name:
                method, path = name.split(" ", 1)
                base = path.split(":")[0] if ":" in path.rsplit("/", 1)[-1] else path
            elif name.startswith(":"):
                path = base + name
            else:
                path = name
            path = path.split("?")[0].replace("{id}", "{schedule_id}")
            found.add((method.lower(), path))
    return found


def documented_routes() -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in document()["paths"].items()
        for method in item
        if method != "parameters"
    }


def test_the_api_page_lists_every_route_and_no_other() -> None:
    listed = listed_routes(API_PAGE.read_text())
    assert ("post", "/v1/schedules/{schedule_id}:resume") in listed
    assert ("get", "/metrics") in listed
    assert listed == documented_routes(), listed ^ documented_routes()


def test_the_api_page_lists_every_error_code_with_its_status() -> None:
    rows = table_rows(API_PAGE.read_text(), "| code | status |")
    codes = {row[0].strip("`"): row[1] for row in rows}
    assert set(codes) == set(ERROR_CODES), set(codes) ^ set(ERROR_CODES)
    classes = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.SchedulerError)
    ]
    suggested = {cls.code: cls.status_hint for cls in classes if cls.status_hint}
    assert len(suggested) >= 15
    for code, status in suggested.items():
        assert codes[code] == str(status), (code, codes[code], status)


def test_a_route_missing_from_the_page_is_seen() -> None:
    text = API_PAGE.read_text()
    line = next(line for line in text.splitlines() if line.startswith("| `GET /v1/cluster/counts`"))
    assert ("get", "/v1/cluster/counts") not in listed_routes(text.replace(line + "\n", ""))


# -- the receiver's check of a delivery -------------------------------------------


def receivers_accept() -> Callable[..., bool]:
    """``accept`` as the API page writes it (the block it marks checked here)."""
    [block] = [b for b in fenced_blocks(API_PAGE) if b.marker.startswith("<!-- checked:")]
    namespace: dict[str, Any] = {}
    exec(compile(block.text, f"{API_PAGE}:{block.line}", "exec"), namespace)
    accept: Callable[..., bool] = namespace["accept"]
    return accept


def signed_delivery(secret: str, token: int) -> tuple[dict[str, str], bytes]:
    """A delivery of token ``token`` as a node builds and signs it."""
    doc = {"_id": "order-1", "tenant": "default", "http": {"url": "https://hooks.example/o"},
           "executeAt": datetime(2030, 1, 1, tzinfo=UTC), "payload": b'{"order": 42}',
           "createdAt": datetime(2029, 12, 31, tzinfo=UTC)}  # fmt: skip
    call = build_call(doc, token, attempt=1)
    headers = [*call.headers, *signed_headers(call, [secret_key(secret)], int(time.time()))]
    return dict(headers), call.body


def test_the_api_pages_receiver_accepts_a_delivery_and_refuses_a_stale_owner() -> None:
    accept, secret = receivers_accept(), new_secret()
    highest: dict[str, int] = {}
    headers, body = signed_delivery(secret, token=7)
    assert accept(secret, body, headers, highest) and highest == {headers["schedule-id"]: 7}
    stale_headers, stale_body = signed_delivery(secret, token=6)  # a former owner, later
    assert not accept(secret, stale_body, stale_headers, highest)
    forged = {**headers, "fence-token": "9"}  # a token the node did not sign
    assert not accept(secret, body, forged, highest)
    assert highest == {headers["schedule-id"]: 7}
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        accept(secret, b'{"order": 43}', headers, highest)  # the body changed
