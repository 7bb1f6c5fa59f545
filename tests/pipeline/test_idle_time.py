"""A spare's thread at SCHED_IDLE: lowered before each batch, raised back once a batch
overruns, and left alone where the way back is refused."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tensorgate.pipeline import idle_time
from tensorgate.pipeline.idle_time import IdleTime, lowered_to_idle_time
from tests.pipeline.conftest import run

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"),
                                reason="SCHED_IDLE is Linux's")


class _Worker:
    """A thread that lowers itself through lowered_to_idle_time, then waits to be told to
    stop: the policy changes under test are made to it from the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.idle: IdleTime | None = None
        self.id = 0
        self._lowered = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(loop,), daemon=True)
        self._thread.start()
        assert self._lowered.wait(10.0)

    def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        self.id = threading.get_native_id()
        self.idle = lowered_to_idle_time(loop)
        self._lowered.set()
        self._stop.wait(30.0)

    def policy(self) -> int:
        return os.sched_getscheduler(self.id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)


@contextlib.asynccontextmanager
async def _working() -> AsyncIterator[_Worker]:
    """A _Worker for the running loop, stopped however the test leaves."""
    worker = _Worker(asyncio.get_running_loop())
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def may_raise() -> Iterator[None]:
    idle_time._may_lower_and_raise.cache_clear()
    if not idle_time._may_lower_and_raise():
        pytest.skip("this process may not raise a thread back from SCHED_IDLE")
    yield


def test_a_batch_that_overruns_is_raised_and_the_next_starts_lowered(may_raise: None) -> None:
    async def scenario() -> None:
        async with _working() as worker:
            assert worker.idle is not None and worker.policy() == os.SCHED_IDLE
            done = [0]
            # expected 1 ms: raised after the least wait (5 ms), the batch not finished (not
            # even taken, as by a thread the busy loop starves)
            worker.idle.batch_handed(1_000_000, lambda: done[0])
            for _ in range(200):  # (up to 2 s on a loaded machine)
                await asyncio.sleep(0.01)
                if worker.policy() == os.SCHED_OTHER:
                    break
            assert worker.policy() == os.SCHED_OTHER and worker.idle.raises == 1
            # the first finishes; the next, expected to take 10 s, is lowered as it is
            # handed over
            done[0] += 1
            worker.idle.batch_handed(10_000_000_000, lambda: done[0])
            assert worker.policy() == os.SCHED_IDLE and worker.idle.raises == 1
    run(scenario())


def test_a_batch_done_in_time_is_not_raised(may_raise: None) -> None:
    async def scenario() -> None:
        async with _working() as worker:
            assert worker.idle is not None
            done = [0]
            # expected 200 ms: its raise is due at 300 ms; it is finished before that
            worker.idle.batch_handed(200_000_000, lambda: done[0])
            done[0] += 1
            # another, handed over after it (its raise due in 15 s): the first's timer,
            # when it comes, finds the first finished and leaves the thread lowered
            worker.idle.batch_handed(10_000_000_000, lambda: done[0])
            await asyncio.sleep(0.5)
            assert worker.policy() == os.SCHED_IDLE and worker.idle.raises == 0
    run(scenario())


def test_a_thread_told_to_stop_is_raised_for_good(may_raise: None) -> None:
    async def scenario() -> None:
        async with _working() as worker:
            assert worker.idle is not None
            worker.idle.batch_handed(1_000_000, lambda: 0)
            worker.idle.raise_now()
            assert worker.policy() == os.SCHED_OTHER and worker.idle.raised
            await asyncio.sleep(0.05)  # the batch's timer finds it raised already
            assert worker.idle.raises == 0 and worker.policy() == os.SCHED_OTHER
            worker.idle.batch_handed(1_000_000, lambda: 1)  # (a batch queued before its stop)
            assert worker.policy() == os.SCHED_OTHER
    run(scenario())


def test_where_the_way_back_is_refused_the_thread_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As for an unprivileged process (RLIMIT_NICE 0, no CAP_SYS_NICE): SCHED_IDLE may be
    entered but not left, so the spare is not lowered at all."""
    real = os.sched_setscheduler
    lowered: set[int] = set()

    def kernel_rule(tid: int, policy: int, param: Any) -> None:
        tid = tid or threading.get_native_id()
        if tid in lowered and policy != os.SCHED_IDLE:
            raise PermissionError(1, "Operation not permitted")
        real(tid, policy, param)
        if policy == os.SCHED_IDLE:
            lowered.add(tid)

    monkeypatch.setattr(os, "sched_setscheduler", kernel_rule)
    idle_time._may_lower_and_raise.cache_clear()
    try:
        async def scenario() -> None:
            async with _working() as worker:
                assert worker.idle is None and worker.policy() == os.SCHED_OTHER
        run(scenario())
    finally:
        idle_time._may_lower_and_raise.cache_clear()
