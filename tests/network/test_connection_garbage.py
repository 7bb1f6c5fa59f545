"""A closed connection is freed when it closes, not at the garbage collector's next pass.

The server freezes the GC's generations after loading, and a keep-alive connection is old
enough to sit in the oldest one: whatever a reference cycle holds (a request's pooled body
buffer among it) stays until a full collection, which an idle server may not make for a
long time. So these tests run with the collector off and check that a connection's objects
and pooled buffers are gone once it has closed. Found by tools/fuzz_front_ends.py: a chunked
body followed, in the same read, by the next request kept its 64 KiB buffer.
"""

from __future__ import annotations

import asyncio
import gc
import pathlib
import socket
from collections.abc import Awaitable, Callable, Iterator

import pytest

from tensorgate.dataplane import DataPlane
from tensorgate.network import ConnectionBudget, http
from tensorgate.network.grpc import GrpcFrontEnd
from tensorgate.network.http import HttpFrontEnd
from tensorgate.network.http2 import Http2Connection
from tensorgate.pipeline.engine import Engine
from tensorgate.tensor.pool import BufferPool

READY = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = (b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"\r\n2\r\n{}\r\n0\r\n\r\n")
SIZED = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
def collector_off() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _alive(kind: type) -> int:
    """Objects of `kind` the collector tracks, freed or not (it is off: nothing is)."""
    return sum(type(o) is kind for o in gc.get_objects())


async def _served(tmp_path: pathlib.Path,
                  talk: Callable[[int, int], Awaitable[None]]) -> tuple[BufferPool, int]:
    """Front ends over an engine with no models, on 127.0.0.1; `talk(http_port, grpc_port)`;
    then once every connection has closed: the pool, and bytes still in use in it."""
    pool = BufferPool()
    engine = Engine(tmp_path, pool=pool)
    await engine.start()
    budget = ConnectionBudget()
    plane = DataPlane(engine, "test")
    front = HttpFrontEnd(plane, pool, 1 << 20, budget=budget)
    grpc = GrpcFrontEnd(plane, pool, 1 << 20, budget=budget)
    try:
        http_port = await front.start("127.0.0.1", 0)
        grpc_port = await grpc.start("127.0.0.1", 0)
        await talk(http_port, grpc_port)
        for _ in range(400):  # a connection closed after its answer lingers a little
            if not budget.open:
                break
            await asyncio.sleep(0.01)
        assert not budget.open
        await asyncio.sleep(0.05)
        return pool, pool.statistics().bytes_in_use
    finally:
        front.stop_accepting()
        await front.close()
        await grpc.stop(1.0)
        await engine.shutdown(1.0)


async def _exchange(port: int, data: bytes) -> bytes:
    """Send `data`, read until the server closes (or 2 s), then close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    answer = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 16), 2.0):
            answer += chunk
    except (asyncio.TimeoutError, ConnectionError):
        pass
    writer.close()
    return answer


@pytest.mark.parametrize("first", [CHUNKED, SIZED, READY], ids=["chunked", "sized", "bare"])
def test_a_request_with_the_next_in_the_same_read_frees_its_connection(
        tmp_path: pathlib.Path, collector_off: None, first: bytes) -> None:
    """The first is answered with Connection: close (http.py's docstring); the connection,
    and the chunked body's pooled buffer, are freed when it closes."""
    before = _alive(http._Connection)

    async def talk(http_port: int, grpc_port: int) -> None:
        answer = await _exchange(http_port, first + READY)
        assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer

    _, in_use = asyncio.run(_served(tmp_path, talk))
    assert in_use == 0
    assert _alive(http._Connection) == before


def test_connections_closed_by_either_side_are_freed(tmp_path: pathlib.Path,
                                                     collector_off: None) -> None:
    """Keep-alive HTTP connections the client closes, one the server refuses, and HTTP/2
    connections (a gRPC client's preface, then gone)."""
    before = _alive(http._Connection), _alive(Http2Connection)

    async def talk(http_port: int, grpc_port: int) -> None:
        for data in (READY, READY + READY, CHUNKED, b"NOT HTTP\r\n\r\n"):
            await _exchange(http_port, data)
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
        for data in (preface, preface + b"junk" * 10):
            with socket.create_connection(("127.0.0.1", grpc_port)) as sock:
                sock.sendall(data)
            await asyncio.sleep(0.05)

    _, in_use = asyncio.run(_served(tmp_path, talk))
    assert in_use == 0
    assert (_alive(http._Connection), _alive(Http2Connection)) == before
