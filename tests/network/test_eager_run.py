"""EagerRun drives a request's handler as a task would, but from the callback that starts it:
what it runs at once, how it resumes, and what cancelling it means (a task's meaning)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tensorgate.network.eager import EagerRun


def _run(test: Any) -> None:
    asyncio.run(test())


async def _turns(count: int) -> None:
    """Let the loop run `count` turns (what the run scheduled happens in them)."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_it_runs_until_it_first_waits_then_resumes_when_the_future_is_done() -> None:
    async def test() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        seen: list[Any] = []

        async def handler() -> None:
            seen.append("started")
            seen.append(await answer)
            await asyncio.sleep(0)  # a bare yield: resumed on the loop's next turn
            seen.append("ended")

        run = EagerRun(handler(), loop)
        assert seen == []  # made, not started
        run.start()
        assert seen == ["started"] and not run.done()  # at once, no turn of the loop
        answer.set_result(7)
        await _turns(10)
        assert seen == ["started", 7, "ended"] and run.done()
    _run(test)


def test_a_handler_that_never_waits_is_done_when_start_returns() -> None:
    async def test() -> None:
        async def handler() -> None:
            return None
        run = EagerRun(handler(), asyncio.get_running_loop())
        run.start()
        assert run.done() and not run.cancel()
    _run(test)


def test_cancelling_it_cancels_what_it_awaits() -> None:
    async def test() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        met: list[str] = []

        async def handler() -> None:
            try:
                await answer
            except asyncio.CancelledError:
                met.append("cancelled where it awaits")
                raise
        run = EagerRun(handler(), loop)
        run.start()
        assert run.cancel()
        assert answer.cancelled()  # the scheduler drops a cancelled request's item
        await _turns(2)
        assert met == ["cancelled where it awaits"] and run.done()
    _run(test)


@pytest.mark.parametrize("when", ["awaiting a done future", "after a bare yield"])
def test_cancelled_when_nothing_can_be_cancelled_it_meets_cancellation_next(when: str) -> None:
    async def test() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        met: list[str] = []

        async def handler() -> None:
            try:
                if when == "after a bare yield":
                    await asyncio.sleep(0)
                else:
                    await answer
                met.append("went on")
            except asyncio.CancelledError:
                met.append("cancelled")
        run = EagerRun(handler(), loop)
        run.start()
        if when == "awaiting a done future":
            answer.set_result(1)  # its wake-up is scheduled, the future can no longer cancel
        assert run.cancel()
        await _turns(5)
        assert met == ["cancelled"] and run.done()
    _run(test)


def test_an_error_escaping_the_handler_is_raised_to_whoever_ran_the_step() -> None:
    async def test() -> None:
        async def handler() -> None:
            raise ValueError("a bug")
        run = EagerRun(handler(), asyncio.get_running_loop())
        with pytest.raises(ValueError, match="a bug"):
            run.start()
        assert run.done()

        async def odd() -> None:
            await _Odd()
        run = EagerRun(odd(), asyncio.get_running_loop())
        with pytest.raises(RuntimeError, match="no future"):
            run.start()
        assert run.done()
    _run(test)


class _Odd:
    def __await__(self) -> Any:
        yield "not a future"
