"""Triton's Python-backend API (`triton_python_backend_utils`), so that a Triton repository's
Python models (`backend: "python"`, a `model.py` with `class TritonPythonModel`) serve here
unchanged: `import triton_python_backend_utils as pb_utils` finds this module.

What a model sees is what Triton's Python backend gives it: `initialize(args)` once per
instance with the same `args` strings, `execute(requests)` per batch with one
`InferenceRequest` per request (each its own tensors: requests are not concatenated),
`finalize()` at unload. Differences, each deliberate:

- Tensors are views of the request's bytes (`as_numpy()`, `to_dlpack()` copy nothing), and
  the model runs in the server's process on the instance's executor thread: no stub process,
  no shared-memory hop per request.
- BLS (`InferenceRequest(model_name=...).exec()` / `await ....async_exec()`) goes through
  the server's engine like a client's request (pipeline/bls.py), tensors as views.
- Custom metrics (`MetricFamily`, custom_metrics.py) appear on the server's metrics port.
- `auto_complete_config` runs as in Triton, once at load before any instance
  (`ModelConfig`: python_backend_config.py; pipeline/auto_complete.py).
- Request rescheduling (`set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`, with
  `sequence_batching { iterative_sequence: true }`) as in Triton, for models that answer
  through `execute`'s list (`None` for a rescheduled request), and for decoupled models,
  whose responses to a request rescheduled in a synchronous `execute` go through that
  execute's sender before it returns (a later send through it raises, naming the rerun's
  sender as the one to use). Rescheduling a model without `iterative_sequence` raises
  `TritonModelException` naming the setting (Triton fails the request later, vaguer).
- A response's `parameters` (bool, int, float or str values) go to the client with it: in
  the JSON response's `parameters`, as gRPC InferParameters, to a BLS caller; a response
  that carries some is not kept by the response cache.
- A model not decoupled that answers through its requests' response senders (execute
  returning None, as Triton allows since 23.10) holds its instance until each request has
  its response and final flag; Triton takes the next batch meanwhile. One that returns
  None without using a sender is refused with an error naming it (Triton waits forever).
- A BLS call's error keeps its kind (`error().code()` NOT_FOUND for an unknown model,
  INVALID_ARG for a request the callee refused); Triton's are all INTERNAL.

What a model sees is otherwise Triton 2.51's, compared with Triton's own module by
tools/triton_diff.py's probe model (tools/triton_diff_probe.py): the helpers' answers
(`triton_to_numpy_type(14)` is None, `serialize_byte_tensor` returns bytes, TYPE_BOOL is
Python's bool), the errors (TritonModelException for a dtype no datatype holds, TypeError
for outputs not in a list), `get_model_dir()`, `PreferredMemory`, the memory kinds' numbers.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import struct  # noqa: F401 - Triton's module has it, so a model may reach pb_utils.struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np  # noqa: F401 - as struct: pb_utils.np (they left with Tensor, 15136b6)

from tensorgate.custom_metrics import Metric, MetricFamily
from tensorgate.errors import TritonModelException
from tensorgate.python_backend_config import ModelConfig
from tensorgate.python_backend_server import (bls_runner, get_model_dir, is_model_ready,
                                              load_model, unload_model)
from tensorgate.python_backend_tensor import (TRITON_STRING_TO_NUMPY, Tensor,
                                              deserialize_bytes_tensor, numpy_to_triton_type,
                                              serialize_byte_tensor, triton_string_to_numpy,
                                              triton_to_numpy_type)

__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace",
    "LogLevel", "Logger", "Metric", "MetricFamily", "ModelConfig", "PreferredMemory",
    "TRITON_STRING_TO_NUMPY", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "Tensor", "TritonError", "TritonModelException",
    "deserialize_bytes_tensor", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_model_dir", "get_output_config_by_name", "get_output_tensor_by_name",
    "is_model_ready", "load_model", "numpy_to_triton_type", "serialize_byte_tensor",
    "triton_string_to_numpy", "triton_to_numpy_type", "unload_model",
    "using_decoupled_model_transaction_policy",
]

# Triton's flag values (tritonserver.h), which models compare against
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
# PreferredMemory's kinds, numbered as Triton's Python backend numbers them (not as
# tritonserver.h does: there CPU is 0)
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1

_log = logging.getLogger("tensorgate.python_backend")


class TritonError:
    """One request's error, given as `InferenceResponse(error=...)`; `code` picks the
    status the client sees (INVALID_ARG: HTTP 400, NOT_FOUND: 404, UNAVAILABLE: 503, ...)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class InferenceResponse:
    """A request's answer: its output tensors, or an error."""

    def __init__(self, output_tensors: Sequence[Tensor] | None = None,
                 error: TritonError | None = None,
                 parameters: Mapping[str, Any] | str | None = None) -> None:
        if output_tensors is not None and not isinstance(output_tensors, (list, tuple)):
            raise TypeError("InferenceResponse: 'output_tensors' must be a list of "
                            f"pb_utils.Tensor, not a {type(output_tensors).__name__}")
        self._outputs = list(output_tensors or [])
        for tensor in self._outputs:
            if not isinstance(tensor, Tensor):
                raise TypeError("InferenceResponse: 'output_tensors' must hold "
                                f"pb_utils.Tensor, not {type(tensor).__name__}")
        self._error = error
        self._parameters = (json.loads(parameters) if isinstance(parameters, str)
                            else dict(parameters or {}))

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def parameter_values(self) -> dict[str, Any]:
        """The parameters as given (the server sends them with the response)."""
        return self._parameters


class InferenceResponseSender:
    """A decoupled model's way to answer: any number of `send(response)`, then one
    `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` (which may carry the last response).
    May be called from any thread of the model's, also after `execute` returned."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, int], None],
                 cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False
        self._retired = ""  # why it may send no more, though no final flag was sent
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException("the response sender already sent its final flag")
            if self._retired:
                raise TritonModelException(self._retired)
            if response is not None and not isinstance(response, InferenceResponse):
                raise TypeError("send() takes a pb_utils.InferenceResponse, not a "
                                f"{type(response).__name__}")  # as Triton's raises it
            self._closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def retire(self, reason: str) -> None:
        """Refuse further sends with `reason` (not part of Triton's API): its request was
        rescheduled, and the execute that runs it next has a sender of its own."""
        with self._lock:
            if not self._closed:
                self._retired = reason


class InferenceTrace:
    """A request's trace (`request.trace()`), for a BLS call to join by passing it on:
    `InferenceRequest(..., trace=request.trace())`, as in Triton; the callee's trace then
    hangs under this one's (in the trace file, its parent_id; in opentelemetry mode, its
    spans under this model's span)."""

    def __init__(self, of: Any = None) -> None:
        self.of = of  # tensorgate's: the server's trace of the request (None: not traced)

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The trace's OpenTelemetry context as JSON ({"traceparent": ...}), for the model
        to pass to what it calls; None when the request is not traced in that mode."""
        context = getattr(self.of, "context", None)
        if mode != "opentelemetry" or context is None:
            return None
        return json.dumps({"traceparent": context.traceparent()})


_UNTRACED = InferenceTrace()


class InferenceRequest:
    """A request as `execute` receives it, or as a model makes one to call another model
    (BLS: `exec()`, or `await async_exec()` in an `async def execute`)."""

    def __init__(self, model_name: str = "", requested_output_names: Sequence[str] = (),
                 inputs: Sequence[Tensor] = (), request_id: str = "",
                 correlation_id: int | str = 0, flags: int = 0, timeout: int = 0,
                 parameters: Mapping[str, Any] | str | None = None, model_version: int = -1,
                 preferred_memory: Any = None, trace: Any = None) -> None:
        # `preferred_memory`: taken as Triton takes it; a BLS call's outputs are on the
        # host. `trace`: the calling request's `trace()`, to trace the call as part of it
        self._model_name = model_name
        self._model_version = model_version
        self._outputs = list(requested_output_names)
        self._inputs = list(inputs)
        self._id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = (parameters if isinstance(parameters, str)
                            else json.dumps(dict(parameters or {})))
        self._sender: InferenceResponseSender | None = None
        self._make_sender: Callable[[], InferenceResponseSender] | None = None
        self._cancelled: Callable[[], bool] = _never
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._reschedulable = False  # its model's config has iterative_sequence
        self._trace = trace if isinstance(trace, InferenceTrace) else _UNTRACED

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object string (json.loads it)."""
        return self._parameters

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's sender: any number of responses for a decoupled model; for one
        not decoupled, one response and the final flag, its execute returning None (Triton
        allows both since 23.10)."""
        if self._sender is None:
            if self._make_sender is None:
                raise TritonModelException("this request has no response sender: it is not "
                                           "one the server handed to execute")
            self._sender = self._make_sender()
        return self._sender

    def trace(self) -> InferenceTrace:
        """The request's trace, for a BLS call to join (see InferenceTrace)."""
        return self._trace

    def set_flags(self, flags: int) -> None:
        """The request's flags (a BLS call's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START /
        _END), as Triton's `set_flags`."""
        self._flags = flags

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: run this request again in a later batch
        (its response in execute's list is None); RELEASE_ALL: answered as usual."""
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and not self._reschedulable:
            raise TritonModelException(
                "a request is rescheduled (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) only by a "
                "model whose config has 'sequence_batching { iterative_sequence: true }', "
                "and only a request that came to its execute")
        self._release_flags = flags

    def rescheduled(self) -> bool:
        """Whether the model asked to run this request again (not part of Triton's API)."""
        return bool(self._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on model `model_name` and wait: its InferenceResponse (an error
        response when it failed), or with `decoupled` an iterator of a decoupled model's."""
        return bls_runner().exec(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` for an `async def execute`: other requests can be awaited meanwhile."""
        if decoupled:
            raise TritonModelException("async_exec(decoupled=True) is not supported here; "
                                       "iterate exec(decoupled=True) instead")
        return await asyncio.wrap_future(bls_runner().submit(self))


def _never() -> bool:
    return False


class PreferredMemory:
    """Where a BLS call would like its outputs (`InferenceRequest(...,
    preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_GPU, 0))`): taken, as Triton takes
    it; a BLS call's outputs are on the host here."""

    __slots__ = ("_memory_type", "_device_id")

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self._memory_type = preferred_memory_type
        self._device_id = preferred_device_id


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether `model_config` (args["model_config"], parsed) says the model is decoupled."""
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


def incoming_request(inputs: Sequence[Tensor], request_id: str, correlation_id: int | str,
                     requested_output_names: Sequence[str], parameters: str, flags: int,
                     cancelled: Callable[[], bool],
                     sender: InferenceResponseSender | None = None,
                     trace: Any = None, reschedulable: bool = False,
                     make_sender: Callable[[], InferenceResponseSender]
                     | None = None, timeout: int = 0) -> InferenceRequest:
    """A request as the server hands it to `execute` (not part of Triton's API); `trace`:
    the server's trace of it, when it is traced; `reschedulable`: its model's config has
    iterative_sequence; `make_sender`: makes its sender when the model first asks for it
    (a model not decoupled, which seldom does); `timeout`: the request's, in µs."""
    request = InferenceRequest(requested_output_names=requested_output_names, inputs=inputs,
                               request_id=request_id, correlation_id=correlation_id,
                               flags=flags, parameters=parameters, timeout=timeout,
                               trace=InferenceTrace(trace) if trace is not None else None)
    request._cancelled = cancelled
    request._sender = sender
    request._make_sender = make_sender
    request._reschedulable = reschedulable
    return request


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
           LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}


class Logger:
    """Model logging into the server's log (`pb_utils.Logger.log_info("...")`)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _log.log(_LEVELS[LogLevel(level)], "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("input", ()) if c.get("name") == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any],
                              name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("output", ()) if c.get("name") == name), None)
