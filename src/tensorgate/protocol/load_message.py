"""A gRPC RepositoryModelLoad message with its uploaded files taken out before protobuf
parses it: each file is a bytes parameter of tens of MB (tritonclient's
`load_model(files=...)`), and protobuf's parse of the whole message, then the copy a Python
bytes object of it costs when read, are two C calls that hold the event loop (and the GIL):
a small binary request's P99 beside back-to-back gRPC uploads of a 40 MB model was 55 ms
(bench/upload_stall_bench.py), where a reload of that model from the repository costs 15.

The message's fields are walked on the wire (protocol/protobuf_wire.py), a yield to the loop
every PARTS_A_STEP of them: each `parameters` map entry whose key starts "file:" and whose
value is nothing but a bytes_param of LONG_FILE bytes or more is cut out and kept as a view
of the message (no copy: the upload's writer reads it, and the view holds the buffer); the
rest is parsed by protobuf, bounded as every message is (parse_bounded_steps). Anything
else — such a key twice, a malformed field — leaves the message to the plain parse, whose
errors are the ones a client gets.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.grpc_codec import parse_bounded_steps
from tensorgate.protocol.protobuf_wire import (LENGTH_DELIMITED, MAX_MESSAGE_PARTS, PARTS_A_STEP,
                                               fields, too_many_parts)

__all__ = ["LONG_FILE", "LoadRequest", "split_load_steps"]

LONG_FILE = 64 << 10  # bytes: a file this long is taken out, not parsed into the message
_NAME = "RepositoryModelLoadRequest"
_PARAMETERS, _KEY, _VALUE, _BYTES_PARAM = 3, 1, 2, 4  # field numbers


class LoadRequest:
    """The parsed message, and the long files taken out of it: key → a view of its bytes."""

    __slots__ = ("message", "files")

    def __init__(self, message: Any, files: dict[str, memoryview]) -> None:
        self.message = message
        self.files = files


def split_load_steps(data: bytes | memoryview) -> Generator[None, None, LoadRequest]:
    """Steps whose result is the LoadRequest of a RepositoryModelLoad message `data`."""
    view = memoryview(data)
    if len(view) < LONG_FILE:
        return (yield from _whole(view))
    kept: list[memoryview] = []
    files: dict[str, memoryview] = {}
    keys: set[str] = set()
    at = count = 0
    for number, kind, start, stop, complete in fields(view, len(view), 0, _NAME):
        if not complete:
            break  # the plain parse says what is wrong
        count += 1
        if count > MAX_MESSAGE_PARTS:
            raise too_many_parts(_NAME)
        if not count % PARTS_A_STEP:
            yield
        entry = _entry(view, start, stop) if (number, kind) == (_PARAMETERS,
                                                                LENGTH_DELIMITED) else None
        if entry is not None:
            key, content = entry
            if key in keys:  # a key twice: the map's last-one-wins is protobuf's to apply
                return (yield from _whole(view))
            keys.add(key)
            if content is not None:
                files[key] = content
                at = stop
                continue
        kept.append(view[at:stop])
        at = stop
    if at != len(view) or not files:
        return (yield from _whole(view))
    message = yield from parse_bounded_steps(pb.RepositoryModelLoadRequest, b"".join(kept))
    return LoadRequest(message, files)


def _whole(view: memoryview) -> Generator[None, None, LoadRequest]:
    """The message parsed whole by protobuf, nothing taken out."""
    return LoadRequest((yield from parse_bounded_steps(pb.RepositoryModelLoadRequest,
                                                       bytes(view))), {})


def _entry(view: memoryview, start: int, stop: int) -> tuple[str, memoryview | None] | None:
    """A parameters map entry's key (its last, as protobuf reads it; "" where it has none)
    and, where the key starts "file:" and the value is nothing but a bytes_param of
    LONG_FILE bytes or more, a view of those bytes; None where the entry is not readable
    (protobuf says what is wrong)."""
    key, values, plain, reached = "", [], True, start
    try:
        for number, kind, begin, end, complete in fields(view, stop, start, _NAME):
            reached = end
            if not complete:
                return None
            if (number, kind) == (_KEY, LENGTH_DELIMITED):
                key = bytes(view[begin:end]).decode()
            elif (number, kind) == (_VALUE, LENGTH_DELIMITED):
                values.append((begin, end))
            else:
                plain = False
        if reached != stop:
            return None
        if not (plain and len(values) == 1 and key.startswith("file:")):
            return key, None
        begin, end = values[0]
        inner = list(fields(view, end, begin, _NAME))
    except (InvalidArgumentError, UnicodeDecodeError):
        return None
    if len(inner) != 1:
        return key, None
    [(field, wire, first, last, whole)] = inner
    if (field, wire) != (_BYTES_PARAM, LENGTH_DELIMITED) or not whole or last != end \
            or last - first < LONG_FILE:
        return key, None
    return key, view[first:last]
