"""A client's PINGs, SETTINGS and WINDOW_UPDATEs are bounded: PINGs too often with no data
between them end the connection as gRPC's servers end it (GOAWAY ENHANCE_YOUR_CALM
"too_many_pings", network/keepalive.py), answers a client leaves unread end it past
_UNREAD_ACKS (HTTP/2's ping flood), and each takes a share of a turn of the loop. Driven
through the asyncio protocol methods, as test_http2_streams.py drives them."""

from __future__ import annotations

import asyncio
import struct

from tensorgate.network import http2_frames
from tensorgate.network.keepalive import IDLE_PING_INTERVAL_S, Keepalive, PingStrikes
from tests.e2e.h2_client import (END_HEADERS, END_STREAM, HEADERS, PING, SETTINGS,
                                 WINDOW_UPDATE, H2Client)
from tests.network.test_http2_streams import (_answering, _feed, _frames, _goaway,
                                              _ReadingRecorder, _request_block, _turning,
                                              _until_closed)

ACK = 0x1
_TRITONS = Keepalive(7200.0, 20.0)  # Triton's defaults: 300 s between PINGs, 2 strikes


def _ping(number: int) -> bytes:
    return H2Client.frame(PING, 0, 0, number.to_bytes(8, "big"))


async def _parsed(transport: _ReadingRecorder) -> None:
    """Turns of the loop until all that was fed is parsed (an answered PING counts 8 of a
    turn's 1,024 frames: 128 a turn)."""
    for _ in range(100):
        await asyncio.sleep(0)
        if transport.reading or transport.closed:
            return


def _acks(transport: _ReadingRecorder) -> list[int]:
    return [int.from_bytes(payload, "big") for kind, flags, _, payload
            in _frames(bytes(transport.written)) if kind == PING and flags & ACK]


def _too_many_pings(transport: _ReadingRecorder) -> bool:
    goaway = _goaway(transport)
    return (transport.closed
            and int.from_bytes(goaway[4:8], "big") == http2_frames.ENHANCE_YOUR_CALM
            and goaway[8:] == b"too_many_pings")


def test_a_ping_past_two_strikes_ends_the_connection_with_too_many_pings() -> None:
    """The first PING is no strike; the next two, as soon after, are; the fourth is one too
    many: answered, then GOAWAY ENHANCE_YOUR_CALM with the debug data grpcio looks for
    ("too_many_pings": it then doubles its keepalive time), and the connection closed — as
    Triton 2.51 answers the same four (tools/triton_diff.py), in one read or not."""
    async def scenario() -> None:
        connection, transport, _, _ = _turning(True, keepalive=_TRITONS)
        _feed(connection, _ping(1) + _ping(2) + _ping(3))
        assert _acks(transport) == [1, 2, 3] and not transport.closed
        _feed(connection, _ping(4))
        assert _acks(transport) == [1, 2, 3, 4] and _too_many_pings(transport)
        connection, transport, _, _ = _turning(True, keepalive=_TRITONS)
        _feed(connection, _ping(1) + _ping(2) + _ping(3) + _ping(4) + _ping(5))
        assert _acks(transport) == [1, 2, 3, 4] and _too_many_pings(transport)
    asyncio.run(scenario())


def test_data_either_way_between_pings_forgives_the_strikes() -> None:
    """A client that PINGs often beside its calls is never closed: an answer sent, or a
    request's DATA received, starts the count again."""
    async def scenario() -> None:
        connection, transport, _, encoder = _turning(True, keepalive=_TRITONS)
        block = _request_block(encoder)
        for stream_id in range(1, 12, 2):  # two PINGs, then a call answered, six times
            _feed(connection, _ping(stream_id) + _ping(stream_id + 1)
                  + H2Client.frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))
        assert not transport.closed and len(_acks(transport)) == 12
        # a call left open: its request's DATA flows, the server answers nothing yet
        _feed(connection, H2Client.frame(HEADERS, END_HEADERS, 13, block))
        for n in range(6):
            _feed(connection, _ping(100 + 2 * n) + _ping(101 + 2 * n)
                  + H2Client.frame(0, 0, 13, b"more"))
        assert not transport.closed and len(_acks(transport)) == 24
        _feed(connection, _ping(200) + _ping(201) + _ping(202) + _ping(203))
        assert _too_many_pings(transport)
    asyncio.run(scenario())


def test_strikes_count_pings_sooner_than_the_interval_two_hours_while_idle() -> None:
    """PINGs the interval apart are no strikes; with no call open the interval is two
    hours, unless PINGs are permitted without calls; 0 strikes allowed: no bound."""
    strikes = PingStrikes(Keepalive(7200.0, 20.0, min_ping_interval_s=10.0))
    assert not any(strikes.struck_out(t, True, False) for t in (0.0, 10.0, 20.0, 30.0))
    assert strikes.strikes == 0
    assert [strikes.struck_out(t, True, False) for t in (35.0, 40.0, 45.0)] == [False, False,
                                                                                True]
    idle = PingStrikes(Keepalive(7200.0, 20.0, min_ping_interval_s=10.0))
    times = [n * IDLE_PING_INTERVAL_S / 2 for n in range(4)]  # an hour apart
    assert [idle.struck_out(t, False, False) for t in times] == [False, False, False, True]
    permitted = PingStrikes(Keepalive(7200.0, 20.0, idle=True, min_ping_interval_s=10.0))
    assert not any(permitted.struck_out(t, False, False) for t in times)
    unbounded = PingStrikes(Keepalive(7200.0, 20.0, max_ping_strikes=0))
    assert not any(unbounded.struck_out(n * 0.001, True, False) for n in range(1000))
    assert unbounded.strikes == 999
    assert "too_many_pings: 999 PINGs" in unbounded.describe(True)


def test_without_keepalive_settings_pings_are_answered_without_bound() -> None:
    async def scenario() -> None:
        connection, transport, _, _ = _turning(True)
        _feed(connection, b"".join(_ping(n) for n in range(500)))
        assert _acks(transport) == list(range(128))  # a turn's share
        await _parsed(transport)
        assert _acks(transport) == list(range(500)) and not transport.closed
    asyncio.run(scenario())


def test_answers_left_unread_past_1000_end_the_connection() -> None:
    """With the transport's buffer over its mark (the client reads nothing), a PING's or a
    SETTINGS' answer is counted; past 1,000 the connection ends: before, a client that
    sent PINGs and read nothing grew the server without bound. The transport draining
    (resume_writing) starts the count again."""
    async def scenario() -> None:
        connection, transport, _, _ = _turning(True)
        connection.pause_writing()
        _feed(connection, b"".join(_ping(n) for n in range(1000)))
        await _parsed(transport)
        connection.resume_writing()  # it read them after all
        connection.pause_writing()
        _feed(connection, b"".join(_ping(n) for n in range(999))
              + H2Client.frame(SETTINGS, 0, 0, b""))
        await _parsed(transport)
        assert not transport.closed and len(_acks(transport)) == 1999
        _feed(connection, _ping(1))
        await _parsed(transport)
        goaway = _goaway(transport)
        assert transport.closed and int.from_bytes(goaway[4:8], "big") == \
            http2_frames.ENHANCE_YOUR_CALM
        assert b"1001 answers to PING and SETTINGS frames left unread (the last to a PING)" \
            in goaway[8:]
    asyncio.run(scenario())


def test_settings_past_the_first_count_as_frames_that_carry_nothing() -> None:
    """A client sends SETTINGS a few times; a flood of them (each answered) ends past the
    10,000 frames that carry nothing, as PRIORITY frames do."""
    async def scenario() -> None:
        connection, transport, _, _ = _turning(True)
        _feed(connection, H2Client.frame(SETTINGS, 0, 0, b"") * 10_001)
        await _until_closed(transport, 200)  # (128 a turn)
        goaway = _goaway(transport)
        assert transport.closed and int.from_bytes(goaway[4:8], "big") == \
            http2_frames.ENHANCE_YOUR_CALM
        assert b"10001 frames that carry nothing (the last SETTINGS)" in goaway[8:]
    asyncio.run(scenario())


def test_settings_that_widen_the_window_send_what_waited() -> None:
    """SETTINGS_INITIAL_WINDOW_SIZE raised while an answer waits on its stream's window
    widens that window (RFC 9113 §6.9.2): the rest goes at once. Before, it waited for the
    client's next WINDOW_UPDATE on the stream (grpcio sends them as it reads, so no call of
    its stalled)."""
    connection, transport, _ = _answering(200_000)
    _feed(connection, H2Client.frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    assert connection.unsent_bytes == 200_000 - 65_535  # the stream's window holds it
    before = len(transport.written)
    _feed(connection, H2Client.frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)))
    assert connection.unsent_bytes == 0
    # the SETTINGS' answer first: grpcio counts a window it announced only once it is
    # acknowledged, and failed the call ("frame of size 465708 overflows local window of
    # 0") when DATA under it came before the answer (CI, a first version of this change)
    after = _frames(bytes(transport.written[before:]))
    assert after[0][:2] == (SETTINGS, ACK)
    assert {kind for kind, *_ in after[1:]} == {0, HEADERS}  # the rest of it, its trailers


def test_window_updates_take_a_turns_share_as_frames_that_carry_nothing() -> None:
    """A client may send WINDOW_UPDATEs for as long as it reads, so they are never closed
    for; but each counts 8 of a turn's 1,024 frames: a flood of them held health checks
    beside it to 6,434 in 5 s (82,461 alone), 40,736 now (bench/flood_bench.py window)."""
    async def scenario() -> None:
        connection, transport, _, _ = _turning()
        window = connection._peer_window
        _feed(connection, H2Client.frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 1000)
        assert connection._peer_window - window <= 128 and not transport.reading
        await _parsed(transport)
        assert connection._peer_window - window == 1000 and not transport.closed
    asyncio.run(scenario())
