"""Triton's opentelemetry trace mode: sampled requests become OpenTelemetry spans, sent in
batches to a collector over OTLP/HTTP (JSON encoding), off the event loop.

The spans are Triton's: `InferRequest` (the front end's receive and send times and each
INFER_RESPONSE_COMPLETE), under it the model's span named after the model (REQUEST_START,
QUEUE_START, REQUEST_END), under that `compute` (COMPUTE_START … COMPUTE_END); an ensemble's
steps hang their model spans under the ensemble's. Each span carries model_name,
model_version and request_id (and a step its parent_id) as attributes. Stamps are taken on
the monotonic clock; spans are on the wall clock, moved by the offset between the two read
when a batch is sent.

A request carrying a W3C `traceparent` (HTTP header, gRPC metadata) puts its spans in the
caller's trace, under the caller's span; when the caller sampled it, it is traced whatever
rate and count say (Triton's rule: rate=0 then traces only those).

Batching as the SDK's batch span processor, with its settings: spans wait until
bsp_max_export_batch_size of them or bsp_schedule_delay ms; at most bsp_max_queue_size
wait, and past that a finished trace is dropped and counted. One export at a time, in the
loop's default executor, each within TIMEOUT_S; a failed export drops its spans (counted,
logged once per run of failures) and the server serves on. OTEL_EXPORTER_OTLP_HEADERS (or
..._TRACES_HEADERS) adds headers to each export (a hosted collector's key).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensorgate.trace_config import key_values
from tensorgate.pipeline.trace import Trace, new_span_id

__all__ = ["TIMEOUT_S", "OtlpExporter", "parse_traceparent", "trace_spans"]

log = logging.getLogger("tensorgate.trace")

TIMEOUT_S = 10.0  # the SDK's OTEL_EXPORTER_OTLP_TIMEOUT default
_MAX_ANSWER = 64 << 10  # of a collector's answer: it is read (for errors), not kept
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ROOT_EVENTS = frozenset({"HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START",
                          "HTTP_SEND_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                          "GRPC_SEND_START", "GRPC_SEND_END", "INFER_RESPONSE_COMPLETE"})
_COMPUTE_EVENTS = frozenset({"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                             "COMPUTE_END"})
_SERVER, _INTERNAL = 2, 1  # OTLP span kinds


def parse_traceparent(text: str | None) -> tuple[bytes, bytes, bool] | None:
    """A W3C traceparent header's trace id, parent span id and sampled flag; None when
    absent or malformed (a request with a malformed one is traced as if it had none, as
    the W3C spec asks)."""
    if not text or len(text) > 512:
        return None
    match = _TRACEPARENT.fullmatch(text.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} \
            or set(span_id) == {"0"}:
        return None
    return bytes.fromhex(trace_id), bytes.fromhex(span_id), bool(int(flags, 16) & 1)


def trace_spans(trace: Trace, offset_ns: int) -> list[str]:
    """`trace`'s spans, each as OTLP's JSON text, its monotonic stamps moved by `offset_ns`
    (wall clock minus monotonic). A trace without a SpanContext has none. Written as text
    rather than dicts for json.dumps: 9 µs a trace instead of 23, in a thread that holds the
    GIL the loop needs (measured on 170-trace batches)."""
    context = trace.context
    if context is None or not trace.stamps:
        return []
    stamps = sorted(trace.stamps, key=lambda stamp: stamp[1])
    is_request = context.caller_id is not None
    root: list[tuple[str, int]] = []
    model: list[tuple[str, int]] = []
    computes: list[list[tuple[str, int]]] = []
    open_compute: list[tuple[str, int]] | None = None
    for name, ns in stamps:
        if name in _COMPUTE_EVENTS:
            if name == "COMPUTE_START" or open_compute is None:
                open_compute = []
                computes.append(open_compute)
            open_compute.append((name, ns))
            if name == "COMPUTE_END":
                open_compute = None
        elif is_request and name in _ROOT_EVENTS:
            root.append((name, ns))
        else:
            model.append((name, ns))
    attributes = [_attribute("model_name", trace.model),
                  _attribute("model_version", trace.version),
                  _attribute("request_id", trace.request_id)]
    if trace.parent_id:
        attributes.append(_attribute("parent_id", trace.parent_id))
    shared = (context.trace_id.hex(), json.dumps(attributes, separators=(",", ":")),
              offset_ns)
    spans = []
    if is_request:
        assert context.caller_id is not None
        spans.append(_span(shared, context.parent_id, context.caller_id, '"InferRequest"',
                           _SERVER, stamps, root))
    spans.append(_span(shared, context.span_id, context.parent_id, json.dumps(trace.model),
                       _INTERNAL, model or stamps, model))
    for events in computes:
        spans.append(_span(shared, new_span_id(), context.span_id, '"compute"', _INTERNAL,
                           events, events))
    return spans


def _span(shared: tuple[str, str, int], span_id: bytes, parent_id: bytes, name: str,
          kind: int, extent: Sequence[tuple[str, int]],
          events: Sequence[tuple[str, int]]) -> str:
    """One span from the first to the last of `extent`'s stamps, with `events` (the
    server's own stamp names: nothing in them to escape). `shared`: the trace's id, its
    attributes as JSON, the clock offset; `name` is JSON already."""
    trace_id, attributes, offset = shared
    parent = f',"parentSpanId":"{parent_id.hex()}"' if parent_id else ""
    marks = ",".join([f'{{"timeUnixNano":"{ns + offset}","name":"{event}"}}'
                      for event, ns in events])
    return (f'{{"traceId":"{trace_id}","spanId":"{span_id.hex()}"{parent},"name":{name},'
            f'"kind":{kind},"startTimeUnixNano":"{extent[0][1] + offset}",'
            f'"endTimeUnixNano":"{extent[-1][1] + offset}","attributes":{attributes},'
            f'"events":[{marks}]}}')


def _attribute(key: str, value: str | int) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64 is a JSON string
    return {"key": key, "value": {"stringValue": value}}


def _span_count(trace: Trace) -> int:
    computes = sum(1 for name, _ in trace.stamps if name == "COMPUTE_START")
    request = trace.context is not None and trace.context.caller_id is not None
    return 1 + int(request) + max(computes, 1)


class OtlpExporter:
    """Finished traces in, OTLP/HTTP exports out, on the SDK's batch span processor's
    rules. `done(traces, sent)` is called on the loop once each batch is sent or dropped."""

    def __init__(self, url: str, resource: Sequence[str], max_queue_size: int,
                 schedule_delay_ms: int, max_export_batch_size: int, version: str,
                 done: Callable[[list[Trace], bool], None],
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path
        variable = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS"
                    if environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                    else "OTEL_EXPORTER_OTLP_HEADERS")
        self._headers = {**key_values(environ.get(variable, ""), variable),
                         "Content-Type": "application/json"}
        attributes = [_attribute(key, value)
                      for key, _, value in (item.partition("=") for item in resource)]
        # the payload around each batch's spans, made once: b'...' + spans + b'...'
        head, tail = json.dumps({"resourceSpans": [{
            "resource": {"attributes": attributes},
            "scopeSpans": [{"scope": {"name": "tensorgate", "version": version},
                            "spans": ["SPANS"]}]}]}, separators=(",", ":")).split('"SPANS"')
        self._head, self._tail = head.encode(), tail.encode()
        self.max_queue_size = max_queue_size
        self.schedule_delay_s = schedule_delay_ms / 1000
        self.max_export_batch_size = max_export_batch_size
        self._done = done
        self._queue: deque[tuple[Trace, int]] = deque()  # (trace, its span count)
        self._queued_spans = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Future[None] | None = None
        self._connection: http.client.HTTPConnection | None = None  # the exporting thread's
        self._failing = False
        self._abandoned = False

    def add(self, trace: Trace) -> bool:
        """Queue a finished trace's spans; False (and nothing queued) when the queue is
        full: the caller counts it as dropped."""
        spans = _span_count(trace)
        if self._queued_spans + spans > self.max_queue_size or self._abandoned:
            return False
        self._queue.append((trace, spans))
        self._queued_spans += spans
        if self._queued_spans >= self.max_export_batch_size:
            self._export()
        elif self._timer is None and self._sending is None:
            self._timer = asyncio.get_running_loop().call_later(self.schedule_delay_s,
                                                                self._due)
        return True

    def _due(self) -> None:
        self._timer = None
        self._export()

    def _export(self) -> None:
        """Send the next batch unless one is on its way (its end sends the next)."""
        if self._sending is not None or not self._queue:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch: list[Trace] = []
        spans = 0
        while self._queue and (not batch
                               or spans + self._queue[0][1] <= self.max_export_batch_size):
            trace, count = self._queue.popleft()
            batch.append(trace)
            spans += count
        self._queued_spans -= spans
        self._sending = asyncio.get_running_loop().run_in_executor(None, self._send, batch)
        self._sending.add_done_callback(lambda sent: self._sent(sent, batch))

    def _sent(self, sent: asyncio.Future[None], batch: list[Trace]) -> None:
        self._sending = None
        error = sent.exception() if not sent.cancelled() else asyncio.CancelledError()
        if error is not None and not self._failing:
            log.warning("could not send %d traces to the OpenTelemetry collector at %s: %s; "
                        "traces are dropped until it answers", len(batch), self.url, error)
        elif error is None and self._failing:
            log.info("the OpenTelemetry collector at %s answers again", self.url)
        self._failing = error is not None
        self._done(batch, error is None)
        if self._abandoned:
            return  # shutdown stopped waiting: send no more
        if self._queued_spans >= self.max_export_batch_size:
            self._export()
        elif self._queue and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.schedule_delay_s,
                                                                self._due)

    def _send(self, batch: list[Trace]) -> None:
        """In the executor: the batch's spans as one OTLP/HTTP JSON request."""
        offset = time.time_ns() - time.monotonic_ns()
        spans = ",".join([span for trace in batch for span in trace_spans(trace, offset)])
        body = self._head + spans.encode() + self._tail
        connection = self._connection
        if connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = self._connection = kind(self._host, self._port, timeout=TIMEOUT_S)
        try:
            connection.request("POST", self._path, body, self._headers)
            response = connection.getresponse()
            answer = response.read(_MAX_ANSWER)
            if response.will_close or not response.isclosed():
                connection.close()  # or an unread rest would be taken for the next answer
        except Exception:
            connection.close()
            self._connection = None
            raise
        if not 200 <= response.status < 300:
            raise RuntimeError(f"HTTP {response.status} {response.reason}: "
                               f"{answer[:200].decode('utf-8', 'replace')}")

    async def close(self, timeout_s: float) -> None:
        """Shutdown: send what is queued, waiting at most `timeout_s`; what is left then
        is dropped (and said)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._queue or self._sending is not None:
            self._export()
            sending = self._sending
            if sending is None:
                break
            try:
                await asyncio.wait_for(asyncio.shield(sending), deadline - loop.time())
            except asyncio.TimeoutError:
                self._abandoned = True
                log.warning("%d traces were not sent to the OpenTelemetry collector: "
                            "shutdown waits at most %g s for them", len(self._queue),
                            timeout_s)
                break
            except Exception:
                pass  # logged by _sent
        if self._connection is not None:
            self._connection.close()
