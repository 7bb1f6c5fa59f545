"""Protocol Buffers wire bytes written by hand, for messages protobuf would not write (its
fields in two runs, elements unpacked, unknown or malformed fields)."""

from __future__ import annotations

from tensorgate.protocol.protobuf_wire import varint_bytes


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, then `payload`."""
    return varint_bytes(number << 3 | 2) + varint_bytes(len(payload)) + payload
