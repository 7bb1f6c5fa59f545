"""Work handed between the event loop and an executor thread, each woken through a file
descriptor written with the GIL let go.

Why not `loop.call_soon_threadsafe` one way and `queue.SimpleQueue` the other: both wake the
other thread while the waker holds the GIL. With both threads on one core (placement puts a
light model's executor on the loop's), the woken thread preempts the waker, finds the GIL
taken and sleeps again, and is woken once more when the waker lets the GIL go: two context
switches more each way. `os.write` lets the GIL go around the write, so the woken thread
finds it free. Measured on the 2-core machine (bench/handoff_bench.py): a round trip
loop → thread → loop on one core, 6.2 context switches and P50 16-19 µs before against 2.0
and 9.1 µs; on two cores level. Identity over HTTP, sequential: -25 µs at P50
(bench/interleaved_bench.py; bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import select
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopMailbox", "ThreadInbox", "WakeFd", "call_on_loop"]

_T = TypeVar("_T")

_ONE = (1).to_bytes(8, sys.byteorder)  # an eventfd adds what is written: 8 bytes, native
EVENTFD = hasattr(os, "eventfd")  # Linux; elsewhere a pipe (tests try both)


class WakeFd:
    """A descriptor to wake a waiting thread or loop through: an eventfd where there is
    one (Linux), else a pipe. `wake` from any thread; `wait` (a thread) or `clear` (a loop
    that reads it) by the one that waits: each with the GIL let go (os.write, poll,
    os.read). A wake after `close` does nothing: the lock keeps it from writing to a number
    the system has given to another file since."""

    def __init__(self) -> None:
        if EVENTFD:
            self.read_fd = self.write_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:
            self.read_fd, self.write_fd = os.pipe()  # (close-on-exec, as Python makes them)
            os.set_blocking(self.read_fd, False)
            os.set_blocking(self.write_fd, False)
        self._lock = threading.Lock()
        self._closed = False
        self._poll = select.poll()
        self._poll.register(self.read_fd, select.POLLIN)

    def wait(self, timeout_s: float | None = None) -> None:
        """Until woken (a wake since the last wait or clear counts), at most `timeout_s`
        seconds; then cleared."""
        self._poll.poll(None if timeout_s is None else max(int(timeout_s * 1000), 1))
        self.clear()

    def wake(self) -> None:
        with self._lock:
            if self._closed:  # nobody is left to wake
                return
            try:
                os.write(self.write_fd, _ONE)
            except BlockingIOError:  # a pipe full of wake-ups: one is on its way
                pass

    def clear(self) -> None:
        try:
            os.read(self.read_fd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in {self.read_fd, self.write_fd}:
                os.close(fd)


class LoopMailbox:
    """Calls posted from any thread, run on the loop in the order posted: one a loop, as its
    self-pipe is (`for_loop`). A call posted once its loop is closed is dropped, as
    call_soon_threadsafe's is."""

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> LoopMailbox:
        """`loop`'s mailbox, made on its first use there (on the loop's thread). Those of
        loops closed since are closed here: a mailbox lives as long as its loop, whose
        executors may report after an engine's shutdown (a load that was still running)."""
        with _MAILBOXES_LOCK:
            for key, box in list(_MAILBOXES.items()):
                if box.loop.is_closed():
                    box.close()
                    del _MAILBOXES[key]
            found = _MAILBOXES.get(id(loop))  # (a live loop's id is its own: the box holds it)
            if found is None:
                found = _MAILBOXES[id(loop)] = cls(loop)
            return found

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._woken = False  # a wake-up is on its way: calls posted before its run need none
        self._wake = WakeFd()
        loop.add_reader(self._wake.read_fd, self._run)

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        self._calls.append((fn, args))
        if not self._woken:
            self._woken = True
            self._wake.wake()

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self._wake.read_fd)
        self._wake.close()
        self._calls.clear()

    def _run(self) -> None:
        # Cleared, then the flag down, then the calls taken: a call posted before the flag
        # went down is taken here, one posted after wakes the loop again. (The other way
        # round, the wake of a call posted between the two was cleared and its flag stayed
        # up: the next call found it up and waited for a wake that never came.)
        self._wake.clear()
        self._woken = False
        calls = self._calls
        for _ in range(len(calls)):  # what is posted meanwhile runs after other ready work
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception as error:  # noqa: BLE001 - as the loop reports a callback's
                self.loop.call_exception_handler({
                    "message": f"exception in {fn!r}, posted to the loop", "exception": error})


_MAILBOXES: dict[int, LoopMailbox] = {}  # by id(loop)
_MAILBOXES_LOCK = threading.Lock()  # (loops may run in several threads)


class ThreadInbox:
    """What one thread takes, put from any thread: SimpleQueue's `put`, `get` and `empty`,
    the taker woken through a WakeFd. Closed by the taker, once it takes no more."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._wake = WakeFd()

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._wake.wake()

    def empty(self) -> bool:
        return not self._items

    def get(self, timeout: float | None = None) -> Any:
        """The next item, waiting for one at most `timeout` seconds (None: for ever); raises
        queue.Empty when none came."""
        items = self._items
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if items:
                return items.popleft()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise queue.Empty
            self._wake.wait(left)  # (then the items again: a put after this wakes once more)

    def close(self) -> None:
        self._wake.close()


def call_on_loop(mailbox: LoopMailbox, work: Coroutine[Any, Any, _T]) -> _T:
    """`work` run on `mailbox`'s loop, from another thread, which waits for its result (or
    its exception) on a descriptor of its own, woken with the GIL let go: what
    `run_coroutine_threadsafe(work, loop).result()` does, without the two wake-ups that
    find the GIL taken (a Python model's BLS call, whose thread may share the loop's core).
    A cancelled `work` raises concurrent.futures.CancelledError, as that did; a loop that
    closes first raises RuntimeError."""
    finished: list[asyncio.Task[_T]] = []
    started: list[bool] = []
    waiter = _waiter()

    def start() -> None:
        started.append(True)
        task = mailbox.loop.create_task(work)
        task.add_done_callback(done)

    def done(task: asyncio.Task[_T]) -> None:
        finished.append(task)
        waiter.wake()

    if mailbox.loop.is_closed():
        work.close()
        raise RuntimeError("the event loop is closed")
    mailbox.post(start)
    while not finished:
        waiter.wait(_CLOSED_POLL_S)
        if not finished and mailbox.loop.is_closed():
            if not started:  # (one that started is its loop's to end, not this thread's)
                work.close()
            raise RuntimeError("the event loop closed before a call to it ended")
    task = finished[0]
    if task.cancelled():
        raise concurrent.futures.CancelledError()
    return task.result()


_CLOSED_POLL_S = 1.0  # how often a waiting call looks whether its loop has closed


_WAITERS = threading.local()


def _waiter() -> WakeFd:
    """The calling thread's descriptor for call_on_loop, made on its first call, its
    numbers closed when the thread ends (its thread-local lets go of it)."""
    found: WakeFd | None = getattr(_WAITERS, "wake", None)
    if found is None:
        found = _WAITERS.wake = WakeFd()
        weakref.finalize(found, _close_all, {found.read_fd, found.write_fd})
    return found


def _close_all(fds: set[int]) -> None:
    for fd in fds:
        os.close(fd)
