"""The chaos run's webhook receiver (``chaos/lab/receiver.py``), served in
process: what each mode answers and what it logs, the signatures checked
against the node's own signing; and its log read back as deliveries
(``chaos/receipts.py``)."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from chaos.history import HTTP, occurrence
from chaos.lab.receiver import CONTROL, SLOW, Endpoint, application, digest
from chaos.receipts import ReceiverLog, receipt
from node.schedule.webhook import HttpCall, new_secret, secret_key, signed_headers

SECRET = new_secret()
KEY = secret_key(SECRET)
EXECUTE_AT = "2026-11-26T17:00:00.000Z"


def delivery_headers(schedule_id: str = "s1", body: bytes = b"17") -> dict[str, str]:
    """The headers a node sends for attempt 2 of ``schedule_id`` under token 7."""
    own = [
        ("schedule-id", schedule_id),
        ("execute-at", EXECUTE_AT),
        ("fence-token", "7"),
        ("attempt", "2"),
        ("tenant", "default"),
        ("content-type", "application/json"),
    ]
    call = HttpCall("http://x/hooks", "POST", own, body, 10.0, "default", "msg_1")
    return dict(own + signed_headers(call, [KEY], 1_790_000_000))


# What the receivers of these tests were asked to wait, in order.
HELD: list[float] = []


async def hold(seconds: float) -> None:
    """A slow answer's wait, noted instead of waited."""
    HELD.append(seconds)


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], io.StringIO]]:
    """A receiver checking SECRET's signatures, and its log."""
    log = io.StringIO()
    HELD.clear()
    async with TestClient(TestServer(application(Endpoint(log, KEY, hold)))) as client:
        yield client, log


def lines(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


async def test_up_takes_a_delivery_and_logs_it_before_it_answers(
    served: tuple[TestClient[Any, Any], io.StringIO],
) -> None:
    client, log = served
    answer = await client.put("/hooks/s1", data=b"17", headers=delivery_headers())
    assert answer.status == 200
    [line] = lines(log)
    assert {k: line[k] for k in ("status", "method", "path", "schedule_id", "attempt")} == {
        "status": 200,
        "method": "PUT",
        "path": "/hooks/s1",
        "schedule_id": "s1",
        "attempt": "2",
    }
    assert (line["fence_token"], line["execute_at"], line["webhook_id"]) == (
        "7",
        EXECUTE_AT,
        "msg_1",
    )
    assert line["digest"] == digest(b"17") and line["signed"] is True
    assert line["at"] <= line["answered"]


async def test_a_body_or_a_fenced_header_not_as_signed_fails_the_signatures(
    served: tuple[TestClient[Any, Any], io.StringIO],
) -> None:
    client, log = served
    await client.post("/hooks/s1", data=b"18", headers=delivery_headers())
    await client.post("/hooks/s1", data=b"17", headers={**delivery_headers(), "fence-token": "9"})
    assert [line["signed"] for line in lines(log)] == [False, False]


@pytest.mark.parametrize(("mode", "status"), [("503", 503), ("400", 400), ("up", 200)])
async def test_each_mode_answers_and_logs_its_status(
    served: tuple[TestClient[Any, Any], io.StringIO], mode: str, status: int
) -> None:
    client, log = served
    switched = await client.put(CONTROL, json={"mode": mode, "retry_after": 4})
    assert switched.status == 200
    answer = await client.post("/hooks/s1", data=b"17", headers=delivery_headers())
    assert answer.status == status
    assert answer.headers.get("Retry-After") == ("4" if mode == "503" else None)
    assert [line["status"] for line in lines(log)] == [status]


async def test_slow_answers_200_only_after_holding_the_request(
    served: tuple[TestClient[Any, Any], io.StringIO],
) -> None:
    client, log = served
    await client.put(CONTROL, json={"mode": "slow"})
    answer = await client.post("/hooks/s1", data=b"17", headers=delivery_headers())
    assert answer.status == 200 and HELD == [SLOW]
    assert [line["status"] for line in lines(log)] == [200]
    # Back up, nothing is held.
    await client.put(CONTROL, json={"mode": "up"})
    await client.post("/hooks/s1", data=b"17", headers=delivery_headers())
    assert HELD == [SLOW]


async def test_an_unknown_mode_is_refused_and_changes_nothing(
    served: tuple[TestClient[Any, Any], io.StringIO],
) -> None:
    client, log = served
    assert (await client.put(CONTROL, json={"mode": "down"})).status == 400
    assert (await client.post("/x", data=b"1", headers=delivery_headers())).status == 200
    assert len(lines(log)) == 1  # the control route is no delivery


# -- the log read back ---------------------------------------------------------------------


def line(status: int = 200, schedule_id: str = "s1", **fields: Any) -> dict[str, Any]:
    return {
        "at": 100.5,
        "answered": 100.6,
        "status": status,
        "schedule_id": schedule_id,
        "fence_token": "7",
        "attempt": "2",
        "execute_at": EXECUTE_AT,
        "webhook_id": "msg_1",
        "digest": "9f2c",
        "signed": True,
        **fields,
    }


def test_a_2xx_is_a_delivery_at_the_receiver_named_by_its_unit() -> None:
    got = receipt(line())
    assert got.delivery is not None and not got.refused
    d = got.delivery
    assert (d.schedule_id, d.token, d.attempt, d.at, d.sink) == ("s1", 7, 2, 100.5, HTTP)
    assert (d.digest, d.received, d.partition) == ("9f2c", 100.5, None)
    assert d.execute_at == datetime(2026, 11, 26, 17, tzinfo=UTC).timestamp()
    # A recurring schedule's request names its occurrence, as a record does.
    chained = receipt(line(schedule_id="chain1"), recurring={"chain1"}).delivery
    assert chained is not None and chained.schedule_id == occurrence("chain1", EXECUTE_AT)


def test_a_4xx_is_a_refusal_for_good_but_a_retried_one_or_a_5xx_is_not() -> None:
    assert [receipt(line(status)).refused for status in (400, 404, 408, 425, 429, 503)] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert all(receipt(line(status)).delivery is None for status in (400, 429, 503))


def test_a_request_without_the_schedulers_headers_is_nobodys() -> None:
    for bad in (line(schedule_id=""), line(fence_token=None), line(attempt="two")):
        got = receipt(bad)
        assert got.unit == "" and got.delivery is None


def test_the_log_is_read_as_it_grows_a_line_being_written_waits(tmp_path: Path) -> None:
    path = tmp_path / "receiver.jsonl"
    log = ReceiverLog(path, recurring={"chain1"})
    log.read()  # nothing written yet
    with path.open("w") as out:
        out.write(json.dumps(line()) + "\n")
        out.write(json.dumps(line(400, "s2")) + "\n")
        out.write(json.dumps(line(503, "s3")) + "\n")
        out.write(json.dumps(line(schedule_id="s4", signed=False)) + "\n")
        out.write(json.dumps(line(schedule_id=""))[:30])  # half a line
    log.read()
    assert log.units() == {"s1", "s4"}
    assert (log.refused, log.unsigned, log.unnamed) == ({"s2"}, {"s4"}, 0)
    assert dict(log.answers) == {200: 2, 400: 1, 503: 1}
    with path.open("a") as out:
        out.write(json.dumps(line(schedule_id=""))[30:] + "\n")
        out.write(json.dumps(line(schedule_id="chain1")) + "\n")
    log.read()
    assert log.unnamed == 1 and len(log.deliveries) == 3
    assert log.units() == {"s1", "s4", occurrence("chain1", EXECUTE_AT)}
