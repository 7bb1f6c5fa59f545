"""A Triton Python-backend model (`model.py` with `class TritonPythonModel`) behind a Runner.

Such a model answers requests, not batches: `execute(requests)` gets one
`pb_utils.InferenceRequest` per request, each with its own input tensors (views of the
request's bytes: nothing is gathered or copied), and returns one `InferenceResponse` each,
which may be an error for that request alone, or (as Triton allows since 23.10) returns
None and answers each request through its response sender: one response and the final
flag, from execute or later from a thread of its own (the instance waits for them: on
Triton it would take its next batch). A decoupled one answers through each
request's response sender, from any of its threads, also after `execute` returned: each
response goes to that request's sink as it is sent (`start_streams`), and the instance is
free for its next batch as soon as `execute` returns, as on Triton. An `async def execute`
of a decoupled model runs on an event loop of the instance's own, on a thread of its own,
so one execute may await while the next begins (Triton's "async execute"). With
`iterative_sequence`, a request the model rescheduled (`set_release_flags(RESCHEDULE)`, its
response None) is RESCHEDULED: the sequence batcher runs it again. Built on the instance's
executor thread.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from tensorgate import python_backend as pb_utils
from tensorgate import python_backend_server
from tensorgate.errors import InternalError, TensorgateError, UnimplementedError
from tensorgate.model import NO_PARAMETERS, ModelContext, RequestInfo
from tensorgate.pipeline.served_config import instance_name
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.triton_answers import (CANCEL_POLL_S, Answer, SentAnswers, Sink,
                                                answer_of, deliver_to)
from tensorgate.repository.model_config import ModelSpec

__all__ = ["MODULE_NAME", "RESCHEDULED", "Answer", "RequestInputs", "Sink", "TritonPythonRunner",
           "install_module"]

MODULE_NAME = "triton_python_backend_utils"  # what Triton's Python models import
LOOP_STOP_S = 5.0  # how long `close` waits for an async decoupled model's loop to stop


def install_module() -> None:
    """Make `import triton_python_backend_utils` find tensorgate's."""
    sys.modules[MODULE_NAME] = pb_utils


class RequestInputs(NamedTuple):
    """One request of a batch, for a model that takes requests one by one."""

    inputs: Mapping[str, Any]   # its own tensors by input name (numpy objects for BYTES)
    info: RequestInfo
    wanted: Sequence[str]       # the outputs it asks for
    correlation_id: int | str   # its sequence (0: none)
    flags: int                  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
    cancelled: Callable[[], bool]
    trace: Trace | None = None  # when traced: what its BLS calls may join
    timeout_us: int = 0         # its timeout (0: none), as `request.timeout()` says it


# A request the model rescheduled (iterative_sequence): no answer yet, it runs again.
RESCHEDULED = Answer({}, NO_PARAMETERS)
WARM_UP_RUNS = 1000  # a warm-up request rescheduled more often than this fails the load


class TritonPythonRunner:
    """`execute` over requests (`run_each`), or for a decoupled model over requests that
    each stream their responses (`start_streams`); `finalize` at `close`."""

    def __init__(self, model_class: type, spec: ModelSpec, context: ModelContext) -> None:
        self.spec = spec
        self._directory = str(context.directory.resolve())  # pb_utils.get_model_dir()
        self.model = model_class()
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            before = python_backend_server.running_in(self._directory)
            try:
                initialize(initialize_args(spec, context))
            finally:
                python_backend_server.running_in(before)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        if inspect.iscoroutinefunction(self.model.execute):
            # `async def execute` (to await BLS calls with async_exec): run on a loop of
            # this instance's own, on its executor thread, one call at a time; a decoupled
            # model's on that loop's own thread, where its executes overlap as they await
            self._loop = asyncio.new_event_loop()
            if spec.decoupled:
                self._loop_thread = threading.Thread(
                    target=_run_forever, args=(self._loop, self._directory),
                    name=f"tg-async-{spec.name}", daemon=True)
                self._loop_thread.start()
        self._execute = self.model.execute
        self._reschedulable = spec.sequence is not None and spec.sequence.iterative
        # when run_each's `execute` began and returned (monotonic ns): what came before is
        # its requests made (compute_input), what comes after its responses read
        self.call_ns = (0, 0)

    def _call(self, requests: list[pb_utils.InferenceRequest]) -> Any:
        before = python_backend_server.running_in(self._directory)  # for get_model_dir() in execute
        try:
            if self._loop is None:
                return self._execute(requests)
            return self._loop.run_until_complete(self._execute(requests))
        finally:
            python_backend_server.running_in(before)  # the thread may run other things after

    def run_each(self, requests: Sequence[RequestInputs]) -> list[Answer | TensorgateError]:
        """Each request's answer, or its error; RESCHEDULED for one the model rescheduled
        (its response is ignored, as Triton's Python backend ignores it)."""
        sent = SentAnswers(self.spec.name, len(requests))
        incoming = [_incoming(r, reschedulable=self._reschedulable,
                              make_sender=sent.sender_maker(index, r.cancelled))
                    for index, r in enumerate(requests)]
        began = time.monotonic_ns()
        responses = self._call(incoming)
        self.call_ns = (began, time.monotonic_ns())
        name = self.spec.name
        if sent.used and responses is None:  # each request answers through its sender
            return sent.wait([request.cancelled for request in requests])
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            found = (f"{len(responses)} responses" if isinstance(responses, (list, tuple))
                     else f"a {type(responses).__name__}")
            raise InternalError(f"model '{name}': execute returned {found} for {len(requests)} "
                                "requests; it must return a list of one InferenceResponse per "
                                "request, in order")
        answers: list[Answer | TensorgateError] = []
        for index, (request, response) in enumerate(zip(incoming, responses)):
            # a response sent through the sender stands, the list's for it unread (Triton)
            if sent.used and (given := sent.answer(index)) is not None:
                answers.append(given)
                continue
            if request.rescheduled():
                answers.append(RESCHEDULED)
                continue
            if not isinstance(response, pb_utils.InferenceResponse):
                raise InternalError(f"model '{name}': execute's response {index} is a "
                                    f"{type(response).__name__}, not an InferenceResponse")
            answers.append(answer_of(response, name))
        return answers

    def start_streams(self, requests: Sequence[RequestInputs], sinks: Sequence[Sink],
                      failed: Callable[[TensorgateError], None]) -> list[bool]:
        """Give each request its response sender and run a decoupled model's `execute`:
        what the model sends for `requests[i]`, now or later and from any thread, goes to
        `sinks[i]`. Returns once `execute` has, saying which requests it rescheduled (their
        senders then refuse more: the rerun has its own). An `async def execute`: returns
        once it is scheduled on the instance's loop; what it raises goes to `failed`, as
        does its rescheduling a request (not supported). Raises what a synchronous
        `execute` raised."""
        name = self.spec.name
        incoming = [_incoming(request, pb_utils.InferenceResponseSender(
            deliver_to(sink, name), request.cancelled), self._reschedulable)
            for request, sink in zip(requests, sinks)]
        if self._loop_thread is not None:
            assert self._loop is not None
            running = asyncio.run_coroutine_threadsafe(self._execute(incoming), self._loop)
            running.add_done_callback(
                lambda done: _report_async_end(done, name, incoming, failed))
            return [False] * len(incoming)
        if self._call(incoming) is not None:
            raise InternalError(_NOT_NONE.format(name))
        rescheduled = [request.rescheduled() for request in incoming]
        for request, again in zip(incoming, rescheduled):
            if again:
                request.get_response_sender().retire(_RETIRED.format(name))
        return rescheduled

    def run_stream(self, request: RequestInputs) -> Iterator[Answer]:
        """A decoupled model's responses to `request` alone, on this thread, until the
        final flag (or until the client has gone): for a warm-up run. A rescheduled
        request runs again at once, as neither start nor end."""
        arrived: queue.SimpleQueue[tuple[Answer | TensorgateError | None, bool]] = \
            queue.SimpleQueue()
        runs = 0
        while self.start_streams([request],
                                 [lambda answer, final: arrived.put((answer, final))],
                                 lambda error: arrived.put((error, True)))[0]:
            runs += 1
            if runs >= WARM_UP_RUNS:
                raise InternalError(f"model '{self.spec.name}' rescheduled one request "
                                    f"{WARM_UP_RUNS} times without ending it")
            request = request._replace(flags=0)
        while True:
            try:
                answer, final = arrived.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                if request.cancelled():
                    return
                continue
            if isinstance(answer, TensorgateError):
                raise answer
            if answer is not None:
                yield answer
            if final:
                return

    def run(self, inputs: Mapping[str, Any], requests: Sequence[RequestInfo] | None = None
            ) -> Any:
        """One request of `inputs` (warm-up, cost probe): its outputs, or for a decoupled
        model the iterator of its responses. Batched `inputs` of several rows are as many
        requests of a row, in one execute (a model_warmup sample): the first one's outputs."""
        rows = next((len(v) for v in inputs.values()), 1) if self.spec.max_batch_size else 1
        info = requests[0] if requests else RequestInfo("", slice(0, rows), NO_PARAMETERS)
        request = RequestInputs(inputs, info, self.spec.output_names, 0, 0, _never)
        if self.spec.decoupled:
            return (answer.outputs for answer in self.run_stream(request))
        pending = [request]
        if rows > 1:  # a model_warmup sample of batch_size N: N requests of a row each, in
            # one execute, as Triton warms a Python model up (one may take a row a request)
            one = RequestInfo("", slice(0, 1), NO_PARAMETERS)
            pending = [RequestInputs({name: value[row:row + 1] for name, value in inputs.items()},
                                     one, self.spec.output_names, 0, 0, _never)
                       for row in range(rows)]
        first: dict[str, Any] | None = None  # the first request's outputs
        for _ in range(WARM_UP_RUNS):
            again = []
            for asked, answer in zip(pending, self.run_each(pending)):
                if isinstance(answer, TensorgateError):
                    raise answer
                if answer is RESCHEDULED:  # runs again: neither START nor END
                    again.append(asked._replace(flags=0))
                elif first is None:
                    first = answer.outputs
            if not again:
                assert first is not None
                return first
            pending = again
        raise InternalError(f"model '{self.spec.name}' rescheduled one request "
                            f"{WARM_UP_RUNS} times without answering it")

    def close(self) -> None:
        before = python_backend_server.running_in(self._directory)
        try:
            finalize = getattr(self.model, "finalize", None)
            if finalize is not None:
                finalize()
        finally:
            python_backend_server.running_in(before)
            loop, thread = self._loop, self._loop_thread
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(LOOP_STOP_S)
            if loop is not None and not loop.is_running():  # a stuck one is left to exit
                loop.close()


def _run_forever(loop: asyncio.AbstractEventLoop, directory: str) -> None:
    """An async decoupled model's loop, on its own thread, which runs that model only."""
    python_backend_server.running_in(directory)
    loop.run_forever()


def initialize_args(spec: ModelSpec, context: ModelContext) -> dict[str, str]:
    """`initialize(args)`'s dictionary, with Triton's keys; every value a string."""
    device = context.device
    return {
        "model_config": json.dumps(spec.config_dict()),
        "model_instance_kind": "GPU" if device.type == "cuda" else "CPU",
        "model_instance_name": instance_name(spec, context.instance),
        "model_instance_device_id": str(device.index or 0),
        "model_repository": str(context.directory.parent.resolve()),  # the model's folder
        "model_version": str(context.version),
        "model_name": spec.name,
    }


def _incoming(request: RequestInputs, sender: pb_utils.InferenceResponseSender | None = None,
              reschedulable: bool = False,
              make_sender: Callable[[], pb_utils.InferenceResponseSender] | None = None
              ) -> pb_utils.InferenceRequest:
    inputs = [pb_utils.Tensor(name, value) for name, value in request.inputs.items()]
    return pb_utils.incoming_request(
        inputs, request.info.id, request.correlation_id, list(request.wanted),
        json.dumps(dict(parameters)) if (parameters := request.info.parameters) else "{}",
        request.flags, request.cancelled, sender, request.trace, reschedulable, make_sender,
        request.timeout_us)


_NOT_NONE = ("model '{}' is decoupled: its execute must return None and answer through "
             "request.get_response_sender()")
_RETIRED = ("model '{}': this request was rescheduled, so this sender sends no more; send "
            "through the sender of the execute that runs it next")


def _report_async_end(done: Any, model: str, requests: Sequence[pb_utils.InferenceRequest],
                      failed: Callable[[TensorgateError], None]) -> None:
    """An async decoupled execute has ended: what it raised (or returned, but for None)
    fails its requests that are not over yet, as does its rescheduling one."""
    if done.cancelled():
        failed(InternalError(f"model '{model}': its async execute was cancelled (the model "
                             "is being unloaded)"))
        return
    error = done.exception()
    if error is not None:
        failed(error if isinstance(error, TensorgateError) else InternalError(
            f"model '{model}' raised {type(error).__name__}: {error}"))
    elif done.result() is not None:
        failed(InternalError(_NOT_NONE.format(model)))
    elif any(request.rescheduled() for request in requests):
        failed(UnimplementedError(f"model '{model}': an async def execute rescheduled a "
                                  "request, which tensorgate does not support; reschedule "
                                  "from a synchronous execute"))


def _never() -> bool:
    return False
