"""HTTP/2 server connections (RFC 9113) on the event loop, for the gRPC front end.

Why our own and not grpcio's server: grpcio's asyncio server hands every call between its
event-engine threads, its poller thread and our loop. Measured with perf and h2load on the
2-core machine (602 KB identity calls, one connection), it cost 826 µs of server CPU per call
(342 µs of it in the kernel, mostly thread switches) against 300 µs for the same call over
our HTTP/1.1 front end. Here frames are parsed on the loop as they arrive and a response is
handed to the transport in one call, as frame headers between views of the tensor bytes.

Scope is what a gRPC server needs: no server push, no priorities (PRIORITY is read and
ignored), no h2c upgrade (gRPC clients speak HTTP/2 with prior knowledge). Header blocks are
decoded with `hpack` (http2_headers.py); the few headers we send are encoded as literals that
never touch the peer's table (http2_frames.py, the wire's vocabulary). Flow control is
honoured both ways: the peer's windows bound what we send, and our windows are replenished as
DATA is consumed.

The layer above sees `Http2Stream`s: its `open_stream` callback gets each new stream's
headers and returns the stream's `StreamHandler`, DATA goes to that handler as it arrives
(or is read straight into the buffer it offers), and `Http2Connection.respond` /
`respond_headers` answer it — or, for a response of many messages, `begin_response`, `send`
as each is ready, and `send` with the trailers. `pause_reading` holds back a stream's
window (backpressure on a client that sends faster than it is answered); `drained` tells
the handler when what it sent has all gone to the transport.

The connection's parts: http2_base.py (limits, state, streams), http2_send.py (responses),
http2_control.py (control frames), http2_read.py (reading, DATA); here the asyncio protocol
and the connection's lifetime.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time

from tensorgate.network.flooders import address_key
from tensorgate.network.http2_base import (ALIVE_PING, CONNECTION_WINDOW, DRAIN_PING, DRAIN_PING_S,
                                           FRAME_SIZE, FRAMES_PER_TURN, IDLE_BUFFER, MAX_STREAMS,
                                           SHRINK_IDLE_S, STREAM_WINDOW, FloodWatch, Http2Stream,
                                           StreamHandler)
from tensorgate.network.http2_frames import (DEFAULT_WINDOW, ENABLE_PUSH, GOAWAY, HEAD,
                                             INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS,
                                             MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, MAX_STREAM_ID,
                                             NO_ERROR, PING, SETTINGS, WINDOW_UPDATE, Fields,
                                             Http2Error, StreamError, encode_headers, frame,
                                             refusal_frames)
from tensorgate.network.http2_headers import MAX_HEADER_BLOCK
from tensorgate.network.http2_read import Http2Reader
from tensorgate.network.keepalive import Keepalive
from tensorgate.network.socket_send import SocketSender, copies_what_it_keeps

__all__ = ["Fields", "FloodWatch", "Http2Connection", "Http2Error", "Http2Stream",
           "StreamError", "StreamHandler", "encode_headers", "refusal_frames"]

log = logging.getLogger("tensorgate.http2")


class Http2Connection(Http2Reader, asyncio.BufferedProtocol):
    """One client connection. `open_stream(connection, stream, headers)` is called for each
    new request's header block and returns the stream's handler."""

    # -- asyncio protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.tls = transport.get_extra_info("ssl_object") is not None
        self._sender = SocketSender.for_transport(transport)  # type: ignore[arg-type]
        self.joins_writes = self._sender is None and copies_what_it_keeps(transport)
        if self._watch is not None:
            self.address = address_key(transport.get_extra_info("peername"))
            if self._frames_per_turn == FRAMES_PER_TURN:  # (driven by hand: no turns)
                self._probation = self._watch.on_probation(self.address)
                if self._probation is not None:
                    self._frames_per_turn = self._probation_share()
        settings = b"".join(struct.pack(">HI", key, value) for key, value in (
            (ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, MAX_STREAMS),
            (MAX_FRAME_SIZE, FRAME_SIZE), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK)))
        self._write([frame(SETTINGS, 0, 0, len(settings)) + settings
                     + frame(WINDOW_UPDATE, 0, 0, 4)
                     + HEAD.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._probation is not None:
            self._probation.leave()
            self._probation = None
        streams, self.streams = self.streams, {}
        self._blocked.clear()
        for stream in streams.values():
            self._let_go(stream)
            self._cancel(stream)
            stream.handler = None
        self._on_close(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._unread_acks = 0
        for stream in list(self.streams.values()):
            if stream.pending or stream.trailers is not None or stream.head:
                self._flush(stream)

    # -- its lifetime, as the front end drives it: expiry, keepalive, retirement ----------

    def expire(self, now: float, read_timeout_s: float) -> None:
        """Called about once a second: a connection stalled inside its preface, a frame or a
        header block is closed; a stream whose request stopped arriving is told so (its
        handler answers it). A stream whose window we hold back is not waiting on the
        client, and an idle connection between calls may stay open for ever (gRPC's)."""
        if self.transport is None:
            return
        if now >= self._abort_at:  # retired, and its grace is over: what is open is cut off
            self._close()
            return
        if now - self._draining_since >= DRAIN_PING_S:  # our PING was left unanswered
            self._last_goaway()
        quiet = now - self._last_read
        if (quiet > SHRINK_IDLE_S and len(self._buffer) > IDLE_BUFFER and not self.streams
                and self._start == self._end and not self._data_left):
            self._buffer = bytearray(IDLE_BUFFER)  # nothing unparsed: nothing to move
            self._view = memoryview(self._buffer)
            self._start = self._end = 0
        if quiet > read_timeout_s and (not self._preface or self._end > self._start
                                       or self._data_left or self._blocks.stream_id):
            self._go_away(NO_ERROR, f"no bytes for {quiet:.1f} s inside a frame")
            self._close()
            return
        if self._block_took(now) > read_timeout_s:  # one CONTINUATION just within each
            self._go_away(NO_ERROR, f"a header block took more than {read_timeout_s:g} s to "
                                    f"arrive (--read-timeout-s)")
            self._close()
            return
        for stream in list(self.streams.values()):
            handler = stream.handler
            if handler is None or stream.reading_paused or stream.remote_closed:
                continue
            inside = self._data_left and self._data_stream == stream.id  # a frame arriving
            quiet = now - (self._last_read if inside else stream.last_data)
            try:
                if quiet > read_timeout_s and handler.waiting():
                    handler.timed_out(quiet, read_timeout_s)
            except Exception as error:
                self._failed(stream, error)

    def _block_took(self, now: float) -> float:
        """How long the header block arriving has been seen arriving (0: none arriving):
        counted from the first `expire` that saw it, so a second short at most."""
        if not self._blocks.stream_id:
            return 0.0
        begun, seen = self._block_seen
        if begun != self._blocks.begun:
            self._block_seen = (self._blocks.begun, now)
            return 0.0
        return now - seen

    def keep_alive(self, now: float, settings: Keepalive) -> bool:
        """Called about once a second (GrpcFrontEnd.expire): a PING to a connection quiet
        for `settings.time_s`, and the close of one whose PING went unanswered for
        `settings.timeout_s` (then True: its calls are cancelled as a client's leaving
        cancels them)."""
        if self.transport is None:
            return False
        if self._alive_ping_at < math.inf:
            if now - self._alive_ping_at < settings.timeout_s:
                return False
            log.info("gRPC connection closed: no answer to a keepalive PING in %.1f s "
                     "(--grpc-keepalive-timeout), %d calls open", now - self._alive_ping_at,
                     len(self.streams))
            self.transport.abort()  # the peer reads nothing: what we would write is lost
            return True
        if now - self._last_read < settings.time_s or not (self.streams or settings.idle):
            return False
        if settings.max_pings and self._pings_without_data >= settings.max_pings:
            return False
        self._alive_ping_at = now
        self._pings_without_data += 1
        self._write([frame(PING, 0, 0, 8) + ALIVE_PING])
        return False

    def retire(self, now: float, grace_s: float | None) -> bool:
        """The connection reached its maximum age: closed as close_when_idle closes it, and
        once `grace_s` has passed (None: no bound) with whatever calls are still open. The
        client opens its next calls on a new connection (a load balancer's chance to send
        them elsewhere); calls it opened before it read the first GOAWAY are served. Whether
        this began its close (not: one had begun, shutdown's or the client's); inside its
        TLS handshake (no GOAWAY can go yet) nothing is done, and it is retired later."""
        if self.transport is None:
            return False
        self.retire_at = math.inf
        if grace_s is not None:
            self._abort_at = min(self._abort_at, now + grace_s)
        began = not self.going_away and self._draining_since == math.inf
        self.close_when_idle()
        return began

    def close_when_idle(self) -> None:
        """Graceful close: no new streams, and closed once the open ones finish: the first
        GOAWAY now, with a PING, the second when the PING is answered (see DRAIN_PING)."""
        if self.going_away or self._draining_since < math.inf:
            return
        if self.transport is None:  # inside its TLS handshake: it will take no streams
            self.going_away = True
            return
        self._draining_since = time.monotonic()
        self._write([frame(GOAWAY, 0, 0, 8) + HEAD.pack(MAX_STREAM_ID)
                     + HEAD.pack(NO_ERROR) + frame(PING, 0, 0, 8) + DRAIN_PING])

    def abort(self) -> None:
        self._close()
