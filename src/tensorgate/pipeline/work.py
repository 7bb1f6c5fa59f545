"""What crosses between the loop and the executor: one request's work, and a batch of them.

A `WorkItem` is made on the loop, read by the executor, and given results by the executor or
the post-processing pool; the loop reads them again only after the executor's post to the
loop's mailbox (pipeline/handoff.py), which orders those writes before the reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from tensorgate.errors import InternalError, TensorgateError
from tensorgate.model import NO_PARAMETERS, Parameter, RequestInfo
from tensorgate.pipeline.stats import StageTimes
from tensorgate.pipeline.trace import Trace
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.view import TensorView

__all__ = ["Batch", "SequenceFlags", "WorkItem"]

_RELEASED: dict[str, Any] = {}  # an answered item's inputs and results; never written to


class SequenceFlags(NamedTuple):
    """A request's place in a sequence of a stateful model (Triton's sequence extension)."""

    id: int | str
    start: bool = False
    end: bool = False


class WorkItem:
    """One request inside the pipeline."""

    __slots__ = ("inputs", "rows", "key", "wanted", "future", "enqueued_ns", "deadline_ns",
                 "ledger", "times", "results", "level", "priority", "respond", "abandoned",
                 "sequence", "filler", "id", "parameters", "trace", "error", "answer_parameters",
                 "rescheduled")

    def __init__(self, inputs: dict[str, Any], rows: int, key: tuple[Any, ...],
                 wanted: tuple[str, ...], future: asyncio.Future[Any], enqueued_ns: int,
                 deadline_ns: int, ledger: CopyLedger, level: int = 0,
                 sequence: SequenceFlags | None = None, priority: int = 0, id: str = "",
                 parameters: Mapping[str, Parameter] = NO_PARAMETERS,
                 trace: Trace | None = None) -> None:
        self.inputs = inputs          # config input name → CPU tensor (numpy object for BYTES)
        self.rows = rows              # batch rows this request brings (1 when not batching)
        self.key = key                # per-item shapes: only equal keys batch together
        self.wanted = wanted          # output names to return
        self.future = future
        self.enqueued_ns = enqueued_ns
        self.deadline_ns = deadline_ns  # 0: none
        self.ledger = ledger
        self.times = StageTimes()
        self.results: dict[str, TensorView] = {}
        self.level = level            # priority level's queue index: 0 is the highest
        self.priority = priority      # as the request asked (0: default), for ensemble steps
        # A decoupled model's request: each response goes to `respond` on the loop as soon as
        # it is made; `abandoned` (set on the loop) tells the executor to stop making them.
        # `respond(outputs, taken, parameters, final)`: the receiver calls `taken()` once its
        # client has the response, which lets the executor make one more (a bound on those
        # waiting); `final`: the model said it is the request's last (a Triton model's send
        # with the final flag; a generator's last is known only after it, never here).
        # In place of the outputs, a TensorgateError: an error response that is not the
        # last (a Triton model's, without the final flag).
        self.respond: Callable[[dict[str, TensorView] | TensorgateError, Callable[[], None],
                                Mapping[str, Parameter], bool], None] | None = None
        self.abandoned = False
        self.sequence = sequence
        # A row that only fills a gap in a direct sequence batch (pipeline/sequences.py): run,
        # but nobody's request, so neither answered nor counted.
        self.filler = False
        self.id = id                  # the request's id, and the parameters its model sees
        self.parameters = parameters
        self.trace = trace            # None unless a trace setting sampled the request
        # Its own failure, where a model answers each request of a batch (a Triton Python
        # model's error response); the batch's other requests are answered.
        self.error: BaseException | None = None
        # the parameters its model's response carries (a Triton Python model's
        # `InferenceResponse(parameters=...)`), which the client gets with the outputs
        self.answer_parameters: Mapping[str, Parameter] = NO_PARAMETERS
        # Its model asked to run it again in a later batch (iterative_sequence): it ran, but
        # is not answered yet, nor counted as a success.
        self.rescheduled = False

    def fail(self, error: BaseException) -> bool:
        """Answer it with `error` unless it is answered; True if this did. An expected error
        (a TensorgateError) goes without the frames it was raised through, nor those of the
        errors it came from: those frames may hold this item, whose future would hold the
        error, a cycle that kept the request and its buffers for the garbage collector (the
        server freezes its generations; tools/fuzz_front_ends.py found it). Any other error
        is a bug and keeps its traceback for the log."""
        if self.future.done():
            return False
        if isinstance(error, TensorgateError):
            _forget_frames(error)
        self.future.set_exception(error)
        return True

    def set_error(self, error: BaseException) -> None:
        """Its own failure, which the loop answers it with: an expected error without the
        frames it was raised through, as `fail` gives it. Those frames (a model's thread's,
        an executor's) hold this item; a client that left before the loop ran the failure
        never reads it, and the item kept it in a cycle for the collector
        (tests/pipeline/test_engine_garbage.py)."""
        if isinstance(error, TensorgateError):
            _forget_frames(error)
        self.error = error

    def release(self) -> None:
        """Its batch is done and it is answered: the item lets go of its tensors (the future
        holds the results). The executor thread may still hold the batch for a moment after
        it reported it done, and must not keep the request's buffers out of the pool
        meanwhile. Only once the batch is done: the executor writes `results` until then."""
        self.inputs = self.results = _RELEASED


def _forget_frames(error: BaseException) -> None:
    """Drop the tracebacks of `error` and of the errors it was raised from or during."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += (current.__cause__, current.__context__)


class Batch:
    """Work items run in one model execution."""

    __slots__ = ("items", "rows", "error", "dispatched_ns", "input_ns", "infer_ns", "output_ns",
                 "started_ns", "output_started_ns", "infos", "streaming", "streams_open",
                 "run_alone", "counted_if_failed")

    def __init__(self, items: list[WorkItem], dispatched_ns: int) -> None:
        self.items = items
        self.rows = sum(item.rows for item in items)
        self.error: BaseException | None = None
        self.dispatched_ns = dispatched_ns
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0
        self.started_ns = 0         # when the executor began it, and began its outputs (for
        self.output_started_ns = 0  # traces: the durations above are what statistics need)
        self.infos: list[RequestInfo] | None = None  # what `requests()` handed the model
        # A decoupled Triton Python model's batch: its requests go on streaming after its
        # execute (pipeline/response_streams.py); each ends on its own, and the batch is
        # over once `streams_open` (counted down on the loop) is 0.
        self.streaming = False
        self.streams_open = 0
        # it failed as a batch and its requests ran again one by one (executor._each_alone):
        # its time is no batch's cost (pipeline/batch_cap.py learns from the others)
        self.run_alone = False
        # a Triton Python model's execute that raised is still an execution (Triton's Python
        # backend reports every execute's batch; its C++ backends none for a failed batch)
        self.counted_if_failed = False

    def requests(self) -> list[RequestInfo]:
        """Its requests as a Python model's `preprocess` sees them, in row order (kept, for
        the response parameters the model sets on them)."""
        found = []
        start = 0
        for item in self.items:
            found.append(RequestInfo(item.id, slice(start, start + item.rows), item.parameters))
            start += item.rows
        self.infos = found
        return found

    def take_response_parameters(self, model: str) -> None:
        """Each request's `response_parameters`, as the model set them, onto its item; an
        error naming the first that a response cannot carry."""
        for item, info in zip(self.items, self.infos or ()):
            if info.response_parameters:
                error = response_parameter_error(model, info.response_parameters)
                if error is not None:
                    raise error
                item.answer_parameters = dict(info.response_parameters)


def response_parameter_error(model: str, given: Mapping[Any, Any]) -> InternalError | None:
    """Why `given` cannot be a response's parameters (None when it can): names are strings,
    values bool, int (64-bit), float or str — what JSON and gRPC's InferParameter carry."""
    for key, value in given.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, float, str)) or (
                type(value) is int and not -(1 << 63) <= value < 1 << 63):
            return InternalError(f"model '{model}': its response's parameter {key!r} is "
                                 f"{type(value).__name__} {value!r}; a response parameter "
                                 "must be a string name with a bool, int (64-bit), float or str "
                                 "value")
    return None
