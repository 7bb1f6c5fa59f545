"""BLS (Triton's business-logic scripting): a Triton Python model calling another model with
`pb_utils.InferenceRequest(model_name=..., inputs=..., requested_output_names=...).exec()`.

The call comes on a model's thread (its executor thread, or a thread of its own); the request
goes through the engine on the event loop like any client's (batched, counted, traced), and
the calling thread waits for its answer, never the loop. Inputs and outputs cross
as views, not copies (a GPU tensor is copied to the host, counted). A call given the
calling request's `trace()` is traced as part of it (its trace made on the loop, under the
caller's). As on Triton, a model that calls itself with no free instance waits forever:
give such requests a `timeout`.

The calling thread is woken through descriptors written with the GIL let go
(pipeline/handoff.py: call_on_loop, ThreadInbox), as the executors are: a light Python
model's thread shares the loop's core (placement), where a wake-up by a thread that holds
the GIL costs two context switches more each way (bench/RESULTS.md, "BLS calls handed over
as batches are").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

import torch

from tensorgate import python_backend as pb_utils
from tensorgate.errors import InvalidArgumentError, Status, TensorgateError
from tensorgate.pipeline.handoff import LoopMailbox, ThreadInbox, call_on_loop
from tensorgate.pipeline.requests import InferenceRequest, InferenceResult
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.work import SequenceFlags
from tensorgate.repository.upload import UploadedFiles, uploaded_files
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.view import TensorView

__all__ = ["BlsBridge", "ModelControl"]

_T = TypeVar("_T")


class ModelControl(NamedTuple):
    """The engine's model management, for Triton's BLS model loading API."""

    allowed: bool  # load and unload (--model-control-mode explicit)
    load: Callable[[str, str | None, UploadedFiles | None], Coroutine[Any, Any, None]]
    unload: Callable[..., Coroutine[Any, Any, None]]
    ready: Callable[[str, int | None], bool]

_CODES = {Status.INVALID_ARGUMENT: pb_utils.TritonError.INVALID_ARG,
          Status.NOT_FOUND: pb_utils.TritonError.NOT_FOUND,
          Status.ALREADY_EXISTS: pb_utils.TritonError.ALREADY_EXISTS,
          Status.UNAVAILABLE: pb_utils.TritonError.UNAVAILABLE,
          Status.CANCELLED: pb_utils.TritonError.CANCELLED,
          Status.UNIMPLEMENTED: pb_utils.TritonError.UNSUPPORTED}
_END = object()


class BlsBridge:
    """`exec` for `pb_utils.InferenceRequest`, on the engine that runs on `loop`."""

    def __init__(self, infer: Callable[[InferenceRequest], Awaitable[InferenceResult]],
                 infer_stream: Callable[[InferenceRequest], AsyncIterator[InferenceResult]],
                 loop: asyncio.AbstractEventLoop,
                 control: ModelControl | None = None) -> None:
        """`control`: what `pb_utils.load_model` / `unload_model` / `is_model_ready` call;
        None refuses the first two (model control is for --model-control-mode explicit)."""
        self._infer = infer
        self._infer_stream = infer_stream
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop
        self._mailbox = LoopMailbox.for_loop(loop)
        self._control = control

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        """The response (an error response when the call failed), or with `decoupled` an
        iterator of the responses of a decoupled model (the last an empty one where the
        model sent its final flag alone, as on Triton)."""
        if threading.get_ident() == self._loop_thread:
            raise pb_utils.TritonModelException("exec() on the event loop would wait on "
                                                "itself; call it from the model's thread")
        try:
            call = _engine_request(request)
        except TensorgateError as error:
            return _error_response(error)
        parent = request.trace().of
        if decoupled:
            return self._stream(call, parent)
        return call_on_loop(self._mailbox, self._answer(call, parent))

    def submit(self, request: pb_utils.InferenceRequest
               ) -> concurrent.futures.Future[pb_utils.InferenceResponse]:
        """`exec` without waiting: the future of its response (for `async_exec`)."""
        try:
            call = _engine_request(request)
        except TensorgateError as error:
            done: concurrent.futures.Future[pb_utils.InferenceResponse] = \
                concurrent.futures.Future()
            done.set_result(_error_response(error))
            return done
        return asyncio.run_coroutine_threadsafe(self._answer(call, request.trace().of),
                                                self._loop)

    def load_model(self, name: str, config: str, files: Mapping[str, bytes] | None) -> None:
        control = self._controlling("load_model")
        try:
            upload = uploaded_files(files, _file_content) if files else None
        except TensorgateError as error:
            raise pb_utils.TritonModelException(error.message) from None
        self._wait(control.load(name, config or None, upload))

    def unload_model(self, name: str, dependents: bool) -> None:
        control = self._controlling("unload_model")
        self._wait(control.unload(name, dependents=dependents))

    def is_model_ready(self, name: str, version: str) -> bool:
        number = None
        if version:
            if not version.isdecimal():
                raise pb_utils.TritonModelException(f"is_model_ready: model_version "
                                                    f"{version!r} is not a version number")
            number = int(version)
        control = self._control
        if control is None:
            return False

        async def look() -> bool:  # the engine's state is the loop's to read
            return control.ready(name, number)
        return self._wait(look())

    def _controlling(self, what: str) -> ModelControl:
        if self._control is None or not self._control.allowed:
            raise pb_utils.TritonModelException(
                f"{what} is only allowed when the server runs with --model-control-mode "
                "explicit (as on Triton)")
        return self._control

    def _wait(self, work: Coroutine[Any, Any, _T]) -> _T:
        if threading.get_ident() == self._loop_thread:
            work.close()
            raise pb_utils.TritonModelException("a model-control call on the event loop would "
                                                "wait on itself; call it from the model's "
                                                "thread")
        try:
            return call_on_loop(self._mailbox, work)
        except TensorgateError as error:
            raise pb_utils.TritonModelException(error.message) from None

    async def _answer(self, call: InferenceRequest, parent: Trace | None
                      ) -> pb_utils.InferenceResponse:
        call.trace = parent.child(call.model) if parent is not None else None
        try:
            return _response(await self._infer(call))
        except TensorgateError as error:
            return _error_response(error)
        finally:
            if call.trace is not None:
                call.trace.finish()

    def _stream(self, call: InferenceRequest, parent: Trace | None
                ) -> Iterator[pb_utils.InferenceResponse]:
        arrived = ThreadInbox()  # (what is put once the model stopped reading: dropped)

        async def pump() -> None:
            call.trace = parent.child(call.model) if parent is not None else None
            ended = False  # by a response the model sent with the final flag
            try:
                async for result in self._infer_stream(call):
                    arrived.put(_response(result) if result.error is None
                                else _error_response(result.error))  # and more may come
                    ended = result.final
                if not ended:  # the flag came alone: an empty last response, as on Triton
                    arrived.put(pb_utils.InferenceResponse([]))
            except TensorgateError as error:
                arrived.put(_error_response(error))
            finally:
                arrived.put(_END)
                if call.trace is not None:
                    call.trace.finish()

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := arrived.get()) is not _END:
                yield item
        finally:
            future.cancel()  # the model stopped reading: the stream stops
            arrived.close()


def _engine_request(request: pb_utils.InferenceRequest) -> InferenceRequest:
    name = request.model_name()
    if not name:
        raise InvalidArgumentError("a BLS request needs a model_name")
    ledger = CopyLedger()
    inputs = {}
    for tensor in request.inputs():
        value = tensor.value()
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":  # to the host
            record_copy(value.numel() * value.element_size(), "device", ledger)
            value = value.cpu()
        inputs[tensor.name()] = TensorView.from_array(value, name=tensor.name(), ledger=ledger)
    flags = request.flags()
    correlation = request.correlation_id()
    start, end = (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
                  pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    sequence = (SequenceFlags(correlation, bool(flags & start), bool(flags & end))
                if correlation not in (0, "") else None)
    version = request.model_version()
    return InferenceRequest(
        name, inputs, version=version if version >= 0 else None,
        outputs=request.requested_output_names() or None,
        timeout_us=request.timeout() or None, id=request.request_id(), ledger=ledger,
        sequence=sequence, parameters=json.loads(request.parameters()))


def _file_content(key: str, value: object) -> bytes:
    """pb_utils.load_model's `files` value: the file's content, bytes as Triton's takes."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"load_model: files[{key!r}] must be bytes, the file's "
                                   f"content, not {type(value).__name__}")
    return bytes(value)


def _response(result: InferenceResult) -> pb_utils.InferenceResponse:
    tensors = [pb_utils.Tensor(name, view.torch() if view.datatype.numpy is None
                               else view.numpy())
               for name, view in result.outputs.items()]
    return pb_utils.InferenceResponse(tensors, parameters=result.parameters)


def _error_response(error: TensorgateError) -> pb_utils.InferenceResponse:
    code = _CODES.get(error.status, pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message, code))
