"""Header blocks read as HPACK says, whatever the connection keeps: a block seen before is
not decoded again while the dynamic table is as it was, and every stream still gets exactly
the fields a fresh decoder, fed the same blocks in the same order, reads — after blocks that
add to the table, evict from it, resize it, or reference entries whose meaning has moved.
What a connection keeps is bounded however many distinct blocks a peer sends, and so are the
CONTINUATION frames one block may take."""

from __future__ import annotations

import time
from typing import Any

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.network import http2
from tensorgate.network import http2_frames
from tensorgate.network.http2_headers import MAX_CONTINUATIONS, HeaderBlocks
from tests.e2e.h2_client import (CONTINUATION, END_HEADERS, END_STREAM, HEADERS, PREFACE,
                                 SETTINGS, H2Client)
from tests.network.test_http2_streams import _feed, _goaway, _Handler, _Recorder


class _CountingDecoder(hpack.Decoder):
    def __init__(self) -> None:
        super().__init__(max_header_list_size=64 << 10)
        self.calls = 0

    def decode(self, data: bytes, raw: bool = False) -> Any:
        self.calls += 1
        return super().decode(data, raw)


def _connection() -> tuple[http2.Http2Connection, _Recorder, list[list[tuple[str, str]]],
                           _CountingDecoder]:
    seen: list[list[tuple[str, str]]] = []

    def open_stream(connection: Any, stream: Any, headers: Any) -> _Handler:
        seen.append(list(headers))
        return _Handler(explode=False)

    connection = http2.Http2Connection(open_stream, lambda c: None)
    decoder = _CountingDecoder()
    connection._blocks = HeaderBlocks(decoder)
    transport = _Recorder()
    connection.connection_made(transport)
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b""))
    return connection, transport, seen, decoder


def _send(connection: http2.Http2Connection, blocks: list[bytes], first_stream: int = 1) -> None:
    _feed(connection, b"".join(H2Client.frame(HEADERS, END_HEADERS | END_STREAM,
                                              first_stream + 2 * i, block)
                               for i, block in enumerate(blocks)))


def _reference(blocks: list[bytes]) -> list[list[tuple[str, str]]] | int:
    """What a fresh decoder reads from the blocks; the index of the first it cannot."""
    decoder = hpack.Decoder(max_header_list_size=64 << 10)
    out = []
    for i, block in enumerate(blocks):
        try:
            out.append([(str(k), str(v)) for k, v in decoder.decode(block)])
        except hpack.HPACKError:
            return i
    return out


_REQUEST = [(":method", "POST"), (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers")]


def test_a_repeated_block_is_decoded_once_while_the_table_holds_still() -> None:
    connection, _, seen, decoder = _connection()
    encoder = hpack.Encoder()
    first = encoder.encode(_REQUEST)   # literals, each added to the table
    again = encoder.encode(_REQUEST)   # all indexed: the table is left as it was
    assert first != again
    _send(connection, [first, again, again, again])
    assert seen == [_REQUEST] * 4
    assert decoder.calls == 2  # `first` changed the table; `again` was decoded once, then kept


def test_a_kept_block_is_read_again_once_the_table_moves() -> None:
    """0xbe is "the newest dynamic entry": the same byte means another field after a block
    adds one, so nothing decoded before that block is served after it."""
    connection, _, seen, decoder = _connection()
    encoder = hpack.Encoder()
    add_a = encoder.encode(_REQUEST + [("x-a", "1")])
    newest = b"\xbe"
    add_b = b"\x40" + bytes([5]) + b"x-bee" + bytes([1]) + b"2"  # literal, added to the table
    _send(connection, [add_a, newest, newest, add_b, newest, newest])
    assert [fields[-1] if fields else None for fields in seen] == [
        ("x-a", "1"), ("x-a", "1"), ("x-a", "1"), ("x-bee", "2"), ("x-bee", "2"), ("x-bee", "2")]
    assert decoder.calls == 4  # add_a, newest, add_b, newest


def test_a_resized_table_forgets_what_was_kept() -> None:
    """A size update to 0 empties the table: the kept reading of 0xbe is stale, and the
    block that now points past the table fails the connection as HPACK requires."""
    connection, transport, seen, _ = _connection()
    encoder = hpack.Encoder()
    _send(connection, [encoder.encode(_REQUEST), b"\xbe", b"\xbe"])
    assert len(seen) == 3
    _send(connection, [b"\x20" + encoder.encode([(":method", "POST")])], first_stream=7)
    assert len(seen) == 4
    _send(connection, [b"\xbe"], first_stream=9)
    assert len(seen) == 4 and transport.closed
    assert b"undecodable header block" in bytes(transport.written)


def _added(name: bytes, value: bytes) -> bytes:
    """A literal field added to the table (incremental indexing, new name)."""
    return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value


def test_an_eviction_that_leaves_as_many_entries_still_moves_the_table() -> None:
    """In a 64-byte table one entry fits: adding x-b evicts x-a, and 0xbe, kept as x-a,
    now reads x-b."""
    connection, _, seen, _ = _connection()
    _send(connection, [b"\x3f\x21" + _added(b"x-a", b"1"), b"\xbe", b"\xbe",
                       _added(b"x-b", b"2"), b"\xbe"])
    assert [fields[-1] for fields in seen] == [("x-a", "1"), ("x-a", "1"), ("x-a", "1"),
                                               ("x-b", "2"), ("x-b", "2")]


def test_a_resize_that_evicts_nothing_still_forgets_what_was_kept() -> None:
    """A block that sets the size the table already has is kept; after another block
    shrinks the table (evicting nothing), that block must resize it again: a 3,000-byte
    entry then fits, where in the smaller table it empties the table."""
    connection, transport, seen, _ = _connection()
    restore = b"\x3f\xe1\x1f" + b"\xbe"   # size 4096, then the newest entry
    shrink = b"\x3f\xe1\x0f" + b"\xbe"    # size 2048, then the newest entry
    big = b"\x40" + bytes([5]) + b"x-big" + b"\x7f\xb9\x16" + b"y" * 3000
    _send(connection, [_added(b"x-a", b"1"), restore, restore, shrink, restore, big,
                       b"\xbe"])
    assert not transport.closed
    assert seen[-1] == [("x-big", "y" * 3000)]


def _never_indexed(value: str) -> bytes:
    """A block of one field the table never holds (it is left as it was: such a block is
    kept)."""
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple("x-n", value)], huffman=False)


def _kept_bytes(connection: http2.Http2Connection) -> int:
    return sum(len(block) + sum(len(name) + len(value) for name, value in fields)
               for block, fields in connection._blocks.kept.items())


def test_what_a_connection_keeps_is_bounded() -> None:
    connection, transport, seen, decoder = _connection()
    small = [_never_indexed(f"{n:04d}" * 25) for n in range(60)]     # ~100 bytes each
    _send(connection, small)
    assert len(connection._blocks.kept) <= 8
    large = [_never_indexed(f"{n:04d}" * 225) for n in range(60)]    # ~900 bytes each
    _send(connection, large, first_stream=121)
    assert len(connection._blocks.kept) <= 4 and _kept_bytes(connection) <= 8 << 10
    over = _never_indexed("v" * 1100)                                # over 1 KiB: not kept
    _send(connection, [over, over], first_stream=241)
    assert over not in connection._blocks.kept
    assert decoder.calls == 122 and not transport.closed
    assert seen[-1] == [("x-n", "v" * 1100)] and len(seen) == 122


_FIELDS = st.sampled_from([
    _REQUEST, _REQUEST + [("grpc-timeout", "5S")], [(":method", "POST"), ("x-big", "y" * 3000)],
    [("x-a", "1"), ("x-b", "2")], [(":path", "/a")]])


def _steps() -> st.SearchStrategy[list[tuple[str, Any]]]:
    return st.lists(st.one_of(
        st.tuples(st.just("fields"), _FIELDS, st.booleans()),
        st.tuples(st.just("size"), st.sampled_from([0, 64, 200, 4096])),
        st.tuples(st.just("raw"), st.sampled_from([b"\xbe", b"\xbf", b"\xc0", b"\x82\xbe"]))),
        min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(steps=_steps())
def test_every_stream_gets_what_a_fresh_decoder_reads(steps: list[tuple[str, Any]]) -> None:
    encoder = hpack.Encoder()
    blocks = []
    for step in steps:
        if step[0] == "fields":
            blocks.append(encoder.encode(step[1], huffman=step[2]))
        elif step[0] == "size":
            encoder.header_table_size = step[1]  # sent at the start of the next block
        else:
            blocks.append(step[1])
    expected = _reference(blocks)
    connection, transport, seen, _ = _connection()
    _send(connection, blocks)
    if isinstance(expected, int):  # the connection fails at the first undecodable block
        assert len(seen) == expected and transport.closed
        assert b"undecodable header block" in bytes(transport.written)
    else:
        assert seen == expected and not transport.closed


def test_nothing_after_an_undecodable_block_is_read_even_in_later_reads() -> None:
    """The error closes the connection; blocks that still arrive (here in later reads, the
    receive buffer being smaller than what was sent) open no streams: their fields would be
    read against a table the error left unknown. Hypothesis found it: 5 of 6 streams opened
    where a fresh decoder stops at the fourth block."""
    encoder = hpack.Encoder()
    encoder.header_table_size = 0
    fields = [(":method", "POST"), ("x-big", "y" * 5000)]
    blocks = [encoder.encode(fields, huffman=False) for _ in range(3)] + [b"\xbe"]
    blocks += [encoder.encode(fields, huffman=False) for _ in range(2)]
    assert _reference(blocks) == 3
    connection, transport, seen, _ = _connection()
    _send(connection, blocks)
    assert len(seen) == 3 and transport.closed


def _in_pieces(stream: int, block: bytes, continuations: int) -> bytes:
    """The block as HEADERS and `continuations` CONTINUATION frames, the last ending it: its
    bytes cut into pieces, then the frames before the last padded out with empty ones."""
    cuts = [len(block) * i // 4 for i in range(5)]
    pieces = [block[a:b] for a, b in zip(cuts, cuts[1:])]
    pieces[1:1] = [b""] * (continuations + 1 - len(pieces))
    frames = [H2Client.frame(HEADERS, END_STREAM, stream, pieces[0])]
    frames += [H2Client.frame(CONTINUATION, END_HEADERS if i == len(pieces) - 1 else 0, stream,
                              piece) for i, piece in enumerate(pieces) if i]
    return b"".join(frames)


def test_a_block_may_take_16_continuation_frames_each_and_a_17th_ends_the_connection() -> None:
    """Bytes alone never bounded a block's CONTINUATIONs: empty ones add none, and a client
    sent a million (its connection open, each parsed, the CVE-2024-27316 flood). 16 a block,
    counted afresh for each; past them: GOAWAY(ENHANCE_YOUR_CALM) naming them, closed."""
    assert MAX_CONTINUATIONS == 16
    connection, transport, seen, _ = _connection()
    encoder = hpack.Encoder()
    first, again = encoder.encode(_REQUEST), encoder.encode(_REQUEST)
    _feed(connection, _in_pieces(1, first, 16) + _in_pieces(3, again, 16)
          + _in_pieces(5, again, 3))
    assert seen == [_REQUEST] * 3 and not transport.closed
    _feed(connection, _in_pieces(7, again, 17) + _in_pieces(9, again, 1))
    assert len(seen) == 3 and transport.closed
    goaway = _goaway(transport)
    assert int.from_bytes(goaway[4:8], "big") == http2_frames.ENHANCE_YOUR_CALM
    assert b"a header block in more than 16 CONTINUATION frames" in goaway[8:]


def test_a_header_block_must_arrive_whole_within_the_read_timeout() -> None:
    """A CONTINUATION just within the read timeout each kept a block arriving for 16 times
    it (8 min at 30 s) on a connection never quiet: as an HTTP/1.1 request's head, a block
    must arrive whole within --read-timeout-s, from the first time the connection's
    once-a-second check saw it arriving. One that ends in time opens its stream, and the
    next block's time starts afresh; past it: GOAWAY naming it, closed."""
    connection, transport, seen, _ = _connection()
    encoder = hpack.Encoder()
    first, second = _in_pieces(1, encoder.encode(_REQUEST), 3), encoder.encode(_REQUEST)
    start = time.monotonic()
    frames = {0: first[:len(first) // 2], 20: first[len(first) // 2:],  # whole after 20 s
              21: H2Client.frame(HEADERS, END_STREAM, 3, second[:2])}
    frames.update({21 + 10 * k: H2Client.frame(CONTINUATION, 0, 3, b"") for k in range(1, 5)})
    closed_at = None
    for second_ in range(60):
        now = start + second_
        if second_ in frames:
            _feed(connection, frames[second_])
            connection._last_read = now  # (never quiet for 10 s)
        connection.expire(now, 30.0)
        if transport.closed:
            closed_at = second_
            break
    assert seen == [_REQUEST] and closed_at == 21 + 31, (seen, closed_at)
    assert b"a header block took more than 30 s to arrive (--read-timeout-s)" \
        in _goaway(transport)[8:]
