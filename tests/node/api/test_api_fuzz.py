"""The HTTP API fuzzed from its own OpenAPI document, with schemathesis.

A node runs in the test's event loop; schemathesis (blocking ``requests``)
runs in a thread against it. Every operation of /v1/openapi.json is called
with cases schemathesis generates from the document, valid ones and invalid
ones, and on top of them a hostile layer of values schemathesis never
generates: lone surrogates (it cannot encode them; a JSON body carries them
as ``\\ud800`` escapes), JSON nested past any bound and past the interpreter's
recursion limit, NUL, look-alike slashes, oversize strings, times that
overflow once made UTC, digits that only ``str.isdigit`` takes. A hostile
body value is planted mostly in a valid body (VALID_BODIES), so that it gets
past the first check that would refuse a generated body anyway.

Every response must be documented: never a 500, no other 5xx unless the
operation documents it (``/readyz``'s 503, the store's 503), a documented
status and content type, a body matching its schema (errors in the error
shape), invalid data refused with a 4xx, and a body with a lone surrogate or
nested past MAX_DEPTH refused with a 400 or 413.

Derandomized (the same cases every run) and bounded: MAX_EXAMPLES per
operation and mode, no shrinking (a failure names its case and a curl
command instead); about 15 s for the file on two cores.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import CheckContext
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from node.schedule.parse import MAX_DEPTH
from node.store.tenants import TenantStore
from node.tenants.model import Tenant
from tests.conftest import EmbeddedServers, NodeFactory

# Per operation and generation mode (positive, negative).
MAX_EXAMPLES = 40
MAX_EXAMPLES_AUTH_ON = 12
HORIZON = str(100 * 366 * 86400)  # the most allowed: more generated times pass
# Nesting depths: just past MAX_DEPTH; past the interpreter's recursion limit
# (about 1,000, but Hypothesis raises it to some 2,100 while it runs, for the
# whole process); far past it, yet under a schedule's body limit.
DEPTHS = (MAX_DEPTH + 1, 1500, 3000, 20000)
# Lone surrogates: only a JSON body can carry them (as escapes), not a URL.
SURROGATES = ("\ud800", "a\udfffb")
HOSTILE = (
    *SURROGATES,
    "\x00",
    "nul\x00inside",
    "\u00b2",  # a digit to str.isdigit(), not to int()
    "billing\uff0forder-1",  # a fullwidth solidus
    "billing/order-1",
    "billing%2Forder-1",
    "$where",
    "a.b",
    "x" * 5000,
    "trailing\n",
    "0001-01-01T00:00:00+01:00",  # before year 1 once made UTC
    "9999-12-31T23:59:59-01:00",  # after year 9999 once made UTC
)
# Replaced, once the body is JSON text, by the deep nesting.
_DEEP_MARKER = "\x00deep-nesting\x00"
# Valid bodies to plant hostile values in (most generated ones are refused
# early, for a topic or a time, before the code that chokes is reached). The
# node's horizon is raised to 100 years, so 2030 is in range.
_SCHEDULE = {
    "id": "fuzz-1",
    "topic": "fuzz.hostile",
    "executeAt": "2030-01-01T09:00:00Z",
    "payload": {"order": 1, "note": "send the reminder", "lines": [{"sku": "a-1"}]},
    "key": "order-1",
    "headers": {"trace-id": "4bf92f35"},
}
VALID_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/schedules"): _SCHEDULE,
    ("POST", "/v1/schedules:batch"): {
        "schedules": [
            _SCHEDULE,
            {
                "topic": "fuzz.hostile",
                "recurrence": {"every": "P1D", "start": "2030-01-01T09:00:00Z"},
                "retry": {"maxAttempts": 3, "initialBackoff": "PT1S"},
                "payloadBase64": "aGVsbG8=",
            },
        ]
    },
    ("POST", "/v1/internal/wake"): {
        "bucket": 3,
        "dueAt": "2030-01-01T09:00:00Z",
        "from": "node-b",
        "sentAt": "2030-01-01T08:59:59.500Z",
    },
    ("PUT", "/v1/chaos/partition"): {"blocked": ["127.0.0.1:1"]},
    ("PATCH", "/v1/schedules/{schedule_id}"): {
        "executeAt": "2030-01-02T09:00:00Z",
        "payload": {"order": 2},
        "labels": {"training": "t-1"},
        "expireAfter": "PT90M",
    },
    ("POST", "/v1/schedules:cancel"): {
        "labels": {"training": "t-1"},
        "key": "order-1",
        "dueBefore": "2030-01-02T09:00:00Z",
    },
}


UNSIGNED = {"cluster_keys": "", "gossip_unsigned": "on"}


@dataclass(frozen=True)
class Hostile:
    what: str
    must_refuse: bool  # a lone surrogate or nesting past MAX_DEPTH: a 400 or 413


def no_server_error(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """No 500, and no other 5xx unless the operation documents it."""
    status = response.status_code
    if status == 500 or (
        status >= 500 and str(status) not in case.operation.responses.status_codes
    ):
        raise AssertionError(f"{status} {response.text[:300]!r}")
    return None


CHECKS: list[Callable[..., bool | None]] = [
    no_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Without the check that invalid data is refused: a batch answers 200 with a
# verdict per item (whose status the schema checks), and a hostile value need
# not be invalid ("a.b" is a fine payload string), which the Hostile oracle
# judges instead.
LENIENT_CHECKS = [check for check in CHECKS if check is not negative_data_rejection]


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths to every node of a JSON value, the root first."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_slots(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_slots(item, (*path, index)))
    return found


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


def _as_bytes(body: Any, depth: int = 0) -> bytes:
    """The body as JSON text, sent as it is: lone surrogates as escapes
    (``json.dumps`` escapes all but ASCII), the marker as deep nesting."""
    text = json.dumps(body)
    return text.replace(json.dumps(_DEEP_MARKER), "[" * depth + "]" * depth).encode()


def make_hostile(case: Any, data: st.DataObject) -> Hostile | None:
    """Maybe make one part of ``case`` hostile (drawn, so reproducible): in
    its body (the generated one, or more often a valid one), its query or
    its path."""
    kinds = [None, None, "surrogate", "deep", "string", "member", "query", "path"]
    kind = data.draw(st.sampled_from(kinds))
    in_url = [s for s in HOSTILE if s not in SURROGATES]  # a URL cannot carry them
    if kind in {"surrogate", "deep", "string", "member"}:
        body = case.body
        valid = VALID_BODIES.get((case.method.upper(), case.path))
        if valid is not None and data.draw(st.sampled_from([True, True, True, False])):
            body = valid
        if not isinstance(body, dict | list):
            return None
        where = data.draw(st.sampled_from(_slots(body)))
        place = _get(body, where)
        if kind == "deep":
            depth = data.draw(st.sampled_from(DEPTHS))
            case.body = _as_bytes(_replace(body, where, _DEEP_MARKER), depth)
            return Hostile(f"{depth} levels at {where}", must_refuse=True)
        new = data.draw(st.sampled_from(SURROGATES if kind == "surrogate" else in_url))
        if kind == "member" or (kind == "surrogate" and isinstance(place, dict)):
            if not isinstance(place, dict):
                return None
            case.body = _as_bytes(_replace(body, where, {**place, new: "x"}))
            return Hostile(f"member {new!r} in {where}", must_refuse=kind == "surrogate")
        case.body = _as_bytes(_replace(body, where, new))
        return Hostile(f"{new!r} at {where}", must_refuse=kind == "surrogate")
    if kind == "query" and case.operation.query:
        name = data.draw(st.sampled_from(sorted(p.name for p in case.operation.query)))
        case.query = {**(case.query or {}), name: data.draw(st.sampled_from(in_url))}
        return Hostile(f"query {name}={case.query[name]!r}", must_refuse=False)
    if kind == "path" and case.path_parameters:
        name = data.draw(st.sampled_from(sorted(case.path_parameters)))
        case.path_parameters = {**case.path_parameters, name: data.draw(st.sampled_from(in_url))}
        return Hostile(f"path {name}={case.path_parameters[name]!r}", must_refuse=False)
    return None


def fuzz(url: str, headers: dict[str, str], max_examples: int) -> list[str]:
    """Fuzz every operation of the node at ``url``; the failures, described."""
    document = requests.get(url + "/v1/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    # The key, if any, is the caller's (``headers``): schemathesis neither
    # makes one up nor leaves it out.
    schema.config.generation.update(with_security_parameters=False)
    # Invalid data may be refused for its size too.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    operations = [result.ok() for result in schema.get_all_operations()]
    # A drained node answers differently (409 to the next drain, 503 to
    # /readyz): drain last.
    operations.sort(key=lambda op: op.path == "/v1/admin/drain")
    failures: list[str] = []
    with requests.Session() as session:
        for operation in operations:
            for mode in schemathesis.GenerationMode:
                try:
                    _fuzz_operation(operation, mode, url, session, headers, max_examples)
                except hypothesis.errors.Unsatisfiable:
                    pass  # nothing invalid to generate (an operation without parameters)
                except AssertionError as exc:
                    failures.append(str(exc))
    return failures


def _fuzz_operation(
    operation: Any,
    mode: schemathesis.GenerationMode,
    url: str,
    session: requests.Session,
    headers: dict[str, str],
    max_examples: int,
) -> None:
    batch = operation.path == "/v1/schedules:batch"

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: bounded time
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        hostile = make_hostile(case, data)
        checks = LENIENT_CHECKS if batch or hostile else CHECKS
        try:
            response = case.call(base_url=url, session=session, headers=headers)
            case.validate_response(response, checks=checks, headers=headers)
            if hostile and hostile.must_refuse and response.status_code not in (400, 413):
                raise AssertionError(f"accepted: {response.status_code} {response.text[:300]}")
        except (Exception, BaseExceptionGroup) as exc:
            report = f"{operation.label} [{mode.value}] {hostile.what if hostile else ''}\n{exc}"
            raise AssertionError(report[:3000]) from None

    run()


async def test_every_operation_answers_as_documented_under_fuzzing(
    start_node: NodeFactory,
) -> None:
    # Unsigned (GOSSIP_UNSIGNED), so the wake route is open and the fuzz
    # reaches its parser: signed, every hostile hint is a 401 before it is read.
    node = await start_node(chaos_mode="on", max_payload_bytes="4096", horizon=HORIZON, **UNSIGNED)
    failures = await asyncio.to_thread(fuzz, node.url, {}, MAX_EXAMPLES)
    assert not failures, "\n\n".join(failures)


@pytest.fixture
async def admin_key(servers: EmbeddedServers, database_name: str) -> Any:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(servers.mongo_uri, tz_aware=True)
    tenants = TenantStore(client[database_name])
    await tenants.prepare()
    yield await tenants.add(Tenant(name="fuzz-ops", admin=True), datetime.now(UTC))
    await client.close()


async def test_every_operation_answers_as_documented_under_fuzzing_with_auth_on(
    start_node: NodeFactory, admin_key: str
) -> None:
    node = await start_node(
        auth="on", chaos_mode="on", max_payload_bytes="4096", horizon=HORIZON, **UNSIGNED
    )
    bearer = {"Authorization": f"Bearer {admin_key}"}
    failures = await asyncio.to_thread(fuzz, node.url, bearer, MAX_EXAMPLES_AUTH_ON)
    assert not failures, "\n\n".join(failures)
