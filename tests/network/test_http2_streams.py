"""The HTTP/2 layer keeps a connection's streams apart: a stream whose handler raises (a bug
above the layer) is reset alone, and the connection's other streams — all of a gRPC client's
calls share one connection — carry on. DATA frames of any sizes, padded or not, in reads of
any sizes, bring gRPC messages whole, in order and byte for byte, whether a payload is read
into place, copied there in a run of whole frames (`_data_run`) or taken a piece at a time;
copies are counted, never more than the tensor, and the windows count every DATA byte.
Driven through the asyncio protocol methods the event loop calls, with a transport that
records what the layer writes."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.network import ConnectionBudget, http2, http2_base, http2_frames
from tensorgate.network.grpc_messages import MessageReader
from tensorgate.network.keepalive import Keepalive
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import BufferPool
from tests.e2e.h2_client import (DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE,
                                 PRIORITY, RST_STREAM, SETTINGS, WINDOW_UPDATE, H2Client)

PADDED = 0x8
_PATTERN = bytes(range(251))


class _Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0  # the socket takes everything at once


class _Handler:
    def __init__(self, explode: bool) -> None:
        self.explode = explode
        self.data = b""
        self.ended = self.cancelled_ = False

    def data_received(self, data: memoryview) -> None:
        if self.explode:
            raise RuntimeError("a bug in the layer above")
        self.data += bytes(data)

    def receive_buffer(self, limit: int) -> memoryview | None:
        return None

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        pass

    def end_received(self) -> None:
        self.ended = True

    def cancelled(self) -> None:
        self.cancelled_ = True

    def drained(self) -> None:
        pass

    def waiting(self) -> bool:
        return False

    def timed_out(self, quiet_s: float, limit_s: float) -> None:
        pass


def _request_block(encoder: hpack.Encoder) -> bytes:
    """A POST request's header block."""
    return encoder.encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                           (":authority", "a")])


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        out.append((data[3], data[4], stream, data[9:9 + length]))
        data = data[9 + length:]
    return out


def test_a_failing_stream_is_reset_alone(caplog: pytest.LogCaptureFixture) -> None:
    handlers: dict[int, _Handler] = {}

    def open_stream(connection, stream, headers) -> _Handler:
        handlers[stream.id] = _Handler(explode=stream.id == 1)
        return handlers[stream.id]

    connection = http2.Http2Connection(open_stream, lambda c: None)
    transport = _Recorder()
    connection.connection_made(transport)
    encoder = hpack.Encoder()
    block = _request_block(encoder)
    incoming = (PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
                + H2Client.frame(HEADERS, END_HEADERS, 1, block)
                + H2Client.frame(HEADERS, END_HEADERS, 3, block)
                + H2Client.frame(DATA, 0, 1, b"boom")
                + H2Client.frame(DATA, END_STREAM, 3, b"fine"))
    buffer = connection.get_buffer(len(incoming))
    buffer[:len(incoming)] = incoming
    connection.buffer_updated(len(incoming))

    frames = _frames(bytes(transport.written))
    resets = [(stream, int.from_bytes(payload, "big")) for kind, _, stream, payload in frames
              if kind == RST_STREAM]
    assert resets == [(1, http2_frames.INTERNAL_ERROR)]
    assert not any(kind == GOAWAY for kind, *_ in frames) and not transport.closed
    assert handlers[1].cancelled_
    assert (handlers[3].data, handlers[3].ended, handlers[3].cancelled_) == (b"fine", True,
                                                                             False)
    assert "HTTP/2 stream 1: its handler raised; the stream is reset" in caplog.text


def _feed(connection: http2.Http2Connection, data: bytes, chunk: int = 1 << 30) -> list[int]:
    """Deliver `data` as the event loop would: each read fills at most the room offered
    (and at most `chunk`: what the client had sent by then). Returns the room offered for
    each read."""
    offered = []
    while data:
        room = connection.get_buffer(-1)
        offered.append(len(room))
        n = min(len(room), len(data), chunk)
        room[:n] = data[:n]
        connection.buffer_updated(n)
        data = data[n:]
    return offered


def test_the_receive_buffer_grows_for_large_frames_and_busy_reads_then_shrinks() -> None:
    """An idle connection holds a small receive buffer (1,000 idle gRPC connections held
    259 MB at 256 KiB each); a header block larger than it, and reads that keep filling
    it, grow it; idle again, it shrinks, and frames still parse."""
    seen: dict[int, list[tuple[str, str]]] = {}
    handlers: dict[int, _Handler] = {}

    def open_stream(connection, stream, headers) -> _Handler:
        seen[stream.id] = headers
        handlers[stream.id] = _Handler(explode=False)
        return handlers[stream.id]

    connection = http2.Http2Connection(open_stream, lambda c: None)
    connection.connection_made(_Recorder())
    assert len(connection._buffer) == http2_base.IDLE_BUFFER
    encoder = hpack.Encoder()
    big = "b" * 40_000  # one header block of about 40 KB: larger than the idle buffer
    block = encoder.encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a"), ("x-big", big)], huffman=False)
    assert http2_base.IDLE_BUFFER < len(block) < http2_base.MAX_CONTROL_FRAME
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
          + H2Client.frame(HEADERS, END_HEADERS, 1, block), chunk=1000)  # a slow sender
    assert dict(seen[1])["x-big"] == big
    assert len(connection._buffer) == 9 + len(block)  # grown to fit the frame, no more

    payload = bytes(range(256)) * 4  # 300 DATA frames of 1 KiB: reads that fill the room
    frames = b"".join(H2Client.frame(DATA, 0, 1, payload) for _ in range(299))
    offered = _feed(connection, frames + H2Client.frame(DATA, END_STREAM, 1, payload))
    assert handlers[1].data == payload * 300 and handlers[1].ended
    assert len(connection._buffer) == http2_base.RECEIVE_BUFFER
    assert max(offered) > http2_base.RECEIVE_BUFFER // 2  # reads of many frames once grown

    connection.streams.clear()  # the call was answered
    connection.expire(connection._last_read + http2_base.SHRINK_IDLE_S + 1,
                      read_timeout_s=30)
    assert len(connection._buffer) == http2_base.IDLE_BUFFER
    _feed(connection, H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 3,
                                      encoder.encode([(":method", "POST"), (":path", "/y"),
                                                      (":scheme", "http"),
                                                      (":authority", "a")])))
    assert dict(seen[3])[":path"] == "/y" and handlers[3].ended


class _Messages(_Handler):
    """A stream's handler that reads its length-prefixed messages as the gRPC front end
    does (placed in pooled buffers, each first tensor aligned)."""

    def __init__(self, pool: BufferPool) -> None:
        super().__init__(explode=False)
        self.got: list[bytes] = []
        self.ledgers: list[CopyLedger] = []
        self.reader = MessageReader(pool, 1 << 24, "identity", True, self._whole)

    def _whole(self, message: Any, encoding: str, ledger: CopyLedger) -> None:
        self.got.append(bytes(message))
        self.ledgers.append(ledger)

    def data_received(self, data: memoryview) -> None:
        self.reader.feed(data)

    def receive_buffer(self, limit: int) -> memoryview | None:
        return self.reader.receive_buffer(limit)

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        self.reader.data_written(nbytes, copied)


def _message(size: int, seed: int) -> tuple[bytes, int]:
    request = pb.ModelInferRequest(model_name="wide", id=f"r{seed}")
    tensor = request.inputs.add(name="INPUT__0", datatype="UINT8")
    tensor.shape.append(size)
    request.raw_input_contents.append((_PATTERN * (size // 251 + 2))[seed:seed + size])
    return request.SerializeToString(), size


def _data_frames(body: bytes, sizes: list[int], padding: list[int]) -> bytes:
    """`body` as DATA frames of stream 1 cut at `sizes` (cycled), the k-th padded with
    padding[k] bytes (cycled; 0: not padded), END_STREAM on the last."""
    out = bytearray()
    start = k = 0
    while start < len(body):
        size = sizes[k % len(sizes)]
        pad = padding[k % len(padding)]
        piece = body[start:start + size]
        start += size
        flags = END_STREAM if start >= len(body) else 0
        if pad:
            out += H2Client.frame(DATA, flags | PADDED, 1, bytes([pad - 1]) + piece
                                  + b"\0" * (pad - 1))
        else:
            out += H2Client.frame(DATA, flags, 1, piece)
        k += 1
    return bytes(out)


def _count(frames: bytes) -> int:
    count = 0
    while frames:
        frames = frames[9 + int.from_bytes(frames[:3], "big"):]
        count += 1
    return count


@settings(max_examples=150, deadline=None)
@given(tensors=st.lists(st.integers(0, 40_000), min_size=1, max_size=3),
       sizes=st.lists(st.integers(1, 20_000), min_size=1, max_size=6),
       padding=st.lists(st.sampled_from([0, 0, 0, 1, 7]), min_size=1, max_size=4),
       reads=st.lists(st.integers(1, 70_000), min_size=1, max_size=6))
def test_messages_in_any_frames_and_reads_arrive_whole(tensors: list[int], sizes: list[int],
                                                       padding: list[int],
                                                       reads: list[int]) -> None:
    pool = BufferPool(1 << 26)
    handler = _Messages(pool)
    connection = http2.Http2Connection(lambda c, stream, headers: handler, lambda c: None)
    transport = _Recorder()
    connection.connection_made(transport)
    messages = [_message(size, seed) for seed, size in enumerate(tensors)]
    body = b"".join(b"\0" + len(m).to_bytes(4, "big") + m for m, _ in messages)
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                                    (":authority", "a")])
    frames = _data_frames(body, sizes, padding)
    frame_count = _count(frames)
    incoming = (PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
                + H2Client.frame(HEADERS, END_HEADERS, 1, block) + frames)
    k = 0
    while incoming:  # as the event loop reads: at most the room offered, and what was sent
        room = connection.get_buffer(-1)
        n = min(len(room), len(incoming), reads[k % len(reads)])
        room[:n] = incoming[:n]
        connection.buffer_updated(n)
        incoming = incoming[n:]
        k += 1
    assert handler.got == [m for m, _ in messages]
    assert handler.ended and not handler.cancelled_
    for ledger, (_, tensor_bytes) in zip(handler.ledgers, messages):
        assert ledger.bytes <= tensor_bytes  # copies counted, never more than the tensor
    written = _frames(bytes(transport.written))
    assert not [kind for kind, *_ in written if kind in (RST_STREAM, GOAWAY)]
    given_back = {0: 0, 1: 0}  # WINDOW_UPDATE increments, per stream (0: the connection)
    for kind, _, stream_id, payload in written:
        if kind == WINDOW_UPDATE:
            given_back[stream_id] += int.from_bytes(payload, "big")
    # the windows count every DATA byte (padding included), however it was taken
    data = len(frames) - 9 * frame_count
    assert connection.streams[1].receive_window == (http2_base.STREAM_WINDOW - data
                                                    + given_back[1])
    # sent with our SETTINGS
    opening = http2_base.CONNECTION_WINDOW - http2_frames.DEFAULT_WINDOW
    assert connection._receive_window == (http2_base.CONNECTION_WINDOW - data
                                          + given_back[0] - opening)


def test_a_run_of_whole_frames_is_counted_as_copied() -> None:
    """Frames of 16 KiB, all in one read: after the first (which places the message), the
    rest go into place as one run, and every tensor byte is counted as copied once."""
    pool = BufferPool(1 << 26)
    handler = _Messages(pool)
    connection = http2.Http2Connection(lambda c, stream, headers: handler, lambda c: None)
    connection.connection_made(_Recorder())
    message, tensor_bytes = _message(100_000, 3)
    body = b"\0" + len(message).to_bytes(4, "big") + message
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                                    (":authority", "a")])
    incoming = (PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
                + H2Client.frame(HEADERS, END_HEADERS, 1, block)
                + _data_frames(body, [16384], [0]))
    _feed(connection, incoming)
    assert handler.got == [message] and handler.ended
    assert handler.ledgers[0].bytes == tensor_bytes


def _answering(body_bytes: int) -> tuple[http2.Http2Connection, _Recorder, hpack.Encoder]:
    """A connection whose stream 1 (a whole request) is answered with `body_bytes`: the
    peer's default windows (65,535 bytes) let only the first of them go."""
    def open_stream(connection, stream, headers) -> _Handler:
        return _Handler(explode=False)

    connection = http2.Http2Connection(open_stream, lambda c: None)
    transport = _Recorder()
    connection.connection_made(transport)
    encoder = hpack.Encoder()
    block = _request_block(encoder)
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
          + H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    connection.respond(connection.streams[1], encoder.encode([(":status", "200")]),
                       [bytes(body_bytes)], encoder.encode([("grpc-status", "0")]))
    return connection, transport, encoder


def test_an_answer_whose_client_grants_no_window_is_unread_after_two_seconds() -> None:
    """What the windows hold back is counted; it is an unread answer (network.PoolRelief
    may drop the connection) once no DATA has gone for UNREAD_ANSWER_S, and a window
    update that lets some go starts the wait again."""
    connection, _, _ = _answering(200_000)
    assert connection.unsent_bytes == 200_000 - 65_535
    now = time.monotonic_ns()
    assert connection.body_eta(now) is None
    assert connection.body_eta(now + int(2.5e9)) == float("inf")
    update = struct.pack(">I", 10_000)
    _feed(connection, H2Client.frame(WINDOW_UPDATE, 0, 0, update)
          + H2Client.frame(WINDOW_UPDATE, 0, 1, update))
    assert connection.unsent_bytes == 200_000 - 75_535
    assert connection.body_eta(now + int(1.5e9)) is None  # DATA went just now
    assert connection.body_eta(time.monotonic_ns() + int(2.5e9)) == float("inf")


def test_a_reset_stream_takes_its_unsent_bytes_with_it() -> None:
    """The peer resets the stream whose answer waits: nothing is unsent any more, so the
    connection is never taken for one whose client does not read."""
    connection, _, _ = _answering(200_000)
    _feed(connection, H2Client.frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
    assert connection.unsent_bytes == 0
    assert connection.body_eta(time.monotonic_ns() + int(10e9)) is None


def test_an_unread_answer_gives_way_by_dropping_its_connection() -> None:
    connection, transport, _ = _answering(200_000)
    stream = connection.streams[1]
    assert connection.refuse_slow(float("inf"), 30.0) == 200_000 - 65_535
    assert transport.closed and not stream.pending and connection.unsent_bytes == 0


class _ReadingRecorder(_Recorder):
    """A transport that also records whether it is read, and names its peer."""

    def __init__(self, peer: tuple[str, int] | None = None) -> None:
        super().__init__()
        self.reading = True
        if peer is not None:
            self._extra["peername"] = peer

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading


def _turning(finish: bool = False, budget: ConnectionBudget | None = None,
             keepalive: Keepalive | None = None, peer: tuple[str, int] | None = None
             ) -> tuple[http2.Http2Connection, _ReadingRecorder, list[int], hpack.Encoder]:
    """A connection inside a running loop, and the ids of the streams it opened; with
    `finish`, each stream whose request is whole is answered at once (an empty 200); with
    `budget`, ended for flooding, it tells that budget (and asks it whether it starts on
    probation); `keepalive`: its client's PINGs bounded (tests/network/test_http2_pings.py);
    `peer`: its client's address."""
    opened: list[int] = []
    encoder = hpack.Encoder()
    head, trailers = encoder.encode([(":status", "200")]), encoder.encode([("grpc-status", "0")])

    class Answering(_Handler):
        def __init__(self, stream: http2.Http2Stream) -> None:
            super().__init__(explode=False)
            self.stream = stream

        def end_received(self) -> None:
            super().end_received()
            if finish:
                connection.respond(self.stream, head, [b""], trailers)

    def open_stream(connection, stream, headers) -> _Handler:
        opened.append(stream.id)
        return Answering(stream)

    connection = http2.Http2Connection(open_stream, lambda c: None, budget, keepalive)
    transport = _ReadingRecorder(peer)
    connection.connection_made(transport)
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b""))
    return connection, transport, opened, encoder


_streams = H2Client.streams


async def _until_closed(transport: _ReadingRecorder, turns: int) -> None:
    """Turns of the loop until the connection is closed, `turns` at most."""
    for _ in range(turns):
        if transport.closed:
            return
        await asyncio.sleep(0)


def _goaway(transport: _Recorder) -> bytes:
    """The payload of the first GOAWAY written (b"" if none)."""
    return next((payload for kind, _, _, payload in _frames(bytes(transport.written))
                 if kind == GOAWAY), b"")


async def _opened_by_turn(transport: _ReadingRecorder, opened: list[int],
                         turns: int = 60) -> list[int]:
    """The streams opened in each turn of the loop until the connection reads again."""
    counts = [len(opened)]
    while transport.reading is False and len(counts) <= turns:
        await asyncio.sleep(0)
        counts.append(len(opened))
    return [b - a for a, b in zip(counts, counts[1:])]


def test_a_new_connection_opens_8_streams_a_turn_and_earns_up_to_its_concurrent_limit() -> None:
    """300 new streams (each reset by the client) in one read: a new connection opens 8 a
    turn, then is not read until the loop's next turn (uvloop reads a busy socket up to 32
    times a turn: a client resetting each stream as it opened it kept every other connection
    waiting 5.3 s; at 128 a turn, one connecting again for each burst still cost them 6-8 ms
    a turn). One more a turn for each stream answered: after 56, 64 a turn; after 120, 128
    (its concurrent limit: a new stream then counts 8 of the 1,024 frames a turn); but none
    for a stream the client reset after its answer (a rapid-reset client's answer may be
    quicker than its reset)."""
    async def scenario(answered: int, most: int, reset_after: bool = False) -> None:
        connection, transport, opened, encoder = _turning(finish=True)
        block = _request_block(encoder)
        _feed(connection, _streams(1, answered, block, end=True, reset=reset_after))
        await _opened_by_turn(transport, opened)
        assert connection._finished == answered and transport.reading
        assert connection._wasted == 0  # (reset after its answer: not wasted either)
        before = len(opened)
        _feed(connection, _streams(1 + 2 * answered, 300, block, end=False, reset=True))
        steps = [len(opened) - before, *await _opened_by_turn(transport, opened)]
        # (the first turn's budget was partly spent on the answered; a stream's RST_STREAM
        # counts a frame too)
        assert all(most * 0.85 <= step <= most for step in steps[1:-1]), (answered, steps)
        assert max(steps) <= most and sum(steps) == 300, (answered, steps)
        assert opened == list(range(1, 2 * (answered + 300), 2))
        assert transport.reading and not transport.closed

    assert (http2_base.FRAMES_PER_TURN // (1 + http2_base.NEW_STREAM)) == 128
    for answered, most in ((0, 8), (56, 64), (120, 128), (1000, 128)):
        asyncio.run(scenario(answered, most))
    asyncio.run(scenario(200, 8, reset_after=True))


def test_a_client_that_wastes_its_streams_is_told_to_calm_down_and_closed() -> None:
    """Streams reset before their answers, or opened beyond the concurrent limit, are
    wasted; past 1,280 (while they outnumber the streams answered) the connection ends
    with GOAWAY(ENHANCE_YOUR_CALM)."""
    for wasting in ("reset", "beyond the limit"):
        async def scenario() -> None:
            connection, transport, opened, encoder = _turning()
            block = _request_block(encoder)
            data = (_streams(1, 1300, block, end=False, reset=True) if wasting == "reset"
                    else _streams(1, 1500, block, end=False, reset=False))
            _feed(connection, data)
            await _until_closed(transport, 200)  # (8 streams a turn)
            goaway = _goaway(transport)
            assert transport.closed and goaway, wasting
            assert int.from_bytes(goaway[4:8], "big") == http2_frames.ENHANCE_YOUR_CALM
            assert b"1281 streams refused or reset unanswered" in goaway[8:]

        asyncio.run(scenario())


def _broken_streams(count: int, block: bytes, how: str) -> bytes:
    """`count` new streams from 1, each broken by its client right after it opens: a stream
    error, which the server answers by resetting the stream."""
    after = {"a WINDOW_UPDATE of 0": H2Client.frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"),
             "a window past 2^31-1": H2Client.frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"),
             "DATA after its end": H2Client.frame(DATA, 0, 0, b"x"),
             "trailers that were not last": H2Client.frame(HEADERS, END_HEADERS, 0, block)}[how]
    ended = how == "DATA after its end"  # (the request whole: the stream waits for its answer)
    opening = H2Client.frame(HEADERS, END_HEADERS | (END_STREAM if ended else 0), 0, block)
    out = bytearray()
    for stream in range(1, 2 * count, 2):
        for frame in (opening, after):
            out += frame[:5] + struct.pack(">I", stream) + frame[9:]
    return bytes(out)


@pytest.mark.parametrize("how", ["a WINDOW_UPDATE of 0", "a window past 2^31-1",
                                 "DATA after its end", "trailers that were not last"])
def test_streams_the_client_breaks_are_wasted_as_if_it_reset_them(how: str) -> None:
    """A stream error the client makes has the server reset the stream: without counting
    those, a client that broke each stream it opened was rapid reset without a RST_STREAM
    ("MadeYouReset", CVE-2025-8671), never closed. Each is answered RST_STREAM, and past
    1,280 the connection ends with GOAWAY(ENHANCE_YOUR_CALM) naming the last."""
    async def scenario() -> None:
        connection, transport, opened, encoder = _turning()
        _feed(connection, _broken_streams(1300, _request_block(encoder), how))
        await _until_closed(transport, 200)  # (8 streams a turn)
        goaway = _goaway(transport)
        assert transport.closed and goaway
        assert int.from_bytes(goaway[4:8], "big") == http2_frames.ENHANCE_YOUR_CALM
        assert f"1281 streams refused or reset unanswered (the last {how})".encode() \
            in goaway[8:]
        resets = [stream for kind, _, stream, _ in _frames(bytes(transport.written))
                  if kind == RST_STREAM]
        assert resets == opened == list(range(1, 2 * 1281, 2))

    asyncio.run(scenario())


def test_connections_ended_for_flooding_are_counted_and_logged_once_in_a_while(
        caplog: pytest.LogCaptureFixture) -> None:
    """A client connecting again for each flood ended ~8 connections a second, each a log
    line: they are counted (the metrics' tensorgate_connections_flooding_total) and logged
    at most every 10 s."""
    budget = ConnectionBudget()

    async def flood() -> None:
        connection, transport, _, encoder = _turning(budget=budget)
        _feed(connection, _streams(1, 1300, _request_block(encoder), end=False, reset=True))
        await _until_closed(transport, 200)
        assert transport.closed

    with caplog.at_level(logging.INFO):
        for _ in range(3):
            asyncio.run(flood())
    assert budget.floods == 3
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and "floods the server (1281 streams refused or reset" in said[0], \
        said


def test_a_client_whose_calls_mostly_finish_may_reset_many() -> None:
    """1,400 calls answered, then 1,300 reset unanswered (deadlines that passed): the
    connection serves on; 200 more, and the wasted outnumber the answered: closed."""
    async def scenario() -> None:
        connection, transport, opened, encoder = _turning(finish=True)
        block = _request_block(encoder)

        async def fed(data: bytes) -> None:
            _feed(connection, data)
            for _ in range(30):
                await asyncio.sleep(0)

        await fed(_streams(1, 1400, block, end=True, reset=False))
        await fed(_streams(2801, 1300, block, end=False, reset=True))
        assert not transport.closed and len(opened) == 2700
        await fed(_streams(5401, 200, block, end=False, reset=True))
        assert transport.closed, (connection._finished, connection._wasted, len(opened))

    asyncio.run(scenario())


def test_frames_that_ask_for_nothing_are_parsed_128_a_turn_and_closed_past_10000() -> None:
    """PRIORITY frames (not acted on), frames of unknown types and empty DATA that does not
    end its stream ask for no answer, so nothing else holds back a client that floods them
    (every other connection waited 0.5-1 s): each counts 8 of the 1,024 frames a connection
    may have parsed in a turn of the loop (at 1, a client connecting again for each flood
    still cost the others 0.5-0.7 ms a turn), and past 10,000 such frames (and 64 for each
    stream answered) the connection ends with GOAWAY(ENHANCE_YOUR_CALM)."""
    for frame in (H2Client.frame(PRIORITY, 0, 1, b"\0\0\0\0\x10"),
                  H2Client.frame(0xFF, 0, 0, b"")):
        async def scenario() -> None:
            connection, transport, _, _ = _turning()
            _feed(connection, frame * 3000)
            parsed = connection._idle_frames
            assert parsed <= 128 and not transport.reading
            await asyncio.sleep(0)
            assert connection._idle_frames - parsed == 128 and not transport.reading
            assert http2_base.FRAMES_PER_TURN // http2_base.IDLE_FRAME_COUNTS == 128
            for _ in range(30):
                await asyncio.sleep(0)
            assert connection._idle_frames == 3000 and transport.reading
            _feed(connection, frame * 7001)
            await _until_closed(transport, 100)
            goaway = _goaway(transport)
            assert transport.closed and goaway
            assert int.from_bytes(goaway[4:8], "big") == http2_frames.ENHANCE_YOUR_CALM
            assert b"10001 frames that carry nothing" in goaway[8:]

        asyncio.run(scenario())


def test_empty_data_that_does_not_end_its_stream_counts_as_nothing() -> None:
    async def scenario() -> None:
        connection, transport, opened, encoder = _turning()
        _feed(connection, H2Client.frame(HEADERS, END_HEADERS, 1, _request_block(encoder))
              + H2Client.frame(DATA, 0, 1, b"") * 10_001)
        await _until_closed(transport, 120)  # (128 a turn)
        assert opened == [1] and transport.closed

    asyncio.run(scenario())
