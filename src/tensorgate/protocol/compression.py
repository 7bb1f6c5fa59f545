"""Request decompression shared by both front ends (HTTP's Content-Encoding and gRPC's
grpc-encoding name the same two zlib formats), and HTTP's answers compressed a slice at a
time (`deflate_steps`).

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
from collections.abc import Callable, Generator, Sequence
from typing import Any

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.steps import run_through
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.copies import CopyLedger, record_copy

__all__ = ["ANSWER_LEVEL", "deflate_steps", "inflate", "inflate_steps", "worth_compressing"]

_CHUNK = 1 << 20  # output a call
_INPUT = 256 << 10  # input a call: what zlib leaves unread of it is copied each call
_FIRST_BYTES = 64 << 10  # the first buffer when the size is not known: at least this
_MAX_RATIO = 1032  # deflate's most output per input byte: a gzip size hint beyond is false
# Answers are compressed at zlib's fastest level: a 1.6 MB JSON answer (identity, random
# floats) took 151 ms at the default level 6 and 23 at 1, for 0.44 against 0.47 of its size;
# Python's requests asks for gzip on every call, so every JSON answer paid it.
ANSWER_LEVEL = 1
_ANSWER_SLICE = 256 << 10  # of an answer compressed between two turns of the loop (~2 ms)
# A binary answer's tensors are compressed only when samples of them shrink below this:
# aiohttp (so tritonclient.http.aio) accepts gzip on every call unasked, and identity's
# 602 KB of random FP32 then cost 14 ms at level 1 to save a tenth: 17 ms a call against
# 0.7 for the same client without.
_WORTH = 0.85
# bytes a sample, three of them from the largest tensor: three of 4 KiB cost 131 µs a
# call for random FP32 (level 1), three of 1 KiB 27; the ratios they give differ by a few
# hundredths (the smaller less hopeful, so nearer identity: no cost to the client)
_SAMPLE = 1024


def inflate(data: Any, encoding: str, limit: int, what: str, ledger: CopyLedger,
            acquire: Callable[[int], HostBuffer], pad: int = 0) -> memoryview | None:
    """inflate_steps in one go."""
    result: memoryview | None = run_through(inflate_steps(data, encoding, limit, what,
                                                          ledger, acquire, pad))
    return result


def inflate_steps(data: Any, encoding: str, limit: int, what: str, ledger: CopyLedger,
                  acquire: Callable[[int], HostBuffer], pad: int = 0
                  ) -> Generator[None, None, memoryview | None]:
    """`data` decompressed from gzip or deflate (a zlib stream) into a buffer from
    `acquire`, starting `pad` bytes in (so that what follows a JSON header of known length
    lands aligned); None when it would exceed `limit` bytes (each front end answers that in
    its own way). `acquire` raises when the pool has no room: the request is refused. A
    yield after each _CHUNK of output (protocol.steps): 12 MB of gzipped random floats took
    43 ms to decompress, all of it on the loop."""
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
        yield
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


def deflate_steps(parts: Sequence[Any], encoding: str) -> Generator[None, None, bytes]:
    """`parts` (bytes and byte views, in order) compressed as one gzip or deflate body at
    ANSWER_LEVEL, _ANSWER_SLICE of input a step: a yield between steps lets the loop serve
    others (a 6.4 MB JSON answer, identity [4,3,224,224], held it for 337 ms at level 6 in
    one go; 50 ms at level 1, a step per 256 KiB)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    packer = zlib.compressobj(ANSWER_LEVEL, zlib.DEFLATED, wbits)
    out = []
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, len(view), _ANSWER_SLICE):
            out.append(packer.compress(view[start:start + _ANSWER_SLICE]))
            if len(view) - start > _ANSWER_SLICE:
                yield
    out.append(packer.flush())
    return b"".join(out)


def worth_compressing(tensors: Sequence[Any]) -> bool:
    """Whether binary tensors (byte views) compress enough to spend zlib on them: three
    samples of the largest (start, middle, end) at ANSWER_LEVEL must come to under _WORTH
    of their size. Accept-Encoding allows compression, it does not require it: where this
    says no, the answer goes as it is."""
    if not tensors:
        return True
    largest = max((memoryview(t).cast("B") for t in tensors), key=len)
    if len(largest) <= 3 * _SAMPLE:
        return len(zlib.compress(largest, ANSWER_LEVEL)) < _WORTH * len(largest)
    middle = (len(largest) - _SAMPLE) // 2
    sample = b"".join(largest[at:at + _SAMPLE]
                      for at in (0, middle, len(largest) - _SAMPLE))
    return len(zlib.compress(sample, ANSWER_LEVEL)) < _WORTH * len(sample)
