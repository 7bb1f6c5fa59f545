"""gRPC front end: `inference.GRPCInferenceService` over our own HTTP/2 (network/http2.py).

Thin, like the HTTP front end: read a call's one request message, decode it with
protocol/grpc_codec, call the data plane, encode, and answer with the status in trailers.
Errors are translated here and only here, through protocol/status.py's table.

ModelInfer's message is received into one pooled, 64-byte-aligned buffer, placed so that the
first tensor starts on the boundary, and inputs are views into it. Large DATA frames (grpcio
clients send up to the 1 MiB we allow) are read by the kernel straight into that buffer;
what arrives through the connection's receive buffer instead (small frames, the first bytes
of each frame) is copied in and counted as "receive" from the first tensor on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from tensorgate.dataplane import DataPlane
from tensorgate.errors import (InvalidArgumentError, PoolExhaustedError, TensorgateError,
                               UnimplementedError)
from tensorgate.network import http2
from tensorgate.protocol.compression import inflate
from tensorgate.protocol.grpc_codec import (decode_model_infer, encode_model_infer_parts,
                                            first_raw_input_offset, split_model_infer,
                                            statistics_message)
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.buffer import ALIGNMENT
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.pool import BufferPool

__all__ = ["GrpcFrontEnd"]

log = logging.getLogger("tensorgate.grpc")

_SERVICE = "/inference.GRPCInferenceService/"
# gRPC status codes by name (grpc/doc/statuscodes.md)
_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
          "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "RESOURCE_EXHAUSTED": 8, "UNIMPLEMENTED": 12,
          "INTERNAL": 13, "UNAVAILABLE": 14}
_ENCODINGS = "identity,deflate,gzip"
_RESPONSE_HEADERS = http2.encode_headers([(b":status", b"200"),
                                          (b"content-type", b"application/grpc"),
                                          (b"grpc-accept-encoding", _ENCODINGS.encode())])
_OK_TRAILERS = http2.encode_headers([(b"grpc-status", b"0")])
_TIMEOUT_UNITS = {"H": 3600e9, "M": 60e9, "S": 1e9, "m": 1e6, "u": 1e3, "n": 1.0}
# Bytes of ModelInfer's message held back before placing it: enough to find where the first
# tensor starts in any ordinary request (tritonclient's header fields come first).
_PLACEMENT_WINDOW = 64 << 10


class _Failure(Exception):
    """Answer the call with this gRPC status (transport-level problems, not the data plane's)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _trailers(code: int, message: str) -> bytes:
    # grpc-message is percent-encoded UTF-8 (gRPC's PROTOCOL-HTTP2.md)
    encoded = "".join(c if " " <= c <= "~" and c != "%" else
                      "".join(f"%{b:02X}" for b in c.encode()) for c in message)
    return http2.encode_headers([(b"grpc-status", str(code).encode()),
                                 (b"grpc-message", encoded.encode())])


def _error_block(code: int, message: str) -> bytes:
    """A trailers-only response: status 200 and the gRPC status in one header block."""
    return http2.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")]) \
        + _trailers(code, message)


def _deadline_ns(value: str) -> int:
    """grpc-timeout ("100m", "5S", at most 8 digits and a unit) as a monotonic deadline."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        raise _Failure("INTERNAL", f"grpc-timeout '{value}' is malformed")
    return time.monotonic_ns() + int(int(digits) * _TIMEOUT_UNITS[unit])


class _Call:
    """One RPC on one stream: collects its request message, runs it, answers."""

    __slots__ = ("front", "connection", "stream", "method", "ledger", "deadline_ns",
                 "compressed_with", "_prefix", "_length", "_received", "_message", "_head",
                 "_counted_from", "_complete", "_task", "_answered")

    def __init__(self, front: GrpcFrontEnd, connection: http2.Http2Connection,
                 stream: http2.Http2Stream) -> None:
        self.front = front
        self.connection = connection
        self.stream = stream
        self.method = ""
        self.ledger = CopyLedger()
        self.deadline_ns: int | None = None
        self.compressed_with = "identity"
        self._prefix = bytearray()      # the 5-byte length prefix, as it arrives
        self._length = -1               # the message's length once the prefix is in
        self._received = 0
        # where the message lands: a view of a pooled buffer for ModelInfer, else a bytearray
        self._message: Any = None
        self._head: bytearray | None = None  # ModelInfer bytes held back until placed
        self._counted_from = 0          # message offset from which copied bytes count
        self._complete = False
        self._task: asyncio.Task[None] | None = None
        self._answered = False

    # -- the request, as HTTP/2 delivers it ------------------------------------------------

    def open(self, headers: list[tuple[str, str]]) -> None:
        values = dict(headers)
        if values.get(":method") != "POST":
            self._http_error(405)
            return
        if not values.get("content-type", "").startswith("application/grpc"):
            self._http_error(415)
            return
        path = values.get(":path", "")
        self.method = path[len(_SERVICE):] if path.startswith(_SERVICE) else ""
        if self.method not in _METHODS and self.method != "ModelInfer":
            self._fail("UNIMPLEMENTED", f"unknown method {path}; this server implements "
                                        f"{_SERVICE}{{{', '.join(['ModelInfer', *_METHODS])}}}")
            return
        encoding = values.get("grpc-encoding", "identity")
        if encoding not in ("identity", "gzip", "deflate"):
            self._fail("UNIMPLEMENTED", f"grpc-encoding '{encoding}' is not supported; use "
                                        f"one of {_ENCODINGS}")
            return
        self.compressed_with = encoding
        try:
            if "grpc-timeout" in values:
                self.deadline_ns = _deadline_ns(values["grpc-timeout"])
        except _Failure as failure:
            self._fail(failure.code, failure.message)

    def data_received(self, data: memoryview) -> None:
        if self._answered:
            return
        try:
            self._take(data)
        except _Failure as failure:
            self._fail(failure.code, failure.message)
        except TensorgateError as error:  # a malformed message, found while placing it
            self._fail(codes_for(error)[1], error.message)

    def receive_buffer(self, limit: int) -> memoryview | None:
        """Where the next `limit` bytes of DATA may be read in place: the rest of a placed
        message (zero copy for large DATA frames, as grpcio clients send)."""
        if self._answered or self._head is not None or self._length < 0 or self._complete \
                or not isinstance(self._message, memoryview):
            return None
        start = self._received
        return self._message[start:start + min(limit, self._length - start)]

    def data_written(self, nbytes: int) -> None:
        self._received += nbytes
        if self._received == self._length:
            self._complete = True

    def end_received(self) -> None:
        if self._answered:
            return
        if not self._complete:
            self._fail("INTERNAL", "the call ended without a whole request message"
                       if self._length >= 0 or self._prefix else
                       "the call ended without a request message")
            return
        self._task = asyncio.ensure_future(self._run())

    def cancelled(self) -> None:
        self._answered = True
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client reset the stream: its queued request is dropped
        self._message = self._head = None

    # -- receiving the one message ---------------------------------------------------------

    def _take(self, data: memoryview) -> None:
        while len(data):
            if self._complete:
                raise _Failure("INTERNAL", "a unary call carried more than one request message")
            if self._length < 0:
                need = 5 - len(self._prefix)
                self._prefix += data[:need]
                data = data[need:]
                if len(self._prefix) == 5:
                    self._begin_message()
                continue
            if self._head is not None:  # ModelInfer: hold the start back until it is placed
                # a little at a time: what is held back here is copied twice
                room = min(len(data), self._length - len(self._head), 512)
                self._head += data[:room]
                data = data[room:]
                if (len(self._head) == self._length or len(self._head) >= _PLACEMENT_WINDOW
                        or first_raw_input_offset(memoryview(self._head)) is not None):
                    self._place()
                continue
            data = data[self._copy_in(data):]

    def _copy_in(self, data: memoryview) -> int:
        """Copy what of `data` belongs to the message into it; returns how much that was."""
        start = self._received
        count = min(len(data), self._length - start)
        self._message[start:start + count] = data[:count]
        self._received = start + count
        counted = start + count - max(start, self._counted_from)
        if counted > 0:  # tensor bytes moved, not only the message's small fields
            record_copy(counted, "receive", self.ledger)
        if self._received == self._length:
            self._complete = True
        return count

    def _begin_message(self) -> None:
        flag, length = self._prefix[0], int.from_bytes(self._prefix[1:5], "big")
        if flag > 1:
            raise _Failure("INTERNAL", f"message prefix flag {flag}; it must be 0 or 1")
        if flag and self.compressed_with == "identity":
            raise _Failure("INTERNAL", "a compressed message without grpc-encoding")
        limit = self.front.max_message_bytes
        if length > limit:
            raise _Failure("RESOURCE_EXHAUSTED", f"request message of {length} bytes exceeds "
                                                 f"the {limit}-byte limit (--max-request-bytes)")
        self._length = length
        if not flag:
            self.compressed_with = "identity"
        if self.method == "ModelInfer" and not flag:
            self._head = bytearray()
            if length == 0:
                self._place()
        else:
            self._message = bytearray(length)
            self._complete = length == 0

    def _place(self) -> None:
        """Acquire the message's buffer so that its first tensor starts 64-byte aligned,
        and move what has arrived so far into it."""
        assert self._head is not None
        head, self._head = self._head, None
        offset = first_raw_input_offset(memoryview(head))
        pad = (-offset) % ALIGNMENT if offset is not None else 0
        # Bytes before the first tensor are the message's small fields: not counted.
        self._counted_from = offset if offset is not None else self._length
        try:
            buffer = self.front.pool.acquire(self._length + pad)
        except PoolExhaustedError as error:
            raise _Failure("UNAVAILABLE", error.message) from None
        # the view keeps the pooled buffer alive, and so do the input views made of it
        self._message = memoryview(buffer).cast("B")[pad:pad + self._length]
        self._copy_in(memoryview(head))

    # -- running it ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            message = self._message
            if self.compressed_with != "identity":
                message = self._inflate(message)
            if self.method == "ModelInfer":
                parts = await self._model_infer(message)
            else:
                handler = _METHODS[self.method]
                try:  # every method's message is named after it: ServerLive → ServerLiveRequest
                    request = getattr(pb, f"{self.method}Request").FromString(bytes(message))
                except Exception as error:  # protobuf's DecodeError
                    raise InvalidArgumentError(f"{self.method} request is malformed: "
                                               f"{error}") from None
                parts = [(await handler(self.front.dataplane, request)).SerializeToString()]
        except asyncio.CancelledError:
            return
        except _Failure as failure:
            self._fail(failure.code, failure.message)
            return
        except TensorgateError as error:
            self._fail(codes_for(error)[1], error.message)
            return
        except Exception as error:  # a bug: answer, log, keep serving
            log.exception("unexpected error in gRPC %s", self.method)
            self._fail("INTERNAL", f"internal error: {type(error).__name__}: {error}")
            return
        finally:
            self._message = None
        self._answered = True
        size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        self.connection.respond(self.stream, _RESPONSE_HEADERS,
                                [b"\x00" + size.to_bytes(4, "big"), *parts], _OK_TRAILERS)

    async def _model_infer(self, message: Any) -> list[Any]:
        dp = self.front.dataplane
        request, spans = split_model_infer(memoryview(message))
        decoded = decode_model_infer(request, self.ledger, dp.shm, message=message,
                                     raw_spans=spans)
        if self.deadline_ns is not None and decoded.timeout_us is None:
            decoded.timeout_us = max(0, (self.deadline_ns - time.monotonic_ns()) // 1000)
        result, outputs, _, in_shm = await dp.infer(request.model_name, request.model_version,
                                                    decoded, self.ledger)
        joined = self.connection.joined_bytes(
            [v.nbytes for n, v in outputs.items() if not in_shm or n not in in_shm])
        return encode_model_infer_parts(result.model, result.version, result.id, outputs,
                                        self.ledger,
                                        bool(decoded.parameters.get("tensorgate_report_copies")),
                                        in_shm, copies_to_come=joined)

    def _inflate(self, message: Any) -> bytes:
        limit = self.front.max_message_bytes
        data = inflate(message, self.compressed_with, limit, "message", self.ledger)
        if data is None:
            raise _Failure("RESOURCE_EXHAUSTED", f"the decompressed message exceeds the "
                                                 f"{limit}-byte limit (--max-request-bytes)")
        return data

    # -- answering errors ------------------------------------------------------------------

    def _fail(self, code: str, message: str) -> None:
        if self._answered:
            return
        self._answered = True
        self._message = self._head = None
        self.connection.respond_headers(self.stream, _error_block(_CODES[code], message))

    def _http_error(self, status: int) -> None:
        self._answered = True
        self.connection.respond_headers(self.stream, http2.encode_headers(
            [(b":status", str(status).encode())]))


# -- the unary RPCs other than ModelInfer: request type and handler ---------------------------

Handler = Callable[[DataPlane, Any], Awaitable[Any]]


async def _server_live(dp: DataPlane, request: Any) -> Any:
    return pb.ServerLiveResponse(live=dp.live())


async def _server_ready(dp: DataPlane, request: Any) -> Any:
    return pb.ServerReadyResponse(ready=dp.ready())


async def _model_ready(dp: DataPlane, request: Any) -> Any:
    return pb.ModelReadyResponse(ready=dp.model_ready(request.name, request.version))


async def _server_metadata(dp: DataPlane, request: Any) -> Any:
    meta = dp.server_metadata()
    return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                     extensions=meta["extensions"])


async def _model_metadata(dp: DataPlane, request: Any) -> Any:
    meta = dp.model_metadata(request.name, request.version)
    tensors = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta["name"], versions=meta["versions"], platform=meta["platform"],
        inputs=[tensors(**t) for t in meta["inputs"]],
        outputs=[tensors(**t) for t in meta["outputs"]])


async def _model_config(dp: DataPlane, request: Any) -> Any:
    return pb.ModelConfigResponse(config=dp.engine.spec(request.name).config)


async def _model_statistics(dp: DataPlane, request: Any) -> Any:
    return statistics_message(dp.statistics(request.name, request.version))


async def _shm_register(dp: DataPlane, request: Any) -> Any:
    dp.shm.register(request.name, request.key, request.offset, request.byte_size)
    return pb.SystemSharedMemoryRegisterResponse()


async def _shm_unregister(dp: DataPlane, request: Any) -> Any:
    dp.shm.unregister(request.name or None)
    return pb.SystemSharedMemoryUnregisterResponse()


async def _shm_status(dp: DataPlane, request: Any) -> Any:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in dp.shm.status(request.name or None):
        status = response.regions[region["name"]]
        status.name, status.key = region["name"], region["key"]
        status.offset, status.byte_size = region["offset"], region["byte_size"]
    return response


async def _repository_index(dp: DataPlane, request: Any) -> Any:
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(models=[index(**e) for e in
                                              dp.repository_index(request.ready)])


async def _repository_load(dp: DataPlane, request: Any) -> Any:
    if request.parameters:
        raise UnimplementedError("loading with override parameters is not supported")
    await dp.load(request.model_name)
    return pb.RepositoryModelLoadResponse()


async def _repository_unload(dp: DataPlane, request: Any) -> Any:
    await dp.unload(request.model_name)
    return pb.RepositoryModelUnloadResponse()


_METHODS: dict[str, Handler] = {
    "ServerLive": _server_live,
    "ServerReady": _server_ready,
    "ModelReady": _model_ready,
    "ServerMetadata": _server_metadata,
    "ModelMetadata": _model_metadata,
    "ModelConfig": _model_config,
    "ModelStatistics": _model_statistics,
    "SystemSharedMemoryRegister": _shm_register,
    "SystemSharedMemoryUnregister": _shm_unregister,
    "SystemSharedMemoryStatus": _shm_status,
    "RepositoryIndex": _repository_index,
    "RepositoryModelLoad": _repository_load,
    "RepositoryModelUnload": _repository_unload,
}


class GrpcFrontEnd:
    """Owns the listening socket; one `Http2Connection` per client."""

    def __init__(self, dataplane: DataPlane, pool: BufferPool, max_message_bytes: int) -> None:
        self.dataplane = dataplane
        self.pool = pool
        self.max_message_bytes = max_message_bytes
        self.connections: set[http2.Http2Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    def _open_stream(self, connection: http2.Http2Connection, stream: http2.Http2Stream,
                     headers: list[tuple[str, str]]) -> _Call:
        call = _Call(self, connection, stream)
        call.open(headers)
        return call

    def _connection(self) -> http2.Http2Connection:
        connection = http2.Http2Connection(self._open_stream, self.connections.discard)
        self.connections.add(connection)
        return connection

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, backlog=1024,
                                                reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """No new connections, and GOAWAY on every open one: calls in flight still finish."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_when_idle()

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, give open calls `grace_s` to finish, then close what is left."""
        self.stop_accepting()
        deadline = time.monotonic() + grace_s
        while any(c.streams for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
