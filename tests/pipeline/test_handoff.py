"""Work handed between the loop and executor threads (pipeline/handoff.py): nothing posted
or put is lost or reordered however the threads interleave, a wait with a timeout ends, a
closed descriptor is never written, a loop's mailbox goes once the loop is closed, and a
thread's call on the loop gets its own result back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
import time

import pytest

from tensorgate.pipeline import handoff
from tensorgate.pipeline.handoff import LoopMailbox, ThreadInbox, WakeFd, call_on_loop
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


def test_calls_from_threads_get_their_own_results_and_errors_back() -> None:
    """Four threads call the loop 300 times each: each gets its own call's result, a call
    that raises raises in its thread, a cancelled one raises CancelledError there (as
    run_coroutine_threadsafe's future did), and every call ran on the loop."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        mailbox = LoopMailbox.for_loop(loop)
        on_loop: list[bool] = []

        async def echo(thread: int, value: int) -> tuple[int, int]:
            on_loop.append(asyncio.get_running_loop() is loop)
            if value % 3 == 0:
                await asyncio.sleep(0)  # some answer on a later turn of the loop
            if value == 7:
                raise ValueError(f"call {thread}/{value} failed")
            if value == 11:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)
            return thread, value

        failures: dict[int, list[str]] = {n: [] for n in range(4)}
        results: dict[int, list[tuple[int, int]]] = {n: [] for n in range(4)}

        def caller(thread: int) -> None:
            for value in range(300):
                try:
                    results[thread].append(call_on_loop(mailbox, echo(thread, value)))
                except ValueError as error:
                    failures[thread].append(str(error))
                except concurrent.futures.CancelledError:
                    failures[thread].append("cancelled")

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            await asyncio.sleep(0.01)
        for n in range(4):
            assert results[n] == [(n, v) for v in range(300) if v not in (7, 11)]
            assert failures[n] == [f"call {n}/7 failed", "cancelled"]
        assert len(on_loop) == 4 * 300 and all(on_loop)
    run(scenario())


def test_a_call_to_a_closed_loop_raises_and_one_waiting_when_it_closes_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "_CLOSED_POLL_S", 0.02)
    mailboxes: list[LoopMailbox] = []
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async def scenario() -> None:
        mailboxes.append(LoopMailbox.for_loop(asyncio.get_running_loop()))

    loop = asyncio.new_event_loop()
    loop.run_until_complete(scenario())
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            call_on_loop(mailboxes[0], forever())
        except BaseException as error:  # noqa: BLE001 - what it raised is the point
            raised.append(error)

    thread = threading.Thread(target=caller)
    thread.start()
    while not started.is_set():  # (the loop runs the call once it runs)
        loop.run_until_complete(asyncio.sleep(0.005))
    for task in asyncio.all_tasks(loop):
        task.cancel()  # as a loop's end does (asyncio.run)
    for _ in range(1000):  # (bounded: until its thread has the cancellation)
        if not thread.is_alive():
            break
        loop.run_until_complete(asyncio.sleep(0.005))
    thread.join(5)
    assert [type(e) for e in raised] == [concurrent.futures.CancelledError]
    thread = threading.Thread(target=caller)
    thread.start()
    time.sleep(0.05)  # it waits: the loop does not run
    loop.close()
    thread.join(5)
    assert not thread.is_alive()
    assert [type(e) for e in raised[1:]] == [RuntimeError]
    with pytest.raises(RuntimeError, match="closed"):
        call_on_loop(mailboxes[0], forever())


def test_a_calling_thread_s_descriptor_goes_with_the_thread() -> None:
    async def scenario() -> None:
        mailbox = LoopMailbox.for_loop(asyncio.get_running_loop())

        async def one() -> int:
            return 1

        def caller() -> None:
            assert call_on_loop(mailbox, one()) == 1

        counts = []
        for _ in range(8):
            thread = threading.Thread(target=caller)
            thread.start()
            while thread.is_alive():
                await asyncio.sleep(0.005)
            counts.append(len(os.listdir("/proc/self/fd")))
        assert counts[-1] <= counts[0], counts
    run(scenario())
