"""How the API shows what is stored: a schedule, and one attempt of its
history. The one place a stored document becomes a response body."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

from node.schedule.changes import version_of
from node.schedule.destination import http_view
from node.schedule.flow import flow_of
from node.schedule.model import Status, labels_of, priority_of, public_id
from node.schedule.payload import SIZE, payload_of, payload_size
from node.schedule.recurrence import Recurrence
from node.schedule.retry import RetryPolicy
from node.schedule.times import format_duration, format_time
from node.schedule.trace import REQUEST_ID_FIELD, TRACEPARENT_FIELD


def _recurrence_view(doc: dict[str, Any]) -> dict[str, Any]:
    live = doc["status"] in {Status.PENDING.value, Status.PAUSED.value, Status.IN_FLIGHT.value}
    return {
        "recurrence": Recurrence.from_document(doc["recurrence"]).to_view(),
        # executeAt is the occurrence under way or due next; none once ended.
        "nextExecuteAt": format_time(doc["executeAt"]) if live else None,
        "occurrences": doc.get("occurrences", 0),
        "skippedOccurrences": doc.get("skippedOccurrences", 0),
        "lastOccurrences": [
            {
                "executeAt": format_time(o["executeAt"]),
                "outcome": o["outcome"],
                "at": format_time(o["at"]),
                "attempts": o.get("attempts", 0),
                "error": o.get("error"),
            }
            for o in reversed(doc.get("recent") or [])
        ],
    }


def _destination_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The one destination: ``topic``, or ``http``."""
    if doc.get("http"):
        return {"http": http_view(doc["http"])}
    return {"topic": doc["topic"]}


def public_view(doc: dict[str, Any], *, with_payload: bool = True) -> dict[str, Any]:
    """The schedule as the API shows it; without its payload when the read
    left the payload out (a listing's basic view)."""
    view: dict[str, Any] = {
        "id": public_id(doc["_id"]),
        "tenant": doc["tenant"],
        **_destination_view(doc),
        "executeAt": format_time(doc["executeAt"]),
        "bucket": doc["bucket"],
        "status": doc["status"],
        "attempts": doc.get("attempts", 0),
        "deliveredAt": format_time(doc.get("deliveredAt")),
        "lastError": doc.get("lastError"),
        "key": doc.get("key"),
        "headers": doc.get("headers") or {},
        "createdAt": format_time(doc.get("createdAt")),
        "labels": labels_of(doc.get("labels")),
        "priority": priority_of(doc),
        "version": version_of(doc),
    }
    if doc.get("expireAfterMs") is not None:
        view["expireAfter"] = format_duration(timedelta(milliseconds=doc["expireAfterMs"]))
        view["deadline"] = format_time(doc.get("deadline"))
    for name in (REQUEST_ID_FIELD, TRACEPARENT_FIELD):  # the call that made or last changed it
        if doc.get(name) is not None:
            view[name] = doc[name]
    for name in ("pausedAt", "cancelledAt", "expiredAt", "triggeredAt"):
        if doc.get(name) is not None:
            view[name] = format_time(doc[name])
    if doc["status"] == Status.PENDING.value and doc.get("dueAt") != doc["executeAt"]:
        view["nextAttemptAt"] = format_time(doc.get("dueAt"))
    if doc.get("retry"):
        view["retry"] = RetryPolicy.from_document(doc["retry"]).to_view()
    if (flow := flow_of(doc)) is not None:
        view["flowControl"] = flow.to_view()
    if doc.get("recurrence"):
        view.update(_recurrence_view(doc))
    if not with_payload:
        # A document stored before payloadBytes existed has no size but its
        # payload, which this read left out: its size is not known here.
        if SIZE in doc:
            view["payloadBytes"] = doc[SIZE]
        return view
    view["payloadBytes"] = payload_size(doc)
    payload = payload_of(doc)
    if doc.get("payloadFormat") == "json":
        view["payload"] = json.loads(payload)
    else:
        view["payloadBase64"] = base64.b64encode(payload).decode()
    return view


def delivered_record(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A delivered or expired one-shot schedule's end, as a history record,
    from the schedule itself (history does not store it)."""
    if doc.get("recurrence"):
        return None
    if doc["status"] == Status.DELIVERED.value:
        at, outcome, error = doc.get("deliveredAt"), "delivered", None
    elif doc["status"] == Status.EXPIRED.value:
        deadline = format_time(doc.get("deadline"))
        error = f"not published by its deadline {deadline}"
        at, outcome = doc.get("expiredAt"), "expired"
    else:
        return None
    return {
        "at": format_time(at),
        "executeAt": format_time(doc["executeAt"]),
        "attempt": doc.get("attempts", 0),
        "outcome": outcome,
        "node": doc.get("owner"),
        "token": doc.get("token", 0),
        "error": error,
        "requestId": doc.get(REQUEST_ID_FIELD),
    }


def public_record(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "at": format_time(doc["at"]),
        "executeAt": format_time(doc["executeAt"]),
        "attempt": doc["attempt"],
        "outcome": doc["outcome"],
        "node": doc["node"],
        "token": doc["token"],
        "error": doc.get("error"),
        "requestId": doc.get(REQUEST_ID_FIELD),
    }
