"""Protocol Buffers' wire format, read where protobuf would cost more than the reading: the
split of a ModelInferRequest from its tensors, the count of a message's parts before it is
parsed, an input's typed contents read as arrays. Every length is checked against the bytes
there are; a varint longer than 10 bytes is refused (it would grow a Python int without end).
"""

from __future__ import annotations

from collections.abc import Iterator

from tensorgate.errors import InvalidArgumentError

__all__ = ["LENGTH_DELIMITED", "MAX_MESSAGE_PARTS", "PARTS_A_STEP", "VARINT", "PartsBudget",
           "fields", "too_many_parts", "varint", "varint_bytes", "whole_fields"]

VARINT, LENGTH_DELIMITED = 0, 2  # the wire types read by kind here; 1 and 5 are fixed 8 and 4

# Fields, nested messages and map entries one gRPC request may hold, at every level (a
# parameter is four: its entry, key, value and the value's field). upb parses a map in time
# that grows with the square of its entries (protocolbuffers/upb#1335): 1.5 million request
# parameters (26 MB) held the event loop for 11 s in-process, 400,000 for 0.6; and each part
# read is a Python object, each field walked here Python time. Room for the most tensors a
# request may name (MAX_TENSORS: 4,096 inputs of ~5 parts, 4,096 outputs, their raw
# contents); counting 65,536 takes ~30 ms.
MAX_MESSAGE_PARTS = 65_536

# Fields walked in Python between two yields: ~1-2.5 µs each (a message of 65,000 empty
# outputs, 131 KB, held the loop for 155 ms in one step)
PARTS_A_STEP = 1024


def too_many_parts(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} holds more than {MAX_MESSAGE_PARTS:,} fields, nested "
                                "messages and map entries; at most that many are parsed")


class PartsBudget:
    """The fields a message may still have walked here, MAX_MESSAGE_PARTS in all: a request
    walked in parts (its inputs, their contents) spends one budget."""

    __slots__ = ("left", "name")

    def __init__(self, name: str, left: int = MAX_MESSAGE_PARTS) -> None:
        self.name = name
        self.left = left

    def spend(self, count: int = 1) -> None:
        self.left -= count
        if self.left < 0:
            raise too_many_parts(self.name)


def varint(data: memoryview, at: int, end: int, message: str = "ModelInferRequest"
           ) -> tuple[int, int]:
    """(value, next offset) of the varint at `at`; (-1, at) when it is cut off at `end`."""
    if at < end and data[at] < 0x80:  # one byte: tags, and lengths under 128
        return data[at], at + 1
    value = shift = 0
    while at < end:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise InvalidArgumentError(f"{message} is malformed: a varint is longer than 10 "
                                       "bytes")
    return -1, at


def varint_bytes(value: int) -> bytes:
    """`value` (not negative) written as a varint: 7 bits a byte, least significant first."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def fields(data: memoryview, end: int, at: int = 0, message: str = "ModelInferRequest"
           ) -> Iterator[tuple[int, int, int, int, bool]]:
    """(field number, wire type, value start, value end, payload complete) for each field of
    a `message` in data[at:end]; stops at the first field whose header is incomplete."""
    while at < end:
        tag, after = varint(data, at, end, message)
        if tag < 0:
            return
        kind, number = tag & 7, tag >> 3
        if kind == VARINT:
            value, stop = varint(data, after, end, message)
            if value < 0:
                return
            start = after
        elif kind == LENGTH_DELIMITED:
            length, start = varint(data, after, end, message)
            if length < 0:
                return
            stop = start + length
        elif kind in (1, 5):
            start, stop = after, after + (8 if kind == 1 else 4)
        else:
            raise InvalidArgumentError(f"{message} is malformed: field {number} has wire type "
                                       f"{kind}")
        if number == 0:
            raise InvalidArgumentError(f"{message} is malformed: field number 0")
        yield number, kind, start, stop, stop <= end
        at = stop


def whole_fields(data: memoryview, message: str, at: int = 0
                 ) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) for each field of a `message` that
    data[at:] must hold whole: a field that runs past its end, or an end inside a field's
    header, is malformed."""
    for number, kind, start, stop, complete in fields(data, len(data), at, message):
        if not complete:
            raise InvalidArgumentError(f"{message} is malformed: field {number} runs past the "
                                       f"end of the {len(data)}-byte message")
        yield number, kind, start, stop
        at = stop
    if at != len(data):
        raise InvalidArgumentError(f"{message} is malformed: it ends inside a field")
