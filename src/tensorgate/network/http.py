"""HTTP/1.1 front end of the Open Inference Protocol, on raw asyncio protocols + httptools.

Request bodies land where they are used: after the headers are parsed, the socket reads
straight into one pooled, 64-byte-aligned buffer of Content-Length bytes (asyncio's
BufferedProtocol hands the kernel our buffer), and inputs are views into it. Only the part of
the body that arrived in the same read as the headers is copied (counted as "receive" when it
reaches past the JSON header). Responses are written as the JSON header followed by views of
the output tensors, never joined. Bodies over the limit are refused before they are read.

One request at a time per connection; while one is served the socket is still read, so
that a client that goes away (EOF) cancels its request — queued, it never runs; rescheduled,
its model is told — as nginx answers 499. Bytes that come meanwhile (a pipelined request)
are held, reading pauses, and they are parsed once the answer is out; so are those of a
request that begins in the same read as the end of the one before (`_hold_next`), which
answers in order a client that pipelines small requests in one write (wrk's pipeline
script, a health checker). Where that read cannot be cut (a chunked body before it), the
first is answered with `Connection: close`, and the client sends the rest again on a new
connection (as RFC 9112 §9.3.2 has pipelining clients do).

A connection closed after an answer while the client may still be sending (a body we will
not read, a pipelined request) closes lingering (RFC 9112 §9.6): our side is shut for
writing once the answer is out, and what comes meanwhile is read and dropped for up to
_LINGER_S. Closed at once, the kernel resets a connection with unread bytes, and a client
could lose the answer before reading it (seen in a test: ECONNRESET after `Connection:
close`).

The routes and their handlers are in `http_routes.py`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any, cast

import httptools

from tensorgate.dataplane import DataPlane
from tensorgate.errors import (CancelledError, InvalidArgumentError, PoolExhaustedError,
                               TensorgateError)
from tensorgate.network import (UNREAD_ANSWER_S, ConnectionBudget, PoolRelief, RefusedConnection,
                               arrival_eta, slow_message, stalled_message)
from tensorgate.network.eager import EagerRun
from tensorgate.network.http_routes import OIP_ROUTES, HttpRequest, Routes, StreamedResponse
from tensorgate.network.socket_send import SocketSender
from tensorgate.protocol.infer_codec import json_error
from tensorgate.protocol.restricted import Restrictions, refusal
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.buffer import ALIGNMENT, HostBuffer
from tensorgate.tensor.pool import BufferPool

__all__ = ["HttpFrontEnd"]

log = logging.getLogger("tensorgate.http")

# Headers are read in windows this small so that few body bytes arrive with them (those are
# copied into the body buffer); a typical tritonclient request needs two reads of headers.
_HEAD_WINDOW = 256
_MAX_HEAD = 64 * 1024         # more header bytes than this: 431
_CHUNKED_FIRST_BYTES = 64 << 10  # a chunked body's first buffer
_LINGER_S = 2.0               # a closing connection reads and drops what still comes this long
# An answer's tensor bytes are written this much at a time while the socket takes them: what
# it cannot take is copied into the transport's buffer, so a client that does not read holds
# at most this outside the pool (the rest waits in its pooled views). 256 KiB cost identity's
# 600 KB answers 11 % more server CPU (three writes, bench/ab_bench.py); 1 MiB is one write.
_SEND_SLICE = 1 << 20
# A connection reads its next request at once after an answer, but after this many in a row
# the next waits for the loop's next turn: answered inline, the requests a client pipelines
# ran one after another, up to ~190 a turn (libuv reads a busy socket 32 times a turn), and
# another connection's health check waited 2 ms at P50 beside one sending 2,000 a write
# (bench/flood_bench.py, pipeline).
_REQUESTS_IN_A_ROW = 16
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
            504: "Gateway Timeout"}


_NO_PARSER = httptools.HttpRequestParser(object())  # a closed connection's: never fed


def _blank_line(state: int, data: memoryview) -> int:
    """How much of a blank line's b"\r\n\r\n" `data` ends with, where the bytes before it
    ended with `state` of it (4: the whole, the header block's end)."""
    for byte in data:
        if byte == 13:  # \r
            state = 3 if state == 2 else 1
        elif byte == 10 and state in (1, 3):  # \n
            state += 1
        else:
            state = 0
    return state


class _Pipelined(Exception):
    """Raised when a second request begins in bytes parsed with the end of the first."""


class _Refusal(Exception):
    """Raised inside parser callbacks: answer `code` and close the connection."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class HttpFrontEnd:
    """Owns the listening socket; one `_Connection` per client."""

    def __init__(self, dataplane: DataPlane, pool: BufferPool, max_request_bytes: int,
                 read_timeout_s: float = 30.0, keep_alive_timeout_s: float = 75.0,
                 budget: ConnectionBudget | None = None,
                 header_forward: re.Pattern[str] | None = None,
                 restricted: Restrictions | None = None,
                 relief: PoolRelief | None = None, routes: Routes = OIP_ROUTES) -> None:
        """`relief`: shared with the gRPC front end (server.py), so that slow bodies of
        either give way to the other's when the pool is full. `routes`: what this port
        serves (the Open Inference Protocol's, or SageMaker's: sagemaker_routes.py)."""
        self.dataplane = dataplane
        self.routes = routes
        self.header_forward = header_forward  # headers passed to models as parameters
        self.restricted = restricted or {}    # API group → the header it needs
        self.budget = budget or ConnectionBudget()
        self.pool = pool
        self.max_request_bytes = max_request_bytes
        self.read_timeout_s = read_timeout_s
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self.relief = relief or PoolRelief(read_timeout_s)
        self.relief.add_source(lambda: self.connections)

    def expire(self, now: float) -> None:
        """Called about once a second (server.py): answer requests whose bytes stopped
        arriving, close connections idle past the keep-alive timeout."""
        for connection in list(self.connections):
            connection.expire(now, self.read_timeout_s, self.keep_alive_timeout_s)

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen; the port taken (`port` 0 picks one). `reuse_port`: SO_REUSEPORT, the port
        shared with other servers that set it too (config.reuse_http_port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, backlog=1024,
                                                reuse_address=True, reuse_port=reuse_port)
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> asyncio.BaseProtocol:
        if not self.budget.admit():
            body = json_error(self.budget.refusal())
            return RefusedConnection(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        return _Connection(self)

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        self.stop_accepting()
        for connection in list(self.connections):
            connection.close_when_idle()
        if self._server is not None:
            await self._server.wait_closed()


class _Connection(asyncio.BufferedProtocol):
    """One client connection: headers through httptools, the body straight into a buffer.

    Headers are read in small windows (_HEAD_WINDOW) so that little of the body arrives with
    them; once the headers are parsed, reads go straight into the request's pooled buffer.
    """

    # the request being read; `_new_request` resets them
    _parser: httptools.HttpRequestParser
    _request: HttpRequest
    _url: bytes
    _keep_alive: bool
    _headers_done: bool
    _in_body: bool
    _chunked: _ChunkedBody | None  # a chunked body, gathered
    _body_memory: memoryview | None  # where a sized body is read to: a pooled buffer
    _received: int
    _head_bytes: int
    _message_begun: bool         # its request line has begun (empty lines before it skipped)
    _blank: int                  # how much of b"\r\n\r\n" its head's reads so far end with
    _complete: bool
    _begun: bool                 # a byte of this request has arrived
    _last_read: float            # time.monotonic() of the last bytes (or of the last answer)
    _loop: asyncio.AbstractEventLoop

    def __init__(self, front: HttpFrontEnd) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self._window = memoryview(bytearray(_HEAD_WINDOW))
        self._hold = memoryview(bytearray(_HEAD_WINDOW))  # read while a request is served
        self._held = 0  # bytes of it that wait for the answer (reading paused meanwhile)
        self._task: EagerRun | None = None  # the request being served
        self._closing_when_idle = False
        self._lingering: asyncio.TimerHandle | None = None  # closing: input is dropped
        self._drained: asyncio.Future[None] | None = None  # set while the transport is full
        self._unsent: list[Any] = []  # the answer's tensor bytes still to write, last first
        self._last_sent = 0.0  # time.monotonic() when the socket last took some of them
        self._sender: SocketSender | None = None  # on a plain socket (not TLS)
        # answered, and the next request waits until the client has read enough of it
        self._next_when_drained = False
        self._in_a_row = 0  # requests answered since it last left the next to a new turn
        self._new_request()

    # -- asyncio protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport = cast(asyncio.Transport, transport)  # asyncio's or uvloop's
        # paused as soon as the transport holds a byte, resumed once it holds none: answers
        # are written only while the socket takes them (_send)
        self.transport.set_write_buffer_limits(high=0)
        self._sender = SocketSender.for_transport(self.transport)
        self.front.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        self._next_when_drained = False  # nothing more is read
        self.resume_writing()
        self.front.budget.release()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client went away: its queued request is dropped
        if self._lingering is not None:
            self._lingering.cancel()
        # A keep-alive connection is old enough to sit in the GC's oldest generation: what
        # it holds goes now, whatever may still refer to it (a request being cancelled).
        self._body_memory = None
        self._request.body = None
        self._chunked = None
        self._unsent = []
        self._sender = None
        self.transport = None
        # Nor does anything of this protocol's stay in a cycle with it (it is freed now,
        # not at a collection): the parser holds its callbacks, the request its `_pooled`.
        self._parser = _NO_PARSER
        self._request.acquire = _no_buffer

    def pause_writing(self) -> None:
        """The transport's buffer is full: a streamed response waits before its next part."""
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None
        if self._unsent:
            self._send()
            return
        if self._next_when_drained:
            self._next_when_drained = False
            self._read_next()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._lingering is not None:  # closing: read to be dropped
            return self._window
        if self._task is not None:  # being served: only EOF or a pipelined request come
            return self._hold[self._held:]
        if self._in_body:
            assert self._body_memory is not None
            return self._body_memory[self._received:self._request.length]
        return self._window

    def buffer_updated(self, nbytes: int) -> None:
        if self._lingering is not None:
            return
        if self._task is not None:  # the next request's first bytes: parsed after the answer
            self._held += nbytes
            assert self.transport is not None
            self.transport.pause_reading()
            return
        self._last_read = time.monotonic()
        if self._in_body:
            self._received += nbytes
            if self._received == self._request.length:
                self._in_body = False
                self._dispatch()
            return
        self._head_bytes += nbytes
        if not self._begun:
            self._begun = True
            self._request.began_ns = time.monotonic_ns()
        begun = self._message_begun  # (else the window may start with empty lines)
        try:
            if self._head_bytes > _MAX_HEAD and not self._headers_done:
                raise _Refusal(431, f"request headers exceed {_MAX_HEAD} bytes")
            self._parser.feed_data(self._window[:nbytes])
        except _Refusal as refusal:
            self._refuse(refusal.code, refusal.message)
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as error:
            if not self._pipelined(error, nbytes, begun):
                return
            # the first request is whole: dispatched below, out of this handler (answered
            # at once, the next would be parsed inside it, and its own error's context
            # would be this one rather than what its callback raised)
        if self._complete:
            self._dispatch()
        elif not self._headers_done:
            if self._message_begun:  # (what of a blank line it ends with, for _hold_next)
                self._blank = _blank_line(self._blank if nbytes < 3 else 0,
                                          self._window[max(nbytes - 3, 0):nbytes])
        elif self._chunked is None:
            self._in_body = True  # the rest of the body goes straight into its buffer

    def _pipelined(self, error: httptools.HttpParserError, nbytes: int, begun: bool) -> bool:
        """True where a second request began in the read of `nbytes` that ended the first
        (its bytes held, or the first to be answered with `Connection: close`); else the
        request is refused, and False. `begun`: the first's request line began before."""
        # (a method of its own: its cause, raised in a callback below buffer_updated, has a
        # traceback whose frames lead back to buffer_updated's, so a local of that frame
        # holding it was a cycle, and the connection waited for the garbage collector)
        cause = error.__context__
        if isinstance(cause, _Pipelined):
            self._hold_next(nbytes, begun)
            return True
        if isinstance(cause, _Refusal):
            self._refuse(cause.code, cause.message)
        else:
            self._refuse(400, f"malformed HTTP request: {error}")
        return False

    def _hold_next(self, nbytes: int, begun: bool) -> None:
        """Keep the bytes of the request that began in this read of `nbytes` after the end
        of the one just parsed, to be parsed once that one is answered (as those read while
        it is served are). httptools does not say where a message ended, so it is found:
        the header block ended in this read (a body that had not arrived whole by then was
        read into its buffer, never the window), at its blank line — begun in the read
        before where `_blank` says so, else the window's first after the empty lines llhttp
        skips before a request line (where it had not `begun` before this read) — and
        Content-Length bytes of body follow (llhttp takes CRLF line ends only, refuses a
        second Content-Length and one beside Transfer-Encoding). After a chunked body that
        is not told, and the first is answered with `Connection: close`: the client sends
        the rest again on a new connection (RFC 9112 §9.3.2)."""
        request = self._request
        start = -1
        if "transfer-encoding" not in request.headers:
            window = self._window
            head_end = 4 - self._blank
            if not self._blank or _blank_line(self._blank, window[:head_end]) != 4:
                skipped = 0
                while not begun and skipped < nbytes and window[skipped] in b"\r\n":
                    skipped += 1
                found = cast(bytearray, window.obj).find(b"\r\n\r\n", skipped, nbytes)
                head_end = found + 4 if found >= 0 else -1
            if head_end >= 0:
                start = head_end + request.length
        if not 0 < start < nbytes:
            self._keep_alive = False
            return
        self._held = nbytes - start
        self._hold[:self._held] = self._window[start:nbytes]
        assert self.transport is not None
        self.transport.pause_reading()  # (the hold is the window's size: it may be full)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            raise _Pipelined
        self._message_begun = True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._request.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        request = self._request
        self._headers_done = True
        request.method = self._parser.get_method().decode()
        request.path = url_path(self._url)
        self._keep_alive = self._parser.should_keep_alive()
        try:
            request.json_length = self.front.routes.json_length(request.headers)
        except InvalidArgumentError as error:
            raise _Refusal(400, error.message) from None
        limit = self.front.max_request_bytes
        length_text = request.headers.get("content-length")
        if length_text is None:
            if request.headers.get("transfer-encoding", "").lower() == "chunked":
                self._chunked = _ChunkedBody(self.front.pool, limit)
                self._continue()
            return
        length = int(length_text)  # httptools has already checked it
        if length > limit:
            raise _Refusal(413, f"request body of {length} bytes exceeds the {limit}-byte "
                                "limit (--max-request-bytes)")
        request.length = length
        if length:
            # Start the body so that the byte after the JSON header — the first tensor — lands
            # on a 64-byte boundary: binary inputs then need no realigning copy.
            pad = (-(request.json_length or 0)) % ALIGNMENT
            buffer = memoryview(self._acquire(length + pad)).cast("B")
            self._body_memory = buffer[pad:pad + length]
            request.body = self._body_memory
            self._continue()

    def _continue(self) -> None:
        """Tell a client that waits for it (`Expect: 100-continue`) to send its body, now that
        the body has a buffer: curl waits a second for this before a body over 1 MiB, and
        a 3 MB JSON request took 1.06 s instead of 0.04 (RFC 9110 §10.1.1). A request
        refused by its headers (413, 503, 431) gets its final answer instead."""
        if (self._request.headers.get("expect", "").lower() == "100-continue"
                and self._parser.get_http_version() == "1.1" and self.transport is not None):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _acquire(self, nbytes: int) -> Any:
        """The body's pooled buffer; a full pool first takes back those of bodies that arrive
        too slowly (network.PoolRelief), else the request is refused 503 by name."""
        try:
            return self._pooled(nbytes)
        except PoolExhaustedError as error:
            raise _Refusal(503, error.message) from None

    def _pooled(self, nbytes: int) -> HostBuffer:
        """A pooled buffer for this connection's request (its body, or the body
        decompressed): PoolExhaustedError when slow bodies giving way do not make room."""
        return self.front.relief.acquire(self.front.pool, nbytes, self)

    def body_eta(self, now_ns: int) -> float | None:
        """Seconds the body still needs at the rate it has come so far; None unless a body
        is arriving into its buffer, and has been for a second or more. An answer whose
        client has read none of it for UNREAD_ANSWER_S will never arrive: infinity."""
        if self._unsent:
            stalled = now_ns / 1e9 - self._last_sent
            return float("inf") if stalled >= UNREAD_ANSWER_S else None
        if not self._in_body or self._body_memory is None or self._task is not None:
            return None
        return arrival_eta(self._received, self._request.length,
                           (now_ns - self._request.began_ns) / 1e9)

    def refuse_slow(self, eta_s: float, limit_s: float) -> int:
        """Answer 408 and let the body's buffer go (the pool needs it): bytes given back.
        A connection whose answer is not being read is dropped, and its answer's views."""
        if self._unsent:
            return self._drop_unread_answer()
        request = self._request
        held = request.length
        elapsed = (time.monotonic_ns() - request.began_ns) / 1e9
        self._refuse(408, slow_message(self._received, request.length, elapsed, eta_s, limit_s))
        return held

    def on_body(self, data: bytes) -> None:
        if self._chunked is not None:
            if self._chunked.length + len(data) > self.front.max_request_bytes:
                raise _Refusal(413, f"chunked request body exceeds the "
                                    f"{self.front.max_request_bytes}-byte limit")
            try:
                self._chunked.append(data, self._request.ledger)
            except PoolExhaustedError as error:
                raise _Refusal(503, error.message) from None
            return
        assert self._body_memory is not None
        start = self._received
        self._body_memory[start:start + len(data)] = data
        self._received += len(data)
        json_length = self._request.json_length
        json_end = json_length if json_length is not None else self._request.length
        tensor_bytes = self._received - max(start, json_end)
        if tensor_bytes > 0:  # tensor bytes were moved, not just the JSON header
            record_copy(tensor_bytes, "receive", self._request.ledger)

    def on_message_complete(self) -> None:
        if self._chunked is not None:
            body = self._chunked.body()
            record_copy(len(body), "receive", self._request.ledger)
            self._request.body, self._request.length = body, len(body)
            self._chunked = None
        self._complete = True

    # -- request flow ----------------------------------------------------------------------

    def _new_request(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._request = HttpRequest(self.front.max_request_bytes, self._pooled,
                                    self.front.header_forward)
        self._url = b""
        self._keep_alive = True
        self._headers_done = False
        self._in_body = False
        self._chunked = None
        self._body_memory = None
        self._received = 0
        self._head_bytes = 0
        self._message_begun = False
        self._blank = 0
        self._complete = False
        self._begun = False
        self._last_read = time.monotonic()  # the keep-alive wait starts now

    def _dispatch(self) -> None:
        assert self.transport is not None
        request = self._request
        self._body_memory = None  # the request holds its body now, and lets it go once decoded
        request.received_ns = time.monotonic_ns()
        # HEAD is GET without the body (RFC 9110 §9.3.2): load balancers' checks send it
        route = self.front.routes.route
        target, detail = route("GET" if request.method == "HEAD" else request.method,
                               request.path)
        if isinstance(target, int):
            headers = [("Content-Type", "application/json")]
            if target == 405:  # with the methods that path takes (RFC 9110 §15.5.6)
                headers.append(("Allow", ", ".join(
                    m for m in ("GET", "HEAD", "POST")
                    if not isinstance(route("GET" if m == "HEAD" else m, request.path)[0],
                                      int))))
            self._respond(target, headers, [json_error(str(detail))])
            return
        restricted = self.front.restricted
        if restricted:
            group = self.front.routes.api_group[target]
            needed = restricted.get(group)
            if needed is not None:
                reason = refusal(group, needed, request.headers.get(needed[0]))
                if reason is not None:
                    self._respond_error(403, reason)
                    return
        args = cast(tuple[str, ...], detail)  # a handler's path arguments, once not an error
        # started here, not on the loop's next turn (network/eager.py)
        run = self._task = EagerRun(self._run(target, args, request), self._loop)
        run.start()

    async def _run(self, fn: Callable[..., Any], args: tuple[str, ...],
                   request: HttpRequest) -> None:
        try:
            answer = await fn(self.front.dataplane, request, *args)
            if isinstance(answer, StreamedResponse):
                await self._stream(answer)
                return
            status, headers, parts = answer
        except asyncio.CancelledError:
            if request.trace is not None:
                request.trace.finish()
            return
        except TensorgateError as error:
            self._respond_error(codes_for(error)[0], error.message)
            return
        except Exception as error:  # a bug: answer, log, keep serving
            log.exception("unexpected error handling %s %s", request.method, request.path)
            self._respond_error(500, f"internal error: {type(error).__name__}: {error}")
            return
        self._respond(status, headers, parts)

    def _respond_error(self, code: int, message: str) -> None:
        self._respond(code, [("Content-Type", "application/json")], [json_error(message)])

    def _respond(self, status: int, headers: list[tuple[str, str]], parts: list[Any]) -> None:
        trace = self._request.trace
        if trace is not None:
            trace.stamp("HTTP_SEND_START")
        transport = self.transport
        if transport is None or transport.is_closing():
            if trace is not None:
                trace.finish()
            return
        length = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
                f"Content-Length: {length}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers]
        if not self._keep_alive or self._closing_when_idle:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        first = "".join(head).encode("latin-1")
        if self._request.method == "HEAD":
            parts = []  # its Content-Length is GET's
        if parts and isinstance(parts[0], bytes):
            transport.write(first + parts[0])  # the JSON header is small: one write
            rest = parts[1:]
        else:
            transport.write(first)
            rest = parts
        if rest:  # tensor views (bytes-format, TensorView.memoryview): never joined
            self._unsent = rest[::-1]
        self._send()

    def _send(self) -> None:
        """Write the answer's unsent tensor bytes, a slice at a time, until the transport
        holds some (the socket is full: they were copied into its buffer, counted as
        "send"); resume_writing calls again once the client has read them. Then the request
        is finished."""
        unsent = self._unsent
        transport = self.transport
        self._last_sent = time.monotonic()
        while unsent:
            if transport is None or transport.is_closing():
                unsent.clear()
                break
            if self._drained is not None:
                return
            part = unsent.pop()
            if len(part) > _SEND_SLICE:
                unsent.append(part[_SEND_SLICE:])
                part = part[:_SEND_SLICE]
            if self._sender is not None:  # never leaves the transport a pooled view
                held = self._sender.send([part])
            else:  # TLS: encrypted at once into the ssl layer's buffers
                transport.write(part)
                held = transport.get_write_buffer_size()
            if held:
                record_copy(held, "send", self._request.ledger)
        trace = self._request.trace
        if trace is not None:
            trace.stamp("HTTP_SEND_END")
            trace.finish()
        self._finish_request()

    async def _stream(self, response: StreamedResponse) -> None:
        """Write each part as it comes, as one chunk (HTTP/1.0: as it is, then close), waiting
        while the transport's buffer is full; the client leaving cancels this task, which
        closes the parts (and the model's generator behind them)."""
        parts = response.parts
        trace = self._request.trace
        if trace is not None:
            trace.stamp("HTTP_SEND_START")
        try:
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            chunked = self._parser.get_http_version() != "1.0"
            if not chunked:
                self._keep_alive = False
            head = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'OK')}\r\n"]
            head += [f"{k}: {v}\r\n" for k, v in response.headers]
            if chunked:
                head.append("Transfer-Encoding: chunked\r\n")
            if not self._keep_alive or self._closing_when_idle:
                head.append("Connection: close\r\n")
            transport.write("".join(head).encode("latin-1") + b"\r\n")
            async for part in parts:
                if transport.is_closing():
                    return
                transport.write(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
                if self._drained is not None:
                    await self._drained
            if chunked and not transport.is_closing():
                transport.write(b"0\r\n\r\n")
        finally:
            await parts.aclose()
            if trace is not None:
                trace.stamp("HTTP_SEND_END")
                trace.finish()
        self._finish_request()

    def _finish_request(self) -> None:
        self._task = None
        if self.transport is None:  # closed: no next request, nor a parser for it
            return
        keep = self._keep_alive and not self._closing_when_idle
        self._new_request()
        if not keep:
            self._close_lingering()
            return
        if self._drained is not None:
            # The client is not reading its answers (it pipelines requests): read its next
            # request once the transport's buffer has drained, not while answers pile up in
            # it (they did, without bound: 2.4 GB in 10 s from one client).
            self.transport.pause_reading()
            self._next_when_drained = True
            return
        self._in_a_row += 1
        if self._in_a_row >= _REQUESTS_IN_A_ROW:  # the next at the loop's next turn
            self._in_a_row = 0
            self.transport.pause_reading()
            self._loop.call_soon(self._read_next)
            return
        self._read_next()

    def _read_next(self) -> None:
        """Read the connection's next request, and parse what of it came meanwhile."""
        if self.transport is None or self.transport.is_closing():  # (closed while it waited)
            return
        self.transport.resume_reading()  # a no-op unless bytes were held
        if self._held:  # a pipelined request's first bytes, as if they came now
            held, self._held = self._held, 0
            self._window[:held] = self._hold[:held]
            self.buffer_updated(held)

    def _close_lingering(self) -> None:
        """Close after the answer without resetting the connection (module docstring)."""
        transport = self.transport
        assert transport is not None
        if not transport.can_write_eof():
            _close(transport)
            return
        try:
            transport.write_eof()  # a FIN once the answer is written
        except OSError:  # the client has reset the connection already (asyncio's transport
            transport.abort()  # raises ENOTCONN; uvloop's says it in connection_lost)
            return
        self._lingering = asyncio.get_running_loop().call_later(_LINGER_S, _close, transport)
        transport.resume_reading()  # to drop what the client still sends, until its EOF

    def _refuse(self, code: int, message: str) -> None:
        """Answer a request we will not read, and close: its body is still on the wire."""
        self._keep_alive = False
        if self.transport is not None:
            self.transport.pause_reading()
        self._respond_error(code, message)

    def _drop_unread_answer(self) -> int:
        """Drop the connection and, at once, the pooled views of the answer its client does
        not read (the pool may be asked again before the connection is lost); their bytes."""
        held = sum(len(part) for part in self._unsent)
        self._unsent = []
        assert self.transport is not None
        self.transport.abort()
        return held

    def expire(self, now: float, read_timeout_s: float, keep_alive_timeout_s: float) -> None:
        if self._unsent and self.transport is not None:
            if now - self._last_sent > keep_alive_timeout_s:
                self._drop_unread_answer()  # its client has read nothing of it for that long
            return
        if self._task is not None or self.transport is None or self.transport.is_closing():
            return  # being served: the model's queue has its own timeouts
        quiet = now - self._last_read
        if self._begun:
            if quiet > read_timeout_s:
                self._refuse(408, stalled_message(quiet, read_timeout_s))
        elif quiet > keep_alive_timeout_s:
            _close(self.transport)

    def close_when_idle(self) -> None:
        self._closing_when_idle = True
        if self._task is None and self.transport is not None:
            if (self._held or self._begun) and self._lingering is None:
                # a request (pipelined) not read yet, or read in part: closed at once with
                # its bytes unread, the connection was reset, and a client lost the answers
                # it had been given but not yet read
                self._close_lingering()
            else:
                _close(self.transport)


class _ChunkedBody:
    """A chunked request body, gathered in a pooled buffer that doubles as it fills: such
    bodies count against the pool as sized ones do (a bytearray each was outside it, so
    connections sending chunked bodies were bounded only by --max-request-bytes each)."""

    __slots__ = ("_pool", "_limit", "_view", "length")

    def __init__(self, pool: BufferPool, limit: int) -> None:
        self._pool = pool
        self._limit = limit  # the body's most (--max-request-bytes): no larger buffer
        self._view = memoryview(b"")  # of the pooled buffer, which it keeps
        self.length = 0

    def append(self, data: bytes, ledger: CopyLedger) -> None:
        end = self.length + len(data)
        if end > len(self._view):
            grown = min(max(_CHUNKED_FIRST_BYTES, 2 * len(self._view)), self._limit)
            buffer = self._pool.acquire(max(grown, end))
            view = memoryview(buffer).cast("B")
            if self.length:  # what came so far moves to the larger buffer
                view[:self.length] = self._view[:self.length]
                record_copy(self.length, "receive", ledger)
            self._view = view
        self._view[self.length:end] = data
        self.length = end

    def body(self) -> memoryview:
        return self._view[:self.length]


def _close(transport: asyncio.Transport) -> None:
    """Close once what is buffered for the client is written; if it is still not, _LINGER_S
    on, drop it: a transport's close waits for its buffer without end, and a client that
    never reads would hold the connection (and the answer) for ever."""
    transport.close()
    if transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(_LINGER_S, transport.abort)


def _no_buffer(nbytes: int) -> HostBuffer:
    """A closed connection's request gets no buffer (to decompress its body into)."""
    raise CancelledError(f"no buffer of {nbytes} bytes: the client closed the connection")


def url_path(url: bytes) -> str:
    """The path of a request target. A bare path (most requests) is its own: parse_url,
    which is what costs, only for one with a query, a fragment or a scheme."""
    if url[:1] == b"/" and b"?" not in url and b"#" not in url:
        return url.decode("latin-1")
    return httptools.parse_url(url).path.decode("latin-1")

