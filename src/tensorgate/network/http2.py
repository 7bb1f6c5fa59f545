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
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tensorgate.network import UNREAD_ANSWER_S
from tensorgate.network.http2_frames import (
    ACK, CONTINUATION, DATA, DEFAULT_FRAME, DEFAULT_WINDOW, ENABLE_PUSH, END_HEADERS,
    END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY, HEAD, HEADERS,
    INITIAL_WINDOW_SIZE, INTERNAL_ERROR, MAX_CONCURRENT_STREAMS, MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE, MAX_STREAM_ID, MAX_WINDOW, NO_ERROR, PADDED, PING, PREFACE, PRIORITY,
    PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM, RST_STREAM, SETTINGS,
    STREAM_CLOSED, WINDOW_UPDATE, Fields, Http2Error, StreamError, encode_headers, frame,
    refusal_frames)
from tensorgate.network.http2_headers import MAX_HEADER_BLOCK, HeaderBlocks
from tensorgate.network.in_order import InOrder
from tensorgate.network.keepalive import TOO_MANY_PINGS, Keepalive, PingStrikes
from tensorgate.network.socket_send import SocketSender, copies_what_it_keeps
from tensorgate.tensor.copies import record_copy

__all__ = ["Fields", "Http2Connection", "Http2Error", "Http2Stream", "StreamError",
           "StreamHandler", "encode_headers", "refusal_frames"]

log = logging.getLogger("tensorgate.http2")

# DATA frames up to 1 MiB: grpcio clients then send a 602 KB tensor in one frame, whose
# payload is read straight into the message's buffer (see get_buffer). Other frames are
# never that large: anything but DATA over _MAX_CONTROL_FRAME is refused.
_FRAME_SIZE = 1 << 20
_MAX_CONTROL_FRAME = 64 << 10
_DIRECT_READ = 4096                # read a DATA payload into place when this much is left
_RUN_FRAME = 1024                  # whole DATA frames this large go straight into place
# Between frames, a peer that sends large DATA frames gets reads this small, so that little
# of the next payload arrives here (copied) before its frame header is parsed.
_SMALL_READ = 4096
_WRITE_ALONE = 32 << 10            # a response part this large is never joined to others
# DATA written to the transport at a time: what the socket cannot take is copied into the
# transport's buffer (outside the pool), and the rest waits in its pooled views until the
# transport has drained (resume_writing). Without it a client that grants large windows and
# does not read had every answer copied there whole.
_SEND_SLICE = 1 << 20
_STREAM_WINDOW = 16 << 20          # what each stream may send before we replenish
_CONNECTION_WINDOW = 64 << 20      # and all streams together
_MAX_STREAMS = 128                 # concurrent streams per connection
# Frames one connection may have parsed in one turn of the event loop, a new stream
# counting _NEW_STREAM more (its header block decoded, its call started: 128 streams a turn
# at most, its concurrent limit); then it is read no further until the next turn. A client
# that resets each stream as it opens it (HTTP/2 "rapid reset"), or opens more than it may
# at once, is never held back by the concurrent limit, nor is one sending frames that ask
# for no answer (PRIORITY, unknown types, empty DATA); and uvloop reads a busy socket up to
# 32 times a turn: every other connection waited for about 60,000 of such streams (a health
# check took 5.3 s), or 0.5-1 s for such frames (bench/RESULTS.md). The next turn is
# scheduled once _TURN_CHECK have come since the last: not a callback a turn for every
# connection.
_FRAMES_PER_TURN = 1024
_NEW_STREAM = 7
_TURN_CHECK = 64
# A connection earns its streams a turn: it may open _FIRST_STREAMS a turn at first, and one
# more for each of its streams answered and not reset by the client afterwards, up to
# _FRAMES_PER_TURN // (1 + _NEW_STREAM) (a new stream counting more frames until then). A
# client that resets every stream as it opens it earns nothing, whether its answer was
# quicker than the reset (a third of ModelMetadata calls) or not: connecting again for each
# burst of them, it cost every other connection 6-8 ms a turn at 128 streams
# (bench/flood_bench.py, reset-again). gRPC clients reset no stream that has its answer;
# one whose calls are answered is at the full rate after its first 120.
_FIRST_STREAMS = 8
# Streams a connection's client may waste — reset before their answer, or opened beyond
# the concurrent limit it was told — before it is told ENHANCE_YOUR_CALM and closed, once
# they also outnumber the streams it let finish (a client whose calls time out now and
# then is not closed; one that wastes its streams is, and must connect again).
_WASTED_STREAMS = 10 * _MAX_STREAMS
# Frames that carry nothing — PRIORITY (not acted on), unknown types, empty DATA that does
# not end its stream — a client may send beyond 64 a finished stream before it is told
# ENHANCE_YOUR_CALM and closed (gRPC clients send none; a flood of them asks for no answer,
# so nothing else would ever stop it).
_IDLE_FRAMES = 10_000
# And each counts this many of a turn's _FRAMES_PER_TURN (128 a turn): at one, a client that
# connected again whenever closed cost every other connection 0.5-0.7 ms a turn with empty
# DATA frames (bench/flood_bench.py, empty-data-again).
_IDLE_FRAME_COUNTS = 8
# Answers to a client's PINGs and SETTINGS written while the transport's buffer is over its
# high-water mark (the client is not reading): past this many the client is told
# ENHANCE_YOUR_CALM and closed. Without it a client that sent PINGs and read nothing grew
# the server by the answers without bound (HTTP/2's "ping flood", CVE-2019-9512; nghttp2
# allows 1,000 such answers queued, as here).
_UNREAD_ACKS = 1000
# The receive buffer: an idle connection holds _IDLE_BUFFER (at 256 KiB each, 1,000 idle
# gRPC connections held 259 MB: bench/idle_connections_bench.py); a read that fills what it
# was offered grows it to _RECEIVE_BUFFER, which holds many frames per read, and a frame
# larger than the buffer grows it to fit. _SHRINK_IDLE_S after its last read an idle
# connection's buffer goes back to _IDLE_BUFFER.
_IDLE_BUFFER = 16 << 10
_RECEIVE_BUFFER = 256 << 10
_SHRINK_IDLE_S = 2.0
# A graceful close is two GOAWAYs, as gRPC's own servers send them. The first names no last
# stream (2^31-1) and comes with a PING: the client opens no new streams once it reads it,
# and its answer to the PING comes after every stream it opened before, which are served.
# The second, sent then, names the last stream taken (a client that had no stream open
# usually closes the connection before). One GOAWAY naming the last stream at once failed
# the calls racing it: 125-134 of ~27,000 in 15 s with 4 grpcio clients and connections
# retired every 100 ms ("Stream removed (GOAWAY received)": grpcio does not retry them);
# two, 1-2 (the client's own race, which grpc's servers see too: grpc/grpc#31733); two with
# the second only after a second of quiet instead of the PING, 0-1. A client that leaves
# the PING unanswered gets the second after _DRAIN_PING_S.
_DRAIN_PING = b"tg-drain"
_DRAIN_PING_S = 5.0
_ALIVE_PING = b"tg-alive"  # a keepalive PING's payload (Keepalive)


class StreamHandler(Protocol):
    """What the layer above gives each stream (see grpc.py's `_Call`)."""

    def data_received(self, data: memoryview) -> None: ...
    def receive_buffer(self, limit: int) -> memoryview | None: ...
    def data_written(self, nbytes: int, copied: bool = False) -> None: ...
    def end_received(self) -> None: ...
    def cancelled(self) -> None: ...
    def drained(self) -> None: ...
    def waiting(self) -> bool: ...                    # for request bytes the client owes
    def timed_out(self, quiet_s: float, limit_s: float) -> None: ...


class Http2Stream:
    __slots__ = ("id", "handler", "send_window", "receive_window", "unacknowledged",
                 "reading_paused", "head", "pending", "pending_bytes", "trailers",
                 "remote_closed", "local_closed", "last_data")

    def __init__(self, stream_id: int, send_window: int, opened_at: float) -> None:
        self.id = stream_id
        self.handler: StreamHandler | None = None
        self.send_window = send_window
        self.receive_window = _STREAM_WINDOW
        self.unacknowledged = 0          # DATA bytes consumed and not yet given back
        self.reading_paused = False      # give nothing back until resume_reading
        self.head = b""                  # the response's HEADERS frame, sent with what follows
        # response bytes waiting for a window, each with whether it is written alone
        self.pending: deque[tuple[memoryview, bool]] = deque()
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # the trailer block, sent after `pending`
        self.remote_closed = False
        self.local_closed = False
        self.last_data = opened_at  # when its last DATA frame began (or it opened)


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _frames_a_new_stream(earned: int) -> int:
    """The frames opening a stream counts beyond its HEADERS, on a connection that has
    `earned` streams (see _FIRST_STREAMS)."""
    return max(_NEW_STREAM, _FRAMES_PER_TURN // (_FIRST_STREAMS + earned) - 1)


class Http2Connection(asyncio.BufferedProtocol):
    """One client connection. `open_stream(connection, stream, headers)` is called for each
    new request's header block and returns the stream's handler."""

    def __init__(self, open_stream: Callable[[Http2Connection, Http2Stream, Fields],
                                             StreamHandler],
                 on_close: Callable[[Http2Connection], None],
                 flooded: Callable[[str], None] | None = None,
                 keepalive: Keepalive | None = None) -> None:
        """`keepalive`: how often the client may PING (keepalive.PingStrikes); without it,
        as often as it likes."""
        self._open_stream = open_stream
        self._on_close = on_close
        self._flooded = flooded  # told how, when the connection is ended for flooding
        self._strikes = PingStrikes(keepalive) if keepalive is not None else None
        self._data_flowed = False  # data sent or received since the client's last PING
        self._unread_acks = 0  # answers to PINGs and SETTINGS written while writing paused
        self._acks: list[bytes] = []  # those parsed in this read, written once it is parsed
        self._settled = False  # the client's first SETTINGS came
        # the order in which this connection's requests of sequences reach the pipeline
        self.in_order = InOrder()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray(_IDLE_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._need = 9                 # bytes the frame at _start needs in the buffer
        self._offered = 0              # the room the last get_buffer() gave
        self._grow = False             # the last read filled it: grow at the next chance
        self._preface = False
        self._blocks = HeaderBlocks()  # request header blocks, and HPACK's table
        self.streams: dict[int, Http2Stream] = {}
        self._last_stream = 0
        self._peer_window = DEFAULT_WINDOW           # our send window on the connection
        self._peer_initial = DEFAULT_WINDOW          # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self._peer_frame = DEFAULT_FRAME             # the peer's SETTINGS_MAX_FRAME_SIZE
        self._receive_window = _CONNECTION_WINDOW
        self._unacknowledged = 0
        self._blocked: dict[int, Http2Stream] = {}   # streams waiting for the connection window
        self._writing_paused = False
        self.unsent_bytes = 0  # of every stream's answer: waiting in their pooled views
        self._last_sent = 0.0  # time.monotonic() when DATA last went, or began to wait
        # inside a DATA frame whose payload arrives in pieces
        self._data_stream = 0
        self._data_left = 0            # payload bytes still to come (padding included)
        self._data_padding = -1        # -1: the pad length byte has not arrived yet
        self._data_flags = 0
        self._data_length = 0
        self._direct = False           # the last get_buffer() was a stream's own memory
        self._large_frames = False     # the peer's last sizeable DATA frame was over 16 KiB
        self.going_away = False
        self._draining_since = math.inf  # when the first GOAWAY of a graceful close went
        # --grpc-max-connection-age: when the front end retires the connection (GOAWAY), and
        # when calls still open then are cut off with it (its grace)
        self.retire_at = math.inf
        self._abort_at = math.inf
        self._turn_frames = 0          # frames parsed in this turn of the loop (see above)
        # driven by hand, outside a loop (tests), there are no turns to share (nor schedule)
        looped = _in_loop()
        self._frames_per_turn = _FRAMES_PER_TURN if looped else 1 << 62
        self._finished = 0             # streams answered and closed both ways
        self._earned = 0               # finished, less those the client reset after
        self._wasted = 0               # streams refused, or reset by the client, unanswered
        self._idle_frames = 0          # frames that carried nothing (see _IDLE_FRAMES)
        self._turn_held = False        # reading paused until the next turn (_next_turn)
        self._turn_due = not looped    # the next turn is scheduled
        # a connection error was answered (GOAWAY, close): what still arrives is not read, as
        # its header blocks would be decoded against a table the error left unknown
        self._failed_connection = False
        self._last_read = time.monotonic()
        self._alive_ping_at = math.inf  # when our keepalive PING went, while unanswered
        self._pings_without_data = 0     # keepalive PINGs since our last response was sent
        # On a plain socket we send vectored ourselves (network.socket_send): asyncio's
        # transports join a writelines() into one bytes before Python 3.12 (a client's 16
        # KiB frames cost a copy of every answer, h2load identity, 3.11), and uvloop's and
        # 3.12's keep views of pooled answers they could not send. TLS transports (asyncio's
        # from 3.11, uvloop's) send a writelines as it is; one that joins it (one without a
        # socket; asyncio's TLS on 3.10) has a large part written by itself (_write_runs).
        self.joins_writes = True
        self._sender: SocketSender | None = None
        self.tls = False  # over TLS: every byte each way is also counted a `tls` copy

    # -- asyncio protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.tls = transport.get_extra_info("ssl_object") is not None
        self._sender = SocketSender.for_transport(transport)  # type: ignore[arg-type]
        self.joins_writes = self._sender is None and copies_what_it_keeps(transport)
        settings = b"".join(struct.pack(">HI", key, value) for key, value in (
            (ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, _MAX_STREAMS),
            (MAX_FRAME_SIZE, _FRAME_SIZE), (INITIAL_WINDOW_SIZE, _STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK)))
        self._write([frame(SETTINGS, 0, 0, len(settings)) + settings
                     + frame(WINDOW_UPDATE, 0, 0, 4)
                     + HEAD.pack(_CONNECTION_WINDOW - DEFAULT_WINDOW)])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
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

    def get_buffer(self, sizehint: int) -> memoryview:
        self._direct = False
        if self._start == self._end:
            self._start = self._end = 0
            # Everything read so far is parsed. Inside a large DATA payload, the kernel may
            # write the rest of it straight where the stream wants it: no copy from here.
            if self._data_left >= _DIRECT_READ and self._data_padding >= 0:
                target = self._direct_target()
                if target is not None:
                    self._direct = True
                    return target
            if self._grow:
                self._resize(_RECEIVE_BUFFER)
        elif (self._grow or self._start + self._need > len(self._buffer)
              or len(self._buffer) - self._end < len(self._buffer) >> 2):
            # Move the unparsed tail (less than one frame) to the front, into a larger
            # buffer where the traffic or the frame needs one.
            self._resize(max(len(self._buffer), self._need,
                             _RECEIVE_BUFFER if self._grow else 0))
        if self._large_frames:
            room = self._view[self._end:self._end + _SMALL_READ]
        else:
            room = self._view[self._end:]
        self._offered = len(room)
        return room

    def _resize(self, size: int) -> None:
        """Move the unparsed bytes to the front of a buffer of `size` bytes (this one, or a
        new one when the size differs)."""
        count = self._end - self._start
        if size == len(self._buffer):
            self._view[:count] = self._view[self._start:self._end]
        else:
            buffer = bytearray(size)
            view = memoryview(buffer)
            view[:count] = self._view[self._start:self._end]
            self._buffer, self._view = buffer, view
        self._start, self._end = 0, count
        self._grow = False

    def _direct_target(self) -> memoryview | None:
        stream = self.streams.get(self._data_stream)
        if stream is None or stream.handler is None:
            return None
        try:
            target = stream.handler.receive_buffer(self._data_left - self._data_padding)
        except Exception as error:
            self._failed(stream, error)
            return None
        return target if target is not None and len(target) >= _DIRECT_READ else None

    def buffer_updated(self, nbytes: int) -> None:
        if self._failed_connection:
            return
        self._last_read = time.monotonic()
        if self.tls:  # decrypted into place, after the ssl module copied it once
            record_copy(nbytes, "tls")
        try:
            if self._direct:
                self._direct = False
                stream = self.streams[self._data_stream]
                assert stream.handler is not None
                try:
                    stream.handler.data_written(nbytes)
                except Exception as error:
                    self._failed(stream, error)
                self._data_left -= nbytes
                if self._data_left == 0:
                    self._data_end()
            else:
                self._end += nbytes
                if (nbytes == self._offered and not self._large_frames
                        and len(self._buffer) < _RECEIVE_BUFFER):
                    self._grow = True  # more was waiting: a busy connection
            self._parse()
        except Http2Error as error:
            self._connection_error(error)
            return
        if self._acks:
            self._send_acks()

    def _connection_error(self, error: Http2Error) -> None:
        if error.code == ENHANCE_YOUR_CALM and self._flooded is not None:
            self._flooded(str(error))
        else:
            log.info("HTTP/2 connection error %d: %s", error.code, error)
        self._failed_connection = True
        if self._acks:  # what was answered before it, as if written at once
            self._send_acks()
        self._go_away(error.code, error.debug)
        if self.transport is not None:
            self.transport.close()

    def _next_turn(self) -> None:
        """A new turn of the loop: parse what was held back, then read again."""
        self._turn_frames = 0
        self._turn_due = False
        if not self._turn_held or self._failed_connection:
            return
        self._turn_held = False
        try:
            self._parse()
        except Http2Error as error:
            self._connection_error(error)
            return
        if self._acks:
            self._send_acks()
        if not self._turn_held and self.transport is not None:
            self.transport.resume_reading()

    # -- frames in -------------------------------------------------------------------------

    def _parse(self) -> None:
        view = self._view
        while self.transport is not None:
            if self._turn_frames >= self._frames_per_turn:  # the rest: at the next turn
                if not self._turn_held:
                    self._turn_held = True
                    self.transport.pause_reading()
                return
            if self._data_left:
                if not self._data_piece():
                    self._need = 9  # a DATA payload is taken in pieces
                    return
                continue
            available = self._end - self._start
            if not self._preface:
                if available < len(PREFACE):
                    if PREFACE[:available] != view[self._start:self._end]:
                        raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    self._need = len(PREFACE)
                    return
                if view[self._start:self._start + len(PREFACE)] != PREFACE:
                    raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._start += len(PREFACE)
                self._preface = True
                continue
            if available < 9:
                self._need = 9
                return
            start = self._start
            word = HEAD.unpack_from(view, start)[0]
            length, kind = word >> 8, word & 0xFF
            flags = view[start + 4]
            stream_id = HEAD.unpack_from(view, start + 5)[0] & 0x7FFFFFFF
            if length > _FRAME_SIZE:
                raise Http2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds the "
                                                   f"{_FRAME_SIZE}-byte maximum")
            if length > _MAX_CONTROL_FRAME and kind != DATA:
                raise Http2Error(ENHANCE_YOUR_CALM, f"a frame of type {kind} and {length} "
                                                    f"bytes; only DATA may exceed "
                                                    f"{_MAX_CONTROL_FRAME}")
            if self._blocks.stream_id and kind != CONTINUATION:
                raise Http2Error(PROTOCOL_ERROR, "a header block was interrupted by another "
                                                 "frame")
            self._turn_frames += 1  # (inline: every frame passes here)
            if self._turn_frames >= _TURN_CHECK and not self._turn_due:
                self._turn_due = True  # (a connection held back always has a turn coming)
                asyncio.get_running_loop().call_soon(self._next_turn)
            if kind == DATA:
                self._start = start + 9
                self._data_flowed = True  # (an empty one too: counted an idle frame)
                if (length >= _RUN_FRAME and not flags & PADDED and available >= 9 + length
                        and self._data_run(stream_id, flags, length)):
                    continue
                self._data_begin(stream_id, flags, length)
                continue
            if available < 9 + length:
                self._need = 9 + length
                self._turn_frames -= 1  # counted again when the rest of it has come
                return
            payload = view[start + 9:start + 9 + length]
            self._start = start + 9 + length
            self._control(kind, flags, stream_id, payload)

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
            self._turn_frames += _IDLE_FRAME_COUNTS - 1
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise Http2Error(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR,
                                 "a PING must be 8 bytes on stream 0")
            if not flags & ACK:
                self._turn_frames += _IDLE_FRAME_COUNTS - 1  # (an answer each: a turn's share)
                self._acknowledge(frame(PING, ACK, 0, 8) + bytes(payload), "PING")
                self._client_ping()  # (answered first, the one too many too, as gRPC's are)
            elif payload == _DRAIN_PING and self._draining_since < math.inf:
                self._last_goaway()  # every stream opened before the first GOAWAY has come
            elif payload == _ALIVE_PING:
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
                self._reset(stream_id, PROTOCOL_ERROR)
                return
            self._end_of_stream(stream)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            raise Http2Error(PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}, which is "
                                             "even or not new")
        self._last_stream = stream_id
        self._turn_frames += _frames_a_new_stream(self._earned)
        if self.going_away or len(self.streams) >= _MAX_STREAMS:
            self._reset(stream_id, REFUSED_STREAM)
            self._waste("opened after our GOAWAY" if self.going_away
                        else f"opened beyond the {_MAX_STREAMS} it may have at once")
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

    def _data_begin(self, stream_id: int, flags: int, length: int) -> None:
        if stream_id == 0:
            raise Http2Error(PROTOCOL_ERROR, "DATA on stream 0")
        self._receive_window -= length
        if self._receive_window < 0:
            raise Http2Error(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self._data_stream, self._data_flags, self._data_length = stream_id, flags, length
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.last_data = self._last_read
        if length >= _SMALL_READ:
            self._large_frames = length > DEFAULT_FRAME
        self._data_left = length
        self._data_padding = -1 if flags & PADDED else 0
        if stream is None:
            self._idle_check(stream_id)
        elif stream.remote_closed:
            self._reset(stream_id, STREAM_CLOSED)
        else:
            stream.receive_window -= length
            if stream.receive_window < 0:
                self._reset(stream_id, FLOW_CONTROL_ERROR)
        if length == 0:
            if not flags & END_STREAM:
                self._idle_frame("empty DATA")
            self._data_end()

    def _data_run(self, stream_id: int, flags: int, length: int) -> bool:
        """Whole DATA frames of one stream, one after another in the buffer (16 KiB frames,
        as h2load and peers that keep HTTP/2's default send them), copied straight into the
        message the stream's handler is reading, with the windows and the handler told once
        for the run.
        False, with nothing consumed, when the first frame cannot go this way (the general
        path then takes it, errors included). Each frame's checks are the general path's:
        a frame that would need one of its errors ends the run before it."""
        stream = self.streams.get(stream_id)
        if (stream is None or stream.handler is None or stream.remote_closed
                or stream.receive_window < length or self._receive_window < length):
            return False
        handler = stream.handler
        try:
            target = handler.receive_buffer(MAX_WINDOW)
        except Exception as error:
            self._failed(stream, error)
            return False
        if target is None or len(target) < length:
            return False
        view, pos, end = self._view, self._start, self._end
        room = min(len(target), stream.receive_window, self._receive_window)
        copied = 0
        while True:  # `length` and `flags`: the frame being taken
            target[copied:copied + length] = view[pos:pos + length]
            copied += length
            pos += length
            if flags & END_STREAM or end - pos < 9:
                break
            word = HEAD.unpack_from(view, pos)[0]  # the next frame: taken too if it can be
            following, following_flags = word >> 8, view[pos + 4]
            if (word & 0xFF != DATA or following_flags & PADDED or not following
                    or following > _FRAME_SIZE
                    or following > min(end - pos - 9, room - copied)
                    or HEAD.unpack_from(view, pos + 5)[0] & 0x7FFFFFFF != stream_id):
                break
            pos += 9
            length, flags = following, following_flags
        self._start = pos
        self._receive_window -= copied
        stream.receive_window -= copied
        stream.last_data = self._last_read
        if length >= _SMALL_READ:
            self._large_frames = length > DEFAULT_FRAME
        self._data_stream, self._data_flags, self._data_length = stream_id, flags, copied
        try:
            handler.data_written(copied, copied=True)
        except Exception as error:
            self._failed(stream, error)
        self._data_end()
        return True

    def _data_piece(self) -> bool:
        """Consume what has arrived of the current DATA payload; False when it needs more."""
        available = self._end - self._start
        if not available:
            return False
        if self._data_padding < 0:
            self._data_padding = self._view[self._start]
            self._start += 1
            self._data_left -= 1
            if self._data_padding > self._data_left:
                raise Http2Error(PROTOCOL_ERROR, "DATA padding exceeds the frame")
            available -= 1
        content_left = self._data_left - self._data_padding
        take = min(available, self._data_left)
        content = min(take, content_left)
        stream = self.streams.get(self._data_stream)
        if content > 0 and stream is not None and stream.handler is not None:
            try:
                stream.handler.data_received(self._view[self._start:self._start + content])
            except Exception as error:
                self._failed(stream, error)
        self._start += take
        self._data_left -= take
        if self._data_left == 0:
            self._data_end()
        return True

    def _data_end(self) -> None:
        length = self._data_length
        self._unacknowledged += length
        updates = []
        if self._unacknowledged >= _CONNECTION_WINDOW // 4:
            updates.append(frame(WINDOW_UPDATE, 0, 0, 4) + HEAD.pack(self._unacknowledged))
            self._receive_window += self._unacknowledged
            self._unacknowledged = 0
        stream = self.streams.get(self._data_stream)
        if stream is not None and not stream.remote_closed:
            if self._data_flags & END_STREAM:
                self._end_of_stream(stream)
            else:
                stream.unacknowledged += length
                if stream.unacknowledged >= _STREAM_WINDOW // 4 and not stream.reading_paused:
                    updates.append(self._stream_update(stream))
        if updates:
            self._write(updates)

    @staticmethod
    def _stream_update(stream: Http2Stream) -> bytes:
        """A WINDOW_UPDATE giving back what `stream`'s consumed DATA used of its window."""
        update = frame(WINDOW_UPDATE, 0, stream.id, 4) + HEAD.pack(stream.unacknowledged)
        stream.receive_window += stream.unacknowledged
        stream.unacknowledged = 0
        return update

    def pause_reading(self, stream: Http2Stream) -> None:
        """Give `stream` no more window: the client may send what its window still allows
        (at most _STREAM_WINDOW bytes), then waits. Other streams are not affected."""
        stream.reading_paused = True

    def resume_reading(self, stream: Http2Stream) -> None:
        stream.reading_paused = False
        if stream.unacknowledged and not stream.remote_closed \
                and self.streams.get(stream.id) is stream:
            self._write([self._stream_update(stream)])

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
            self._reset(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._reset(stream_id, FLOW_CONTROL_ERROR)
            return
        self._flush(stream)

    # -- frames out ------------------------------------------------------------------------

    def respond(self, stream: Http2Stream, headers: bytes, body: Sequence[Any],
                trailers: bytes) -> None:
        """Send a response: `headers` (an encoded block), `body` (buffers, sent as DATA
        frames between which they are never joined where the transport can send vectored;
        see `joined_bytes`) and `trailers` (an encoded block), in one write where the
        windows allow."""
        self.begin_response(stream, headers)
        self.send(stream, body, trailers)

    def begin_response(self, stream: Http2Stream, headers: bytes) -> None:
        """Start a response whose body follows in `send` calls; its header block goes out
        with the first of them."""
        if self.streams.get(stream.id) is stream and not stream.local_closed:
            stream.head = frame(HEADERS, END_HEADERS, stream.id, len(headers)) + headers

    def send(self, stream: Http2Stream, body: Sequence[Any],
             trailers: bytes | None = None) -> None:
        """More of a begun response's body, and with `trailers` its end."""
        if self.streams.get(stream.id) is not stream or stream.local_closed:
            return  # reset meanwhile
        if not self.unsent_bytes:
            self._last_sent = time.monotonic()  # a stall is timed from when answers wait
        for part in body:
            view = memoryview(part).cast("B")
            if len(view):
                stream.pending.append((view, self._alone(len(view))))
                stream.pending_bytes += len(view)
                self.unsent_bytes += len(view)
        if trailers is not None:
            stream.trailers = trailers
        self._flush(stream)

    def _alone(self, size: int) -> bool:
        """Whether a response part of `size` bytes is written by itself (never joined)."""
        return size >= _WRITE_ALONE and self._peer_frame >= _WRITE_ALONE

    def joined_bytes(self, sizes: Sequence[int]) -> int:
        """How many of these response parts' bytes `respond` will copy now: on a transport
        that joins its writes (asyncio before 3.12), all but the large parts, and all when
        the peer's frames are too small to write a part alone (h2load's 16 KiB)."""
        if not self.joins_writes:
            return 0
        return sum(size for size in sizes if not self._alone(size))

    def respond_headers(self, stream: Http2Stream, headers: bytes) -> None:
        """A response that is one header block (gRPC's trailers-only errors, HTTP errors)."""
        if self.streams.get(stream.id) is not stream or stream.local_closed:
            return
        self._write([frame(HEADERS, END_HEADERS | END_STREAM, stream.id, len(headers))
                     + headers])
        self._pings_without_data = 0
        self._data_flowed = True
        self._local_end(stream)

    def _flush(self, stream: Http2Stream) -> None:
        """Send what the windows allow of `stream`'s response, after its headers if they
        have not gone yet, in one write where the transport can, _SEND_SLICE of DATA at a
        time while the transport takes them."""
        had_pending = bool(stream.pending)
        while self._flush_slice(stream):
            pass
        if (had_pending and not stream.pending and stream.handler is not None
                and stream.id in self.streams):
            try:
                stream.handler.drained()
            except Exception as error:
                self._failed(stream, error)

    def _flush_slice(self, stream: Http2Stream) -> bool:
        """Write up to _SEND_SLICE of `stream`'s DATA (and its trailers once all is sent);
        whether more could go at once (the slice was full and the transport not paused)."""
        if self.transport is None or self._writing_paused:
            return False
        out: list[tuple[Any, bool]] = []
        if stream.head:
            out.append((stream.head, False))
            stream.head = b""
        frame_limit = self._peer_frame
        total = min(stream.pending_bytes, stream.send_window, self._peer_window, _SEND_SLICE)
        slice_full = total == _SEND_SLICE
        if total > 0:  # DATA frames of frame_limit bytes (one header for all), then the rest
            self._last_sent = time.monotonic()
            stream.send_window -= total
            self._peer_window -= total
            stream.pending_bytes -= total
            self.unsent_bytes -= total
            pending = stream.pending
            full = frame(DATA, 0, stream.id, frame_limit) if total >= frame_limit else b""
            while total:
                size = frame_limit if total >= frame_limit else total
                total -= size
                out.append((full if size == frame_limit else frame(DATA, 0, stream.id, size),
                            False))
                while size:
                    piece, alone = pending[0]
                    if len(piece) <= size:
                        out.append((piece, alone))
                        size -= len(piece)
                        pending.popleft()
                    else:
                        out.append((piece[:size], alone))
                        pending[0] = (piece[size:], alone)
                        size = 0
        done = not stream.pending and stream.trailers is not None
        if done:
            assert stream.trailers is not None
            out.append((frame(HEADERS, END_HEADERS | END_STREAM, stream.id,
                               len(stream.trailers)) + stream.trailers, False))
            stream.trailers = None
            self._blocked.pop(stream.id, None)
        elif stream.pending and self._peer_window <= 0:
            self._blocked[stream.id] = stream
        if out:
            self._write_parts(out)
        if done:
            self._local_end(stream)
            return False
        return slice_full and bool(stream.pending) and not self._writing_paused

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._peer_window <= 0:
                return
            self._blocked.pop(stream.id, None)
            self._flush(stream)

    def _local_end(self, stream: Http2Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # We answered before the request ended (an error): stop the client sending.
            self._write([frame(RST_STREAM, 0, stream.id, 4) + HEAD.pack(NO_ERROR)])
            stream.remote_closed = True
        self._forget_if_closed(stream)

    def _idle_frame(self, what: str) -> None:
        """One more frame that carried nothing; too many: a connection error."""
        self._idle_frames += 1
        self._turn_frames += _IDLE_FRAME_COUNTS - 1  # (its header counted one)
        if self._idle_frames > _IDLE_FRAMES + 64 * self._finished:
            raise Http2Error(ENHANCE_YOUR_CALM, f"{self._idle_frames} frames that carry "
                                                f"nothing (the last {what}) against "
                                                f"{self._finished} streams answered")

    def _waste(self, how: str) -> None:
        """One more stream the client wasted; too many: a connection error."""
        self._wasted += 1
        if self._wasted > _WASTED_STREAMS and self._wasted > self._finished:
            raise Http2Error(ENHANCE_YOUR_CALM, f"{self._wasted} streams refused or reset "
                                                f"unanswered (the last {how}) against "
                                                f"{self._finished} answered")

    def _forget_if_closed(self, stream: Http2Stream) -> None:
        if stream.local_closed and stream.remote_closed:
            if self.streams.pop(stream.id, None) is not None:
                self._finished += 1
                self._earned += 1
            self._blocked.pop(stream.id, None)
            stream.handler = None  # (see _let_go)
            self._close_if_done()

    def _reset(self, stream_id: int, code: int) -> None:
        self._write([frame(RST_STREAM, 0, stream_id, 4) + HEAD.pack(code)])
        self._drop(stream_id)

    def _drop(self, stream_id: int) -> None:
        """Forget a reset stream (ours or the peer's) and cancel its call."""
        stream = self.streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        if stream is not None:
            stream.local_closed = stream.remote_closed = True
            self._let_go(stream)
            self._cancel(stream)
            stream.handler = None
        self._close_if_done()

    def _let_go(self, stream: Http2Stream) -> None:
        """A stream that is over lets its unsent answer's pooled views go now. (Once its
        handler is told, the stream lets go of it too: the two refer to each other, and the
        handler to this connection, a cycle that kept both, and all they hold, for the
        garbage collector.)"""
        self.unsent_bytes -= stream.pending_bytes
        stream.pending.clear()
        stream.pending_bytes = 0

    # -- network.SlowReceiver: an answer the client does not read --------------------------

    def body_eta(self, now_ns: int) -> float | None:
        """Infinity once answers have waited UNREAD_ANSWER_S with none of their DATA taken
        (the client reads nothing, or grants no window): they will never arrive."""
        if self.unsent_bytes and now_ns / 1e9 - self._last_sent >= UNREAD_ANSWER_S:
            return float("inf")
        return None

    def refuse_slow(self, eta_s: float, limit_s: float) -> int:
        """Drop the connection, and its answers' views at once (the pool may be asked again
        before the connection is lost): the bytes they held."""
        held = self.unsent_bytes
        for stream in self.streams.values():
            self._let_go(stream)
        if self.transport is not None:
            self.transport.abort()
        return held

    @staticmethod
    def _cancel(stream: Http2Stream) -> None:
        if stream.handler is not None:
            try:
                stream.handler.cancelled()
            except Exception:
                log.exception("HTTP/2 stream %d: its handler failed to cancel", stream.id)

    def _failed(self, stream: Http2Stream, error: Exception) -> None:
        """A stream's handler raised (a bug above this layer): that stream is reset, and the
        connection's other streams — a gRPC client's every call — carry on."""
        log.error("HTTP/2 stream %d: its handler raised; the stream is reset", stream.id,
                  exc_info=error)
        if self.streams.get(stream.id) is stream:
            self._reset(stream.id, INTERNAL_ERROR)

    def reset(self, stream: Http2Stream, code: int = INTERNAL_ERROR) -> None:
        """Abandon a stream (the layer above could not answer it)."""
        if self.streams.get(stream.id) is stream:
            self._reset(stream.id, code)

    def _go_away(self, code: int, message: str = "") -> None:
        debug = message.encode()[:256]
        self._write([frame(GOAWAY, 0, 0, 8 + len(debug)) + HEAD.pack(self._last_stream)
                     + HEAD.pack(code) + debug])

    def expire(self, now: float, read_timeout_s: float) -> None:
        """Called about once a second: a connection stalled inside its preface, a frame or a
        header block is closed; a stream whose request stopped arriving is told so (its
        handler answers it). A stream whose window we hold back is not waiting on the
        client, and an idle connection between calls may stay open for ever (gRPC's)."""
        if self.transport is None:
            return
        if now >= self._abort_at:  # retired, and its grace is over: what is open is cut off
            self.transport.close()
            return
        if now - self._draining_since >= _DRAIN_PING_S:  # our PING was left unanswered
            self._last_goaway()
        quiet = now - self._last_read
        if (quiet > _SHRINK_IDLE_S and len(self._buffer) > _IDLE_BUFFER and not self.streams
                and self._start == self._end and not self._data_left):
            self._buffer = bytearray(_IDLE_BUFFER)  # nothing unparsed: nothing to move
            self._view = memoryview(self._buffer)
            self._start = self._end = 0
        if quiet > read_timeout_s and (not self._preface or self._end > self._start
                                       or self._data_left or self._blocks.stream_id):
            self._go_away(NO_ERROR, f"no bytes for {quiet:.1f} s inside a frame")
            self.transport.close()
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
        self._write([frame(PING, 0, 0, 8) + _ALIVE_PING])
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
        GOAWAY now, with a PING, the second when the PING is answered (see _DRAIN_PING)."""
        if self.going_away or self._draining_since < math.inf:
            return
        if self.transport is None:  # inside its TLS handshake: it will take no streams
            self.going_away = True
            return
        self._draining_since = time.monotonic()
        self._write([frame(GOAWAY, 0, 0, 8) + HEAD.pack(MAX_STREAM_ID)
                     + HEAD.pack(NO_ERROR) + frame(PING, 0, 0, 8) + _DRAIN_PING])

    def _last_goaway(self) -> None:
        """The second GOAWAY of a graceful close: it names the last stream taken; streams the
        client opens after it are refused."""
        self._draining_since = math.inf
        if not self.going_away:
            self._go_away(NO_ERROR)
        self.going_away = True
        self._close_if_done()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _close_if_done(self) -> None:
        if self.going_away and not self.streams and self.transport is not None:
            self.transport.close()

    def _write(self, buffers: list[bytes]) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
        if self.tls:
            record_copy(len(data), "tls")
        transport.write(data)

    def _write_parts(self, parts: list[tuple[Any, bool]]) -> None:
        """Write frames and response parts in order: vectored where the transport can,
        else small runs joined and each part marked alone written by itself."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._pings_without_data = 0  # a response's frames: data between keepalive PINGs
        self._data_flowed = True  # (and between the client's)
        if self._sender is not None:  # what the socket did not take is copied to the transport
            if copied := self._sender.send([part for part, _ in parts]):
                record_copy(copied, "send")
            return
        if self.tls:  # encrypted, and the ciphertext copied out of the ssl module's buffer
            record_copy(sum(len(part) if isinstance(part, bytes) else part.nbytes
                            for part, _ in parts), "tls")
        self._write_runs(transport, parts)

    def _write_runs(self, transport: asyncio.Transport, parts: list[tuple[Any, bool]]) -> None:
        if not self.joins_writes:
            transport.writelines([part for part, _ in parts])
            return
        run: list[Any] = []
        for part, alone in parts:
            if not alone:
                run.append(part)
                continue
            if run:
                transport.write(run[0] if len(run) == 1 else b"".join(run))
                run = []
            transport.write(part)
        if run:
            transport.write(run[0] if len(run) == 1 else b"".join(run))
