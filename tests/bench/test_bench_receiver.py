"""The delivery suite's HTTP receiver and destinations (bench/receiver.py,
bench/destinations.py): what a receiver notes, how the bench reads it back,
and the schedules an HTTP run stores."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.destinations import Http
from bench.receiver import Receiver, ReceiverReader, delivery_from, receiver_app
from bench.stack import http_documents

EXECUTE_AT = "2030-01-02T03:04:05.678Z"


def test_a_noted_delivery_reads_as_the_judge_reads_one() -> None:
    delivery = delivery_from(["s-1", EXECUTE_AT, 1893553445.9])
    assert delivery.schedule_id == "s-1"
    assert delivery.execute_at == pytest.approx(1893553445.678)
    assert delivery.at == 1893553445.9


async def test_a_receiver_notes_each_arrival_and_forgets_at_reset() -> None:
    async with TestServer(receiver_app(hang=0.0)) as server, aiohttp.ClientSession() as session:
        before = time.time()
        for i in range(3):
            headers = {"schedule-id": f"s-{i}", "execute-at": EXECUTE_AT}
            async with session.post(server.make_url("/deliver"), headers=headers) as answer:
                assert answer.status == 204
        async with session.get(server.make_url("/seen?from=1")) as answer:
            seen = await answer.json()
        assert [entry[:2] for entry in seen] == [["s-1", EXECUTE_AT], ["s-2", EXECUTE_AT]]
        assert all(before <= entry[2] <= time.time() for entry in seen)
        async with session.post(server.make_url("/reset")) as answer:
            assert answer.status == 204
        async with session.get(server.make_url("/seen")) as answer:
            assert await answer.json() == []


async def test_a_hung_receiver_notes_a_call_on_arrival_and_answers_after_its_hang() -> None:
    async with TestServer(receiver_app(hang=0.5)) as server, aiohttp.ClientSession() as session:

        async def deliver() -> int:
            headers = {"schedule-id": "s", "execute-at": EXECUTE_AT}
            async with session.post(server.make_url("/deliver"), headers=headers) as answer:
                return answer.status

        started = time.monotonic()
        call = asyncio.create_task(deliver())
        seen: list[object] = []
        while not seen:  # noted while the call still hangs
            await asyncio.sleep(0.01)
            async with session.get(server.make_url("/seen")) as answer:
                seen = await answer.json()
        assert not call.done()
        assert await call == 204 and time.monotonic() - started >= 0.5


async def test_a_receiver_process_is_read_for_a_run_from_its_start(tmp_path: Path) -> None:
    receiver = Receiver("127.0.0.2", tmp_path / "receiver.log")
    await receiver.start()
    try:
        assert receiver.url == f"http://127.0.0.2:{receiver.port}/deliver"
        async with aiohttp.ClientSession() as session:
            headers = {"schedule-id": "earlier", "execute-at": EXECUTE_AT}
            (await session.post(receiver.url, headers=headers)).release()
            await receiver.reset()  # the run begins
            # Delivered before the reader is entered (a system started late):
            # the run's own.
            headers = {"schedule-id": "early", "execute-at": EXECUTE_AT}
            (await session.post(receiver.url, headers=headers)).release()
            async with ReceiverReader(receiver) as reader:
                for i in range(2):
                    headers = {"schedule-id": f"s-{i}", "execute-at": EXECUTE_AT}
                    (await session.post(receiver.url, headers=headers)).release()
                assert await reader.wait_for(3, time.monotonic() + 10)
        # An earlier run's delivery is not this one's.
        assert reader.ids == {"early", "s-0", "s-1"} and len(reader.deliveries) == 3
    finally:
        receiver.stop()


def receiver_at(host: str, port: int) -> Receiver:
    receiver = Receiver(host, Path("unused.log"))
    receiver.port = port
    return receiver


def test_an_http_run_stores_schedules_to_its_receiver_and_judges_only_those() -> None:
    b, a = receiver_at("127.0.0.1", 8001), receiver_at("127.0.0.2", 8002)
    destination = Http(b, "PT60S", aside_to=a, aside=(False, True, False, True))
    docs = destination.documents("run", 4)
    assert [d["http"]["url"] for d in docs] == [b.url, a.url, b.url, a.url]
    assert [d["http"]["host"] for d in docs] == ["127.0.0.1", "127.0.0.2"] * 2
    assert all(d["http"]["timeout"] == 60.0 and "topic" not in d for d in docs)
    assert [destination.judges(d) for d in docs] == [True, False, True, False]
    assert destination.aside_buckets == [docs[1]["bucket"], docs[3]["bucket"]]
    with pytest.raises(ValueError, match="one mark per schedule"):
        destination.documents("run", 3)


def test_http_documents_need_one_url_per_due_time() -> None:
    with pytest.raises(ValueError, match="one URL per due time"):
        http_documents([], ["http://127.0.0.1:1/deliver"], "run")
