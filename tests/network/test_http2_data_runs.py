"""DATA frames of any sizes, padded or not, in reads of any sizes: the gRPC messages they
carry arrive whole, in order and byte for byte, whether a frame's payload is read into place,
copied there as part of a run of whole frames (http2.Http2Connection._data_run) or taken a
piece at a time; the tensor bytes copied are counted, never more than were sent; no stream
is reset. Driven through the asyncio protocol methods, with a transport that records what
the layer writes."""

from __future__ import annotations

import asyncio
from typing import Any

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.network import http2
from tensorgate.network.grpc_messages import MessageReader
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import BufferPool
from tests.e2e.h2_client import (DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE,
                                 RST_STREAM, SETTINGS, WINDOW_UPDATE, H2Client)

PADDED = 0x8
_PATTERN = bytes(range(251))


class _Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class _Messages:
    """A stream's handler that reads its length-prefixed messages as the gRPC front end
    does (placed in pooled buffers, each first tensor aligned)."""

    def __init__(self, pool: BufferPool) -> None:
        self.got: list[bytes] = []
        self.ledgers: list[CopyLedger] = []
        self.ended = self.cancelled_ = False
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


def _message(size: int, seed: int) -> tuple[bytes, int]:
    request = pb.ModelInferRequest(model_name="wide", id=f"r{seed}")
    tensor = request.inputs.add(name="INPUT__0", datatype="UINT8")
    tensor.shape.append(size)
    request.raw_input_contents.append((_PATTERN * (size // 251 + 2))[seed:seed + size])
    return request.SerializeToString(), size


def _frames(body: bytes, sizes: list[int], padding: list[int]) -> bytes:
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
    frames = _frames(body, sizes, padding)
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
    kinds = []
    given_back = {0: 0, 1: 0}  # WINDOW_UPDATE increments, per stream (0: the connection)
    written = bytes(transport.written)
    while len(written) >= 9:
        length, kind = int.from_bytes(written[:3], "big"), written[3]
        kinds.append(kind)
        if kind == WINDOW_UPDATE:
            stream_id = int.from_bytes(written[5:9], "big")
            given_back[stream_id] += int.from_bytes(written[9:13], "big")
        written = written[9 + length:]
    assert RST_STREAM not in kinds and GOAWAY not in kinds
    # the windows count every DATA byte (padding included), however it was taken
    data = len(frames) - 9 * frame_count
    assert connection.streams[1].receive_window == (http2._STREAM_WINDOW - data
                                                    + given_back[1])
    opening = http2._CONNECTION_WINDOW - http2._DEFAULT_WINDOW  # sent with our SETTINGS
    assert connection._receive_window == (http2._CONNECTION_WINDOW - data
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
                + H2Client.frame(HEADERS, END_HEADERS, 1, block) + _frames(body, [16384], [0]))
    while incoming:
        room = connection.get_buffer(-1)
        n = min(len(room), len(incoming))
        room[:n] = incoming[:n]
        connection.buffer_updated(n)
        incoming = incoming[n:]
    assert handler.got == [message] and handler.ended
    assert handler.ledgers[0].bytes == tensor_bytes
