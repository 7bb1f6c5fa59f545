"""Turns keep requests in the order they took them, whatever each waits for on its way, and
a request that fails or is cancelled does not hold up those after it."""

from __future__ import annotations

import asyncio

from tensorgate.network.in_order import InOrder


async def _request(order: InOrder, name: str, delay: float, entered: list[str],
                   fail: bool = False) -> None:
    turn = order.turn()  # taken as it arrives, before it first waits
    try:
        await asyncio.sleep(delay)  # its own work, on the loop a piece at a time
        if fail:
            raise ValueError(name)
        await turn.wait()
        entered.append(name)  # into the pipeline, before it next waits
    finally:
        turn.end()


def test_requests_enter_in_the_order_they_took_turns() -> None:
    async def scenario() -> list[str]:
        order, entered = InOrder(), []
        await asyncio.gather(*(_request(order, name, delay, entered)
                               for name, delay in [("a", 0.05), ("b", 0.0), ("c", 0.02),
                                                   ("d", 0.0)]))
        return entered
    assert asyncio.run(scenario()) == ["a", "b", "c", "d"]


def test_one_that_fails_or_is_cancelled_ends_its_turn() -> None:
    async def scenario() -> tuple[list[str], list[object]]:
        order, entered = InOrder(), []
        first = asyncio.ensure_future(_request(order, "a", 0.2, entered))
        second = asyncio.ensure_future(_request(order, "b", 0.0, entered, fail=True))
        third = asyncio.ensure_future(_request(order, "c", 0.0, entered))
        fourth = asyncio.ensure_future(_request(order, "d", 0.0, entered))
        await asyncio.sleep(0.05)
        third.cancel()  # while it waits for the first: the first's turn must stay
        outcomes = await asyncio.gather(first, second, third, fourth, return_exceptions=True)
        return entered, [type(o).__name__ for o in outcomes]
    entered, outcomes = asyncio.run(scenario())
    assert entered == ["a", "d"]
    assert outcomes == ["NoneType", "ValueError", "CancelledError", "NoneType"]


def test_a_request_with_nothing_before_it_does_not_wait() -> None:
    async def scenario() -> bool:
        order = InOrder()
        first = order.turn()
        waited = first.wait()
        try:
            waited.send(None)  # runs to its end without suspending
        except StopIteration:
            return True
        finally:
            first.end()
        return False
    assert asyncio.run(scenario())
