"""A request dispatched and its answer written (network/http.py, http_parsing.py): the
route's handler run at once (network/eager.py), the answer as its JSON header and views of
its tensors, a slice at a time while the socket takes them; a streamed answer part by part;
then the next request read, or the connection closed lingering (http.py's docstring)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from tensorgate.errors import TensorgateError
from tensorgate.network import UNREAD_ANSWER_S, arrival_eta, slow_message
from tensorgate.network.eager import EagerRun
from tensorgate.network.http_parsing import HttpParsing
from tensorgate.network.http_request import HttpRequest, StreamedResponse
from tensorgate.protocol.infer_codec import json_error
from tensorgate.protocol.restricted import refusal
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.copies import record_copy

__all__ = ["HttpAnswers", "close_transport"]

log = logging.getLogger("tensorgate.http")

_LINGER_S = 2.0               # a closing connection reads and drops what still comes this long
# An answer with tensor bytes is written this much at a time (its head and parts in one
# writev) while the socket takes them: what it cannot take is copied into the transport's
# buffer, so a client that does not read holds at most this outside the pool (the rest waits
# in its pooled views). 256 KiB cost identity's 600 KB answers 11 % more server CPU (three
# writes, bench/ab_bench.py); 1 MiB is one write.
_SEND_SLICE = 1 << 20
# A connection reads its next request at once after an answer, but after this many in a row
# the next waits for the loop's next turn: answered inline, the requests a client pipelines
# ran one after another, up to ~190 a turn (libuv reads a busy socket 32 times a turn), and
# another connection's health check waited 2 ms at P50 beside one sending 2,000 a write
# (bench/flood_bench.py, pipeline).
_REQUESTS_IN_A_ROW = 16
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large",
            431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
            504: "Gateway Timeout"}


class HttpAnswers(HttpParsing):
    """A connection's requests answered."""

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
            first += parts[0]  # with the head: a binary answer's small JSON header, a
            parts = parts[1:]  # JSON answer's whole body (one write, as before)
        if parts:  # tensor views (bytes-format, TensorView.memoryview): never joined, and
            # written with the head in one writev: a client waiting for the answer is woken
            # once, not for the head and then for the tensor bytes
            self._unsent = parts[::-1]
            self._unsent.append(first)
        else:
            transport.write(first)
        self._send()

    def _send(self) -> None:
        """Write the answer's unsent bytes, a slice of its parts at a time (one writev on a
        plain socket), until the transport holds some (the socket is full: they were copied
        into its buffer, counted as "send"); resume_writing calls again once the client has
        read them. Then the request is finished."""
        unsent = self._unsent
        transport = self.transport
        self._last_sent = time.monotonic()
        while unsent:
            if transport is None or transport.is_closing():
                unsent.clear()
                break
            if self._drained is not None:
                return
            parts = []
            room = _SEND_SLICE
            while unsent and room:
                part = unsent.pop()
                if len(part) > room:
                    unsent.append(part[room:])
                    part = part[:room]
                parts.append(part)
                room -= len(part)
            if self._sender is not None:  # never leaves the transport a pooled view
                held = self._sender.send(parts)
            else:  # TLS: encrypted at once into the ssl layer's buffers
                for part in parts:
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
            close_transport(transport)
            return
        try:
            transport.write_eof()  # a FIN once the answer is written
        except OSError:  # the client has reset the connection already (asyncio's transport
            transport.abort()  # raises ENOTCONN; uvloop's says it in connection_lost)
            return
        self._lingering = asyncio.get_running_loop().call_later(_LINGER_S, close_transport,
                                                                transport)
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


def close_transport(transport: asyncio.Transport) -> None:
    """Close once what is buffered for the client is written; if it is still not, _LINGER_S
    on, drop it: a transport's close waits for its buffer without end, and a client that
    never reads would hold the connection (and the answer) for ever."""
    transport.close()
    if transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(_LINGER_S, transport.abort)
