"""A connection's request header blocks: gathered from HEADERS and CONTINUATION fragments,
decoded by `hpack` (Huffman codes and the dynamic table), and kept decoded while a client
repeats them.

A client sends the same header block call after call (by the second call its fields are
all in HPACK's dynamic table). hpack decoded one in ~40 µs of a ~700 µs gRPC identity call
(py-spy); a block that left the table as it found it decodes the same way while the table
stays so, so its fields are kept, keyed by its bytes, until the table changes. Bounded per
connection: blocks this small, this many, these bytes of block and fields together.
"""

from __future__ import annotations

import hpack

from tensorgate.network.http2_frames import (COMPRESSION_ERROR, ENHANCE_YOUR_CALM, Fields,
                                             Http2Error)

__all__ = ["MAX_CONTINUATIONS", "MAX_HEADER_BLOCK", "HeaderBlocks"]

MAX_HEADER_BLOCK = 64 << 10        # encoded bytes of one header block, CONTINUATIONs included
# CONTINUATION frames one header block may take. Bytes alone do not bound them: empty ones
# add nothing, and a client sending them without end (HTTP/2's "CONTINUATION flood",
# CVE-2024-27316 / CVE-2024-28182) held its connection open and cost the server 1.5 s of CPU
# per million, never answered (a /tmp script before this bound). A 64 KiB block needs 4 at
# 16 KiB, HTTP/2's smallest frame size (we allow 1 MiB: grpcio sends a block in one HEADERS);
# nghttp2's servers allow 8, and 16 lets a client split one into 4 KiB frames.
MAX_CONTINUATIONS = 16
_KEPT_BLOCK = 1024
_KEPT_BLOCKS = 8
_KEPT_BYTES = 8 << 10


class HeaderBlocks:
    """The header blocks of one connection, in the order they arrive (HPACK's table is the
    connection's: a block is decoded against what every block before it left)."""

    __slots__ = ("stream_id", "end_stream", "begun", "decoder", "kept", "_kept_bytes",
                 "_block", "_continuations")

    def __init__(self, decoder: hpack.Decoder | None = None) -> None:
        self.stream_id = 0         # the stream whose block is arriving (0: none)
        self.end_stream = False    # its HEADERS ended the stream
        self.begun = 0             # blocks begun so far (which one is arriving)
        self.decoder = decoder or hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)
        self.kept: dict[bytes, Fields] = {}  # blocks decoded, by their bytes
        self._kept_bytes = 0
        self._block = bytearray()
        self._continuations = 0    # CONTINUATION frames of the block arriving

    def begin(self, stream_id: int, end_stream: bool, fragment: memoryview) -> None:
        """A HEADERS frame's fragment (padding and priority taken off)."""
        self.stream_id = stream_id
        self.end_stream = end_stream
        self.begun += 1
        self._block.clear()
        self._continuations = 0
        self._append(fragment)

    def add(self, fragment: memoryview) -> None:
        """A CONTINUATION's fragment; a block in more than MAX_CONTINUATIONS of them is a
        connection error."""
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise Http2Error(ENHANCE_YOUR_CALM, f"a header block in more than "
                                                f"{MAX_CONTINUATIONS} CONTINUATION frames")
        self._append(fragment)

    def _append(self, fragment: memoryview) -> None:
        """A fragment of the block; a block over MAX_HEADER_BLOCK is a connection error."""
        if len(self._block) + len(fragment) > MAX_HEADER_BLOCK:
            raise Http2Error(ENHANCE_YOUR_CALM, f"a header block exceeds {MAX_HEADER_BLOCK} "
                                                "bytes")
        self._block += fragment

    def finish(self) -> Fields:
        """The block's fields, once its END_HEADERS came; no block is arriving after."""
        self.stream_id = 0
        block = bytes(self._block)
        fields = self.kept.get(block)
        return fields if fields is not None else self._decode(block)

    def _decode(self, block: bytes) -> Fields:
        """The block's fields, decoded by hpack against the dynamic table, and kept for the
        next time the same bytes come if decoding it neither added to the table nor
        resized it; a block that changed the table forgets every block kept."""
        table = self.decoder.header_table
        entries = table.dynamic_entries
        # The table changed iff its newest entry, its length or its size did: entries are
        # added at the front as new tuples and evicted from the back (or all at once).
        newest, length, size = entries[0] if entries else None, len(entries), table.maxsize
        try:
            fields = tuple([(str(name), str(value)) for name, value in
                            self.decoder.decode(block)])
        except hpack.HPACKError as error:  # the shared table is now unknown: fatal
            raise Http2Error(COMPRESSION_ERROR, f"undecodable header block: {error}") from None
        if ((entries[0] if entries else None) is not newest or len(entries) != length
                or table.maxsize != size):
            self.kept.clear()
            self._kept_bytes = 0
            return fields
        if len(block) > _KEPT_BLOCK:
            return fields
        cost = len(block) + sum(len(name) + len(value) for name, value in fields)
        if cost > _KEPT_BYTES:
            return fields
        if len(self.kept) >= _KEPT_BLOCKS or self._kept_bytes + cost > _KEPT_BYTES:
            self.kept.clear()
            self._kept_bytes = 0
        self.kept[block] = fields
        self._kept_bytes += cost
        return fields
