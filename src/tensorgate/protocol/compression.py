"""Request decompression shared by both front ends: HTTP's Content-Encoding and gRPC's
grpc-encoding name the same two zlib formats."""

from __future__ import annotations

import zlib
from typing import Any

from tensorgate.errors import InvalidArgumentError
from tensorgate.tensor.copies import CopyLedger, record_copy

__all__ = ["inflate"]


def inflate(data: Any, encoding: str, limit: int, what: str,
            ledger: CopyLedger) -> bytes | None:
    """`data` decompressed from gzip or deflate (a zlib stream), counted as a copy; None
    when it would exceed `limit` bytes (each front end answers that in its own way)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise InvalidArgumentError(f"the {encoding} {what} cannot be decompressed: "
                                   f"{error}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        return None
    if not inflater.eof:  # its bytes ended before the compressed stream did
        raise InvalidArgumentError(f"the {encoding} {what} is truncated: it ends before its "
                                   "compressed stream does")
    record_copy(len(out), "decode", ledger)
    return out
