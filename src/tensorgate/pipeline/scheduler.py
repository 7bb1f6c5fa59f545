"""The dynamic batcher of one model version; it lives on the event loop and never blocks.

Requests wait in a bounded queue. Whenever an executor is idle, the scheduler takes the oldest
request and every later one with the same per-item shapes, up to `max_batch_size` rows (or
fewer where larger batches have measured dearer per row: pipeline/batch_cap.py), and
dispatches them if the batch is full, has reached a preferred size, or the oldest has waited
`max_queue_delay_us` (at once when the delay is 0). Otherwise one timer wakes it when the
delay ends. A request past its deadline is answered with DEADLINE_EXCEEDED and never reaches
the model (or, under `timeout_action: DELAY`, waits behind the rest of its level); a cancelled
one (its client went away) is dropped. Models without `dynamic_batching` run one request per
execution, as Triton's default scheduler does.

A decoupled Triton Python model's requests stream on after their execute returns: its
instance is idle again at once, and each request ends on its own (`on_stream_end`); the batch
counts as running until the last has. A decoupled tensorgate Model's request streams the same
way, a batch of its own, while its instance steps its generator (pipeline/generations.py).
A sequence batcher learns of each such request as its execute returns (`released`), when
Triton's lets the sequence's next request run.

Priority levels (Triton's `priority_levels`): each level has its own bounded queue and
policy (pipeline/request_queues.py, which owns what waits); "oldest" above means the first
request of the highest level that has any, and a batch fills from the levels in order, so a
request of level 1 never waits behind one of level 2 for a free executor.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Protocol

from tensorgate.errors import TensorgateError
from tensorgate.pipeline.batch_cap import BatchCap
from tensorgate.pipeline.ragged import BatchRoom
from tensorgate.pipeline.rate_limiter import Claim
from tensorgate.pipeline.request_queues import RequestQueues
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.repository.model_config import ModelSpec, QueuePolicy, RaggedLimits

__all__ = ["Scheduler"]

log = logging.getLogger("tensorgate.scheduler")


class _Executor(Protocol):
    def submit(self, batch: Batch) -> None: ...


class Scheduler:
    """Queue, batch formation and result delivery for one model version."""

    def __init__(self, spec: ModelSpec, stats: ModelStatistics,
                 loop: asyncio.AbstractEventLoop, *, measured_cap: bool = True,
                 gather_bytes: int | None = None,
                 arrange: Callable[[list[WorkItem]], list[WorkItem]] | None = None,
                 rescheduled: Callable[[WorkItem], None] | None = None,
                 released: Callable[[WorkItem], None] | None = None) -> None:
        """`arrange` puts a chosen batch's requests in the order they run in (and may add
        filler rows): how a direct sequence batcher keeps each sequence in its row.
        `rescheduled` takes back a request its model rescheduled, at once: the sequence
        batcher queues it again before the executor that ran it takes its next batch.
        `released` gets each other request of a streaming batch as its execute returns.
        `gather_bytes`: what a batch of a cheap model's rows may gather (batch_cap.py); None
        where batching pays whatever it copies (a GPU)."""
        self._spec = spec
        self._arrange = arrange
        self._rescheduled = rescheduled
        self._released = released
        self._stats = stats
        self._loop = loop
        policy = spec.batching
        # a decoupled tensorgate Model's requests run one to a batch (its forward yields one
        # request's responses; an instance may interleave several: pipeline/generations.py):
        # see `batch_decoupled` for a Triton Python model's
        self._batching = policy is not None and not spec.decoupled
        self._max_rows = spec.max_batch_size if self._batching else 0
        self._delay_ns = policy.max_queue_delay_us * 1000 if policy is not None else 0
        self._preferred = policy.preferred_batch_sizes if policy is not None else ()
        # rows that run before the delay ends (BatchingPolicy.ready_rows; 0: no such count)
        self._enough = (policy.ready_rows if policy is not None else 0) or sys.maxsize
        self._preserve_order = policy.preserve_ordering if policy is not None else False
        self._cap = (BatchCap(self._max_rows, gather_bytes)
                     if measured_cap and self._max_rows > 1 else None)
        self._ragged = spec.ragged_limits
        stats.batch_rows_limit = self._max_rows if self._cap is None else self._cap.limit
        self._queued = RequestQueues(  # by priority level (request_queues.py)
            spec.name, policy.queues if policy is not None else (QueuePolicy(),), stats)
        self._idle: list[_Executor] = []  # a stack: the last to finish runs next (warm caches)
        self._spares: set[_Executor] = set()  # taken only when no other executor is idle
        self._spares_may_run: Callable[[], bool] | None = None  # and only while this says so
        # executors that run only while they hold rate limiter resources (their claims)
        self._claims: dict[_Executor, Claim] = {}
        self._running: set[Batch] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._closed: TensorgateError | None = None

    def takes_requests_one_by_one(self) -> None:
        """Its model is given a batch's requests one by one (a Triton Python model): nothing
        is gathered, so a batch is not bounded by what a gather would copy."""
        if self._cap is not None:
            self._cap = BatchCap(self._max_rows)

    def hold_ragged(self, limits: RaggedLimits | None) -> None:
        """Form batches within `limits`: what a ragged model's compiled code takes, learned
        as it loaded (an exported program's, after this was made)."""
        self._ragged = limits

    def batch_decoupled(self) -> None:
        """Batch a decoupled model's requests as its `dynamic_batching` says: its execute
        takes requests that each stream through a response sender of their own (a Triton
        Python model's). No measured cap: an execute's time is not its requests' cost."""
        self._batching = self._spec.batching is not None
        self._max_rows = self._spec.max_batch_size if self._batching else 0
        self._cap = None
        self._stats.batch_rows_limit = self._max_rows

    # -- admission -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Requests queued and not yet executing."""
        return self._queued.pending

    @property
    def busy(self) -> bool:
        return bool(self._queued) or bool(self._running)

    def add_executor(self, executor: _Executor, *, spare: bool = False,
                     claim: Claim | None = None,
                     spare_when: Callable[[], bool] | None = None) -> None:
        """Give batches to `executor`; a `spare` one only runs when every other is busy (and
        `spare_when()` says it may: the loop's core has room, loop_load.py); one with a rate
        limiter `claim` only while it holds the claim's resources."""
        if spare:
            self._spares.add(executor)
            self._spares_may_run = spare_when
        if claim is not None:
            self._claims[executor] = claim
        self.on_idle(executor)

    def submit(self, item: WorkItem) -> None:
        """Queue `item`, or raise at once: UNAVAILABLE when closed or the queue is full."""
        if self._closed is not None:
            raise self._closed
        self._queued.add(item)
        self._schedule()

    def close(self, reason: TensorgateError) -> None:
        """Refuse new requests with `reason`; what is queued stays, to be drained."""
        self._closed = reason

    def fail_queued(self, error: TensorgateError) -> int:
        """Answer every queued request with `error`; returns how many."""
        items = self._queued.take_all()
        now = time.monotonic_ns()
        for item in items:
            self._fail(item, error, now, "OTHER")
        return len(items)

    def fail_running(self, error: TensorgateError) -> int:
        """Answer the requests of batches still executing with `error`; their late results
        are then dropped. Returns how many requests."""
        now = time.monotonic_ns()
        count = 0
        for batch in self._running:
            for item in batch.items:
                if not item.filler and not item.future.done():
                    count += 1
                    self._fail(item, error, now, "OTHER")
        return count

    # -- scheduling ------------------------------------------------------------------------

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queued = self._queued
        head = queued.head()
        if head is None:
            return
        now = time.monotonic_ns()
        if queued.deadlines or head.future.done():
            queued.purge(now)
        while self._idle:
            head = queued.head()
            if head is None:
                return
            at = self._runnable() if self._claims else -1
            if at is None:
                break  # woken when a claim's resources come back
            if (self._idle[at] in self._spares and self._spares_may_run is not None
                    and not self._spares_may_run()):
                break  # its core is the loop's, busy now: the others take the batch
            items = self._take(now, head)
            if items is None:
                break
            executor = self._idle.pop(at)
            if self._claims:
                claim = self._claims.get(executor)
                if claim is not None:
                    claim.take()
            if self._arrange is not None:
                items = self._arrange(items)
            batch = Batch(items, now)
            for item in items:
                item.times.queue_ns = now - item.enqueued_ns
            self._running.add(batch)
            executor.submit(batch)
        self._arm_timer(now)

    def _runnable(self) -> int | None:
        """Where in the idle stack the executor that may run next is (the topmost whose
        rate limiter resources are free), or None after asking to be woken."""
        for at in range(len(self._idle) - 1, -1, -1):
            claim = self._claims.get(self._idle[at])
            if claim is None or claim.may_run():
                return at
        for executor in self._idle:
            self._claims[executor].wait(self._schedule)
        return None

    def _take(self, now: int, head: WorkItem) -> list[WorkItem] | None:
        """The next batch to run, starting with `head`, or None to wait for more requests."""
        if not self._batching:
            return [self._queued.pop_head()]
        cap = self._cap
        limit = (self._max_rows if cap is None else
                 cap.rows_for_next_batch(_row_bytes(head) if cap.bounds_gathers else 0))
        chosen: list[WorkItem] = []
        rows = 0
        room = BatchRoom(self._ragged) if self._ragged is not None else None
        for item in self._queued:
            if item.future.done():
                continue
            if item.key != head.key:
                if self._preserve_order:
                    break
                continue
            if chosen and rows + item.rows > limit:  # a request is never split
                break
            # (a request alone always fits: requests.py refuses one that does not)
            if room is not None and not room.take(item.inputs, item.rows) and chosen:
                break
            chosen.append(item)
            rows += item.rows
            if rows >= limit:
                break
        waited = now - head.enqueued_ns
        if rows < limit and rows < self._enough and self._delay_ns and waited < self._delay_ns:
            preferred = [p for p in self._preferred if p <= rows]
            if not preferred:
                return None
            # Cut to the largest preferred size the chosen requests reach exactly.
            target = preferred[-1]
            cut, total = [], 0
            for item in chosen:
                if total + item.rows > target:
                    break
                cut.append(item)
                total += item.rows
            if total != target:
                return None
            chosen = cut
        self._queued.take(chosen, now)
        return chosen

    def _arm_timer(self, now: int) -> None:
        head = self._queued.head()
        if head is None:
            return
        wake = 0
        if self._idle and self._delay_ns:
            wake = head.enqueued_ns + self._delay_ns
        earliest = self._queued.earliest_deadline()
        if earliest:
            wake = earliest if not wake else min(wake, earliest)
        if wake:
            self._timer = self._loop.call_later(max(wake - now, 0) / 1e9, self._schedule)

    # -- results (called on the loop by the executor, through the loop's mailbox) -----------

    def on_idle(self, executor: _Executor) -> None:
        claim = self._claims.get(executor)
        if claim is not None:
            claim.give_back()  # a no-op unless it ran a batch
        if executor in self._spares:
            self._idle.insert(0, executor)  # the bottom of the stack
        else:
            self._idle.append(executor)
        self._schedule()
        if claim is not None:
            claim.offer()  # what it did not take again goes to other models, in turn

    def on_batch_done(self, batch: Batch) -> None:
        if batch.streaming:  # its execute returned; its requests end on their own
            # an execute that raised is an execution, and infers nothing (Triton's Python
            # backend counts them so); its requests' streams ended with its error, which
            # the batch lets go of (its traceback's frames hold the batch: a cycle)
            self._stats.record_batch(batch.rows, batch.input_ns, batch.infer_ns,
                                     batch.output_ns, None if batch.error is None else 0)
            batch.error = None
            for item in batch.items:
                if item.filler:
                    item.release()
                elif item.rescheduled:  # its stream is over; its rerun has one of its own
                    assert self._rescheduled is not None  # as for a batch that is answered
                    batch.streams_open -= 1
                    self._rescheduled(item)
                    item.release()
                elif self._released is not None:
                    self._released(item)
            if not batch.streams_open:
                self._running.discard(batch)
            return
        self._running.discard(batch)
        now = time.monotonic_ns()
        if batch.error is not None:
            error = batch.error
            if batch.counted_if_failed:  # an execution that inferred nothing
                self._stats.record_batch(batch.rows, batch.input_ns, batch.infer_ns,
                                         batch.output_ns, 0)
            for item in batch.items:
                if not item.filler:
                    self._fail(item, error, now, "BACKEND")
                item.release()
            return
        self._stats.record_batch(batch.rows, batch.input_ns, batch.infer_ns, batch.output_ns,
                                 None if self._arrange is None else
                                 sum(item.rows for item in batch.items if not item.filler))
        if self._cap is not None and not batch.run_alone and self._cap.record(
                batch.rows, batch.input_ns + batch.infer_ns + batch.output_ns):
            self._stats.batch_rows_limit = self._cap.limit
            log.debug("model %s: batches now take up to %d rows (measured cost per row; "
                      "max_batch_size %d)", self._spec.name, self._cap.limit, self._max_rows)
        for item in batch.items:
            if item.filler:
                item.release()
                continue
            if item.error is not None:
                self._fail(item, item.error, now, "BACKEND")
                item.release()
                continue
            if item.rescheduled:  # not answered yet: it runs again
                # only an iterative sequence batcher's models may reschedule, and it gave the hook
                assert self._rescheduled is not None
                self._rescheduled(item)
                item.release()
                continue
            times = item.times
            times.input_ns = batch.input_ns
            times.infer_ns = batch.infer_ns
            times.output_ns = batch.output_ns
            times.total_ns = now - item.enqueued_ns
            self._stats.record_success(times, item.ledger.bytes)
            if item.trace is not None:
                _stamp_compute(item.trace, batch)
            if not item.future.done():
                # The results, not the item: the item holds its future, so a future holding
                # the item is a reference cycle, and every request's tensors would wait for
                # the GC.
                item.future.set_result(item.results)
            item.release()

    def on_stream_end(self, batch: Batch, item: WorkItem) -> None:
        """A request of a streaming batch is over: its model sent the final flag or an error
        response, or its execute failed. Its responses reached its client as they came."""
        batch.streams_open -= 1
        if not batch.streams_open:
            self._running.discard(batch)
        now = time.monotonic_ns()
        future = item.future
        if future.cancelled():  # its client left before the end
            self._stats.record_failure(now - item.enqueued_ns, "CANCELED")
        elif future.done():  # answered already: failed at unload (fail_running)
            pass
        elif item.abandoned:  # its client left (a sequence batcher's item: its own future)
            self._stats.record_failure(now - item.enqueued_ns, "CANCELED")
            future.cancel()
        elif item.error is not None:
            self._fail(item, item.error, now, "BACKEND")
        else:
            times = item.times
            times.total_ns = now - item.enqueued_ns
            self._stats.record_success(times, item.ledger.bytes)
            if item.trace is not None:
                item.trace.stamp("COMPUTE_START", batch.started_ns)
                item.trace.stamp("COMPUTE_END", now)
            future.set_result({})  # its outputs went with each response
        item.release()

    def _fail(self, item: WorkItem, error: BaseException, now: int, reason: str) -> None:
        self._stats.record_failure(now - item.enqueued_ns, reason)
        item.fail(error)


def _row_bytes(item: WorkItem) -> int:
    """The input bytes one row of `item` brings to a gather (a BYTES input's: references)."""
    total = 0
    for value in item.inputs.values():
        total += value.nbytes
    return total // max(item.rows, 1)


def _stamp_compute(trace: Trace, batch: Batch) -> None:
    """A traced request's time in the executor, from its batch's (Triton's names)."""
    trace.stamp("COMPUTE_START", batch.started_ns)
    trace.stamp("COMPUTE_INPUT_END", batch.started_ns + batch.input_ns)
    trace.stamp("COMPUTE_OUTPUT_START", batch.output_started_ns or batch.started_ns)
    trace.stamp("COMPUTE_END", (batch.output_started_ns or batch.started_ns) + batch.output_ns)
