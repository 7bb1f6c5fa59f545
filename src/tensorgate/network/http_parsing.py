"""Reading an HTTP/1.1 request (network/http.py): its head through httptools, in small
windows, and its body straight into a pooled buffer (or, chunked, gathered into one), with
the connection's state.

A connection is one class, http.py's _Connection, in parts: this one (its state, the
request's head and body parsed), http_answers.py (the request dispatched, its answer
written, the connection closed lingering) and http.py (the asyncio protocol: reads,
pipelined requests, expiry). Each is a class over the one before, so that one object is one
connection, as before the split (http.py was 800 lines).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httptools

from tensorgate.errors import InvalidArgumentError, PoolExhaustedError
from tensorgate.network.eager import EagerRun
from tensorgate.network.http_request import HttpRequest
from tensorgate.network.socket_send import SocketSender
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.buffer import ALIGNMENT, HostBuffer
from tensorgate.tensor.pool import BufferPool

if TYPE_CHECKING:
    from tensorgate.network.http import HttpFrontEnd

__all__ = ["HEAD_WINDOW", "HttpParsing", "Pipelined", "Refusal", "url_path"]

# Headers are read in windows this small so that few body bytes arrive with them (those are
# copied into the body buffer); a typical tritonclient request needs two reads of headers.
HEAD_WINDOW = 256
_CHUNKED_FIRST_BYTES = 64 << 10  # a chunked body's first buffer


class Pipelined(Exception):
    """Raised when a second request begins in bytes parsed with the end of the first."""


class Refusal(Exception):
    """Raised inside parser callbacks: answer `code` and close the connection."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class HttpParsing(asyncio.BufferedProtocol):
    """One client connection's state, and its requests read: see the module's docstring.

    Headers are read in small windows (HEAD_WINDOW) so that little of the body arrives with
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
        self._window = memoryview(bytearray(HEAD_WINDOW))
        self._hold = memoryview(bytearray(HEAD_WINDOW))  # read while a request is served
        self._held = 0  # bytes of it that wait for the answer (reading paused meanwhile)
        self._task: EagerRun | None = None  # the request being served
        self._closing_when_idle = False
        self._lingering: asyncio.TimerHandle | None = None  # closing: input is dropped
        self._drained: asyncio.Future[None] | None = None  # set while the transport is full
        self._unsent: list[Any] = []  # the answer's head and tensor bytes to write, last first
        self._last_sent = 0.0  # time.monotonic() when the socket last took some of them
        self._sender: SocketSender | None = None  # on a plain socket (not TLS)
        # answered, and the next request waits until the client has read enough of it
        self._next_when_drained = False
        self._in_a_row = 0  # requests answered since it last left the next to a new turn
        self._new_request()

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

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            raise Pipelined
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
            raise Refusal(400, error.message) from None
        limit = self.front.max_request_bytes
        length_text = request.headers.get("content-length")
        if length_text is None:
            if request.headers.get("transfer-encoding", "").lower() == "chunked":
                self._chunked = _ChunkedBody(self.front.pool, limit)
                self._continue()
            return
        length = int(length_text)  # httptools has already checked it
        if length > limit:
            raise Refusal(413, f"request body of {length} bytes exceeds the {limit}-byte "
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
            raise Refusal(503, error.message) from None

    def _pooled(self, nbytes: int) -> HostBuffer:
        """A pooled buffer for this connection's request (its body, or the body
        decompressed): PoolExhaustedError when slow bodies giving way do not make room."""
        return self.front.relief.acquire(self.front.pool, nbytes, self)

    def on_body(self, data: bytes) -> None:
        if self._chunked is not None:
            if self._chunked.length + len(data) > self.front.max_request_bytes:
                raise Refusal(413, f"chunked request body exceeds the "
                                    f"{self.front.max_request_bytes}-byte limit")
            try:
                self._chunked.append(data, self._request.ledger)
            except PoolExhaustedError as error:
                raise Refusal(503, error.message) from None
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


def url_path(url: bytes) -> str:
    """The path of a request target. A bare path (most requests) is its own: parse_url,
    which is what costs, only for one with a query, a fragment or a scheme."""
    if url[:1] == b"/" and b"?" not in url and b"#" not in url:
        return url.decode("latin-1")
    return httptools.parse_url(url).path.decode("latin-1")
