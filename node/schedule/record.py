"""The Kafka record a schedule becomes (DESIGN.md "Kafka record").

key = the schedule's key or its id; value = the payload bytes; headers carry
schedule-id, execute-at, fence-token, tenant and attempt (so a consumer can
drop repeats), the request id and traceparent of the call that made or last
changed it (``trace.py``), then the caller's headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.schedule.model import public_id
from node.schedule.payload import payload_of
from node.schedule.times import format_time
from node.schedule.trace import KAFKA_REQUEST_ID, delivery_headers


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def build_record(doc: dict[str, Any], token: int, attempt: int) -> Record:
    schedule_id = public_id(str(doc["_id"]))
    # An extra occurrence of a recurring schedule (a trigger) is for the
    # time it was asked for; its chain's executeAt is the next occurrence.
    triggered = doc.get("triggeredAt") if doc.get("recurrence") else None
    execute_at = triggered if triggered is not None else doc["executeAt"]
    headers: list[tuple[str, bytes]] = [
        ("schedule-id", schedule_id.encode()),
        ("execute-at", (format_time(execute_at) or "").encode()),
        ("fence-token", str(token).encode()),
        ("tenant", str(doc["tenant"]).encode()),
        ("attempt", str(attempt).encode()),
        *((name, value.encode()) for name, value in delivery_headers(doc, KAFKA_REQUEST_ID)),
    ]
    headers.extend((name, value.encode()) for name, value in (doc.get("headers") or {}).items())
    key = doc.get("key") or schedule_id
    return Record(topic=doc["topic"], key=str(key).encode(), value=payload_of(doc), headers=headers)
