"""Work handed between the loop and executor threads (pipeline/handoff.py): nothing posted
or put is lost or reordered however the threads interleave, a wait with a timeout ends, a
closed descriptor is never written, and a loop's mailbox goes once the loop is closed."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time

import pytest

from tensorgate.pipeline import handoff
from tensorgate.pipeline.handoff import LoopMailbox, ThreadInbox, WakeFd
from tests.pipeline.conftest import run

POSTS = 10_000


@pytest.fixture(params=["eventfd", "pipe"], autouse=True)
def wake_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on an eventfd (Linux) and on the pipe used where there is none."""
    if request.param == "eventfd" and not handoff.EVENTFD:
        pytest.skip("no eventfd on this system")
    monkeypatch.setattr(handoff, "EVENTFD", request.param == "eventfd")
    return str(request.param)


def test_calls_posted_from_threads_all_run_on_the_loop_in_each_thread_s_order() -> None:
    """Four threads post as fast as they can while the loop runs what came: every call runs,
    once, on the loop, each thread's in order. (A run that let its flag down before
    clearing the descriptor lost a wake-up here: calls waited for ever.)"""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reported: list[BaseException] = []
        loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
        mailbox = LoopMailbox.for_loop(loop)
        assert LoopMailbox.for_loop(loop) is mailbox
        seen: dict[int, list[int]] = {n: [] for n in range(4)}
        on_loop: list[bool] = []
        done = asyncio.Event()

        def record(thread: int, value: int) -> None:
            on_loop.append(threading.current_thread() is threading.main_thread())
            seen[thread].append(value)
            if sum(map(len, seen.values())) == 4 * POSTS:
                done.set()

        def fail() -> None:
            raise ValueError("a posted call failed")

        def produce(thread: int) -> None:
            for value in range(POSTS):
                mailbox.post(record, thread, value)
                if thread == 0 and value == POSTS // 2:
                    mailbox.post(fail)
                if value % 97 == 0:
                    time.sleep(0)  # let the others and the loop in, now and then

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        try:
            await asyncio.wait_for(done.wait(), 20)
        finally:
            for thread in threads:
                thread.join()
        assert all(values == list(range(POSTS)) for values in seen.values())
        assert all(on_loop)
        assert [str(error) for error in reported] == ["a posted call failed"]
    run(scenario())


def test_a_loop_s_mailbox_is_closed_once_its_loop_is() -> None:
    """Loop after loop, the descriptors open stay as many: each loop's mailbox is closed at
    the next one's first use; a call posted to a closed loop's mailbox is dropped."""
    boxes: list[LoopMailbox] = []

    async def make() -> None:
        boxes.append(LoopMailbox.for_loop(asyncio.get_running_loop()))

    open_fds = []
    for _ in range(6):
        run(make())  # (its loop closed at the end)
        open_fds.append(len(os.listdir("/proc/self/fd")))
    assert len(set(map(id, boxes))) == 6
    assert open_fds[-1] <= open_fds[0], open_fds
    boxes[0].post(print, "never")


def test_what_is_put_from_threads_is_taken_by_one_thread_in_each_putter_s_order() -> None:
    inbox = ThreadInbox()
    taken: list[tuple[int, int]] = []

    def take() -> None:
        while len(taken) < 3 * POSTS:
            taken.append(inbox.get(timeout=10))

    def put(thread: int) -> None:
        for value in range(POSTS):
            inbox.put((thread, value))
            if value % 89 == 0:
                time.sleep(0)

    taker = threading.Thread(target=take)
    taker.start()
    putters = [threading.Thread(target=put, args=(n,)) for n in range(3)]
    for thread in putters:
        thread.start()
    for thread in putters:
        thread.join()
    taker.join(20)
    assert not taker.is_alive()
    for thread in range(3):
        assert [value for who, value in taken if who == thread] == list(range(POSTS))
    assert inbox.empty()
    inbox.close()


def test_a_wait_with_a_timeout_ends_empty_and_one_without_takes_what_comes() -> None:
    inbox = ThreadInbox()
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)
    assert 0.04 <= time.monotonic() - started < 2.0
    threading.Timer(0.05, inbox.put, args=("late",)).start()
    assert inbox.get() == "late"
    inbox.close()
    inbox.put("after close")  # nobody takes it, and no descriptor is written


def test_a_wake_after_close_writes_nothing_to_a_number_given_to_another_file(
        wake_kind: str) -> None:
    reader, writer = os.pipe()
    wake = WakeFd()
    assert (wake.read_fd == wake.write_fd) == (wake_kind == "eventfd")
    number = wake.write_fd
    wake.close()
    os.dup2(writer, number)  # the number it wrote to is now another file's
    try:
        wake.wake()
        os.set_blocking(reader, False)
        with pytest.raises(BlockingIOError):
            os.read(reader, 16)  # nothing was written into it
    finally:
        for fd in {reader, writer, number}:
            os.close(fd)


def test_wakes_that_fill_a_pipe_are_not_an_error(wake_kind: str) -> None:
    """A taker that does not take for a while: puts go on (a pipe holds 8,192 wake-ups)
    and what was put is all taken, in order, after."""
    inbox = ThreadInbox()
    for value in range(20_000):
        inbox.put(value)
    assert [inbox.get(timeout=1) for _ in range(20_000)] == list(range(20_000))
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.01)
    inbox.close()
