"""A decoupled Triton Python model's requests, from its `execute` to their final flag.

Triton's Python backend frees a model instance as soon as `execute` returns: the model
hands each request's response sender to a thread of its own (or awaits, in an `async def
execute`), and the instance takes its next batch while earlier requests still stream. A
`ResponseStream` is one such request. What the model sends for it, from whichever thread,
becomes its outputs on that thread and goes to the loop in the order sent; at most
RESPONSES_AHEAD wait there for the client, past that the sending thread waits
(backpressure on the model, which stops when the client has gone). An error response
without the final flag reaches the client as that, and the request goes on, as on Triton.
The final flag, an error response with it or `fail` (its execute raised) ends it, once:
`on_end(batch, item)` on the loop, after every response it let through. A request its
execute rescheduled (iterative_sequence) is `suspend`ed instead: it runs again with a
stream of its own.

What streams send reaches the loop through the loop's mailbox (pipeline/handoff.py): one
wake-up of the loop for however many responses come before it runs them (a wake-up once a
response was 16 % of a token streamer's time in a profile), in order with the instance's
other reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tensorgate.errors import TensorgateError
from tensorgate.model import NO_PARAMETERS
from tensorgate.pipeline.triton_answers import Answer
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.tensor.view import TensorView

__all__ = ["RESPONSES_AHEAD", "ResponseStream", "wait_for_credit"]

RESPONSES_AHEAD = 64  # a decoupled request's responses made but not yet taken by its client
CREDIT_POLL_S = 0.05  # how often a sender held back looks whether its client has gone

# A response's outputs made into the item's results (on the sending thread), or a
# TensorgateError saying what the model got wrong.
TakeResults = Callable[[WorkItem, Mapping[str, Any]], dict[str, TensorView]]
Report = Callable[..., None]  # runs a function on the loop (LoopMailbox.post)


def wait_for_credit(credits: threading.Semaphore, item: WorkItem) -> bool:
    """Whether `item`'s client may take one more response (a credit was taken); False once
    it has gone. Past RESPONSES_AHEAD untaken, the sending thread waits here."""
    while not credits.acquire(timeout=CREDIT_POLL_S):
        if item.abandoned:
            return False
    return not item.abandoned


class ResponseStream:
    """One request of a decoupled model's batch, until it ends."""

    __slots__ = ("item", "batch", "_take", "_report", "_on_end", "_lock", "_credits", "_ended",
                 "_output_ns")

    def __init__(self, item: WorkItem, batch: Batch, take: TakeResults, report: Report,
                 on_end: Callable[[Batch, WorkItem], None]) -> None:
        self.item = item
        self.batch = batch
        self._take = take
        self._report = report
        self._on_end = on_end
        self._lock = threading.Lock()  # `fail` (executor thread) against `send`
        self._credits = threading.Semaphore(RESPONSES_AHEAD)  # the client gives them back
        self._ended = False
        self._output_ns = 0

    def send(self, answer: Answer | TensorgateError | None, final: bool) -> None:
        """What the model sent (its sender calls this one send at a time, in order)."""
        if self._ended:
            return
        item = self.item
        if isinstance(answer, TensorgateError):
            if final:  # the model's error response with the final flag ends it
                self.fail(answer)
            elif not item.abandoned and wait_for_credit(self._credits, item):
                with self._lock:  # one error response to the client; more may follow
                    if not self._ended:
                        self._report(item.respond, answer, self._credits.release,
                                     NO_PARAMETERS, False)
            return
        if answer is not None and not item.abandoned:  # a client that left gets nothing
            started = time.monotonic_ns()
            try:
                results = self._take(item, answer.outputs)
            except TensorgateError as error:  # a response the model got wrong fails it
                self.fail(error)
                return
            self._output_ns += time.monotonic_ns() - started
            if wait_for_credit(self._credits, item):
                with self._lock:
                    if self._ended:
                        return
                    self._report(item.respond, results, self._credits.release,
                                 answer.parameters, final)
        if final:
            self._end(None)

    def fail(self, error: TensorgateError) -> None:
        """End it with `error` (a no-op once it has ended)."""
        self._end(error)

    def suspend(self) -> bool:
        """Its execute rescheduled it: take nothing more, and end it without `on_end` (its
        rerun's stream does). False when it had already ended (a final flag wins)."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            return True

    def _end(self, error: TensorgateError | None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            item = self.item
            if error is not None:
                item.set_error(error)
            times = item.times
            times.output_ns = self._output_ns
            times.infer_ns = max(time.monotonic_ns() - self.batch.started_ns - self._output_ns,
                                 0)
            self._report(self._on_end, self.batch, item)
