"""ModelStreamInfer: many ModelInferRequests on one gRPC stream (tritonclient's
`start_stream` / `async_stream_infer`, its asyncio `stream_infer`, perf_analyzer's
`--streaming`), each answered by a ModelStreamInferResponse as soon as it is done — not
necessarily in the order sent; a response carries its request's id.

A request that fails is answered by an `error_message` and the stream carries on, as in
Triton; only a broken stream (bad framing, a message over the limit) ends it with a gRPC
status. Each message is received like a unary ModelInfer's (pooled, aligned, inputs are
views) and runs through the same data plane and batcher.

A request for a decoupled model is answered by each of its responses as the model makes
them (then an empty final one when the request asks with
`triton_enable_empty_final_response`); while the client's window holds _PENDING_BYTES of
them, the next waits, and so does the model (pipeline/response_streams.py RESPONSES_AHEAD).

Bounded: at most _IN_FLIGHT requests of one stream are in the pipeline and at most
_PENDING_BYTES of its responses wait for the client's window; what arrives beyond that waits
whole, its stream's HTTP/2 window held back so that a client cannot send more than the
window ahead (backpressure, not an error), and past _WAITING messages the stream is ended
with RESOURCE_EXHAUSTED. On shutdown, requests already received are answered, then the
stream ends with UNAVAILABLE; what the client sends after that is not read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from tensorgate.dataplane import DataPlane
from tensorgate.errors import TensorgateError
from tensorgate.network import PoolRelief, http2, in_steps, stalled_message
from tensorgate.network.grpc_compression import packed_message, response_headers
from tensorgate.network.grpc_messages import (CODES, OK_TRAILERS, CallHeaders, Failure,
                                              MessageReader, framed, inflate_message, trailers)
from tensorgate.network.grpc_infer import model_infer, model_infer_responses, split_request
from tensorgate.network.in_order import Turn
from tensorgate.protocol.grpc_codec import (TensorSpans, stream_error_message,
                                            stream_response_parts)
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import BufferPool

__all__ = ["StreamCall"]

log = logging.getLogger("tensorgate.grpc")

_IN_FLIGHT = 64               # requests of one stream in the pipeline at once
_PENDING_BYTES = 32 << 20     # response bytes waiting for the client's window
_WAITING = 1024               # whole requests waiting for a place in the pipeline


class StreamCall:
    """One ModelStreamInfer stream: reads requests as they come, runs up to _IN_FLIGHT at
    once, sends each response when it is ready, and ends once the client has ended its side
    and everything is answered."""

    __slots__ = ("dataplane", "connection", "stream", "deadline_ns", "forwarded",
                 "traceparent", "reader",
                 "_limit", "_registry", "_waiting", "_tasks", "_client_done", "_draining",
                 "_closed", "_paused", "_room", "_packing", "_last_sent")

    def __init__(self, dataplane: DataPlane, pool: BufferPool, max_message_bytes: int,
                 connection: http2.Http2Connection, stream: http2.Http2Stream,
                 call: CallHeaders, registry: set[StreamCall],
                 relief: PoolRelief | None = None, packing: str | None = None) -> None:
        """`packing`: the encoding its responses go in (grpc_compression.py), None: as they
        are."""
        self.dataplane = dataplane
        self.connection = connection
        self.stream = stream
        self.deadline_ns = call.deadline_ns
        self.forwarded = call.forwarded
        self.traceparent = call.traceparent  # the stream's: each of its requests joins it
        self._limit = max_message_bytes
        self.reader = MessageReader(
            pool, max_message_bytes, call.encoding, place=True, on_message=self._whole,
            on_refused=self._refused,
            acquire=None if relief is None else lambda n: relief.acquire(pool, n, self))
        self._registry = registry
        self._waiting: deque[tuple[Any, str, CopyLedger, int]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._client_done = False  # the client has ended its side: no more requests
        self._draining = False     # the server is shutting down: no more requests read
        self._closed = False       # the stream is over (ended by us, or reset)
        self._paused = False       # its window is held back
        self._room = asyncio.Event()  # set when what was sent has gone to the transport
        self._packing = packing
        self._last_sent: asyncio.Future[None] | None = None  # a compressed response's, until sent
        registry.add(self)
        connection.begin_response(stream, response_headers(packing))

    # -- requests, as HTTP/2 delivers them -------------------------------------------------

    def _whole(self, message: Any, encoding: str, ledger: CopyLedger) -> None:
        if len(self._waiting) >= _WAITING:
            raise Failure("RESOURCE_EXHAUSTED", f"more than {_WAITING} requests wait on this "
                                                "stream; read its responses before sending "
                                                "more")
        self._waiting.append((message, encoding, ledger, time.monotonic_ns()))

    def _refused(self, failure: Failure) -> None:
        """A message was malformed or the pool had no room for it: answer it with the
        error, keep the stream."""
        body = [stream_error_message(failure.message, "", "", "")]
        if self._packing is None:
            self._answer(body)
            return
        task = asyncio.ensure_future(self._send(body, CopyLedger()))  # after those before it
        self._tasks.add(task)
        task.add_done_callback(self._ran)

    def data_received(self, data: memoryview) -> None:
        if self._closed or self._draining:
            return
        try:
            self.reader.feed(data)
        except Failure as failure:
            self._end(failure.code, failure.message)
            return
        self._pump()

    def receive_buffer(self, limit: int) -> memoryview | None:
        if self._closed or self._draining:
            return None
        return self.reader.receive_buffer(limit)

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        try:
            self.reader.data_written(nbytes, copied)
        except Failure as failure:
            self._end(failure.code, failure.message)
            return
        self._pump()

    def end_received(self) -> None:
        self._client_done = True
        if self._closed or self._draining:
            return
        if self.reader.partial:
            self._end("INTERNAL", "the stream ended inside a request message")
            return
        self._finish_if_done()

    def cancelled(self) -> None:
        """The client reset the stream (or the connection closed): drop its requests."""
        self._close()

    def drained(self) -> None:
        self._room.set()
        self._pump()

    def waiting(self) -> bool:
        """A request message has begun and not all of it has arrived (between requests a
        stream may stay quiet as long as the client likes)."""
        return self.reader.partial and not self._closed and not self._draining

    def timed_out(self, quiet_s: float, limit_s: float) -> None:
        self._end("DEADLINE_EXCEEDED", stalled_message(quiet_s, limit_s))

    def body_eta(self, now_ns: int) -> float | None:
        """network.SlowReceiver: its request message, while it arrives into a pooled
        buffer."""
        return None if self._closed or self._draining else self.reader.arrival_eta(now_ns)

    def refuse_slow(self, eta_s: float, limit_s: float) -> int:
        """The stream ends (its other requests' answers already sent stay)."""
        return self.reader.give_way(eta_s, limit_s, self._end)

    def drain(self) -> None:
        """Shutdown: read no more requests; answer those received, then end the stream."""
        if self._closed or self._draining:
            return
        self._draining = True
        self.reader.discard()
        self._finish_if_done()

    # -- running them ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Start waiting requests while the pipeline and the client's window have room;
        hold the stream's window back while requests wait."""
        while (self._waiting and len(self._tasks) < _IN_FLIGHT and not self._closed
               and self.stream.pending_bytes < _PENDING_BYTES):
            task = asyncio.ensure_future(self._run(*self._waiting.popleft()))
            self._tasks.add(task)
            task.add_done_callback(self._ran)
        if bool(self._waiting) != self._paused and not self._closed:
            self._paused = not self._paused
            if self._paused:
                self.connection.pause_reading(self.stream)
            else:
                self.connection.resume_reading(self.stream)

    def _ran(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._closed:
            self._pump()
            self._finish_if_done()

    async def _run(self, message: Any, encoding: str, ledger: CopyLedger,
                   received_ns: int) -> None:
        """One request of the stream, `received_ns` when its message was whole (a stream's
        message has no start of its own to trace: the wait for it is the client's)."""
        request = None
        trace = None
        turn = None
        try:
            if encoding != "identity":
                # a request of a sequence may be inside: its place among the connection's is
                # kept while it decompresses in steps
                turn = self.connection.in_order.turn()
                message = await in_steps(inflate_message(message, encoding, self._limit,
                                                         ledger, self.reader.acquire))
            request, spans, turn = await split_request(message, self.connection.in_order,
                                                       turn)
            if self.dataplane.is_decoupled(request.model_name, request.model_version):
                await self._respond_each(message, ledger, request, spans, received_ns, turn)
                return
            parts, trace = await model_infer(
                self.dataplane, self.connection, message, ledger, self.deadline_ns,
                request, spans, self.forwarded, (received_ns, received_ns), self.traceparent,
                turn, streamed=True)
            body = stream_response_parts(parts)
        except asyncio.CancelledError:
            return
        except (Failure, TensorgateError) as error:
            body = [self._error(error.message, request)]
        except Exception as error:  # a bug: answer, log, keep serving
            log.exception("unexpected error in gRPC ModelStreamInfer")
            body = [self._error(f"internal error: {type(error).__name__}: {error}", request)]
        finally:
            message = None
            if turn is not None:
                turn.end()
        if trace is not None:
            trace.stamp("GRPC_SEND_START")
        await self._send(body, ledger)
        if trace is not None:
            trace.stamp("GRPC_SEND_END")
            trace.finish()

    async def _respond_each(self, message: Any, ledger: CopyLedger, request: Any,
                            spans: TensorSpans, received_ns: int, turn: Turn | None) -> None:
        """A decoupled model's responses, each sent as it comes; the next is taken only
        while the client's window leaves room."""
        responses = model_infer_responses(self.dataplane, self.connection, message, ledger,
                                          self.deadline_ns, request, spans, self.forwarded,
                                          (received_ns, received_ns), self.traceparent, turn)
        try:
            async for parts in responses:
                if isinstance(parts, TensorgateError):  # the model's, and it goes on
                    await self._send([self._error(parts.message, request)], ledger)
                    continue
                await self._send(stream_response_parts(parts), ledger)
                while self.stream.pending_bytes >= _PENDING_BYTES and not self._closed:
                    self._room.clear()
                    await self._room.wait()
        finally:
            await responses.aclose()

    @staticmethod
    def _error(message: str, request: Any) -> bytes:
        if request is None:
            return stream_error_message(message, "", "", "")
        return stream_error_message(message, request.model_name, request.model_version,
                                    request.id)

    async def _send(self, body: list[Any], ledger: CopyLedger) -> None:
        """One response message; where the stream's are compressed, compressed a slice at a
        time between turns of the loop (identity's 602 KB of random FP32 held it 12.8 ms in
        one go), then sent once those before it are: a response finished later, and small,
        must not overtake a large one (a sequence's come in order)."""
        if self._packing is None:
            self._answer(body)
            return
        before, mine = self._last_sent, asyncio.get_running_loop().create_future()
        self._last_sent = mine
        try:
            message = framed([await in_steps(packed_message(body, self._packing, ledger))],
                             compressed=True)
            if before is not None and not before.done():
                await asyncio.wait((before,))  # (not cancelled with this one)
            if not self._closed:
                self.connection.send(self.stream, message)
        finally:
            mine.set_result(None)
            if self._last_sent is mine:
                self._last_sent = None

    def _answer(self, body: list[Any]) -> None:
        """One response message, as it is, now."""
        if self._closed:
            return
        self.connection.send(self.stream, framed(body))

    # -- ending ----------------------------------------------------------------------------

    def _finish_if_done(self) -> None:
        if self._closed or self._tasks or self._waiting:
            return
        if self._draining:
            self._end("UNAVAILABLE", "the server is shutting down; requests sent on this "
                                     "stream after it began were not read")
        elif self._client_done:
            self._close()
            self.connection.send(self.stream, [], OK_TRAILERS)

    def _end(self, code: str, message: str) -> None:
        """End the stream with a status: what is already sent stays, the rest is dropped."""
        self._close()
        self.connection.send(self.stream, [], trailers(CODES[code], message))

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._registry.discard(self)
        for task in self._tasks:
            task.cancel()
        self._waiting.clear()
        self.reader.close()
