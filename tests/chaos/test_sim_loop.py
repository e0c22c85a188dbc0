"""The simulation's event loop: asyncio in virtual time (chaos/sim/loop.py)."""

from __future__ import annotations

import asyncio

import pytest

from chaos.sim.loop import Deadlock, VirtualLoop, run


def test_an_hour_of_sleeps_takes_no_real_hour_and_ends_at_the_hour() -> None:
    loop = VirtualLoop()

    async def sleeper(n: int, woke: list[tuple[float, int]]) -> None:
        for _ in range(60):
            await asyncio.sleep(60 / (n + 1))
            woke.append((round(loop.elapsed(), 6), n))

    async def main() -> list[tuple[float, int]]:
        woke: list[tuple[float, int]] = []
        await asyncio.gather(*(sleeper(n, woke) for n in range(3)))
        return woke

    woke = loop.run_until_complete(main())
    loop.close()
    assert woke[-1] == (3600.0, 0)  # the slowest: 60 sleeps of 60 s
    assert woke == sorted(woke, key=lambda w: w[0])  # in virtual time order


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.Event().wait()
        assert isinstance(loop, VirtualLoop)
        return loop.elapsed()

    assert run(main()) == pytest.approx(30)


def test_a_task_waiting_for_nothing_is_a_deadlock_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        run(main())


def test_the_same_program_gives_the_same_order_every_time() -> None:
    def once() -> list[str]:
        order: list[str] = []

        async def worker(name: str, delays: list[float]) -> None:
            for delay in delays:
                await asyncio.sleep(delay)
                order.append(f"{name}@{asyncio.get_running_loop().time():.3f}")

        async def main() -> None:
            await asyncio.gather(
                worker("a", [0.5, 0.5, 0.0]), worker("b", [1.0, 0.0]), worker("c", [0.25] * 4)
            )

        run(main())
        return order

    assert once() == once()
    assert once()[:2] == ["c@1000.250", "a@1000.500"]
