"""One traced request: its timestamps, and at level TENSORS its tensors, as Triton's trace
extension writes them (docs/user_guide/trace.md in triton-inference-server/server).

A `Trace` exists only for a request that a trace setting sampled (tensorgate/tracing.py);
every other request carries None, and each stage that would stamp pays one `is not None`.
Stamps are taken on the event loop (the executor's times arrive there with its batch), on the
monotonic clock the pipeline already reads, in ns. Tensors are copied when they are taken
(the request's buffers go back to the pool when it is answered) and counted as "trace".
In opentelemetry mode a trace also carries its `SpanContext`: the ids its spans will have.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.view import TensorView

__all__ = ["SpanContext", "Trace", "TraceSink", "new_span_id"]


def new_span_id() -> bytes:
    """8 random bytes, never all zero (W3C trace context calls that invalid)."""
    return (random.getrandbits(64) or 1).to_bytes(8, "big")


class SpanContext:
    """Where one traced request's OpenTelemetry spans sit: its trace, its model span's id,
    the span that one hangs under (a request's own InferRequest span, or for an ensemble's
    step its ensemble's model span), and for a request (not a step) the caller's span its
    InferRequest span hangs under (b"": none, a trace of its own)."""

    __slots__ = ("trace_id", "span_id", "parent_id", "caller_id")

    def __init__(self, trace_id: bytes, span_id: bytes, parent_id: bytes,
                 caller_id: bytes | None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.caller_id = caller_id  # None: a step (it has no InferRequest span)

    @classmethod
    def begin(cls, trace_id: bytes | None = None, caller_id: bytes = b"") -> SpanContext:
        """A request's: in the caller's trace when given, else in a new one."""
        if trace_id is None:
            trace_id = new_span_id() + new_span_id()
        return cls(trace_id, new_span_id(), new_span_id(), caller_id)

    def child(self) -> SpanContext:
        """A step's, under this model span."""
        return SpanContext(self.trace_id, new_span_id(), self.span_id, None)

    def traceparent(self) -> str:
        """This model span as a W3C traceparent (what a model passes on to its callees)."""
        return f"00-{self.trace_id.hex()}-{self.span_id.hex()}-01"


class TraceSink(Protocol):
    """What a trace needs of whoever writes it (tensorgate/tracing.py's Tracer, which sits
    above the pipeline: the pipeline never imports it)."""

    def next_id(self) -> int: ...

    def collect(self, trace: Trace) -> None: ...


class Trace:
    """What one sampled request leaves in the trace file; `finish` hands it to be written."""

    __slots__ = ("id", "parent_id", "model", "version", "request_id", "stamps", "tensors",
                 "sampled_for", "nbytes", "context", "_tracer", "_finished")

    def __init__(self, id: int, model: str, tracer: TraceSink, tensors: bool,
                 parent_id: int = 0, context: SpanContext | None = None) -> None:
        self.id = id
        self.parent_id = parent_id    # the ensemble request's trace, for one of its steps
        self.model = model
        self.sampled_for = model      # whose setting took it: its steps' traces go with it
        self.version = -1             # the version that ran, once the engine knows it
        self.request_id = ""
        self.stamps: list[tuple[str, int]] = []
        # (activity, tensor name, datatype, a copy of the data) when tracing TENSORS
        self.tensors: list[tuple[str, str, str, np.ndarray]] | None = [] if tensors else None
        self.nbytes = 0               # of the tensors kept
        self.context = context        # opentelemetry mode: its spans' ids
        self._tracer = tracer
        self._finished = False

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def begin(self, model: str, version: int, request_id: str,
              inputs: Mapping[str, TensorView], ledger: CopyLedger) -> None:
        """The engine takes the request, for this version of this model."""
        self.model = model
        self.version = version
        self.request_id = request_id
        self.stamp("REQUEST_START")
        self.take_tensors("TENSOR_QUEUE_INPUT", inputs, ledger)

    def answered(self, outputs: Mapping[str, TensorView], ledger: CopyLedger,
                 end: bool) -> None:
        """A response is made (a decoupled model's: one of them); `end`: the last."""
        self.take_tensors("TENSOR_BACKEND_OUTPUT", outputs, ledger)
        self.stamp("INFER_RESPONSE_COMPLETE")
        if end:
            self.stamp("REQUEST_END")

    def take_tensors(self, activity: str, views: Mapping[str, TensorView],
                     ledger: CopyLedger) -> None:
        """At level TENSORS, keep a copy of each of `views` under `activity`
        (TENSOR_QUEUE_INPUT, TENSOR_BACKEND_OUTPUT)."""
        if self.tensors is None:
            return
        for name, view in views.items():
            data = view.numpy().copy()
            record_copy(view.nbytes, "trace", ledger)
            self.nbytes += view.nbytes
            self.tensors.append((activity, name, view.datatype.name, data))

    def child(self, model: str) -> Trace:
        """The trace of one step of this (ensemble) request."""
        step = Trace(self._tracer.next_id(), model, self._tracer, self.tensors is not None,
                     parent_id=self.id,
                     context=self.context.child() if self.context is not None else None)
        step.sampled_for = self.sampled_for
        return step

    def finish(self) -> None:
        """The request is answered (or failed): hand the trace over to be written, once."""
        if not self._finished:
            self._finished = True
            self._tracer.collect(self)

    def records(self) -> list[dict[str, Any]]:
        """The trace as Triton's JSON trace entries (made by the writer, off the loop)."""
        head: dict[str, Any] = {"id": self.id, "model_name": self.model,
                                "model_version": self.version, "request_id": self.request_id}
        if self.parent_id:
            head["parent_id"] = self.parent_id
        found: list[dict[str, Any]] = [head]
        stamps = sorted(self.stamps, key=lambda stamp: stamp[1])  # stable: equal ns keep order
        found.append({"id": self.id,
                      "timestamps": [{"name": name, "ns": ns} for name, ns in stamps]})
        for activity, name, datatype, data in self.tensors or ():
            found.append({"id": self.id, "activity": activity,
                          "tensor": {"name": name, "data": _text(data),
                                     "shape": ",".join(map(str, data.shape)),
                                     "dtype": datatype}})
        return found


def _text(data: np.ndarray) -> str:
    """A tensor's values as Triton writes them: comma-separated, row-major. Made a slice at a
    time: one `join` over a whole large tensor is a single C call that holds the GIL for
    tens of ms, and the loop would wait that long (measured: bench/trace_bench.py)."""
    flat = data.ravel()
    if data.dtype == object:
        return ",".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                        for v in flat)
    return ",".join([",".join(map(str, flat[start:start + _SLICE].tolist()))
                     for start in range(0, flat.size, _SLICE)])


_SLICE = 2048  # values made into text between chances for other threads to run (~0.5 ms)
