"""Request decompression shared by both front ends: HTTP's Content-Encoding and gRPC's
grpc-encoding name the same two zlib formats.

A decompressed body goes where a received one does: into a pooled, aligned buffer. As one
`bytes` from zlib it was outside the pool, so compressed requests were bounded only by
--max-request-bytes each (a 64 KB gzip body can hold 64 MB of zeros), never refused when
memory was short, and their binary tensors sat wherever malloc put the object and were
copied again to be aligned. zlib has no decompress-into, so it writes chunks of at most
_CHUNK bytes that are placed into the buffer as they come: every output byte is written
twice, both counted, and at most one chunk lives outside the pool.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from tensorgate.errors import InvalidArgumentError
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.copies import CopyLedger, record_copy

__all__ = ["inflate"]

_CHUNK = 1 << 20  # output a call
_INPUT = 256 << 10  # input a call: what zlib leaves unread of it is copied each call
_FIRST_BYTES = 64 << 10  # the first buffer when the size is not known: at least this
_MAX_RATIO = 1032  # deflate's most output per input byte: a gzip size hint beyond is false


def inflate(data: Any, encoding: str, limit: int, what: str, ledger: CopyLedger,
            acquire: Callable[[int], HostBuffer], pad: int = 0) -> memoryview | None:
    """`data` decompressed from gzip or deflate (a zlib stream) into a buffer from
    `acquire`, starting `pad` bytes in (so that what follows a JSON header of known length
    lands aligned); None when it would exceed `limit` bytes (each front end answers that in
    its own way). `acquire` raises when the pool has no room: the request is refused."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    most = limit + 1  # one byte more than allowed tells that there is more
    view = memoryview(acquire(pad + min(most, _first_size(data, encoding)))).cast("B")
    source = memoryview(data).cast("B")
    length = read = 0
    pending: Any = b""
    while not inflater.eof:
        room = min(len(view) - pad, most) - length
        if not room:
            if length == most:
                break
            view = _grown(view, pad, length, most, ledger, acquire)
            room = min(len(view) - pad, most) - length
        if not pending:  # fed a slice at a time: zlib copies what it leaves unread
            pending = source[read:read + _INPUT]
            read += len(pending)
        asked = min(room, _CHUNK)
        try:
            chunk = inflater.decompress(pending, asked)
        except zlib.error as error:
            raise InvalidArgumentError(f"the {encoding} {what} cannot be decompressed: "
                                       f"{error}") from None
        view[pad + length:pad + length + len(chunk)] = chunk
        length += len(chunk)
        pending = inflater.unconsumed_tail
        if len(chunk) < asked and not pending and read == len(source):
            break  # every input byte is read and zlib holds no more output
    if length > limit:
        return None
    if not inflater.eof:  # its bytes ended before the compressed stream did
        raise InvalidArgumentError(f"the {encoding} {what} is truncated: it ends before its "
                                   "compressed stream does")
    record_copy(2 * length, "decode", ledger)
    return view[pad:pad + length]


def _first_size(data: Any, encoding: str) -> int:
    """The buffer to begin with: gzip's trailer states the size (modulo 2**32) and is
    believed when deflate could make that much of `data`; else a guess that grows."""
    size = len(data)
    if encoding == "gzip" and size >= 18:
        stated = int.from_bytes(memoryview(data)[size - 4:size], "little")
        if 0 < stated <= _MAX_RATIO * size:
            return stated
    return max(_FIRST_BYTES, 4 * size)


def _grown(view: memoryview, pad: int, length: int, most: int, ledger: CopyLedger,
           acquire: Callable[[int], HostBuffer]) -> memoryview:
    """A buffer twice as large (at most `most` after `pad`) holding the `length` bytes so
    far: they are moved, and counted; the old buffer goes back to the pool."""
    grown = memoryview(acquire(pad + min(most, max(2 * (len(view) - pad), length + _CHUNK))))
    grown = grown.cast("B")
    grown[pad:pad + length] = view[pad:pad + length]
    record_copy(length, "decode", ledger)
    return grown
