"""A decoupled tensorgate Model's requests, stepped in turn on its instance's executor thread.

Its `forward` is a generator and each value it yields is one response (tensorgate/model.py).
The generator runs on the executor thread, which owns the device, so requests cannot stream
from threads of their own as a Triton Python model's do. Instead one instance interleaves up
to `streams_per_instance` of them (a config parameter; 1, a request at a time, by default):
it steps each in turn, one `yield` at a time, and starts the next queued request between two
steps. A request's first response then waits for one step of each request already running,
not for their whole streams. Never two steps at once: a model that keeps one request's state
on `self` across a `yield` keeps the default.

Each request may have RESPONSES_AHEAD responses made and not yet taken by its client; one
that has that many is parked (the others go on) until its client takes one, which wakes the
executor, or until its client leaves. The executor is idle (takes another request) while it
runs fewer than its limit.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tensorgate.pipeline.response_streams import RESPONSES_AHEAD
from tensorgate.pipeline.work import Batch

__all__ = ["Generation", "Generations"]


class Generation:
    """One request: its batch of one and the generator its model's forward returned."""

    __slots__ = ("batch", "item", "produced", "run_ns", "output_ns", "parked", "_credits",
                 "_held", "_wake")

    def __init__(self, batch: Batch, produced: Iterator[Any], wake: Callable[[], None]) -> None:
        self.batch = batch
        self.item = batch.items[0]
        self.produced = produced
        self.run_ns = 0       # time the executor spent on it, its outputs included
        self.output_ns = 0    # of which making its responses' outputs
        self.parked = False   # out of credits: the executor looks again when woken
        self._credits = threading.Semaphore(RESPONSES_AHEAD)
        self._held = False    # a credit taken for the response its next step makes
        self._wake = wake

    def take_credit(self) -> bool:
        """Whether its next step may make a response (its client has room for one). If not,
        it is parked: its client's taking a response wakes the executor."""
        if self._held or self._credits.acquire(blocking=False):
            self._held = True
            return True
        self.parked = True  # before looking again: a credit given back meanwhile wakes it
        if self._credits.acquire(blocking=False):
            self.parked = False
            self._held = True
        return self._held

    def spend_credit(self) -> None:
        """Its step made a response, which goes to its client."""
        self._held = False

    def give_back(self) -> None:
        """On the loop: its client took a response."""
        self._credits.release()
        if self.parked:
            self._wake()


class Generations:
    """An executor's running requests: those it steps in turn and those parked."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._runnable: deque[Generation] = deque()
        self._parked: list[Generation] = []
        self._owe_idle = False  # it was full: it is idle again when one ends

    def __len__(self) -> int:
        return len(self._runnable) + len(self._parked)

    @property
    def runnable(self) -> bool:
        return bool(self._runnable)

    @property
    def parked(self) -> bool:
        return bool(self._parked)

    def add(self, generation: Generation) -> bool:
        """A request started: it takes the next step. Whether the instance can take another."""
        self._runnable.appendleft(generation)
        if len(self) < self.limit:
            return True
        self._owe_idle = True
        return False

    def next(self) -> Generation | None:
        """The one to step now (taken out; `again`, `park` or `ended` puts it back or not)."""
        return self._runnable.popleft() if self._runnable else None

    def again(self, generation: Generation) -> None:
        self._runnable.append(generation)

    def park(self, generation: Generation) -> None:
        self._parked.append(generation)

    def unpark(self) -> None:
        """Parked requests whose client took a response, or left, step again."""
        kept = []
        for generation in self._parked:
            if generation.item.abandoned or generation.take_credit():
                generation.parked = False
                self._runnable.append(generation)
            else:
                kept.append(generation)
        self._parked = kept

    def ended(self) -> bool:
        """A request (taken by `next`) is over. Whether the instance is idle again (it was
        full)."""
        owed, self._owe_idle = self._owe_idle, False
        return owed

    def take_all(self) -> list[Generation]:
        """Every running request, forgotten here (the executor stops: none owes it an idle
        turn any more, so `ended` is False for them)."""
        every = [*self._runnable, *self._parked]
        self._runnable.clear()
        self._parked.clear()
        self._owe_idle = False
        return every
