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

The routes and their handlers are in `http_routes.py`. The connection's parts:
http_parsing.py (its state, a request read), http_answers.py (answered, closed lingering);
here the asyncio protocol (reads, pipelined requests) and expiry.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import cast

import httptools

from tensorgate.dataplane import DataPlane
from tensorgate.errors import CancelledError
from tensorgate.network import ConnectionBudget, PoolRelief, RefusedConnection, stalled_message
from tensorgate.network.http_answers import HttpAnswers, close_transport
from tensorgate.network.http_parsing import Pipelined, Refusal
from tensorgate.network.http_request import Routes
from tensorgate.network.http_routes import OIP_ROUTES
from tensorgate.network.socket_send import SocketSender
from tensorgate.protocol.infer_codec import json_error
from tensorgate.protocol.restricted import Restrictions
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.pool import BufferPool

__all__ = ["HttpFrontEnd"]

log = logging.getLogger("tensorgate.http")

_MAX_HEAD = 64 * 1024         # more header bytes than this: 431


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


class _Connection(HttpAnswers):
    """One client connection: headers through httptools, the body straight into a buffer
    (http_parsing.py), answered (http_answers.py)."""

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
                raise Refusal(431, f"request headers exceed {_MAX_HEAD} bytes")
            self._parser.feed_data(self._window[:nbytes])
        except Refusal as refusal:
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
        (its bytes held, or the first to be answered with `Connection: close`), or bytes
        followed a first that closes the connection (`Connection: close`, HTTP/1.0): those
        are not read, the first is answered and the connection closed (RFC 9112 §9.6; it
        was refused 400 "Data after `Connection: close`"); else the request is refused,
        and False. `begun`: the first's request line began before."""
        # (a method of its own: its cause, raised in a callback below buffer_updated, has a
        # traceback whose frames lead back to buffer_updated's, so a local of that frame
        # holding it was a cycle, and the connection waited for the garbage collector)
        cause = error.__context__
        if self._complete and not self._keep_alive:
            return True
        if isinstance(cause, Pipelined):
            self._hold_next(nbytes, begun)
            return True
        if isinstance(cause, Refusal):
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
            elif not self._headers_done and now - self._request.began_ns / 1e9 > read_timeout_s:
                # a head dribbled a byte at a time, each within the timeout, held its
                # connection (one of --max-connections) for ever ("slowloris"): a head is at
                # most 64 KiB, which a client sends at once
                self._refuse(408, f"the request's headers took more than {read_timeout_s:g} s "
                                  "to arrive (--read-timeout-s)")
        elif quiet > keep_alive_timeout_s:
            close_transport(self.transport)

    def close_when_idle(self) -> None:
        self._closing_when_idle = True
        if self._task is None and self.transport is not None:
            if (self._held or self._begun) and self._lingering is None:
                # a request (pipelined) not read yet, or read in part: closed at once with
                # its bytes unread, the connection was reset, and a client lost the answers
                # it had been given but not yet read
                self._close_lingering()
            else:
                close_transport(self.transport)


def _no_buffer(nbytes: int) -> HostBuffer:
    """A closed connection's request gets no buffer (to decompress its body into)."""
    raise CancelledError(f"no buffer of {nbytes} bytes: the client closed the connection")
