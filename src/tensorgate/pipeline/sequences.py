"""The sequence batcher of a stateful model (`sequence_batching`); it lives on the event loop.

A sequence is the requests that share a `sequence_id`, from the one with `sequence_start` to
the one with `sequence_end`. It takes a slot of one instance at its start and keeps it until
it ends, or until it has had no request for `max_sequence_idle_microseconds`; sequences
started while every slot is taken wait for one. Its requests run one at a time, in the order
they arrived: each goes to its instance's dynamic batcher (a `Scheduler`) only when the one
before it is answered, with the control inputs set (START, END, READY, CORRID) and each
implicit state's input holding what the model returned for that state on the one before
(the initial state on a start). Requests of different sequences batch together, at most one
per sequence; under `direct` each request runs in its sequence's row of the batch, and rows
below it that no sequence fills carry READY false (filler rows, answered to no one). The
control tensors, initial states and fillers are made in sequence_inputs.py, which also
remembers the sequences that ended, to tell a late request how.

A request whose client left after it was queued still runs when its turn comes, so that the
sequence's state stays what the client's earlier requests made it; one that left before its
turn is dropped. One that left while rescheduled runs once more, cancelled (`is_cancelled()`)
and as its sequence's end, so that its model lets go of what it keeps for it.

Iterative sequences (Triton's `iterative_sequence`, for models that generate step by step):
a request without a sequence id is a sequence of its own, under an id the server picks (one
no live sequence has), with START set. When the model reschedules it (a Triton Python
model's `set_release_flags(RESCHEDULE)`), it goes back to the head of its sequence and runs
again in a later batch with START false, beside whatever other sequences are running then;
the model's first real answer is the client's, and ends that sequence. So requests join and
leave the model's batches step by step (continuous batching), each holding its slot only
while it runs.

A decoupled (Triton Python) model's request streams its responses to its client; as on
Triton, the sequence's next request runs once its execute has returned (`_released`),
whether or not its final flag has come, and the client's request is over at the final flag
(`_answer_stream`). Rescheduled, it goes back to the head of its sequence as above, its
stream open: its rerun answers through the same client.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections import OrderedDict, deque
from dataclasses import replace
from functools import partial
from typing import Any

from tensorgate.errors import InvalidArgumentError, TensorgateError, UnavailableError
from tensorgate.pipeline.scheduler import Scheduler
from tensorgate.pipeline.sequence_inputs import EndedSequences, SequenceInputs
from tensorgate.pipeline.sequence_slots import SequenceSlots
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.work import SequenceFlags, WorkItem
from tensorgate.repository.model_config import BatchingPolicy, ModelSpec

__all__ = ["SequenceScheduler"]

log = logging.getLogger("tensorgate.sequences")

# Requests held here, not yet handed to an instance's batcher (they wait for the request
# before them in their sequence, or for a slot): bounded, as every queue is.
MAX_WAITING = 4096

class _Sequence:
    __slots__ = ("id", "instance", "slot", "waiting", "running", "state", "corrid", "idle_since",
                 "auto")

    def __init__(self, sequence_id: int | str, auto: bool = False) -> None:
        self.id = sequence_id
        self.auto = auto  # an iterative sequence of one request, under an id the server gave
        self.instance = -1  # no slot yet: the sequence waits in the backlog
        self.slot = -1
        self.waiting: deque[WorkItem] = deque()
        self.running: WorkItem | None = None  # the request handed to the instance's batcher
        self.state: dict[str, Any] = {}  # state input name → tensor for the next request
        self.corrid: Any = None
        self.idle_since = 0


class _SlotItem(WorkItem):
    """A request as its instance's batcher sees it: with its sequence's row, and the
    client's request it runs for."""

    __slots__ = ("slot", "client")
    slot: int
    client: WorkItem


class SequenceScheduler:
    """Sequences, their slots and their state; the Scheduler's interface to the engine.

    `instances` holds one Scheduler per model instance, for the engine to wire to that
    instance's executor: a sequence's requests all run on the instance that holds it."""

    def __init__(self, spec: ModelSpec, stats: ModelStatistics,
                 loop: asyncio.AbstractEventLoop, instances: int,
                 directory: pathlib.Path) -> None:
        policy = spec.sequence
        assert policy is not None
        self._spec = spec
        self._policy = policy
        self._loop = loop
        self._stats = stats
        self._decoupled = spec.decoupled
        batched = spec.max_batch_size > 0
        feed = replace(spec, batching=BatchingPolicy(
            policy.max_queue_delay_us, policy.preferred_batch_sizes,
            policy.preserve_ordering, ready_rows=policy.ready_rows) if batched else None)
        arrange = self._arrange if policy.strategy == "direct" and batched else None
        rescheduled = self._rerun if policy.iterative else None
        released = self._released if spec.decoupled else None
        self.instances = [Scheduler(feed, stats, loop, measured_cap=False, arrange=arrange,
                                    rescheduled=rescheduled, released=released)
                          for _ in range(instances)]
        self._slots = SequenceSlots(policy.slots, instances)  # free ones, lowest first
        self._sequences: dict[int | str, _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()
        self._idle: OrderedDict[int | str, _Sequence] = OrderedDict()  # by when they went idle
        self._idle_ns = policy.idle_us * 1000
        self._idle_timer: asyncio.TimerHandle | None = None
        self._ended = EndedSequences(spec.name, self._idle_ns)
        self._waiting = 0
        self._closed: TensorgateError | None = None
        self._inputs = SequenceInputs(spec, directory)
        self._state_outputs = tuple(s.output_name for s in policy.states)
        # what a request wanting every output wants, with the states' outputs: made once
        self._all_wanted = spec.output_names + tuple(
            n for n in self._state_outputs if n not in spec.output_names)
        self._last_auto_id = 0
        # a decoupled model's client requests → the run streaming for each (its rerun's,
        # once rescheduled), for their clients' leaving to reach
        self._streams: dict[WorkItem, WorkItem] = {}
        stats.sequence_slots = policy.slots * instances

    # -- the Scheduler's interface ---------------------------------------------------------

    @property
    def pending(self) -> int:
        return self._waiting + sum(s.pending for s in self.instances)

    @property
    def busy(self) -> bool:
        return self._waiting > 0 or any(s.busy for s in self.instances)

    def submit(self, item: WorkItem) -> None:
        """Queue `item` behind the earlier requests of its sequence, or raise at once."""
        if self._closed is not None:
            raise self._closed
        flags = item.sequence
        name = self._spec.name
        auto = flags is None and self._policy.iterative
        if auto:
            flags = item.sequence = SequenceFlags(self._auto_id(), start=True)
        if flags is None:
            raise InvalidArgumentError(
                f"model '{name}' is stateful (sequence_batching): each request needs a "
                "non-zero 'sequence_id' parameter, with 'sequence_start' on the first request "
                "of the sequence and 'sequence_end' on the last")
        if item.rows != 1:
            raise InvalidArgumentError(
                f"model '{name}' is stateful (sequence_batching): a request carries one row "
                f"of its sequence, this one has a batch of {item.rows}")
        if self._waiting >= MAX_WAITING:
            raise UnavailableError(
                f"model '{name}' already holds {self._waiting} requests waiting for earlier "
                "requests of their sequences or for a free sequence slot; retry later, or add "
                "instances")
        sequence = self._sequences.get(flags.id)
        if sequence is None:
            if not flags.start:
                raise self._ended.not_started(flags.id)
            corrid = self._inputs.corrid(flags.id)
            self._ended.forget(flags.id)
            sequence = self._sequences[flags.id] = _Sequence(flags.id, auto)
            sequence.corrid = corrid
            self._place(sequence)
        elif sequence.auto and not auto:
            raise InvalidArgumentError(
                f"model '{name}': sequence id {flags.id!r} is taken by a request that came "
                "without one (iterative_sequence gives each its own); choose another id")
        else:
            self._idle.pop(flags.id, None)
        sequence.waiting.append(item)
        self._waiting += 1
        if self._decoupled:  # its client leaving reaches the request running for it
            item.future.add_done_callback(partial(self._client_left, item))
        if sequence.instance >= 0 and sequence.running is None:
            self._run_next(sequence)

    def _auto_id(self) -> int:
        """An id for an iterative sequence: one that no live sequence has (a client's
        included), within every CORRID type's range."""
        while True:
            self._last_auto_id = self._last_auto_id % (2**31 - 1) + 1
            if self._last_auto_id not in self._sequences:
                return self._last_auto_id

    def close(self, reason: TensorgateError) -> None:
        self._closed = reason
        for scheduler in self.instances:
            scheduler.close(reason)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def fail_queued(self, error: TensorgateError) -> int:
        count = 0
        for sequence in self._sequences.values():
            while sequence.waiting:
                item = sequence.waiting.popleft()
                if item.fail(error):
                    count += 1
        self._waiting = 0
        return count + sum(s.fail_queued(error) for s in self.instances)

    def fail_running(self, error: TensorgateError) -> int:
        return sum(s.fail_running(error) for s in self.instances)

    # -- slots -----------------------------------------------------------------------------

    def _place(self, sequence: _Sequence) -> None:
        """Give `sequence` a slot of the instance with the most free, or queue it for one."""
        taken = self._slots.take()
        if taken is None:
            self._backlog.append(sequence)
            self._stats.sequences_waiting = len(self._backlog)
            return
        sequence.instance, sequence.slot = taken
        self._stats.sequences_active += 1

    def _release(self, sequence: _Sequence) -> None:
        """`sequence` is over: its slot goes to the sequence waiting longest for one."""
        del self._sequences[sequence.id]
        self._idle.pop(sequence.id, None)
        self._slots.give_back(sequence.instance, sequence.slot)
        self._stats.sequences_active -= 1
        while self._backlog:
            waiting = self._backlog.popleft()
            self._stats.sequences_waiting = len(self._backlog)
            if waiting.id in self._sequences:
                self._place(waiting)
                self._run_next(waiting)
                return

    def _went_idle(self, sequence: _Sequence) -> None:
        sequence.idle_since = time.monotonic_ns()
        self._idle[sequence.id] = sequence
        if self._idle_timer is None and self._closed is None:
            self._idle_timer = self._loop.call_later(self._idle_ns / 1e9, self._expire)

    def _expire(self) -> None:
        """End the sequences that had no request for max_sequence_idle_microseconds."""
        self._idle_timer = None
        now = time.monotonic_ns()
        while self._idle:
            sequence = next(iter(self._idle.values()))
            if now - sequence.idle_since < self._idle_ns:
                wake = (sequence.idle_since + self._idle_ns - now) / 1e9
                self._idle_timer = self._loop.call_later(wake, self._expire)
                return
            log.debug("model %s: sequence %r ended after %.1f s without requests "
                      "(max_sequence_idle_microseconds)", self._spec.name, sequence.id,
                      self._idle_ns / 1e9)
            self._stats.sequences_expired += 1  # a metric, not a log line per sequence
            self._ended.remember(sequence.id, f"after {self._idle_ns / 1e6:g} ms without "
                                              "requests (max_sequence_idle_microseconds)")
            self._release(sequence)

    # -- requests --------------------------------------------------------------------------

    def _run_next(self, sequence: _Sequence) -> None:
        """Hand the sequence's next request to its instance, with controls and state set."""
        while sequence.waiting:
            item = sequence.waiting.popleft()
            self._waiting -= 1
            flags = item.sequence
            assert flags is not None
            left = item.future.done()  # its client has gone
            if left and not item.rescheduled:
                continue  # before its turn
            if left:  # while rescheduled: its last run, for the model to clean up
                flags = item.sequence = SequenceFlags(flags.id, end=True)
            if flags.start:
                sequence.state = self._inputs.initial_states()
            inputs = dict(item.inputs)
            self._inputs.set_controls(inputs, flags.start, flags.end, sequence.corrid)
            key = item.key
            wanted = item.wanted
            if sequence.state:
                inputs.update(sequence.state)
                key += tuple(tuple(t.shape) for t in sequence.state.values())
                wanted = (self._all_wanted if wanted is self._spec.output_names else wanted
                          + tuple(n for n in self._state_outputs if n not in wanted))
            running = _SlotItem(inputs, 1, key, wanted, self._loop.create_future(),
                                item.enqueued_ns, item.deadline_ns, item.ledger, item.level,
                                flags)
            running.times = item.times
            running.slot = sequence.slot
            running.client = item
            running.abandoned = left or item.abandoned
            sequence.running = running
            if self._decoupled:
                running.respond = item.respond
                self._streams[item] = running
                running.future.add_done_callback(partial(self._answer_stream, item, running))
            else:
                running.future.add_done_callback(partial(self._answer, sequence, item,
                                                          running))
            try:
                self.instances[sequence.instance].submit(running)
            except TensorgateError as error:
                running.fail(error)
            return
        if sequence.running is None:
            if sequence.auto:  # its one request's client left: nothing more will come
                self._release(sequence)
            else:
                self._went_idle(sequence)

    def _answer(self, sequence: _Sequence, item: WorkItem, running: _SlotItem,
                done: asyncio.Future[Any]) -> None:
        """`item` ran (or failed): answer it, keep the state it made, and run the next."""
        if running.rescheduled:
            return  # _rerun has it
        sequence.running = None
        error = (UnavailableError("the request was cancelled before it ran")
                 if done.cancelled() else done.exception())
        flags = item.sequence
        assert flags is not None
        if error is None:
            results = done.result()
            for state in self._policy.states:
                sequence.state[state.input_name] = results[state.output_name].torch()
            item.answer_parameters = running.answer_parameters
            if not item.future.done():
                item.future.set_result({name: results[name] for name in item.wanted})
        else:
            item.fail(error)
        item.release()
        self._advance(sequence, flags)

    def _released(self, running: WorkItem) -> None:
        """A decoupled model's execute of `running` returned (its stream may go on): the
        sequence's next request may run."""
        assert isinstance(running, _SlotItem) and running.sequence is not None
        sequence = self._sequences.get(running.sequence.id)
        if sequence is None or sequence.running is not running:
            return  # its sequence ended meanwhile (unload)
        sequence.running = None
        self._advance(sequence, running.sequence)

    def _client_left(self, item: WorkItem, done: asyncio.Future[Any]) -> None:
        """A decoupled request's client went away: the run streaming for it (if one is) is
        abandoned, so that its model sees it cancelled and its stream stops."""
        running = self._streams.get(item)
        if done.cancelled() and running is not None:
            running.abandoned = True

    def _answer_stream(self, item: WorkItem, running: WorkItem,
                       done: asyncio.Future[Any]) -> None:
        """A decoupled request's stream is over (`running`'s future, set when it ended): its
        client's request is answered — its responses went to it as they came."""
        if running.rescheduled:
            return  # _rerun has it: the request streams on in its rerun
        if self._streams.get(item) is running:
            del self._streams[item]
        if not item.future.done():
            error = None if done.cancelled() else done.exception()
            if error is None:
                item.future.set_result({})
            else:
                item.fail(error)
        item.release()

    def _advance(self, sequence: _Sequence, flags: SequenceFlags) -> None:
        """The sequence's request with `flags` is done running: end the sequence there, or
        run its next request."""
        if flags.end or sequence.auto:
            if not sequence.auto:  # (an iterative sequence's id is the server's own)
                self._ended.remember(sequence.id, "at its request with 'sequence_end'")
            # Requests queued after the end belong to a new sequence only if they start one.
            waiting = sequence.waiting
            while waiting and not waiting[0].sequence.start:  # type: ignore[union-attr]
                late = waiting.popleft()
                self._waiting -= 1
                late.fail(self._ended.not_started(sequence.id))
            if not waiting:
                self._release(sequence)
                return
            self._ended.forget(sequence.id)  # a request starts the id's next sequence
        self._run_next(sequence)

    def _rerun(self, running: WorkItem) -> None:
        """The model rescheduled `running` (called by the instance's batcher as the batch
        ends, so that it is queued before the next batch is chosen): its client's request
        goes first in its sequence again, as neither its start nor (unless it was) its end."""
        assert isinstance(running, _SlotItem) and running.sequence is not None
        running.future.cancel()  # its _answer returns at once; no cycle is left for the GC
        sequence = self._sequences[running.sequence.id]
        item = running.client
        sequence.running = None
        item.rescheduled = True  # it has run: should its client leave, it runs once more
        item.sequence = SequenceFlags(running.sequence.id, end=running.sequence.end)
        sequence.waiting.appendleft(item)
        self._waiting += 1
        self._run_next(sequence)

    def _arrange(self, items: list[WorkItem]) -> list[WorkItem]:
        """A direct batch: each request in its sequence's row; rows below the last that no
        request fills get a filler with READY false (and zeros elsewhere)."""
        rows: list[WorkItem] = sorted(items, key=_slot)
        if _slot(rows[-1]) == len(rows) - 1:
            return rows  # no gaps
        arranged: list[WorkItem] = []
        for item in rows:
            while len(arranged) < _slot(item):
                arranged.append(self._inputs.filler(rows[0], self._loop))
            arranged.append(item)
        return arranged


def _slot(item: WorkItem) -> int:
    return item.slot if isinstance(item, _SlotItem) else 0
