"""node.store start-up: the pinned bucket count and idempotent indexes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from node.errors import BucketCountMismatch
from node.service import Node
from node.store import ScheduleStore
from tests.conftest import EmbeddedServers, make_config


async def test_prepare_is_idempotent_and_creates_the_indexes(mongo: Any) -> None:
    store = ScheduleStore(mongo, 64)
    await store.prepare(datetime.now(UTC))
    await store.prepare(datetime.now(UTC))
    indexes = await mongo.schedules.index_information()
    assert indexes["due_pending"]["key"] == [("dueAt", 1)]
    assert indexes["due_pending"]["partialFilterExpression"] == {"status": "PENDING"}
    assert indexes["due_pending_by_bucket"]["key"] == [("bucket", 1), ("dueAt", 1)]
    assert indexes["due_pending_by_bucket"]["partialFilterExpression"] == {"status": "PENDING"}
    assert indexes["in_flight"]["partialFilterExpression"] == {"status": "IN_FLIGHT"}
    assert indexes["by_tenant_id"]["key"] == [("tenant", 1), ("_id", 1)]
    assert await mongo.cluster.count_documents({}) == 1
    assert (await mongo.cluster.find_one({}))["buckets"] == 64


async def test_prepare_replaces_the_indexes_of_earlier_versions(mongo: Any) -> None:
    # Full indexes on status, as version 1 of the store created them.
    await mongo.schedules.create_index([("status", 1), ("dueAt", 1)], name="due")
    await mongo.schedules.create_index(
        [("bucket", 1), ("status", 1), ("dueAt", 1)], name="due_by_bucket"
    )
    await mongo.schedules.create_index([("tenant", 1), ("status", 1), ("_id", 1)], name="by_tenant")
    await ScheduleStore(mongo, 64).prepare(datetime.now(UTC))
    indexes = set(await mongo.schedules.index_information())
    assert indexes == {"_id_", "due_pending", "due_pending_by_bucket", "in_flight", "by_tenant_id"}


async def test_a_node_with_another_bucket_count_refuses_to_start(
    servers: EmbeddedServers, database_name: str
) -> None:
    first = Node(make_config(servers, database_name, buckets="16"))
    assert await first.start()
    await first.stop()

    other = Node(make_config(servers, database_name, buckets="32"))
    with pytest.raises(BucketCountMismatch) as caught:
        await other.start()
    message = str(caught.value)
    assert "BUCKETS is 32" in message
    assert "created with 16 buckets" in message
    assert other.http_port is None  # nothing was started
    await other.client.close()
