"""An HTTP/2 server connection's limits and state, and what every part of it does with
its streams (network/http2.py): a stream's bookkeeping, writes to the transport, resets and
GOAWAYs.

The connection is one class, Http2Connection, in parts by what they do: this base,
http2_send.py (responses out, within the peer's windows), http2_control.py (HEADERS,
SETTINGS, PING, WINDOW_UPDATE, RST_STREAM and the rest), http2_read.py (the receive buffer,
frames parsed, DATA read into place) and http2.py (the asyncio protocol and the
connection's lifetime: expiry, keepalive, retirement). Each is a class over the one before,
so that one object is one connection, as before the split (http2.py was 1,210 lines).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from tensorgate.network.flooders import Probation
from tensorgate.network.http2_frames import (DEFAULT_FRAME, DEFAULT_WINDOW, ENHANCE_YOUR_CALM,
                                             GOAWAY, HEAD, INTERNAL_ERROR, NO_ERROR, RST_STREAM,
                                             Fields, Http2Error, frame)
from tensorgate.network.http2_headers import HeaderBlocks
from tensorgate.network.in_order import InOrder
from tensorgate.network.keepalive import Keepalive, PingStrikes
from tensorgate.network.socket_send import SocketSender
from tensorgate.tensor.copies import record_copy

if TYPE_CHECKING:
    from tensorgate.network.http2 import Http2Connection

__all__ = ["FloodWatch", "Http2Base", "Http2Stream", "StreamHandler"]

log = logging.getLogger("tensorgate.http2")

# The connection's limits, here for every part that keeps to them.
#
# DATA frames up to 1 MiB: grpcio clients then send a 602 KB tensor in one frame, whose
# payload is read straight into the message's buffer (http2_read.py, get_buffer). Other frames are
# never that large: anything but DATA over MAX_CONTROL_FRAME is refused.
FRAME_SIZE = 1 << 20
MAX_CONTROL_FRAME = 64 << 10
STREAM_WINDOW = 16 << 20          # what each stream may send before we replenish
CONNECTION_WINDOW = 64 << 20      # and all streams together
MAX_STREAMS = 128                 # concurrent streams per connection
# Frames one connection may have parsed in one turn of the event loop, a new stream
# counting NEW_STREAM more (its header block decoded, its call started: 128 streams a turn
# at most, its concurrent limit); then it is read no further until the next turn. A client
# that resets each stream as it opens it (HTTP/2 "rapid reset"), or opens more than it may
# at once, is never held back by the concurrent limit, nor is one sending frames that ask
# for no answer (PRIORITY, unknown types, empty DATA); and uvloop reads a busy socket up to
# 32 times a turn: every other connection waited for about 60,000 of such streams (a health
# check took 5.3 s), or 0.5-1 s for such frames (bench/RESULTS.md). The next turn is
# scheduled once TURN_CHECK have come since the last: not a callback a turn for every
# connection.
FRAMES_PER_TURN = 1024
NEW_STREAM = 7
TURN_CHECK = 64
# A connection earns its streams a turn: it may open FIRST_STREAMS a turn at first, and one
# more for each of its streams answered and not reset by the client afterwards, up to
# FRAMES_PER_TURN // (1 + NEW_STREAM) (a new stream counting more frames until then). A
# client that resets every stream as it opens it earns nothing, whether its answer was
# quicker than the reset (a third of ModelMetadata calls) or not: connecting again for each
# burst of them, it cost every other connection 6-8 ms a turn at 128 streams
# (bench/flood_bench.py, reset-again). gRPC clients reset no stream that has its answer;
# one whose calls are answered is at the full rate after its first 120.
FIRST_STREAMS = 8
# Streams a connection's client may waste — reset before their answer, or opened beyond
# the concurrent limit it was told — before it is told ENHANCE_YOUR_CALM and closed, once
# they also outnumber the streams it let finish (a client whose calls time out now and
# then is not closed; one that wastes its streams is, and must connect again).
WASTED_STREAMS = 10 * MAX_STREAMS
# Frames that carry nothing — PRIORITY (not acted on), unknown types, empty DATA that does
# not end its stream — a client may send beyond 64 a finished stream before it is told
# ENHANCE_YOUR_CALM and closed (gRPC clients send none; a flood of them asks for no answer,
# so nothing else would ever stop it).
IDLE_FRAMES = 10_000
# And each counts this many of a turn's FRAMES_PER_TURN (128 a turn): at one, a client that
# connected again whenever closed cost every other connection 0.5-0.7 ms a turn with empty
# DATA frames (bench/flood_bench.py, empty-data-again).
IDLE_FRAME_COUNTS = 8
# The connections open from an address that lately flooded the server (network/flooders.py)
# are parsed PROBATION_FRAMES a turn together, each its share (one new stream a turn at
# first: n connections, one each n turns, what one overspends owed at the next), each until
# it has earned PROBATION_EARNED streams (it earns none by streams it resets; then it is at
# its full pace anyway). At FRAMES_PER_TURN, rapid reset connecting again whenever closed
# cost every other connection 696 µs a health check at P50 against 81; at this, 138; four
# such clients at once 2,588 and 212 (bench/flood_bench.py, reset-again).
PROBATION_FRAMES = FRAMES_PER_TURN // 8
PROBATION_EARNED = MAX_STREAMS - FIRST_STREAMS
# The receive buffer: an idle connection holds IDLE_BUFFER (at 256 KiB each, 1,000 idle
# gRPC connections held 259 MB: bench/idle_connections_bench.py); a read that fills what it
# was offered grows it to RECEIVE_BUFFER, which holds many frames per read, and a frame
# larger than the buffer grows it to fit. SHRINK_IDLE_S after its last read an idle
# connection's buffer goes back to IDLE_BUFFER.
IDLE_BUFFER = 16 << 10
RECEIVE_BUFFER = 256 << 10
SHRINK_IDLE_S = 2.0
# A graceful close is two GOAWAYs, as gRPC's own servers send them. The first names no last
# stream (2^31-1) and comes with a PING: the client opens no new streams once it reads it,
# and its answer to the PING comes after every stream it opened before, which are served.
# The second, sent then, names the last stream taken (a client that had no stream open
# usually closes the connection before). One GOAWAY naming the last stream at once failed
# the calls racing it: 125-134 of ~27,000 in 15 s with 4 grpcio clients and connections
# retired every 100 ms ("Stream removed (GOAWAY received)": grpcio does not retry them);
# two, 1-2 (the client's own race, which grpc's servers see too: grpc/grpc#31733); two with
# the second only after a second of quiet instead of the PING, 0-1. A client that leaves
# the PING unanswered gets the second after DRAIN_PING_S.
DRAIN_PING = b"tg-drain"
DRAIN_PING_S = 5.0
ALIVE_PING = b"tg-alive"  # a keepalive PING's payload (Keepalive)


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


class FloodWatch(Protocol):
    """Who hears of a connection ended for flooding and says whether a new one starts on
    probation, by its client's address (network.ConnectionBudget)."""

    def flooded(self, how: str, address: str | None) -> None: ...
    def on_probation(self, address: str | None) -> Probation | None: ...


class Http2Stream:
    __slots__ = ("id", "handler", "send_window", "receive_window", "unacknowledged",
                 "reading_paused", "head", "pending", "pending_bytes", "trailers",
                 "remote_closed", "local_closed", "last_data")

    def __init__(self, stream_id: int, send_window: int, opened_at: float) -> None:
        self.id = stream_id
        self.handler: StreamHandler | None = None
        self.send_window = send_window
        self.receive_window = STREAM_WINDOW
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



class Http2Base:
    """One client connection's state; see the module's docstring."""

    def __init__(self, open_stream: Callable[[Http2Connection, Http2Stream, Fields],
                                             StreamHandler],
                 on_close: Callable[[Http2Connection], None],
                 watch: FloodWatch | None = None,
                 keepalive: Keepalive | None = None) -> None:
        """`watch`: told when the connection is ended for flooding, and asked whether it
        starts on probation; `keepalive`: how often the client may PING
        (keepalive.PingStrikes); without it, as often as it likes."""
        # (called with the Http2Connection, by its part that opens streams: http2_control)
        self._open_stream: Callable[[Any, Http2Stream, Fields], StreamHandler] = open_stream
        self._on_close = on_close
        self._watch = watch
        self.address: str | None = None  # its client's (flooders.address_key), once made
        self._probation: Probation | None = None  # while on probation (PROBATION_FRAMES)
        self._strikes = PingStrikes(keepalive) if keepalive is not None else None
        self._data_flowed = False  # data sent or received since the client's last PING
        self._unread_acks = 0  # answers to PINGs and SETTINGS written while writing paused
        self._acks: list[bytes] = []  # those parsed in this read, written once it is parsed
        self._settled = False  # the client's first SETTINGS came
        # the order in which this connection's requests of sequences reach the pipeline
        self.in_order = InOrder()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray(IDLE_BUFFER)
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
        self._receive_window = CONNECTION_WINDOW
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
        # the header block arriving when `expire` first saw it (HeaderBlocks.begun), and then
        self._block_seen = (0, 0.0)
        self._turn_frames = 0          # frames parsed in this turn of the loop (see above)
        # driven by hand, outside a loop (tests), there are no turns to share (nor schedule)
        looped = _in_loop()
        self._frames_per_turn = FRAMES_PER_TURN if looped else 1 << 62
        self._finished = 0             # streams answered and closed both ways
        self._earned = 0               # finished, less those the client reset after
        self._wasted = 0               # streams refused, or reset by the client, unanswered
        self._idle_frames = 0          # frames that carried nothing (see IDLE_FRAMES)
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

    def _idle_frame(self, what: str) -> None:
        """One more frame that carried nothing; too many: a connection error."""
        self._idle_frames += 1
        self._turn_frames += IDLE_FRAME_COUNTS - 1  # (its header counted one)
        if self._idle_frames > IDLE_FRAMES + 64 * self._finished:
            raise Http2Error(ENHANCE_YOUR_CALM, f"{self._idle_frames} frames that carry "
                                                f"nothing (the last {what}) against "
                                                f"{self._finished} streams answered")

    def _waste(self, how: str) -> None:
        """One more stream the client wasted; too many: a connection error."""
        self._wasted += 1
        if self._wasted > WASTED_STREAMS and self._wasted > self._finished:
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

    def _stream_error(self, stream_id: int, code: int, what: str) -> None:
        """A stream error the client made (RFC 9113 §5.4.2): the stream is reset and counted
        wasted, as one the client reset itself. Else a client that opened each stream and
        then broke it (a WINDOW_UPDATE of 0 on it: "MadeYouReset", CVE-2025-8671) was rapid
        reset's flood without a RST_STREAM: never closed, and another client's health
        checks waited 1.0 ms at P50 where they took 0.18 (bench/flood_bench.py,
        made-reset)."""
        self._reset(stream_id, code)
        self._waste(what)

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

    def _go_away(self, code: int, message: str = "") -> None:
        debug = message.encode()[:256]
        self._write([frame(GOAWAY, 0, 0, 8 + len(debug)) + HEAD.pack(self._last_stream)
                     + HEAD.pack(code) + debug])

    def _last_goaway(self) -> None:
        """The second GOAWAY of a graceful close: it names the last stream taken; streams the
        client opens after it are refused."""
        self._draining_since = math.inf
        if not self.going_away:
            self._go_away(NO_ERROR)
        self.going_away = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.going_away and not self.streams:
            self._close()

    def _close(self) -> None:
        """Close the transport, once: asyncio's TLS transport, closed a second time, lets go
        of its protocol, and its pause_reading / resume_reading then raise AttributeError
        (the fuzzer over TLS: a client's GOAWAY with no stream open closed it, then a later
        frame's connection error closed it again)."""
        if self.transport is not None and not self.transport.is_closing():
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
