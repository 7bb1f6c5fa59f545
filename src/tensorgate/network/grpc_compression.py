"""Inference responses compressed for gRPC clients that accept it, as Triton's
--grpc-infer-response-compression-level asks.

The level picks the encoding as gRPC's servers pick it, and so Triton's: of gzip and deflate
(in that order), those the client's grpc-accept-encoding names; `low` the first, `medium` the
middle one, `high` the last — grpcio accepts both, so low answers gzip and medium and high
deflate (probed against tritonserver 2.51: the same for each level and header, for ModelInfer
and ModelStreamInfer; other methods are never compressed). A client that accepts neither, or
sends no grpc-accept-encoding, is answered plainly. zlib's level is the HTTP answers'
(protocol/compression.ANSWER_LEVEL, its fastest): gRPC's level names the encoding, not the
effort. Compressing reads every response byte into a new buffer: a copy, counted ("encode").
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from tensorgate.network import http2
from tensorgate.network.grpc_messages import ENCODINGS, RESPONSE_HEADERS, parts_size
from tensorgate.protocol.compression import deflate_steps
from tensorgate.tensor.copies import CopyLedger, record_copy

__all__ = ["packed_message", "response_encoding", "response_headers"]

_RANKING = ("gzip", "deflate")  # gRPC's, least compressing first
# RESPONSE_HEADERS with the encoding its messages come in
_COMPRESSED_HEADERS = {name: http2.encode_headers([
    (b":status", b"200"), (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", ENCODINGS.encode()), (b"grpc-encoding", name.encode())])
    for name in _RANKING}


def response_encoding(level: str, accepted: str) -> str | None:
    """The encoding an inference response goes in at `level` to a client whose
    grpc-accept-encoding is `accepted`; None: as it is."""
    if level == "none" or not accepted:
        return None
    names = {name.strip() for name in accepted.split(",")}
    usable = [name for name in _RANKING if name in names]
    if not usable:
        return None
    return usable[0 if level == "low" else len(usable) // 2 if level == "medium" else -1]


def response_headers(encoding: str | None) -> bytes:
    """The header block of an answer whose messages come in `encoding` (None: as they are)."""
    return RESPONSE_HEADERS if encoding is None else _COMPRESSED_HEADERS[encoding]


def packed_message(parts: Sequence[Any], encoding: str, ledger: CopyLedger
                   ) -> Generator[None, None, bytes]:
    """A response message's serialized `parts` compressed, to be framed flagged compressed
    (grpc_messages.framed), a slice of it between turns of the loop (protocol.steps)."""
    packed = yield from deflate_steps(parts, encoding)
    record_copy(parts_size(parts), "encode", ledger)
    return packed
