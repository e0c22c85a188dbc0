"""``python -m node tail TOPIC``: print delivered records as JSON lines.

The embedded broker serves aiokafka but not librdkafka-based tools (kcat,
confluent-kafka) or kafka-python, so the project brings its own reader.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import IO, Any

from aiokafka import AIOKafkaConsumer


def render(record: Any) -> str:
    def text(raw: bytes | None) -> str | None:
        if raw is None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode()

    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": text(record.key),
            "headers": {name: text(value) for name, value in record.headers},
            "value": text(record.value),
        },
        ensure_ascii=False,
    )


def topic_consumer(bootstrap: str, topic: str, *, from_beginning: bool = True) -> AIOKafkaConsumer:
    """A reader of one topic outside any consumer group, from its oldest
    record (or the next one), for the tail command, tests, benches and chaos."""
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_auto_commit=False,
        group_id=None,
        # A topic created after we subscribed is seen within half a second.
        metadata_max_age_ms=500,
    )


async def tail(
    topic: str,
    bootstrap: str,
    *,
    from_beginning: bool,
    count: int | None,
    idle_timeout: float | None,
    out: IO[str] = sys.stdout,
) -> int:
    consumer = topic_consumer(bootstrap, topic, from_beginning=from_beginning)
    await consumer.start()
    seen = 0
    loop = asyncio.get_running_loop()
    last = loop.time()
    try:
        while count is None or seen < count:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    print(render(record), file=out, flush=True)
                    seen += 1
                    last = loop.time()
            if idle_timeout is not None and loop.time() - last > idle_timeout:
                break
    finally:
        await consumer.stop()
    return 0
