"""gRPC front end: `inference.GRPCInferenceService` and `grpc.health.v1.Health` over our own
HTTP/2 (network/http2.py).

Thin, like the HTTP front end: each call's stream opened here is read, run and answered by
network/grpc_unary (its message read by network/grpc_messages, decoded by
protocol/grpc_codec, run through the data plane by network/grpc_infer or grpc_methods, its
status in trailers); ModelStreamInfer's many messages each way are network/grpc_stream's.
Errors are translated in those places only, through protocol/status.py's table.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
import time
from typing import Any

from tensorgate.dataplane import DataPlane
from tensorgate.network import ConnectionBudget, PoolRelief, RefusedConnection, http2
from tensorgate.network.grpc_compression import response_encoding
from tensorgate.network.grpc_messages import (CODES, Failure, HttpRefusal, error_block,
                                              read_call_headers)
from tensorgate.network.grpc_methods import API_GROUP, MODEL_INFER, MODEL_STREAM_INFER, UNARY
from tensorgate.network.grpc_stream import StreamCall
from tensorgate.network.grpc_unary import ANSWERED, UnaryCall
from tensorgate.network.keepalive import Keepalive
from tensorgate.network.tls import HANDSHAKE_TIMEOUT_S, Handshakes
from tensorgate.protocol.restricted import Restrictions, refusal
from tensorgate.tensor.pool import BufferPool

__all__ = ["GrpcFrontEnd"]

log = logging.getLogger("tensorgate.grpc")

_KNOWN = ", ".join([MODEL_INFER, MODEL_STREAM_INFER, *UNARY])
_CLOSED_WAIT_S = 0.5  # at stop, at least this long for the listener's connections to close


# A connection past its age is retired while a call is open on it, when one is within this
# long: a client waiting for an answer reads the GOAWAY before it starts its next call, where
# one sent between its calls can meet a call just starting, which grpcio then fails
# ("Stream removed (GOAWAY received)"). 4 grpcio clients, connections retired every 100 ms,
# 6 runs of 15-20 s: 12 failed calls in ~3,600 retirements at any moment, 1 in ~2,800 so.
IDLE_RETIRE_S = 1.0


class GrpcFrontEnd:
    """Owns the listening socket; one `Http2Connection` per client."""

    def __init__(self, dataplane: DataPlane, pool: BufferPool, max_message_bytes: int,
                 read_timeout_s: float = 30.0, budget: ConnectionBudget | None = None,
                 header_forward: re.Pattern[str] | None = None,
                 restricted: Restrictions | None = None,
                 tls: ssl.SSLContext | None = None, relief: PoolRelief | None = None,
                 max_age_s: float = 0.0, age_grace_s: float | None = None,
                 keepalive: Keepalive | None = None,
                 response_compression: str = "none") -> None:
        """`tls`: serve over TLS with this context (network/tls.py), else plain. `relief`:
        shared with the HTTP front end (server.py). `max_age_s` > 0: each connection is
        retired (Http2Connection.retire) after that long, ±10 % so that the connections
        opened together are not all retired together (as gRPC's servers do), its calls
        then open given `age_grace_s` (None: no bound) to finish. `keepalive`: quiet
        connections are sent PINGs, and closed when one goes unanswered; clients' PINGs are
        bounded (network/keepalive.py). `response_compression`: Triton's level for inference
        answers (network/grpc_compression.py)."""
        self.dataplane = dataplane
        self.header_forward = header_forward  # metadata passed to models as parameters
        self.restricted = restricted or {}    # API group → the metadata it needs
        self.budget = budget or ConnectionBudget()
        self.pool = pool
        self.max_message_bytes = max_message_bytes
        self.read_timeout_s = read_timeout_s
        self.max_age_s = max_age_s
        self.age_grace_s = age_grace_s
        self.keepalive = keepalive
        self.response_compression = response_compression
        self.connections: set[http2.Http2Connection] = set()
        self.streams: set[StreamCall] = set()  # open ModelStreamInfer calls
        self._server: asyncio.base_events.Server | None = None
        self.tls = tls
        self.relief = relief or PoolRelief(read_timeout_s)
        self.relief.add_source(self._receivers)
        # connections accepted over TLS whose handshake our protocol has not seen end
        self._handshakes: Handshakes[http2.Http2Connection] = Handshakes(
            min(read_timeout_s, HANDSHAKE_TIMEOUT_S))

    def _open_stream(self, connection: http2.Http2Connection, stream: http2.Http2Stream,
                     headers: http2.Fields) -> http2.StreamHandler:
        try:
            call = read_call_headers(headers, self.header_forward)
            if self.restricted:
                self._check_restricted(call.path, headers)
            if call.path == MODEL_STREAM_INFER:
                return StreamCall(self.dataplane, self.pool, self.max_message_bytes,
                                  connection, stream, call, self.streams, self.relief,
                                  response_encoding(self.response_compression,
                                                    call.accept_encoding))
            if call.path != MODEL_INFER and call.path not in UNARY:
                raise Failure("UNIMPLEMENTED", f"unknown method {call.path}; this server "
                                               f"implements {_KNOWN}")
        except HttpRefusal as refusal:
            connection.respond_headers(stream, http2.encode_headers(
                [(b":status", str(refusal.status).encode())]))
            return ANSWERED
        except Failure as failure:
            connection.respond_headers(stream, error_block(CODES[failure.code],
                                                           failure.message))
            return ANSWERED
        return UnaryCall(self, connection, stream, call)

    def _check_restricted(self, path: str, headers: http2.Fields) -> None:
        group = API_GROUP.get(path.rsplit("/", 1)[-1])
        needed = self.restricted.get(group) if group is not None else None
        if needed is None or group is None:
            return
        given = next((value for name, value in headers if name == needed[0]), None)
        reason = refusal(group, needed, given)
        if reason is not None:
            raise Failure("UNAVAILABLE", reason)  # as Triton answers a restricted protocol

    def _connection(self) -> asyncio.BaseProtocol:
        if not self.budget.admit():
            return RefusedConnection(http2.refusal_frames(self.budget.refusal()))
        connection = http2.Http2Connection(self._open_stream, self._closed,
                                           self.budget, self.keepalive)
        if self.max_age_s > 0:
            connection.retire_at = (time.monotonic()
                                    + self.max_age_s * random.uniform(0.9, 1.1))
        self.connections.add(connection)
        if self.tls is not None:
            self._handshakes.started(connection, time.monotonic())
        return connection

    def _closed(self, connection: http2.Http2Connection) -> None:
        if connection in self.connections:  # once: the handshake sweep may have been first
            self.connections.discard(connection)
            self.budget.release()

    def expire(self, now: float) -> None:
        """Called about once a second (server.py): calls whose request stopped arriving are
        answered, connections stalled inside a frame closed, those past their age retired
        while a call is open on them (or IDLE_RETIRE_S later, idle), quiet ones sent a
        keepalive PING and those that left one unanswered closed."""
        keepalive = self.keepalive
        for connection in list(self.connections):
            if keepalive is not None and connection.keep_alive(now, keepalive):
                self.budget.unanswered += 1
                continue
            if now >= connection.retire_at and (
                    connection.streams or now >= connection.retire_at + IDLE_RETIRE_S) \
                    and connection.retire(now, self.age_grace_s):
                self.budget.retired += 1
            connection.expire(now, self.read_timeout_s)
        if self.tls is not None:
            for connection in self._handshakes.sweep(now, self._made):
                self._closed(connection)  # its handshake failed: our protocol never knew

    def _receivers(self) -> list[Any]:
        """Calls and streams whose message may be arriving into a pooled buffer, and
        connections whose answers wait for a client that may not read them."""
        receivers: list[Any] = [connection for connection in self.connections
                                if connection.unsent_bytes]
        receivers += [stream.handler for connection in self.connections
                      for stream in connection.streams.values()
                      if isinstance(stream.handler, (UnaryCall, StreamCall))]
        return receivers

    def _made(self, connection: http2.Http2Connection) -> bool:
        """Whether the connection's protocol saw its handshake end: it has (or had, and
        lost: then it has left `connections`) a transport."""
        return connection.transport is not None or connection not in self.connections

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen; the port taken (`port` 0 picks one). `reuse_port`: SO_REUSEPORT, the port
        shared with other servers that set it too (config.reuse_grpc_port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection, host, port, backlog=1024, reuse_address=True,
            reuse_port=reuse_port, ssl=self.tls,
            ssl_handshake_timeout=self._handshakes.timeout_s if self.tls else None)
        return int(self._server.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """No new connections, and GOAWAY on every open one: calls in flight still finish."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        for call in list(self.streams):
            call.drain()  # answers what it has received, then ends: a stream has no end of
            # its own that GOAWAY would wait for

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, give open calls `grace_s` to finish, then close what is left."""
        self.stop_accepting()
        deadline = time.monotonic() + grace_s
        while any(c.streams for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()
        if self._server is None:
            return
        # From Python 3.12 wait_closed also waits for connections still in their TLS
        # handshake, which no protocol of ours holds: 3.13 can abort them; on 3.12 they
        # would keep the stop waiting until their handshake's timeout (seen: 4.8 s of 5).
        abort_clients = getattr(self._server, "abort_clients", None)
        if abort_clients is not None:
            abort_clients()
        try:
            await asyncio.wait_for(self._server.wait_closed(), max(deadline - time.monotonic(),
                                                                   _CLOSED_WAIT_S))
        except asyncio.TimeoutError:  # Python 3.10's is not the builtin
            log.info("gRPC: stopped with TLS handshakes still open (they end at their "
                     "timeout)")
