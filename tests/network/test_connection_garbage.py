"""A closed connection, and each call it carried, is freed when it ends, not at the garbage
collector's next pass (tests/garbage.py says why that matters). Found by
tools/fuzz_front_ends.py: a chunked body followed, in the same read, by the next request kept
its 64 KiB buffer; every HTTP/1.1 connection, and every gRPC call with its connection, waited
for the collector."""

from __future__ import annotations

import asyncio
import pathlib
import socket
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from tensorgate.dataplane import DataPlane
from tensorgate.network import ConnectionBudget
from tensorgate.network.grpc import GrpcFrontEnd
from tensorgate.network.http import HttpFrontEnd
from tensorgate.pipeline.engine import Engine
from tensorgate.tensor.pool import BufferPool
from tests.e2e.h2_client import DATA, END_HEADERS, END_STREAM, HEADERS, RST_STREAM, H2Client
from tests.garbage import cyclic_garbage

READY = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = (b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"\r\n2\r\n{}\r\n0\r\n\r\n")
SIZED = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


async def _served(tmp_path: pathlib.Path, talk: Callable[[int, int], Awaitable[None]],
                  uploads: bool = False) -> tuple[int, Counter[str]]:
    """Front ends over an engine with no models, on 127.0.0.1; `talk(http_port, grpc_port)`;
    then, once every connection has closed: the pool's bytes still in use, and what of
    tensorgate's is left in cycles. `uploads`: model control explicit, uploads allowed."""
    pool = BufferPool()
    engine = Engine(tmp_path, pool=pool, model_upload=uploads)
    await engine.start()
    budget = ConnectionBudget()
    plane = DataPlane(engine, "test", model_control_mode="explicit" if uploads else "none")
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
        return pool.statistics().bytes_in_use, cyclic_garbage()
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
    """Both are answered, the second closing the connection as it asks; after a chunked
    body, where the next request begins is not told, and the first is answered with
    Connection: close (http.py's docstring). The connection, the held bytes and the chunked
    body's pooled buffer are freed when it closes."""
    last = READY.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")

    async def talk(http_port: int, grpc_port: int) -> None:
        answer = await _exchange(http_port, first + last)
        assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer
        assert answer.count(b"HTTP/1.1 200") == (1 if first is CHUNKED else 2)

    assert asyncio.run(_served(tmp_path, talk)) == (0, Counter())


def test_http_connections_closed_by_either_side_are_freed(tmp_path: pathlib.Path,
                                                          collector_off: None) -> None:
    """Keep-alive connections the client closes, and one the server refuses."""
    async def talk(http_port: int, grpc_port: int) -> None:
        for data in (READY, READY + READY, CHUNKED, b"NOT HTTP\r\n\r\n"):
            await _exchange(http_port, data)

    assert asyncio.run(_served(tmp_path, talk)) == (0, Counter())


def _call(client: H2Client, method: str, message: bytes, end: bool = True) -> int:
    stream = client.next_stream
    client.next_stream += 2
    client.send(HEADERS, END_HEADERS, stream, client.encoder.encode([
        (":method", "POST"), (":scheme", "http"),
        (":path", f"/inference.GRPCInferenceService/{method}"), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers")]))
    client.send(DATA, END_STREAM if end else 0, stream, message)
    return stream


def _grpc_calls(port: int) -> None:
    """Calls answered, refused, reset and left open, on connections then closed."""
    empty, compressed = b"\0\0\0\0\0", b"\1\0\0\0\0"  # (no grpc-encoding: refused)
    for method in ("ServerLive", "ModelInfer", "ModelStreamInfer"):
        for message in (empty, compressed, empty + b"\0"):
            client = H2Client(port)
            stream = _call(client, method, message)
            client.frames_until(lambda f, s=stream: f.kind == HEADERS and f.stream == s
                                and f.flags & END_STREAM)
            client.close()
        client = H2Client(port)
        _call(client, method, empty[:3], end=False)  # half a message, then the client goes
        client.close()
        client = H2Client(port)
        stream = _call(client, method, empty[:3], end=False)
        client.send(RST_STREAM, 0, stream, b"\0\0\0\x08")  # CANCEL
        client.close()


def test_grpc_calls_and_their_connections_are_freed(tmp_path: pathlib.Path,
                                                    collector_off: None) -> None:
    """A call and its stream referred to each other (and a unary call and its message
    reader), and the call to its connection: every call left the three in a cycle."""
    async def talk(http_port: int, grpc_port: int) -> None:
        await asyncio.to_thread(_grpc_calls, grpc_port)
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
        for data in (preface, preface + b"junk" * 10):
            with socket.create_connection(("127.0.0.1", grpc_port)) as sock:
                sock.sendall(data)
            await asyncio.sleep(0.05)

    assert asyncio.run(_served(tmp_path, talk)) == (0, Counter())



def test_an_answer_to_a_client_that_has_gone_is_dropped_quietly(
        tmp_path: pathlib.Path, collector_off: None) -> None:
    """The client reads "100 Continue" and closes while the server still reads its body
    (an upload in 1-byte chunks, the next request after it: the answer closes the
    connection): the answer's write is taken by the kernel, the client's
    reset comes back at once on loopback, and the FIN that follows the answer found the
    socket no longer connected: asyncio's write_eof raised ENOTCONN out of the handler, and
    its traceback kept the connection and the body's buffer in a cycle (found by
    tools/fuzz_front_ends.py on the asyncio loop). Now the connection is dropped quietly."""
    # base64 with an escaped quote in it: parsed whole, then refused (not base64), by when
    # the client has gone
    text = (b'{"parameters": {"config": "{}", "file:1/model.pt": "' + b"QUJD" * 25_000
            + b'\\"QUJD"}}')
    chunks = b"".join(b"1\r\n%s\r\n" % text[i:i + 1] for i in range(len(text)))
    request = (b"POST /v2/repository/models/up/load HTTP/1.1\r\nHost: x\r\n"
               b"Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
               + chunks + b"0\r\n\r\n" + READY)  # the next in the same read: closed after

    async def talk(http_port: int, _: int) -> None:
        reported: list[BaseException] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context.get("exception")))
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
            writer.write(request)
            assert (await reader.read(1000)).startswith(b"HTTP/1.1 100 Continue")
            writer.close()
            await asyncio.sleep(0.3)
        assert reported == []

    in_use, garbage = asyncio.run(_served(tmp_path, talk, uploads=True))
    assert in_use == 0 and garbage == Counter()
