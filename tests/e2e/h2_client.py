"""A raw HTTP/2 client for tests that need to misbehave: it writes any frame we tell it to
and reads back what the server sends, frame by frame, on a real socket to 127.0.0.1."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes


class H2Client:
    def __init__(self, port: int, settings: dict[int, int] | None = None,
                 preface: bytes = PREFACE, timeout_s: float = 10.0,
                 source: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        """`source`: the loopback address it connects from (127.0.0.1 by default; Linux
        answers all of 127.0.0.0/8), as another client host would; `tls`: over TLS, with
        this context (its ALPN set to h2 here)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s,
                                             source_address=None if source is None
                                             else (source, 0))
        if tls is not None:
            tls.set_alpn_protocols(["h2"])
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._pending = b""
        self.next_stream = 1
        body = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        if preface:  # without one, the test sends its own opening bytes
            self.sock.sendall(preface + self.frame(SETTINGS, 0, 0, body))

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
                + struct.pack(">I", stream) + payload)

    @classmethod
    def streams(cls, first: int, count: int, block: bytes, end: bool = False,
                reset: bool = False) -> bytes:
        """`count` new streams from `first`: a header block each (the request whole with
        `end`), each reset by the client after it with `reset` (CANCEL; "rapid reset" where
        the request is not whole)."""
        out = bytearray()
        for stream in range(first, first + 2 * count, 2):
            out += cls.frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), stream, block)
            if reset:
                out += cls.frame(RST_STREAM, 0, stream, struct.pack(">I", 8))
        return bytes(out)

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.sock.sendall(self.frame(kind, flags, stream, payload))

    def call(self, method: str, message: bytes | None,
             extra: list[tuple[str, str]] | None = None, end_stream: bool = True) -> int:
        """Start a gRPC call with one length-prefixed message (None: headers only); returns
        its stream id."""
        stream = self.next_stream
        self.next_stream += 2
        headers = [(":method", "POST"), (":scheme", "http"),
                   (":path", f"/inference.GRPCInferenceService/{method}"),
                   (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
                   ("te", "trailers"), *(extra or [])]
        self.send(HEADERS, END_HEADERS, stream, self.encoder.encode(headers))
        if message is None:
            return stream
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        for start in range(0, len(body), 16384):
            last = start + 16384 >= len(body)
            self.send(DATA, END_STREAM if last and end_stream else 0, stream,
                      body[start:start + 16384])
        if not body and end_stream:
            self.send(DATA, END_STREAM, stream)
        return stream

    def read_frame(self) -> Frame | None:
        """The next frame, or None once the server has closed the connection."""
        while len(self._pending) < 9 or len(self._pending) < 9 + int.from_bytes(
                self._pending[:3], "big"):
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self._pending += chunk
        length = int.from_bytes(self._pending[:3], "big")
        kind, flags = self._pending[3], self._pending[4]
        stream = int.from_bytes(self._pending[5:9], "big") & 0x7FFFFFFF
        payload, self._pending = self._pending[9:9 + length], self._pending[9 + length:]
        return Frame(kind, flags, stream, payload)

    def frames_until(self, done, limit_s: float = 10.0) -> list[Frame]:
        """Frames (all streams) until `done(frame)` is true or the connection closes."""
        out = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            frame = self.read_frame()
            if frame is None:
                break
            out.append(frame)
            if done(frame):
                break
        return out

    def response(self, stream: int, limit_s: float = 10.0) -> tuple[dict[str, str], bytes]:
        """Headers and trailers of `stream` merged, and its DATA, read to END_STREAM."""
        headers: dict[str, str] = {}
        data = b""
        for frame in self.frames_until(lambda f: f.stream == stream and f.flags & END_STREAM
                                       and f.kind in (HEADERS, DATA)
                                       or f.kind == GOAWAY or
                                       (f.kind == RST_STREAM and f.stream == stream), limit_s):
            if frame.stream != stream:
                continue
            if frame.kind == HEADERS:
                headers.update((str(k), str(v)) for k, v in self.decoder.decode(frame.payload))
            elif frame.kind == DATA:
                data += frame.payload
        return headers, data


def infer_message(model: str) -> bytes:
    """A ModelInferRequest for `model` of INPUT__0, one row of four FP32 ones."""
    from tritonclient.grpc import service_pb2 as pb
    request = pb.ModelInferRequest(model_name=model)
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.extend([1, 4])
    request.raw_input_contents.append(struct.pack("<4f", 1, 1, 1, 1))
    return request.SerializeToString()


def goaway_code(frames: list[Frame]) -> int | None:
    for frame in frames:
        if frame.kind == GOAWAY:
            return int.from_bytes(frame.payload[4:8], "big")
    return None


def flood_until_told_to_calm_down(port: int, source: str,
                                  tls: ssl.SSLContext | None = None) -> None:
    """Rapid reset from `source` (1,400 ServerReady calls, each reset as it opens) until the
    server ends the connection; asserts its GOAWAY is ENHANCE_YOUR_CALM."""
    client = H2Client(port, source=source, tls=tls)
    try:
        block = client.encoder.encode([
            (":method", "POST"), (":scheme", "https" if tls else "http"), (":authority", "x"),
            (":path", "/inference.GRPCInferenceService/ServerReady"),
            ("content-type", "application/grpc"), ("te", "trailers")])
        try:
            client.sock.sendall(client.streams(1, 1400, block, reset=True))
        except OSError:  # closed by the server midway (its GOAWAY was written first)
            pass
        assert goaway_code(client.frames_until(lambda f: f.kind == GOAWAY)) == 0xb
    finally:
        client.close()
