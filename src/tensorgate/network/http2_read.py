"""What an HTTP/2 connection reads (network/http2_base.py): the receive buffer asyncio's
BufferedProtocol reads into, grown for a busy connection and shrunk for an idle one; frames
parsed from it, each turn of the loop a bounded share; DATA read straight into the buffer
its stream offers, and our windows given back as it is consumed."""

from __future__ import annotations

import asyncio
import logging
import time

from tensorgate.network.http2_base import (CONNECTION_WINDOW, FRAME_SIZE, FRAMES_PER_TURN,
                                           MAX_CONTROL_FRAME, PROBATION_EARNED,
                                           PROBATION_FRAMES, RECEIVE_BUFFER, STREAM_WINDOW,
                                           TURN_CHECK, Http2Stream)
from tensorgate.network.http2_control import Http2Control
from tensorgate.network.http2_frames import (CONTINUATION, DATA, DEFAULT_FRAME, END_STREAM,
                                             ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
                                             FRAME_SIZE_ERROR, HEAD, MAX_WINDOW, PADDED, PREFACE,
                                             PROTOCOL_ERROR, STREAM_CLOSED, WINDOW_UPDATE,
                                             Http2Error, frame)
from tensorgate.tensor.copies import record_copy

__all__ = ["Http2Reader"]

log = logging.getLogger("tensorgate.http2")

_DIRECT_READ = 4096                # read a DATA payload into place when this much is left
_RUN_FRAME = 1024                  # whole DATA frames this large go straight into place
# Between frames, a peer that sends large DATA frames gets reads this small, so that little
# of the next payload arrives here (copied) before its frame header is parsed.
_SMALL_READ = 4096


class Http2Reader(Http2Control):
    """A connection's frames in."""

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
                self._resize(RECEIVE_BUFFER)
        elif (self._grow or self._start + self._need > len(self._buffer)
              or len(self._buffer) - self._end < len(self._buffer) >> 2):
            # Move the unparsed tail (less than one frame) to the front, into a larger
            # buffer where the traffic or the frame needs one.
            self._resize(max(len(self._buffer), self._need,
                             RECEIVE_BUFFER if self._grow else 0))
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
                        and len(self._buffer) < RECEIVE_BUFFER):
                    self._grow = True  # more was waiting: a busy connection
            self._parse()
        except Http2Error as error:
            self._connection_error(error)
            return
        if self._acks:
            self._send_acks()

    def _connection_error(self, error: Http2Error) -> None:
        if error.code == ENHANCE_YOUR_CALM and self._watch is not None:
            self._watch.flooded(str(error), self.address)
        else:
            log.info("HTTP/2 connection error %d: %s", error.code, error)
        self._failed_connection = True
        if self._acks:  # what was answered before it, as if written at once
            self._send_acks()
        self._go_away(error.code, error.debug)
        self._close()

    def _next_turn(self) -> None:
        """A new turn of the loop: parse what was held back, then read again."""
        self._turn_due = False
        if self._probation is None:
            self._turn_frames = 0
        elif self._probation_turn():
            return  # what it overspent is not yet paid: held this turn too
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

    def _probation_turn(self) -> bool:
        """A turn on probation: the connection's share of PROBATION_FRAMES, less what it
        spent past its share before (a new stream counts more than a share when the address
        has several connections open); True while that is still owed. Once it has earned
        its streams, its probation is over."""
        probation = self._probation
        assert probation is not None
        if self._earned >= PROBATION_EARNED:
            probation.leave()
            self._probation = None
            self._frames_per_turn = FRAMES_PER_TURN
            self._turn_frames = 0
            return False
        share = self._frames_per_turn = self._probation_share()
        self._turn_frames = max(0, self._turn_frames - share)
        if self._turn_frames < share or self._failed_connection:
            return False
        self._turn_due = True
        asyncio.get_running_loop().call_soon(self._next_turn)
        return True

    def _probation_share(self) -> int:
        """This connection's frames a turn: its share of its address's PROBATION_FRAMES."""
        assert self._probation is not None
        return max(1, PROBATION_FRAMES // self._probation.open)

    def _parse(self) -> None:
        view = self._view
        while self.transport is not None:
            if self._turn_frames >= self._frames_per_turn:  # the rest: at the next turn
                if not self._turn_held:
                    self._turn_held = True
                    self.transport.pause_reading()
                    if not self._turn_due:  # (a new stream's count may pass it at once)
                        self._turn_due = True
                        asyncio.get_running_loop().call_soon(self._next_turn)
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
            if length > FRAME_SIZE:
                raise Http2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds the "
                                                   f"{FRAME_SIZE}-byte maximum")
            if length > MAX_CONTROL_FRAME and kind != DATA:
                raise Http2Error(ENHANCE_YOUR_CALM, f"a frame of type {kind} and {length} "
                                                    f"bytes; only DATA may exceed "
                                                    f"{MAX_CONTROL_FRAME}")
            if self._blocks.stream_id and kind != CONTINUATION:
                raise Http2Error(PROTOCOL_ERROR, "a header block was interrupted by another "
                                                 "frame")
            self._turn_frames += 1  # (inline: every frame passes here)
            if self._turn_frames >= TURN_CHECK and not self._turn_due:
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
            self._stream_error(stream_id, STREAM_CLOSED, "DATA after its end")
        else:
            stream.receive_window -= length
            if stream.receive_window < 0:
                self._stream_error(stream_id, FLOW_CONTROL_ERROR, "DATA beyond its window")
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
                    or following > FRAME_SIZE
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
        if self._unacknowledged >= CONNECTION_WINDOW // 4:
            updates.append(frame(WINDOW_UPDATE, 0, 0, 4) + HEAD.pack(self._unacknowledged))
            self._receive_window += self._unacknowledged
            self._unacknowledged = 0
        stream = self.streams.get(self._data_stream)
        if stream is not None and not stream.remote_closed:
            if self._data_flags & END_STREAM:
                self._end_of_stream(stream)
            else:
                stream.unacknowledged += length
                if stream.unacknowledged >= STREAM_WINDOW // 4 and not stream.reading_paused:
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
        (at most STREAM_WINDOW bytes), then waits. Other streams are not affected."""
        stream.reading_paused = True

    def resume_reading(self, stream: Http2Stream) -> None:
        stream.reading_paused = False
        if stream.unacknowledged and not stream.remote_closed \
                and self.streams.get(stream.id) is stream:
            self._write([self._stream_update(stream)])
