"""A graceful close of an HTTP/2 connection (shutdown's, or --grpc-max-connection-age's), as
gRPC's servers do it: a GOAWAY naming no last stream, with a PING; streams opened meanwhile
(the client had not read it yet) are served; the second GOAWAY, naming the last stream
taken, when the PING comes back, or after _DRAIN_PING_S when it does not; streams opened
after the second are refused unprocessed; the connection closes once the last is answered."""

from __future__ import annotations

import struct
import time
from typing import Any

import hpack

from tensorgate.network import http2, http2_base, http2_frames
from tests.e2e.h2_client import (ACK, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE,
                                 RST_STREAM, SETTINGS, H2Client)
from tests.network.test_http2_streams import _feed, _Handler, _Recorder

BLOCK = hpack.Encoder().encode([(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                                (":authority", "a")])
NO_LAST = (1 << 31) - 1


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in `data`."""
    frames = []
    while data:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
        data = data[9 + length:]
    return frames


def _written(transport: _Recorder) -> list[tuple[int, int, int, bytes]]:
    """The frames written since the last call (other than SETTINGS and its ACK)."""
    frames = _frames(bytes(transport.written))
    transport.written.clear()
    return [frame for frame in frames if frame[0] != SETTINGS]


def _connection() -> tuple[http2.Http2Connection, _Recorder, dict[int, Any]]:
    opened: dict[int, Any] = {}

    def open_stream(connection: Any, stream: Any, headers: Any) -> _Handler:
        opened[stream.id] = stream
        return _Handler(explode=False)

    connection = http2.Http2Connection(open_stream, lambda c: None)
    transport = _Recorder()
    connection.connection_made(transport)
    _feed(connection, PREFACE + H2Client.frame(SETTINGS, 0, 0, b""))
    _written(transport)
    return connection, transport, opened


def _goaway(last: int) -> tuple[int, int, int, bytes]:
    return (GOAWAY, 0, 0, struct.pack(">II", last, http2_frames.NO_ERROR))


def _answer(connection: http2.Http2Connection, stream: Any) -> None:
    connection.respond_headers(stream, http2.encode_headers([(b":status", b"200")]))


def test_streams_racing_the_first_goaway_are_served_and_the_second_names_the_last() -> None:
    connection, transport, opened = _connection()
    connection.close_when_idle()
    ping = (PING, 0, 0, b"tg-drain")
    assert _written(transport) == [_goaway(NO_LAST), ping]
    _feed(connection, H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 1, BLOCK)
          + H2Client.frame(PING, ACK, 0, b"tg-drain")
          + H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 3, BLOCK))
    assert list(opened) == [1]  # 3 came after the PING's answer: refused
    assert _written(transport) == [_goaway(1), (RST_STREAM, 0, 3, struct.pack(
        ">I", http2_frames.REFUSED_STREAM))]
    assert not transport.closed
    _answer(connection, opened[1])
    assert transport.closed


def test_a_client_that_leaves_the_ping_unanswered_gets_the_second_goaway_later() -> None:
    connection, transport, opened = _connection()
    connection.close_when_idle()
    _feed(connection, H2Client.frame(HEADERS, END_HEADERS | END_STREAM, 1, BLOCK))
    connection.expire(time.monotonic() + 1.0, 30.0)
    assert [frame[0] for frame in _written(transport)] == [GOAWAY, PING]  # the first only
    connection.expire(time.monotonic() + http2_base.DRAIN_PING_S + 0.1, 30.0)
    assert _written(transport) == [_goaway(1)]
    _answer(connection, opened[1])
    assert transport.closed


def test_an_idle_connection_closes_with_the_second_goaway() -> None:
    connection, transport, _ = _connection()
    connection.close_when_idle()
    connection.close_when_idle()  # (once: shutdown may come after a retirement)
    assert [frame[0] for frame in _written(transport)] == [GOAWAY, PING]
    _feed(connection, H2Client.frame(PING, ACK, 0, b"tg-drain"))
    assert _written(transport) == [_goaway(0)] and transport.closed
