"""node.schedules: request validation is pure and names the faulty field."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.api.views import public_view
from node.errors import ValidationFailed
from node.schedule.model import Limits, Status, is_storage_id
from node.schedule.parse import MAX_DEPTH, parse_json, parse_new_schedule
from node.store.documents import schedule_document
from ring import bucket_for

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
LIMITS = Limits(max_payload_bytes=1024, horizon=timedelta(days=30))


def body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"topic": "orders", "executeAt": "2030-01-01T12:00:05Z", "payload": {}}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def parse(raw: bytes) -> Any:
    return parse_new_schedule(raw, LIMITS, NOW)


def test_minimal_request() -> None:
    new = parse(body())
    assert new.topic == "orders"
    assert new.tenant == "default"
    assert new.execute_at == datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
    assert new.payload == b"{}"
    assert not new.client_id
    assert len(new.id) == 32


def test_offsets_are_normalised_to_utc_milliseconds() -> None:
    new = parse(body(executeAt="2030-01-01T14:00:05.123456+02:00"))
    assert new.execute_at == datetime(2030, 1, 1, 12, 0, 5, 123000, tzinfo=UTC)


def test_base64_payload_is_decoded() -> None:
    new = parse(body(payload=..., payloadBase64=base64.b64encode(b"\x00\xff").decode()))
    assert new.payload == b"\x00\xff"
    assert new.payload_format == "base64"


def test_fingerprint_ignores_id_but_not_content() -> None:
    a = parse(body(id="a"))
    assert a.fingerprint() == parse(body(id="b")).fingerprint()
    assert a.fingerprint() != parse(body(id="a", payload={"x": 1})).fingerprint()
    # Same instant written with another offset is the same request.
    assert (
        parse(body(executeAt="2030-01-01T13:00:05+01:00")).fingerprint()
        == parse(body(executeAt="2030-01-01T12:00:05Z")).fingerprint()
    )


@pytest.mark.parametrize(
    ("raw", "field", "status"),
    [
        (b"{not json", None, 400),
        (b"[1,2]", None, 400),
        (b'{"topic":"t","executeAt":"2030-01-01T12:00:05Z","payload":NaN}', None, 400),
        (body(extra=1), "extra", 400),
        (body(topic=...), "topic", 400),
        (body(topic="has space"), "topic", 400),
        (body(topic=".."), "topic", 400),
        (body(topic="x" * 250), "topic", 400),
        (body(topic=5), "topic", 400),
        (body(executeAt=...), "executeAt", 400),
        (body(executeAt="2030-01-01T12:00:05"), "executeAt", 400),  # naive
        (body(executeAt="2030-01-01 12:00:05Z"), "executeAt", 400),
        (body(executeAt="2030-02-30T12:00:05Z"), "executeAt", 400),
        (body(executeAt="tomorrow"), "executeAt", 400),
        (body(executeAt=1893499205), "executeAt", 400),
        (body(executeAt="2031-01-01T12:00:05Z"), "executeAt", 400),  # past the horizon
        (body(payload=...), "payload", 400),
        (body(payloadBase64="AAAA"), "payload", 400),  # both
        (body(payload=..., payloadBase64="***"), "payloadBase64", 400),
        (body(payload="x" * 2000), "payload", 413),
        (
            body(payload=..., payloadBase64=base64.b64encode(b"x" * 1025).decode()),
            "payloadBase64",
            413,
        ),
        (body(id=""), "id", 400),
        (body(id="a/b"), "id", 400),
        (body(id="x" * 129), "id", 400),
        (body(id=7), "id", 400),
        (body(tenant="a b"), "tenant", 400),
        (body(key=5), "key", 400),
        (body(key="k" * 1025), "key", 400),
        (body(headers=["a"]), "headers", 400),
        (body(headers={"a": 1}), "headers", 400),
        (body(headers={"fence-token": "9"}), "headers", 400),
        (body(headers={"Schedule-Id": "x"}), "headers", 400),
        # `$` matches before a trailing newline: the patterns must match whole
        (body(id="order-1\n"), "id", 400),
        (body(topic="orders\n"), "topic", 400),
        (body(tenant="billing\n"), "tenant", 400),
        # times that leave datetime's range once made UTC
        (body(executeAt="0001-01-01T00:00:00+01:00"), "executeAt", 400),
        (body(executeAt="9999-12-31T23:59:59-01:00"), "executeAt", 400),
        (
            body(executeAt=..., recurrence={"every": "PT1H", "start": "9999-12-31T23:59:59-01:00"}),
            "recurrence.start",
            400,
        ),
        (body(key="k\x00"), "key", 400),
        (body(headers={"trace": "a\x00b"}), "headers", 400),
    ],
)
def test_bad_input_names_the_field(raw: bytes, field: str | None, status: int) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse(raw)
    assert caught.value.field == field
    assert caught.value.status == status
    assert caught.value.message


def test_a_time_without_offset_is_refused_with_the_callers_own_time_fixed() -> None:
    """The suggestion is the caller's time with an offset, which the horizon
    then takes; never a made-up date that would fail it in turn."""
    with pytest.raises(ValidationFailed) as caught:
        parse(body(executeAt="2030-01-01T12:00:05"))
    assert caught.value.field == "executeAt"
    assert "2030-01-01T12:00:05Z" in caught.value.message
    fixed = parse(body(executeAt="2030-01-01T12:00:05Z"))  # as suggested: accepted
    assert fixed.execute_at == datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
    with pytest.raises(ValidationFailed) as other:
        parse(body(executeAt="tomorrow"))
    assert "YYYY-MM-DDTHH:MM:SSZ" in other.value.message
    assert not any(str(year) in other.value.message for year in range(2000, 2100))


def test_past_times_are_accepted_and_due_at_once() -> None:
    new = parse(body(executeAt="2000-01-01T00:00:00Z"))
    doc = schedule_document(new, 256, NOW)
    assert doc["dueAt"] == doc["executeAt"] < NOW


def test_document_and_public_view() -> None:
    new = parse(body(id="order-1:timeout", key="k", headers={"trace": "t1"}, payload=[1, "two"]))
    doc = schedule_document(new, 256, NOW)
    assert doc["_id"] == "order-1:timeout"
    assert doc["bucket"] == bucket_for("order-1:timeout", 256)
    assert doc["status"] == Status.PENDING
    assert doc["token"] == 0
    view = public_view(doc)
    assert view == {
        "id": "order-1:timeout",
        "tenant": "default",
        "topic": "orders",
        "executeAt": "2030-01-01T12:00:05.000Z",
        "bucket": doc["bucket"],
        "status": "PENDING",
        "attempts": 0,
        "deliveredAt": None,
        "lastError": None,
        "key": "k",
        "headers": {"trace": "t1"},
        "createdAt": "2030-01-01T12:00:00.000Z",
        "labels": {},
        "priority": 5,
        "version": 1,
        "payload": [1, "two"],
        "payloadBytes": len(b'[1,"two"]'),
    }


# -- header names: what the store can hold and Kafka should get ------------------


@pytest.mark.parametrize(
    "name",
    [
        "a\x00b",
        "\x00",
        "",
        "$set",
        "$",
        "a.b",
        ".",
        "a b",
        "tab\there",
        "caf\u00e9",
        "x" * 257,
        "\x7f",
    ],
)
def test_a_header_name_the_store_cannot_hold_is_refused(name: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse(body(headers={name: "v"}))
    assert (caught.value.field, caught.value.status) == ("headers", 400)


@pytest.mark.parametrize(
    "name", ["trace", "X-B3-TraceId", "a$", "__TypeId__", "x" * 256, "!#%&'*+-^_`|~"]
)
def test_header_names_of_printable_ascii_are_kept(name: str) -> None:
    assert parse(body(headers={name: "v\u00e9"})).headers == {name: "v\u00e9"}


# -- what JSON a body may be -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"topic": "t", "payload": "\\ud800"}', "payload"),
        (b'{"topic": "t", "payload": {"\\udc00": 1}}', "payload"),
        (b'{"topic": "t", "payload": {"list": [1, "x\\udfff"]}}', "payload"),
        (b'{"topic": "t", "headers": {"a": "\\ud83d"}}', "headers"),  # half an emoji
        (b'{"topic": "t", "headers": {"\\ud83d": "a"}}', "headers"),
        (b'{"topic": "t", "key": "\\udbff"}', "key"),
        (b'{"topic": "\\ud800"}', "topic"),
        (b'{"\\ud800": 1}', None),  # a top-level member name: no field to name
        (b'"\\ud800"', None),
        (b'{"topic": "t", "payload": "\xed\xa0\x80"}', None),  # the surrogate as UTF-8 bytes
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(raw: bytes, field: str | None) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_json(raw)
    assert (caught.value.field, caught.value.status) == (field, 400)
    # The message is plain text: it never echoes the surrogate itself.
    caught.value.message.encode()


def test_a_surrogate_pair_is_text() -> None:
    new = parse(b'{"topic": "t", "executeAt": "2030-01-01T12:00:05Z", "payload": "\\ud83d\\ude00"}')
    assert new.payload == '"\U0001f600"'.encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_is_bounded_and_never_reaches_the_recursion_limit() -> None:
    assert parse_json(b"5") == 5 and parse_json(b"null") is None
    parse_json(nested(MAX_DEPTH).encode())
    for depth in (MAX_DEPTH + 1, 1000, 100_000):
        with pytest.raises(ValidationFailed) as caught:
            parse_json(nested(depth).encode())
        assert caught.value.status == 400 and "deeper than 64" in caught.value.message
    raw = f'{{"topic": "t", "payload": {nested(MAX_DEPTH)}}}'.encode()
    with pytest.raises(ValidationFailed) as caught:
        parse_json(raw)
    assert caught.value.field == "payload"


def test_a_stored_id_is_what_storage_id_makes() -> None:
    assert is_storage_id("order-1") and is_storage_id("billing/order-1")
    for bad in ("default/order-1", "a/b/c", "order-1\n", "x\x00", "/order-1", "billing/", "\ud800"):
        assert not is_storage_id(bad), bad
