"""HTTP/2's wire vocabulary (RFC 9113, RFC 7541), for the connection in http2.py: frame types,
flags, error and setting codes, a frame's header, the header blocks we send, and the two
errors a peer's frames raise.

The header blocks we send are literals that never touch the peer's dynamic table, so a
block is built once and reused for every call that answers the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["Fields", "Http2Error", "StreamError", "encode_headers", "frame", "refusal_frames"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, \
    FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0, 1, 2, 3, 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xb
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, \
    MAX_HEADER_LIST_SIZE = range(1, 7)

MAX_WINDOW = (1 << 31) - 1
MAX_STREAM_ID = (1 << 31) - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384

HEAD = struct.Struct(">I")  # length (24 bits) and type, packed as one word, then flags+id

# a header block's fields as (name, value) pairs, in order; shared by calls with the same block
Fields = Sequence[tuple[str, str]]


class Http2Error(Exception):
    """A connection error: answered with GOAWAY(code) and the connection is closed. The
    GOAWAY's debug data is `debug` where given (a word a client looks for), else the
    message."""

    def __init__(self, code: int, message: str, debug: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.debug = message if debug is None else debug


class StreamError(Exception):
    """A stream error: answered with RST_STREAM(code); the connection carries on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """A frame's 9-byte header; its payload follows."""
    return HEAD.pack((length << 8) | kind) + bytes([flags]) + HEAD.pack(stream_id)


def refusal_frames(message: str) -> bytes:
    """What a connection we will not serve is told: GOAWAY with `message` as its debug data,
    in place of our SETTINGS. grpcio then counts a failed handshake and fails the call at
    once with UNAVAILABLE; after SETTINGS it counts the connection as made, and retries it
    until the call's deadline (a 10 s deadline ran out in the test)."""
    debug = message.encode()[:256]
    return (frame(GOAWAY, 0, 0, 8 + len(debug))
            + HEAD.pack(0) + HEAD.pack(REFUSED_STREAM) + debug)


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with `first`'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(fields: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (no Huffman, no dynamic table): the peer's
    decoder state never depends on ours, so blocks can be built once and reused."""
    parts = []
    for name, value in fields:
        if name == b":status" and value == b"200":
            parts.append(b"\x88")  # static table entry 8
            continue
        parts += [b"\x00", _integer(len(name), 7), name, _integer(len(value), 7), value]
    return b"".join(parts)
