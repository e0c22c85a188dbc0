"""The designs a team would otherwise build, as worker processes the delivery
suite runs beside the scheduler on the same store, broker and workloads:

``python -m bench.baselines KIND --mongo-uri URI --database DB --bootstrap HOST:PORT --name W``

* ``fua``: the findOneAndUpdate poller of the design literature. Each worker
  claims one due document at a time (PENDING -> IN_FLIGHT, oldest first, one
  atomic ``find_one_and_update``), publishes it, waits for the broker's ack,
  marks it DELIVERED, and sleeps 1 s when nothing is due.
* ``fetch``: db-scheduler's default fetch-and-lock-on-execute. Each worker
  reads a batch of due documents (3 x its 10 executor threads), claims each
  with a conditional ``update_one`` (still PENDING), publishes, marks it
  DELIVERED, 10 at a time; a full batch is followed at once by the next, a
  short one by the 1 s poll interval (db-scheduler's default is 10 s; 1 s is
  the scheduler's own POLL_INTERVAL, so lateness compares like with like).
* ``apscheduler``: APScheduler 4 (4.0.0a6) with its MongoDB data store; each
  worker is a scheduler process, each job produces its record. Tasks allow
  any number of concurrent jobs (the default of one would serialise the
  whole cluster on the task document).

All three read the schedules the scheduler's API stores (the pollers) or
the same schedules as APScheduler jobs, publish the scheduler's record (same
key, value and headers) with its producer settings (acks=all, 2 ms linger),
and use the one index their query needs. None recovers work a dead worker
left IN_FLIGHT: the benchmark kills nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaProducer
from pymongo import ASCENDING, AsyncMongoClient, ReturnDocument

from node.schedule.model import Status
from node.schedule.record import Record, build_record
from node.version import add_version_flag

IDLE_SLEEP = 1.0  # the findOneAndUpdate poller's sleep when nothing is due
FETCH_THREADS = 10  # db-scheduler's default executor threads
FETCH_UPPER = 3 * FETCH_THREADS  # db-scheduler's upper fetch limit (3.0 x threads)
FETCH_POLL = 1.0
DUE_INDEX = "baseline_due"


def producer(bootstrap: str, name: str) -> AIOKafkaProducer:
    # The scheduler's own producer settings (node/publisher.py).
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap.split(","), client_id=name, acks="all", linger_ms=2
    )


async def send(kafka: AIOKafkaProducer, record: Record) -> None:
    await kafka.send_and_wait(record.topic, record.value, key=record.key, headers=record.headers)


async def prepare_pollers(collection: Any) -> None:
    """The one index both pollers' query needs: PENDING by due time."""
    await collection.create_index(
        [("dueAt", ASCENDING)],
        name=DUE_INDEX,
        partialFilterExpression={"status": Status.PENDING.value},
    )


def due_filter(now: datetime) -> dict[str, Any]:
    return {"status": Status.PENDING.value, "dueAt": {"$lte": now}}


async def mark_delivered(collection: Any, schedule_id: str, name: str) -> None:
    await collection.update_one(
        {"_id": schedule_id, "owner": name, "status": Status.IN_FLIGHT.value},
        {"$set": {"status": Status.DELIVERED.value, "deliveredAt": datetime.now(UTC)}},
    )


async def find_one_and_update_worker(collection: Any, kafka: AIOKafkaProducer, name: str) -> None:
    while True:
        now = datetime.now(UTC)
        doc = await collection.find_one_and_update(
            due_filter(now),
            {"$set": {"status": Status.IN_FLIGHT.value, "owner": name, "claimedAt": now}},
            sort=[("dueAt", ASCENDING)],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            await asyncio.sleep(IDLE_SLEEP)
            continue
        await send(kafka, build_record(doc, 0, 1))
        await mark_delivered(collection, doc["_id"], name)


async def fetch_worker(collection: Any, kafka: AIOKafkaProducer, name: str) -> None:
    threads = asyncio.Semaphore(FETCH_THREADS)

    async def execute(doc: dict[str, Any]) -> None:
        async with threads:
            claimed = await collection.update_one(
                {"_id": doc["_id"], "status": Status.PENDING.value},
                {"$set": {"status": Status.IN_FLIGHT.value, "owner": name}},
            )
            if claimed.modified_count == 0:
                return  # another worker picked it first
            await send(kafka, build_record(doc, 0, 1))
            await mark_delivered(collection, doc["_id"], name)

    while True:
        due = await (
            collection.find(due_filter(datetime.now(UTC)))
            .sort("dueAt", ASCENDING)
            .limit(FETCH_UPPER)
            .to_list()
        )
        await asyncio.gather(*(execute(doc) for doc in due))
        if len(due) < FETCH_UPPER:
            await asyncio.sleep(FETCH_POLL)


async def run_poller(kind: str, args: argparse.Namespace) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(args.mongo_uri, tz_aware=True)
    collection = client[args.database]["schedules"]
    kafka = producer(args.bootstrap, args.name)
    await kafka.start()
    worker = find_one_and_update_worker if kind == "fua" else fetch_worker
    try:
        print("ready", flush=True)
        await worker(collection, kafka, args.name)
    finally:
        await kafka.stop()
        await client.close()


# -- APScheduler 4 ---------------------------------------------------------------

_KAFKA: AIOKafkaProducer | None = None


async def deliver(
    topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
) -> None:
    """The APScheduler task: produce the scheduler's record for one schedule."""
    assert _KAFKA is not None, "the producer starts before the scheduler"
    await send(_KAFKA, Record(topic, key, value, list(headers)))


def apscheduler_store(mongo_uri: str, database: str) -> Any:
    from apscheduler.datastores.mongodb import MongoDBDataStore
    from pymongo import MongoClient

    return MongoDBDataStore(MongoClient(mongo_uri, tz_aware=True), database=database)


def apscheduler(data_store: Any, identity: str) -> Any:
    from apscheduler import AsyncScheduler, TaskDefaults

    # attrs converters accept None where the stubs say timedelta.
    scheduler: Any = AsyncScheduler
    return scheduler(
        data_store,
        identity=identity,
        task_defaults=TaskDefaults(max_running_jobs=None),
        cleanup_interval=None,
    )


async def load_apscheduler(
    mongo_uri: str, database: str, docs: Sequence[dict[str, Any]], chunk: int = 2000
) -> None:
    """Store one APScheduler schedule per document, each a DateTrigger at its
    executeAt running ``deliver`` with its record.

    The documents are APScheduler's own (``Schedule.marshal`` with the data
    store's serializer, as ``add_schedule`` builds them) but go in with
    ``insert_many`` rather than one ``insert_one`` each, so loading 20,000
    takes seconds and not minutes; what is measured is delivery.
    """
    from apscheduler import CoalescePolicy
    from apscheduler._structures import Schedule as ScheduleClass
    from apscheduler.datastores.mongodb import marshal_document
    from apscheduler.triggers.date import DateTrigger

    # attrs converters accept None and tuples where the stubs are narrower.
    schedule_class: Any = ScheduleClass
    data_store = apscheduler_store(mongo_uri, database)
    async with apscheduler(data_store, "loader") as scheduler:
        task = await scheduler.configure_task(deliver)
        batch: list[dict[str, Any]] = []
        for doc in docs:
            record = build_record(doc, 0, 1)
            trigger = DateTrigger(doc["executeAt"])
            schedule = schedule_class(
                id=str(doc["_id"]),
                task_id=task.id,
                trigger=trigger,
                args=(record.topic, record.key, record.value, record.headers),
                kwargs={},
                paused=False,
                coalesce=CoalescePolicy.latest,
                misfire_grace_time=None,  # a late job still runs: nothing is dropped
                metadata={},
                max_jitter=None,
                job_executor=task.job_executor,
                job_result_expiration_time=timedelta(0),
            )
            schedule.next_fire_time = trigger.next()
            document = schedule.marshal(data_store.serializer)
            marshal_document(document)
            batch.append(document)
            if len(batch) == chunk:
                await asyncio.to_thread(data_store._schedules.insert_many, batch, ordered=False)
                batch = []
        if batch:
            await asyncio.to_thread(data_store._schedules.insert_many, batch, ordered=False)


async def run_apscheduler(args: argparse.Namespace) -> None:
    kafka = producer(args.bootstrap, args.name)
    await kafka.start()
    # Jobs name their task "bench.baselines:deliver", which imports this file
    # again as bench.baselines when it runs as __main__: the producer goes there.
    home = importlib.import_module("bench.baselines")
    home._KAFKA = kafka  # type: ignore[attr-defined]
    try:
        async with apscheduler(apscheduler_store(args.mongo_uri, args.database), args.name) as s:
            await s.start_in_background()
            print("ready", flush=True)
            await asyncio.Event().wait()
    finally:
        await kafka.stop()


async def main_async(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        if args.kind == "apscheduler":
            await run_apscheduler(args)
        else:
            await run_poller(args.kind, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines", description=__doc__)
    add_version_flag(parser)
    parser.add_argument("kind", choices=["fua", "fetch", "apscheduler"])
    parser.add_argument("--mongo-uri", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--name", required=True)
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
