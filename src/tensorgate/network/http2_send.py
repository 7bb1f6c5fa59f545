"""Responses out on an HTTP/2 connection (network/http2_base.py): HEADERS, DATA within the
peer's windows, trailers; what a window holds back waits in its pooled views and goes when
the peer's WINDOW_UPDATE or the transport's drain lets it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tensorgate.network import UNREAD_ANSWER_S
from tensorgate.network.http2_base import Http2Base, Http2Stream
from tensorgate.network.http2_frames import (DATA, END_HEADERS, END_STREAM, HEAD, HEADERS,
                                             INTERNAL_ERROR, NO_ERROR, RST_STREAM, frame)

__all__ = ["Http2Sender"]

_WRITE_ALONE = 32 << 10            # a response part this large is never joined to others
# DATA written to the transport at a time: what the socket cannot take is copied into the
# transport's buffer (outside the pool), and the rest waits in its pooled views until the
# transport has drained (resume_writing). Without it a client that grants large windows and
# does not read had every answer copied there whole.
_SEND_SLICE = 1 << 20


class Http2Sender(Http2Base):
    """A connection's responses out."""

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

    def reset(self, stream: Http2Stream, code: int = INTERNAL_ERROR) -> None:
        """Abandon a stream (the layer above could not answer it)."""
        if self.streams.get(stream.id) is stream:
            self._reset(stream.id, code)

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
