"""The two sinks as one: a batch of Kafka records and HTTP calls published
at once, each result back in its item's place; and the dead letter a
failed delivery becomes (a record for DEAD_LETTER_TOPIC or a call to
DEAD_LETTER_URL, whatever the original's destination)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from node.delivery.sink import Failed, Sink, Trouble
from node.schedule.destination import SCHEDULER_HEADERS, is_http
from node.schedule.record import Record, build_record
from node.schedule.webhook import HttpCall, build_call

# How long a dead letter sent to DEAD_LETTER_URL may take (seconds).
DEAD_LETTER_TIMEOUT = 10.0


class Router:
    def __init__(self, kafka: Sink[Record], http: Sink[HttpCall] | None) -> None:
        self.kafka = kafka
        self.http = http

    async def publish(self, items: Sequence[Record | HttpCall]) -> list[Failed | None]:
        """Publish every item, Kafka and HTTP at once; one result per item."""
        records = [(i, item) for i, item in enumerate(items) if isinstance(item, Record)]
        calls = [(i, item) for i, item in enumerate(items) if isinstance(item, HttpCall)]
        results: list[Failed | None] = [None] * len(items)

        async def kafka() -> None:
            answers = await self.kafka.publish([r for _i, r in records])
            for (index, _r), answer in zip(records, answers, strict=True):
                results[index] = answer

        async def http() -> None:
            if self.http is None:
                for index, _c in calls:
                    results[index] = Failed("HTTP delivery is not configured", Trouble.REFUSED)
                return
            answers = await self.http.publish([c for _i, c in calls])
            for (index, _c), answer in zip(calls, answers, strict=True):
                results[index] = answer

        await asyncio.gather(*([kafka()] if records else []), *([http()] if calls else []))
        return results


def dead_letter_item(
    doc: dict[str, Any], token: int, attempt: int, error: str, topic: str, url: str
) -> Record | HttpCall:
    """What a schedule that failed for good becomes at the dead letter: its
    payload and the scheduler's headers, with where it was going
    (``original-topic`` or ``original-url``) and why it failed (``error``,
    one line of printable ASCII). A call to DEAD_LETTER_URL carries the
    scheduler's headers only: a Kafka record's own may not be HTTP headers."""
    if is_http(doc):
        where = ("original-url", str(doc["http"]["url"]))
    else:
        where = ("original-topic", str(doc["topic"]))
    if topic:
        # An http schedule has no record headers: the scheduler's alone.
        record = build_record({**doc, "topic": topic}, token, attempt)
        headers = [*record.headers, (where[0], where[1].encode()), ("error", error.encode())]
        return Record(topic, record.key, record.value, headers)
    call = build_call({**doc, "http": {"url": url, "timeout": DEAD_LETTER_TIMEOUT}}, token, attempt)
    own = [(n, v) for n, v in call.headers if n in SCHEDULER_HEADERS]
    return HttpCall(
        url=url,
        method="POST",
        headers=[*own, where, ("error", error)],
        body=call.body,
        timeout=DEAD_LETTER_TIMEOUT,
        tenant=call.tenant,
        webhook_id=call.webhook_id,
        trusted=True,
    )
