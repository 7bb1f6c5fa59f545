"""Every frame but DATA that an HTTP/2 client sends (network/http2_base.py): header blocks
that open streams (each stream's turn share, the concurrent limit, streams wasted),
SETTINGS, PING and its answers, WINDOW_UPDATE, RST_STREAM, PRIORITY, GOAWAY and frames of
unknown types, each within the bounds that keep one client from flooding the loop."""

from __future__ import annotations

import math
import struct
import time

from tensorgate.network.http2_base import (ALIVE_PING, DRAIN_PING, FIRST_STREAMS, FRAMES_PER_TURN,
                                           IDLE_FRAME_COUNTS, MAX_STREAMS, NEW_STREAM, Http2Stream)
from tensorgate.network.http2_frames import (ACK, CONTINUATION, DEFAULT_FRAME, ENABLE_PUSH,
                                             END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM,
                                             FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY, HEAD,
                                             HEADERS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE,
                                             MAX_WINDOW, PADDED, PING, PRIORITY, PRIORITY_FLAG,
                                             PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM,
                                             RST_STREAM, SETTINGS, WINDOW_UPDATE, Http2Error, frame)
from tensorgate.network.http2_send import Http2Sender
from tensorgate.network.keepalive import TOO_MANY_PINGS

__all__ = ["Http2Control"]

# Answers to a client's PINGs and SETTINGS written while the transport's buffer is over its
# high-water mark (the client is not reading): past this many the client is told
# ENHANCE_YOUR_CALM and closed. Without it a client that sent PINGs and read nothing grew
# the server by the answers without bound (HTTP/2's "ping flood", CVE-2019-9512; nghttp2
# allows 1,000 such answers queued, as here).
_UNREAD_ACKS = 1000


def _frames_a_new_stream(earned: int) -> int:
    """The frames opening a stream counts beyond its HEADERS, on a connection that has
    `earned` streams (see FIRST_STREAMS)."""
    return max(NEW_STREAM, FRAMES_PER_TURN // (FIRST_STREAMS + earned) - 1)


class Http2Control(Http2Sender):
    """A connection's control frames in."""

    def _control(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if kind == HEADERS:
            self._data_flowed = True
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if stream_id == 0 or stream_id != self._blocks.stream_id:
                raise Http2Error(PROTOCOL_ERROR, "CONTINUATION without a header block to "
                                                 "continue")
            self._blocks.add(payload)
            if flags & END_HEADERS:
                self._block_done()
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            # a turn's share as the frames that carry nothing (not counted towards their
            # bound: a client reading a long stream sends them for as long as it reads)
            self._turn_frames += IDLE_FRAME_COUNTS - 1
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise Http2Error(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR,
                                 "a PING must be 8 bytes on stream 0")
            if not flags & ACK:
                self._turn_frames += IDLE_FRAME_COUNTS - 1  # (an answer each: a turn's share)
                self._acknowledge(frame(PING, ACK, 0, 8) + bytes(payload), "PING")
                self._client_ping()  # (answered first, the one too many too, as gRPC's are)
            elif payload == DRAIN_PING and self._draining_since < math.inf:
                self._last_goaway()  # every stream opened before the first GOAWAY has come
            elif payload == ALIVE_PING:
                self._alive_ping_at = math.inf
        elif kind == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise Http2Error(PROTOCOL_ERROR, "a RST_STREAM must be 4 bytes on a stream")
            self._idle_check(stream_id)
            if stream_id in self.streams:
                self._waste("reset before their answers")
            elif self._earned > 0:  # reset after its answer (or after ours): earns nothing
                self._earned -= 1
            self._drop(stream_id)
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise Http2Error(FRAME_SIZE_ERROR, "a PRIORITY frame must be 5 bytes")
            self._idle_frame("PRIORITY")
        elif kind == GOAWAY:
            self.going_away = True  # the client opens no more streams; ours still finish
            self._close_if_done()
        elif kind == PUSH_PROMISE:
            raise Http2Error(PROTOCOL_ERROR, "clients cannot push")
        elif kind > CONTINUATION:  # unknown frame types are ignored (RFC 9113 §4.1)
            self._idle_frame(f"of unknown type {kind}")

    def _idle_check(self, stream_id: int) -> None:
        if stream_id > self._last_stream:
            raise Http2Error(PROTOCOL_ERROR, f"frame on idle stream {stream_id}")

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise Http2Error(PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & PADDED:
            if end < 1 or payload[0] >= end:
                raise Http2Error(PROTOCOL_ERROR, "HEADERS padding exceeds the frame")
            end -= payload[0]
            start = 1
        if flags & PRIORITY_FLAG:
            start += 5
            if start > end:
                raise Http2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
        self._blocks.begin(stream_id, bool(flags & END_STREAM), payload[start:end])
        if flags & END_HEADERS:
            self._block_done()

    def _block_done(self) -> None:
        """A header block ended: a new stream's request, or a stream's trailers."""
        stream_id, end_stream = self._blocks.stream_id, self._blocks.end_stream
        fields = self._blocks.finish()
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers: gRPC clients send none, but they may
            if stream.remote_closed or not end_stream:
                self._stream_error(stream_id, PROTOCOL_ERROR, "trailers that were not last")
                return
            self._end_of_stream(stream)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            raise Http2Error(PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}, which is "
                                             "even or not new")
        self._last_stream = stream_id
        self._turn_frames += _frames_a_new_stream(self._earned)
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self._reset(stream_id, REFUSED_STREAM)
            self._waste("opened after our GOAWAY" if self.going_away
                        else f"opened beyond the {MAX_STREAMS} it may have at once")
            return
        stream = Http2Stream(stream_id, self._peer_initial, self._last_read)
        stream.remote_closed = end_stream  # so an answer given at once sends no RST_STREAM
        self.streams[stream_id] = stream
        try:
            handler = self._open_stream(self, stream, fields)
            stream.handler = handler
            if end_stream:
                handler.end_received()
        except Exception as error:
            self._failed(stream, error)
            return
        if end_stream:
            self._forget_if_closed(stream)

    def _end_of_stream(self, stream: Http2Stream) -> None:
        stream.remote_closed = True
        if stream.handler is not None:
            try:
                stream.handler.end_received()
            except Exception as error:
                self._failed(stream, error)
                return
        self._forget_if_closed(stream)

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise Http2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if len(payload):
                raise Http2Error(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement carries nothing")
            return
        if len(payload) % 6:
            raise Http2Error(FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
        widened = False
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise Http2Error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over "
                                                         "2^31-1")
                delta, self._peer_initial = value - self._peer_initial, value
                for stream in self.streams.values():
                    stream.send_window += delta
                widened = widened or delta > 0
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise Http2Error(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is out "
                                                     "of range")
                self._peer_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise Http2Error(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH must be 0 or 1")
        if self._settled:  # past the first, a client sends a few: a flood of them is answered
            self._idle_frame("SETTINGS")
        self._settled = True
        self._acknowledge(frame(SETTINGS, ACK, 0, 0), "SETTINGS")
        # at once, not at the end of the read as PINGs' answers: before any DATA sent under
        # its new windows, which grpcio counts only once acknowledged (it failed a call with
        # "frame of size 465708 overflows local window of 0" when the DATA came first)
        self._send_acks()
        if widened:  # what waited on its stream's window may go now
            for stream in list(self.streams.values()):
                if stream.pending and stream.send_window > 0:
                    self._flush(stream)
        self._flush_blocked()

    def _client_ping(self) -> None:
        """The client's PING: one too many too soon (keepalive.PingStrikes) ends the
        connection, as gRPC's servers end it."""
        strikes = self._strikes
        if strikes is None:
            return
        flowed, self._data_flowed = self._data_flowed, False
        calls_open = bool(self.streams)
        if strikes.struck_out(time.monotonic(), calls_open, flowed):
            raise Http2Error(ENHANCE_YOUR_CALM, strikes.describe(calls_open), TOO_MANY_PINGS)

    def _acknowledge(self, frame: bytes, what: str) -> None:
        """Answer a client's PING or SETTINGS, in one write with the others of the same read
        (_send_acks: one write each cost 5 µs, 1,024 of them a turn) unless the caller sends
        them sooner; too many answers it leaves unread: a connection error (_UNREAD_ACKS)."""
        if self._writing_paused:
            self._unread_acks += 1
            if self._unread_acks > _UNREAD_ACKS:
                raise Http2Error(ENHANCE_YOUR_CALM, f"{self._unread_acks} answers to PING and "
                                                    f"SETTINGS frames left unread (the last "
                                                    f"to a {what})")
        self._acks.append(frame)

    def _send_acks(self) -> None:
        self._write(self._acks)  # (joined into one bytes, or its one frame as it is)
        self._acks.clear()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(FRAME_SIZE_ERROR, "a WINDOW_UPDATE must be 4 bytes")
        increment = HEAD.unpack_from(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise Http2Error(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._peer_window += increment
            if self._peer_window > MAX_WINDOW:
                raise Http2Error(FLOW_CONTROL_ERROR, "the connection window passed 2^31-1")
            self._flush_blocked()
            return
        self._idle_check(stream_id)
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream we have closed: allowed, ignored
        if increment == 0:
            self._stream_error(stream_id, PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, "a window past 2^31-1")
            return
        self._flush(stream)
