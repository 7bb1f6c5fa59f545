"""gRPC over HTTP/2, below the calls: statuses as header blocks, a call's headers, and its
length-prefixed request messages as they arrive in DATA.

A ModelInfer message is received into one pooled, 64-byte-aligned buffer, placed so that the
first tensor starts on the boundary, and its inputs become views into it. Large DATA frames
(grpcio clients send up to the 1 MiB we allow) are read by the kernel straight into that
buffer; what arrives through the connection's receive buffer instead (small frames, the first
bytes of each frame) is copied in and counted as "receive" from the first tensor on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from tensorgate.errors import PoolExhaustedError, TensorgateError
from tensorgate.network import arrival_eta, http2, slow_message
from tensorgate.protocol.compression import inflate_steps
from tensorgate.protocol.grpc_codec import scan_for_tensor
from tensorgate.protocol.request_parameters import forward_headers
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.buffer import ALIGNMENT
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.pool import BufferPool

__all__ = ["CODES", "ENCODINGS", "OK_TRAILERS", "RESPONSE_HEADERS", "CallHeaders", "Failure",
           "HttpRefusal", "MessageReader", "error_block", "framed", "inflate_message",
           "parts_size", "read_call_headers", "trailers"]

# gRPC status codes by name (grpc/doc/statuscodes.md)
CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
         "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "RESOURCE_EXHAUSTED": 8, "UNIMPLEMENTED": 12,
         "INTERNAL": 13, "UNAVAILABLE": 14}
ENCODINGS = "identity,deflate,gzip"
RESPONSE_HEADERS = http2.encode_headers([(b":status", b"200"),
                                         (b"content-type", b"application/grpc"),
                                         (b"grpc-accept-encoding", ENCODINGS.encode())])
OK_TRAILERS = http2.encode_headers([(b"grpc-status", b"0")])
_TIMEOUT_UNITS = {"H": 3600e9, "M": 60e9, "S": 1e9, "m": 1e6, "u": 1e3, "n": 1.0}
# grpc-message at most this long, encoded: grpcio drops a response whose metadata passes
# 16 KiB (and may past 8), and its caller got RESOURCE_EXHAUSTED "Stream removed" instead of
# the status: an unknown model's 20,000-character name did it, as would a model's long
# exception text.
_MESSAGE_BYTES = 4096
# Bytes of ModelInfer's message held back before placing it: enough to find where the first
# tensor starts in any ordinary request (tritonclient's header fields come first).
_PLACEMENT_WINDOW = 64 << 10


class Failure(Exception):
    """Answer the call with this gRPC status (transport-level problems, not the data plane's)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class HttpRefusal(Exception):
    """Not a gRPC call at all: answered with a bare HTTP status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def parts_size(parts: Sequence[Any]) -> int:
    """The bytes of a message's serialized parts (bytes and byte views)."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def framed(parts: Sequence[Any], compressed: bool = False) -> list[Any]:
    """A gRPC message: its 5-byte prefix (the compressed flag, the length), then its parts
    as they are."""
    return [(b"\x01" if compressed else b"\x00") + parts_size(parts).to_bytes(4, "big"),
            *parts]


def trailers(code: int, message: str) -> bytes:
    """The status trailers; grpc-message percent-encoded UTF-8 (gRPC's PROTOCOL-HTTP2.md),
    cut to _MESSAGE_BYTES with a note of how much was left out."""
    parts: list[str] = []
    size = 0
    for index, c in enumerate(message):
        piece = c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
        if size + len(piece) > _MESSAGE_BYTES:
            parts.append(f" ... ({len(message) - index:,} more characters)")
            break
        parts.append(piece)
        size += len(piece)
    return http2.encode_headers([(b"grpc-status", str(code).encode()),
                                 (b"grpc-message", "".join(parts).encode())])


def error_block(code: int, message: str) -> bytes:
    """A trailers-only response: status 200 and the gRPC status in one header block."""
    return http2.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")]) \
        + trailers(code, message)


def _deadline_ns(value: str) -> int:
    """grpc-timeout ("100m", "5S", at most 8 digits and a unit) as a monotonic deadline."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        raise Failure("INTERNAL", f"grpc-timeout '{value}' is malformed")
    return time.monotonic_ns() + int(int(digits) * _TIMEOUT_UNITS[unit])


class CallHeaders:
    """What a call's request headers say: the method's path, compression (the request's, and
    what the client accepts for its answer) and deadline, the metadata to pass to the model
    as parameters, and the caller's W3C trace context."""

    __slots__ = ("path", "encoding", "deadline_ns", "forwarded", "traceparent",
                 "accept_encoding")

    def __init__(self, path: str, encoding: str, deadline_ns: int | None,
                 forwarded: dict[str, str] | None = None,
                 traceparent: str | None = None, accept_encoding: str = "") -> None:
        self.path = path
        self.encoding = encoding
        self.deadline_ns = deadline_ns
        self.forwarded = forwarded
        self.traceparent = traceparent
        self.accept_encoding = accept_encoding


def read_call_headers(headers: http2.Fields,
                      forward: re.Pattern[str] | None = None) -> CallHeaders:
    """Raises HttpRefusal for what is not a gRPC request, Failure for a gRPC request that
    cannot be served (unknown method excepted: the caller knows its methods). `forward`:
    which metadata names to pass to the model."""
    values = dict(headers)
    if values.get(":method") != "POST":
        raise HttpRefusal(405)
    if not values.get("content-type", "").startswith("application/grpc"):
        raise HttpRefusal(415)
    encoding = values.get("grpc-encoding", "identity")
    if encoding not in ("identity", "gzip", "deflate"):
        raise Failure("UNIMPLEMENTED", f"grpc-encoding '{encoding}' is not supported; use one "
                                       f"of {ENCODINGS}")
    deadline = _deadline_ns(values["grpc-timeout"]) if "grpc-timeout" in values else None
    return CallHeaders(values.get(":path", ""), encoding, deadline,
                       forward_headers(headers, forward), values.get("traceparent"),
                       values.get("grpc-accept-encoding", ""))


def inflate_message(message: Any, encoding: str, limit: int, ledger: CopyLedger,
                    acquire: Callable[[int], Any]) -> Generator[None, None, memoryview]:
    """The message decompressed into a pooled buffer from `acquire`, in steps
    (protocol.steps; raises PoolExhaustedError, UNAVAILABLE, when the pool has no room)."""
    data = yield from inflate_steps(message, encoding, limit, "message", ledger, acquire)
    if data is None:
        raise Failure("RESOURCE_EXHAUSTED", f"the decompressed message exceeds the {limit}-byte "
                                            "limit (--max-request-bytes)")
    return data


# a whole message: its bytes (a pooled view or a bytearray), its encoding, its copy ledger
OnMessage = Callable[[Any, str, CopyLedger], None]
OnRefused = Callable[[Failure], None]


def _dropped(message: Any, encoding: str, ledger: CopyLedger) -> None:
    """A closed reader's `on_message`."""


class MessageReader:
    """Length-prefixed messages from one stream's DATA, one after another, each handed to
    `on_message` once whole. `place` puts each message into a pooled buffer with its first
    tensor aligned (ModelInfer requests); otherwise messages land in a bytearray.
    Raises Failure (or a TensorgateError for a malformed message found while placing it).
    With `on_refused`, a message that is malformed where it is placed, or that the pool has
    no room for, is read past instead and `on_refused` gets the failure once it has gone by
    (a stream carries on). `acquire(nbytes)` takes a placed message's buffer (the caller's
    network.PoolRelief.acquire, which asks slow bodies to give theirs back when the pool is
    full); else the pool's own."""

    __slots__ = ("_pool", "_limit", "_place_messages", "_on_message", "_on_refused",
                 "_encoding", "_ledger", "_prefix", "_length", "_received", "_message",
                 "_head", "_scanned", "_counted_from", "_copied", "_message_encoding", "_skipping",
                 "_acquire", "_began_ns")

    def __init__(self, pool: BufferPool, limit: int, encoding: str, place: bool,
                 on_message: OnMessage, on_refused: OnRefused | None = None,
                 acquire: Callable[[int], Any] | None = None) -> None:
        self._pool = pool
        self._acquire = acquire or pool.acquire
        self._began_ns = 0  # when the current message's prefix came
        self._limit = limit
        self._encoding = encoding
        self._place_messages = place
        self._on_message = on_message
        self._on_refused = on_refused
        self._skipping: Failure | None = None  # why the message being read past was refused
        self._ledger: CopyLedger | None = None  # the current message's copies: its own
        self._prefix = bytearray()      # the 5-byte length prefix, as it arrives
        self._length = -1               # the message's length once the prefix is in
        self._received = 0
        # where the message lands: a view of a pooled buffer when placed, else a bytearray
        self._message: Any = None
        self._head: bytearray | None = None  # bytes held back until the message is placed
        self._scanned = 0  # of the head, looked through for its first tensor
        self._counted_from = 0          # message offset from which copied bytes count
        self._copied = 0                # counted bytes copied in, recorded once a message
        self._message_encoding = encoding

    @property
    def acquire(self) -> Callable[[int], Any]:
        """How this reader's pooled buffers are taken: its messages decompressed use it too."""
        return self._acquire

    @property
    def partial(self) -> bool:
        """Whether a message has begun and is not yet whole."""
        return self._length >= 0 or bool(self._prefix)

    def _arrival(self, now_ns: int) -> tuple[int, int, float] | None:
        """(bytes received, message length, seconds since it began) of a message arriving
        into its pooled buffer; None when there is none."""
        if self._length < 0 or self._head is not None or self._skipping is not None \
                or not isinstance(self._message, memoryview):
            return None
        return self._received, self._length, (now_ns - self._began_ns) / 1e9

    def arrival_eta(self, now_ns: int) -> float | None:
        """network.SlowReceiver's body_eta, for the message arriving into a pooled buffer."""
        arrival = self._arrival(now_ns)
        return None if arrival is None else arrival_eta(*arrival)

    def give_way(self, eta_s: float, limit_s: float, fail: Callable[[str, str], None]) -> int:
        """network.SlowReceiver's refuse_slow: `fail(code, why)` answers the call the
        arriving message belongs to (its buffer goes with it); the bytes that buffer held,
        0 when no message is arriving into one."""
        arrival = self._arrival(time.monotonic_ns())
        if arrival is None:
            return 0
        fail("DEADLINE_EXCEEDED", slow_message(*arrival, eta_s, limit_s))
        return arrival[1]

    def discard(self) -> None:
        """Forget a partial message (the call is over)."""
        self._record_copies()
        self._message = self._head = self._skipping = None
        self._length = -1
        self._prefix.clear()

    def close(self) -> None:
        """The call is over: `discard`, and let go of the call's callbacks, each of which
        refers back to the call that holds this reader (a cycle: the call, its connection
        and what they hold waited for the garbage collector). What still comes is read
        past and dropped."""
        self.discard()
        self._on_message = _dropped
        self._on_refused = None
        self._acquire = self._pool.acquire

    def feed(self, data: memoryview) -> None:
        while len(data):
            if self._length < 0:
                need = 5 - len(self._prefix)
                self._prefix += data[:need]
                data = data[need:]
                if len(self._prefix) == 5:
                    self._begin()
                continue
            if self._head is not None:  # hold the start back until the message is placed
                # a little at a time: what is held back here is copied twice
                room = min(len(data), self._length - len(self._head), 512)
                self._head += data[:room]
                data = data[room:]
                held = len(self._head)
                try:
                    offset, self._scanned = scan_for_tensor(memoryview(self._head),
                                                            self._scanned)
                    if (len(self._head) == self._length or len(self._head) >= _PLACEMENT_WINDOW
                            or offset is not None):
                        self._place(offset)
                except TensorgateError as error:  # malformed: no tensor can be placed
                    if self._on_refused is None:
                        raise
                    self._refuse(Failure(codes_for(error)[1], error.message), held)
                continue
            if self._skipping is not None:
                count = min(len(data), self._length - self._received)
                self._received += count
                data = data[count:]
                if self._received == self._length:
                    self._done()
                continue
            data = data[self._copy_in(data):]

    def receive_buffer(self, limit: int) -> memoryview | None:
        """Where the next `limit` bytes of DATA may be read in place: the rest of a placed
        message (zero copy for large DATA frames, as grpcio clients send)."""
        if self._head is not None or self._length < 0 or not isinstance(self._message,
                                                                         memoryview):
            return None
        start = self._received
        return self._message[start:start + min(limit, self._length - start)]

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        """`nbytes` more of the message are in the buffer `receive_buffer` gave: read there
        by the kernel, or `copied` there from the connection's buffer (counted)."""
        start = self._received
        self._received = start + nbytes
        if copied:
            counted = start + nbytes - max(start, self._counted_from)
            if counted > 0:  # tensor bytes moved, not only the message's small fields
                self._copied += counted
        if self._received == self._length:
            self._done()

    def _copy_in(self, data: memoryview) -> int:
        """Copy what of `data` belongs to the message into it; returns how much that was."""
        start = self._received
        count = min(len(data), self._length - start)
        self._message[start:start + count] = data[:count]
        self.data_written(count, copied=True)
        return count

    def _begin(self) -> None:
        flag, length = self._prefix[0], int.from_bytes(self._prefix[1:5], "big")
        if flag > 1:
            raise Failure("INTERNAL", f"message prefix flag {flag}; it must be 0 or 1")
        if flag and self._encoding == "identity":
            raise Failure("INTERNAL", "a compressed message without grpc-encoding")
        if length > self._limit:
            raise Failure("RESOURCE_EXHAUSTED", f"request message of {length} bytes exceeds "
                                                f"the {self._limit}-byte limit "
                                                "(--max-request-bytes)")
        self._length, self._received = length, 0
        self._began_ns = time.monotonic_ns()
        self._ledger = CopyLedger()
        self._message_encoding = self._encoding if flag else "identity"
        if self._place_messages and not flag:
            self._head = bytearray()
            self._scanned = 0
            if length == 0:
                self._place(None)
        else:
            # grown as the message arrives, not made whole from its prefix: 20 streams that
            # each announced 64 MiB in 5 bytes cost 550 MB of zeroed memory
            self._message = bytearray()
            self._counted_from = 0
            if length == 0:
                self._done()

    def _place(self, offset: int | None) -> None:
        """Acquire the message's buffer so that its first tensor (at `offset`, if the head
        has one) starts 64-byte aligned, and move what has arrived so far into it."""
        assert self._head is not None
        head, self._head = self._head, None
        pad = (-offset) % ALIGNMENT if offset is not None else 0
        # Bytes before the first tensor are the message's small fields: not counted.
        self._counted_from = offset if offset is not None else self._length
        try:
            buffer = self._acquire(self._length + pad)
        except PoolExhaustedError as error:
            failure = Failure("UNAVAILABLE", error.message)
            if self._on_refused is None:
                raise failure from None
            self._refuse(failure, len(head))
            return
        # the view keeps the pooled buffer alive, and so do the input views made of it
        self._message = memoryview(buffer).cast("B")[pad:pad + self._length]
        self._copy_in(memoryview(head))

    def _refuse(self, failure: Failure, received: int) -> None:
        """Read past the rest of this message; `on_refused` hears why once it has gone by."""
        self._head = self._message = None
        self._skipping, self._received = failure, received
        if self._received == self._length:
            self._done()

    def _record_copies(self) -> None:
        """Count what was copied into the message as one copy (a 16 KiB-frame client's
        message comes in ~40 pieces: one count, not one a piece)."""
        if self._copied:
            record_copy(self._copied, "receive", self._ledger)
            self._copied = 0

    def _done(self) -> None:
        self._record_copies()
        message, ledger, encoding = self._message, self._ledger, self._message_encoding
        assert ledger is not None
        self._ledger = None
        skipped, self._skipping = self._skipping, None
        self._message = None
        self._length = -1
        self._prefix.clear()
        if skipped is not None:
            assert self._on_refused is not None
            self._on_refused(skipped)
        else:
            self._on_message(message, encoding, ledger)
