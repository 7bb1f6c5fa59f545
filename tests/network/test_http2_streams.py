"""The HTTP/2 layer keeps a connection's streams apart: a stream whose handler raises (a bug
above the layer) is reset alone, and the connection's other streams — all of a gRPC client's
calls share one connection — carry on. Driven through the asyncio protocol methods the event
loop calls, with a transport that records what the layer writes."""

from __future__ import annotations

import asyncio

import hpack
import pytest

from tensorgate.network import http2
from tests.e2e.h2_client import (DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE,
                                 RST_STREAM, SETTINGS, H2Client)


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
    block = encoder.encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])
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
    assert resets == [(1, http2.INTERNAL_ERROR)]
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
    assert len(connection._buffer) == http2._IDLE_BUFFER
    encoder = hpack.Encoder()
    big = "b" * 40_000  # one header block of about 40 KB: larger than the idle buffer
    block = encoder.encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a"), ("x-big", big)], huffman=False)
    assert http2._IDLE_BUFFER < len(block) < http2._MAX_CONTROL_FRAME
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b"")
          + H2Client.frame(HEADERS, END_HEADERS, 1, block), chunk=1000)  # a slow sender
    assert dict(seen[1])["x-big"] == big
    assert len(connection._buffer) == 9 + len(block)  # grown to fit the frame, no more

    payload = bytes(range(256)) * 4  # 300 DATA frames of 1 KiB: reads that fill the room
    frames = b"".join(H2Client.frame(DATA, 0, 1, payload) for _ in range(299))
    offered = _feed(connection, frames + H2Client.frame(DATA, END_STREAM, 1, payload))
    assert handlers[1].data == payload * 300 and handlers[1].ended
    assert len(connection._buffer) == http2._RECEIVE_BUFFER
    assert max(offered) > http2._RECEIVE_BUFFER // 2  # reads of many frames once grown

    connection.streams.clear()  # the call was answered
    connection.expire(connection._last_read + http2._SHRINK_IDLE_S + 1, read_timeout_s=30)
    assert len(connection._buffer) == http2._IDLE_BUFFER
    _feed(connection, H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 3,
                                      encoder.encode([(":method", "POST"), (":path", "/y"),
                                                      (":scheme", "http"),
                                                      (":authority", "a")])))
    assert dict(seen[3])[":path"] == "/y" and handlers[3].ended
