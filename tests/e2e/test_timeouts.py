"""Slow and silent clients against a server with short timeouts (--read-timeout-s 0.5,
--keep-alive-timeout-s 1): a request whose bytes stop arriving is answered (HTTP 408, gRPC
DEADLINE_EXCEEDED) and its pooled buffer released; idle HTTP/1.1 connections are closed;
idle gRPC connections are not; the server serves on."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.e2e import h2_client as h2
from tests.e2e.conftest import (RunningServer, binary_infer_request, scrape, start_server,
                                stop_server, value)
from tests.e2e.test_grpc_wire import _assert_serving

STALL = r"the request stopped arriving: no bytes for \d+\.\d s \(the server waits 0\.5 s, " \
        r"--read-timeout-s\)"


@pytest.fixture(scope="module")
def impatient(e2e_repo, tmp_path_factory) -> Iterator[RunningServer]:
    running = start_server(e2e_repo, tmp_path_factory.mktemp("impatient") / "server.log",
                           "--read-timeout-s", "0.5", "--keep-alive-timeout-s", "1")
    yield running
    stop_server(running)


def _pool_in_use(server: RunningServer) -> int:
    return int(value(scrape(server), "tensorgate_pool_bytes", state="in_use"))


def _read_all(sock: socket.socket, limit_s: float = 10) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _http(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def test_a_body_that_stops_arriving_is_answered_408_and_its_buffer_released(
        impatient: RunningServer) -> None:
    before = _pool_in_use(impatient)
    with _http(impatient) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 4000000\r\n\r\n{\"in")
        time.sleep(0.2)
        assert _pool_in_use(impatient) >= before + 4_000_000  # the body's buffer, held
        answer = _read_all(sock)  # the server answers, then closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout")
    assert re.fullmatch(STALL, json.loads(body)["error"])
    assert _pool_in_use(impatient) == before


def test_headers_that_stop_arriving_are_answered_408(impatient: RunningServer) -> None:
    with _http(impatient) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Ty")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")


def test_headers_dribbled_a_byte_at_a_time_are_answered_408(impatient: RunningServer) -> None:
    """Each byte within the read timeout, the head never whole ("slowloris"): it held its
    connection for as long as the client liked; now a head has the read timeout to arrive."""
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 200 + b"\r\n\r\n"
    started, answer = time.monotonic(), b""
    with _http(impatient) as sock:
        sock.settimeout(0.2)  # each byte 0.2 s after the one before: never quiet 0.5 s
        for byte in head:
            if answer or time.monotonic() - started > 10:
                break
            try:
                sock.sendall(bytes([byte]))
                answer = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:  # closed after its answer, which was read
                break
        waited = time.monotonic() - started
        if answer:  # the rest of it, to the close
            sock.settimeout(5)
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except OSError:
                pass
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), (waited, answer)
    assert b"the request's headers took more than 0.5 s to arrive (--read-timeout-s)" in answer
    assert waited < 5
    _assert_serving(impatient)


def test_an_idle_keep_alive_connection_is_closed(impatient: RunningServer) -> None:
    with _http(impatient) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.6)  # longer than the read timeout: between requests it does not apply
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert _read_all(sock) == b""  # closed by the server, no answer to nothing
        assert 0.9 < time.monotonic() - started < 5


def _open_connections(server: RunningServer) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as answer:
        text = answer.read().decode()
    return int(float(re.search(r"^tensorgate_connections_open (\S+)", text,
                               re.MULTILINE).group(1)))


def test_a_client_that_stops_reading_its_answers_is_closed_when_idle(
        impatient: RunningServer) -> None:
    """Requests sent and their answers never read: past the keep-alive timeout the server
    drops the connection and what it still held for it (closing alone waited for the client
    to read, for ever)."""
    one = binary_infer_request("wide", np.arange(150_000, dtype="<f4"))
    before = _open_connections(impatient)
    with _http(impatient) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        sock.setblocking(False)
        sent, deadline = 0, time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                offset = sent % len(one)
                sent += sock.send(one[offset:])
            except BlockingIOError:
                time.sleep(0.01)
        assert _open_connections(impatient) == before + 1
        deadline = time.monotonic() + 10
        while _open_connections(impatient) > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _open_connections(impatient) == before, "the unread connection stayed open"


def test_a_grpc_call_whose_message_stops_arriving_ends_with_deadline_exceeded(
        impatient: RunningServer) -> None:
    client = h2.H2Client(impatient.grpc_port)
    try:
        stream = client.call("ModelInfer", None, end_stream=False)  # headers only
        client.send(h2.DATA, 0, stream, b"\x00\x00\x10\x00\x00\x0a\x08ident")  # a 1 MiB one
        headers, _ = client.response(stream)
        assert headers["grpc-status"] == "4"
        assert re.fullmatch(STALL, headers["grpc-message"])
        # the connection is fine: a ping is answered
        client.send(h2.PING, 0, 0, b"still-up")
        frames = client.frames_until(lambda f: f.kind == h2.PING)
        assert frames[-1].payload == b"still-up"
    finally:
        client.close()
    _assert_serving(impatient)


def test_a_stream_with_a_stalled_request_ends_but_a_quiet_one_does_not(
        impatient: RunningServer) -> None:
    request = pb.ModelInferRequest(model_name="identity", id="ok")
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.extend([1, 3, 4])
    request.raw_input_contents.append(np.ones(12, np.float32).tobytes())
    message = request.SerializeToString()
    client = h2.H2Client(impatient.grpc_port)
    try:
        stream = client.call("ModelStreamInfer", message, end_stream=False)
        time.sleep(1.0)  # quiet between requests: allowed for as long as the client likes
        client.send(h2.DATA, 0, stream, b"\x00\x00\x00\x01\x00")  # half a request, then silence
        headers, data = client.response(stream)
    finally:
        client.close()
    answer = pb.ModelStreamInferResponse.FromString(data[5:])
    assert answer.infer_response.id == "ok"
    assert headers["grpc-status"] == "4"


def test_a_connection_that_never_sends_its_preface_is_closed(impatient: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", impatient.grpc_port), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n")  # a third of the preface, then nothing
        data = _read_all(sock)
    assert h2.GOAWAY in _frame_kinds(data)


def test_an_idle_grpc_connection_stays_open(impatient: RunningServer) -> None:
    client = h2.H2Client(impatient.grpc_port)
    try:
        client.send(h2.PING, 0, 0, b"first...")
        client.frames_until(lambda f: f.kind == h2.PING)
        time.sleep(1.5)  # past both timeouts, with no call open
        client.send(h2.PING, 0, 0, b"second..")
        frames = client.frames_until(lambda f: f.kind == h2.PING)
        assert frames and frames[-1].payload == b"second.."
    finally:
        client.close()


def _frame_kinds(data: bytes) -> list[int]:
    kinds = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        kinds.append(data[3])
        data = data[9 + length:]
    return kinds


def test_tritonclient_reconnects_after_its_idle_connection_was_closed(
        impatient: RunningServer) -> None:
    """tritonclient's HTTP clients (geventhttpclient, aiohttp) keep connections in a pool;
    one the server closed while idle must cost nothing but a new connection."""
    import asyncio

    import tritonclient.http as httpclient
    import tritonclient.http.aio as httpaio

    value = np.arange(12, dtype=np.float32).reshape(1, 3, 4)

    def request(module) -> list:
        item = module.InferInput("INPUT__0", [1, 3, 4], "FP32")
        item.set_data_from_numpy(value)
        return [item]

    client = httpclient.InferenceServerClient(impatient.url)
    try:
        for _ in range(2):
            assert client.infer("identity", request(httpclient)).as_numpy(
                "OUTPUT__0").tolist() == value.tolist()
            time.sleep(1.5)  # past the keep-alive timeout: the server closes the connection
    finally:
        client.close()

    async def scenario() -> None:
        async with httpaio.InferenceServerClient(impatient.url) as aio:
            for _ in range(2):
                result = await aio.infer("identity", request(httpaio))
                assert result.as_numpy("OUTPUT__0").tolist() == value.tolist()
                await asyncio.sleep(1.5)
    asyncio.run(asyncio.wait_for(scenario(), 30))


def _read_until_closed_or(sock: socket.socket, limit_s: float) -> bytes:
    """What arrives until the server closes, or `limit_s` passes."""
    try:
        return _read_all(sock, limit_s)
    except TimeoutError:
        return b""


def _trickle(server: RunningServer, length: int) -> socket.socket:
    """A request that announces a `length`-byte body and sends one byte of it."""
    sock = _http(server)
    sock.sendall(f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {length}\r\n\r\n{{".encode())
    return sock


def test_bodies_that_trickle_give_their_buffers_back_when_the_pool_is_full(
        e2e_repo, tmp_path) -> None:
    """Two requests announce 3 MiB bodies and send a byte: with a 6 MiB pool a third is
    refused 503 by name (not 'malformed'); a second later (their rate known) the next
    request's body takes the buffer of the slowest, which is answered 408 saying why."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--host-pool-bytes",
                          str(6 << 20), "--max-request-bytes", str(3 << 20))
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3, 4], "datatype": "FP32",
                                   "data": list(range(12))}]}).encode()
    small = (f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
             ).encode() + body
    slow: list[socket.socket] = []
    try:
        slow += [_trickle(server, 3 << 20) for _ in range(2)]
        time.sleep(0.3)
        with _trickle(server, 3 << 20) as third:
            answer = _read_all(third)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"host buffer pool is full" in answer
        time.sleep(1.0)
        with _http(server) as sock:
            sock.sendall(small)
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        refused = [_read_until_closed_or(sock, 2.0) for sock in slow]
        timed_out = [a for a in refused if a.startswith(b"HTTP/1.1 408")]
        assert len(timed_out) == 1, refused
        assert b"the request body arrives too slowly while the server's buffer pool is full" \
            in timed_out[0]
    finally:
        for sock in slow:
            sock.close()
        assert stop_server(server) == 0, server.log.read_text()


def test_a_trickling_grpc_message_gives_way_to_an_http_request(e2e_repo, tmp_path) -> None:
    """The same across front ends: a gRPC ModelInfer whose 3 MiB message stops after its
    first tensor's start, and an HTTP body that came faster, fill a 6 MiB pool; an HTTP
    request a second later takes the gRPC message's buffer (the slower), which ends
    DEADLINE_EXCEEDED saying why, while the HTTP body goes on arriving."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--host-pool-bytes",
                          str(6 << 20), "--max-request-bytes", str(3 << 20))
    request = pb.ModelInferRequest(model_name="wide")
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.append(700_000)
    request.raw_input_contents.append(bytes(2_800_000))
    message = request.SerializeToString()
    head = message[:len(message) - 2_800_000]  # every field up to the tensor's first byte
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3, 4], "datatype": "FP32",
                                   "data": list(range(12))}]}).encode()
    small = (f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
             ).encode() + body
    client = h2.H2Client(server.grpc_port)
    http_body = _trickle(server, 3 << 20)
    try:
        stream = client.call("ModelInfer", None, end_stream=False)
        client.send(h2.DATA, 0, stream, b"\x00" + len(message).to_bytes(4, "big") + head)
        http_body.sendall(b" " * (256 << 10))  # faster than the gRPC message
        time.sleep(1.2)
        with _http(server) as sock:
            sock.sendall(small)
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        headers, _ = client.response(stream)
        assert headers.get("grpc-status") == "4", headers  # DEADLINE_EXCEEDED
        assert "arrives too slowly while the server's buffer pool is full" in \
            urllib.parse.unquote(headers.get("grpc-message", "")), headers
        assert _read_until_closed_or(http_body, 0.5) == b""  # still being read
    finally:
        client.close()
        http_body.close()
        assert stop_server(server) == 0, server.log.read_text()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def test_chunked_bodies_are_answered_and_held_in_the_pool(e2e_repo, tmp_path) -> None:
    """A chunked request body (in pieces of any size) is answered as a sized one; such
    bodies take their memory from the pool (6 MiB here): two that have sent 1.5 MiB each (in
    buffers of 2 MiB, doubled as they fill) leave no room for a third's 2.5 MiB, refused 503
    by name, while the two are still read."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--host-pool-bytes",
                          str(6 << 20), "--max-request-bytes", str(3 << 20))
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3, 4], "datatype": "FP32",
                                   "data": list(range(12))}]}).encode()
    head = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nTransfer-Encoding: chunked\r\n")
    held: list[socket.socket] = []
    try:
        with _http(server) as sock:
            sock.sendall(head + b"Connection: close\r\n\r\n" + _chunk(body[:7])
                         + _chunk(body[7:40]) + _chunk(body[40:]) + b"0\r\n\r\n")
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == \
            list(range(12))
        for _ in range(2):
            sock = _http(server)
            held.append(sock)
            sock.sendall(head + b"\r\n" + b"".join(_chunk(b" " * (256 << 10))
                                                    for _ in range(6)))
        time.sleep(0.5)
        with _http(server) as sock:
            sock.sendall(head + b"\r\n" + _chunk(b" " * (5 << 19)))
            answer = _read_until_closed_or(sock, 5)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b"host buffer pool is full" in answer
        assert all(_read_until_closed_or(sock, 0.3) == b"" for sock in held)  # still read
    finally:
        for sock in held:
            sock.close()
        assert stop_server(server) == 0, server.log.read_text()
