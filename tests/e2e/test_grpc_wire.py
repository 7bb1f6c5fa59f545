"""The gRPC front end's own HTTP/2 on the wire: flow control both ways, errors as gRPC
statuses, hostile frames answered with GOAWAY or RST_STREAM while the server keeps serving,
and real grpcio clients with large, compressed and many concurrent calls."""

from __future__ import annotations

import asyncio
import gzip
import pathlib
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.e2e import h2_client as h2
from tests.pipeline import repo_builder as rb
from tests.e2e.conftest import (RunningServer, count_dropped, scrape, start_server, stop_server,
                                value)

INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 4, 5


def _wide_request(values: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="wide")
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.append(values.size)
    request.raw_input_contents.append(values.astype("<f4").tobytes())
    return request.SerializeToString()


def _output(data: bytes) -> bytes:
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    return pb.ModelInferResponse.FromString(data[5:]).raw_output_contents[0]


def _assert_serving(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        value = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
        item = grpcclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
        item.set_data_from_numpy(value)
        assert client.infer("identity", [item]).as_numpy("OUTPUT__0").tolist() == value.tolist()


def test_ping_is_acknowledged_with_its_payload(server: RunningServer) -> None:
    client = h2.H2Client(server.grpc_port)
    try:
        client.send(h2.PING, 0, 0, b"tgping!!")
        frames = client.frames_until(lambda f: f.kind == h2.PING)
        assert (frames[-1].flags, frames[-1].payload) == (h2.ACK, b"tgping!!")
    finally:
        client.close()


def test_unary_call_on_raw_frames(server: RunningServer) -> None:
    client = h2.H2Client(server.grpc_port)
    try:
        values = np.linspace(-1, 1, 5000, dtype=np.float32)
        headers, data = client.response(client.call("ModelInfer", _wide_request(values)))
        assert headers[":status"] == "200" and headers["grpc-status"] == "0"
        assert _output(data) == values.tobytes()
    finally:
        client.close()


def test_a_tensor_in_small_frames_is_copied_in_once(server: RunningServer) -> None:
    """16 KiB DATA frames (h2load's, grpc-go's) cannot be read in place: the tensor's bytes
    are copied from each frame into the message, and counted — all of them, once. The
    answer's frames are sent vectored, never joined (Python 3.11's asyncio joined them:
    one more copy of the tensor)."""
    client = h2.H2Client(server.grpc_port)
    try:
        values = np.linspace(-1, 1, 15_000, dtype=np.float32)  # 60 KB: 4 frames each way
        request = pb.ModelInferRequest(model_name="wide")
        request.ParseFromString(_wide_request(values))
        request.parameters["tensorgate_report_copies"].bool_param = True
        headers, data = client.response(client.call("ModelInfer",
                                                    request.SerializeToString()))
        assert headers["grpc-status"] == "0"
        response = pb.ModelInferResponse.FromString(data[5:])
        assert response.raw_output_contents[0] == values.tobytes()
        assert response.parameters["tensorgate_copied_bytes"].int64_param == values.nbytes
    finally:
        client.close()


def test_responses_wait_for_the_clients_window(server: RunningServer) -> None:
    """With a 1,000-byte stream window, the server sends 1,000 bytes and then waits for a
    WINDOW_UPDATE; it finishes the call once it has one."""
    client = h2.H2Client(server.grpc_port, settings={INITIAL_WINDOW_SIZE: 1000})
    try:
        values = np.arange(4000, dtype=np.float32)
        stream = client.call("ModelInfer", _wide_request(values))
        client.sock.settimeout(0.5)
        frames = []
        try:
            while True:
                frame = client.read_frame()
                assert frame is not None
                frames.append(frame)
        except TimeoutError:
            pass
        sent = sum(len(f.payload) for f in frames if f.kind == h2.DATA and f.stream == stream)
        assert sent == 1000
        assert not any(f.flags & h2.END_STREAM for f in frames if f.stream == stream)
        client.sock.settimeout(10)
        client.send(h2.WINDOW_UPDATE, 0, stream, struct.pack(">I", 1 << 20))
        headers, data = client.response(stream)
        assert headers["grpc-status"] == "0"
        assert _output(bytes(b"".join(f.payload for f in frames if f.kind == h2.DATA
                                      and f.stream == stream)) + data) == values.tobytes()
    finally:
        client.close()


@pytest.mark.parametrize("method, headers, message, code, text", [
    ("NoSuchMethod", [], b"", 12, r"unknown method /inference.GRPCInferenceService/NoSuchMethod"),
    ("ServerLive", [("grpc-encoding", "snappy")], b"", 12, r"grpc-encoding 'snappy'"),
    ("ServerLive", [("grpc-timeout", "soon")], b"", 13, r"grpc-timeout 'soon' is malformed"),
    ("ModelInfer", [], b"\x0a\xff", 3, r"ModelInferRequest is malformed"),
    ("ModelInfer", [], b"\x3b", 3, r"field 7 has wire type 3"),
    ("ModelMetadata", [], b"\x0a\x04nope", 5, r"unknown model 'nope'"),
    ("ModelInfer", [], pb.ModelInferRequest(model_name="identity", inputs=[
        pb.ModelInferRequest.InferInputTensor(name=f"x{i}", datatype="FP32", shape=[1])
        for i in range(5000)]).SerializeToString(), 3,
     r"^the request names 5,000 inputs; at most 4,096 are accepted$"),
    ("ModelInfer", [], pb.ModelInferRequest(model_name="identity", outputs=[
        pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT__0")] * 5000
    ).SerializeToString(), 3, r"^the request names 5,000 outputs; at most 4,096 are accepted$"),
])
def test_errors_are_grpc_statuses(server: RunningServer, method: str,
                                  headers: list[tuple[str, str]], message: bytes, code: int,
                                  text: str) -> None:
    client = h2.H2Client(server.grpc_port)
    try:
        answer, _ = client.response(client.call(method, message, headers))
        assert answer[":status"] == "200" and answer["grpc-status"] == str(code)
        assert __import__("re").search(text, answer["grpc-message"].replace("%27", "'"))
        # the connection carries on
        answer, data = client.response(client.call("ServerLive", b""))
        assert answer["grpc-status"] == "0" and pb.ServerLiveResponse.FromString(data[5:]).live
    finally:
        client.close()


def test_a_message_over_the_limit_is_refused_before_it_is_read(server: RunningServer) -> None:
    """The prefix announces 2 MiB (the limit is 1 MiB): RESOURCE_EXHAUSTED at once, and the
    stream is reset so the client stops sending."""
    client = h2.H2Client(server.grpc_port)
    try:
        stream = client.next_stream
        client.next_stream += 2
        client.send(h2.HEADERS, h2.END_HEADERS, stream, client.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":authority", "x"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            ("content-type", "application/grpc")]))
        client.send(h2.DATA, 0, stream, b"\x00" + (2 << 20).to_bytes(4, "big"))
        frames = client.frames_until(lambda f: f.kind == h2.RST_STREAM)
        answer = {}
        for frame in frames:
            if frame.kind == h2.HEADERS:
                answer.update((str(k), str(v)) for k, v in client.decoder.decode(frame.payload))
        assert answer["grpc-status"] == "8"
        assert "exceeds the 1048576-byte limit" in answer["grpc-message"]
        assert frames[-1].kind == h2.RST_STREAM and frames[-1].stream == stream
    finally:
        client.close()
    _assert_serving(server)


@pytest.mark.parametrize("frames, code", [
    ([b"GET / HTTP/1.1\r\n\r\n" + b"\x00" * 16], 1),                   # not HTTP/2
    ([h2.H2Client.frame(h2.DATA, 0, 1, b"")], 1),                        # DATA on an idle stream
    ([h2.H2Client.frame(h2.PING, 0, 0, b"short")], 6),                   # PING not 8 bytes
    ([(2 << 20).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01"], 6),  # DATA over 1 MiB
    ([(100_000).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x01"], 11),  # HEADERS of 100 KB
    ([h2.H2Client.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff")], 9),  # bad HPACK
    ([h2.H2Client.frame(h2.HEADERS, 0, 1, b"\x82"),
      h2.H2Client.frame(h2.PING, 0, 0, b"12345678")], 1),              # interrupted block
    ([h2.H2Client.frame(h2.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff")], 3),  # window overflow
    ([h2.H2Client.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", MAX_FRAME_SIZE, 10))], 1),
    ([h2.H2Client.frame(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00\x00\x00\x02")], 1),
])
def test_protocol_errors_end_the_connection_with_goaway(server: RunningServer,
                                                        frames: list[bytes], code: int) -> None:
    preface = b"" if frames[0].startswith(b"GET") else h2.PREFACE
    client = h2.H2Client(server.grpc_port, preface=preface)
    try:
        for raw in frames:
            client.sock.sendall(raw)
        got = client.frames_until(lambda f: f.kind == h2.GOAWAY)
        assert h2.goaway_code(got) == code
        assert client.read_frame() is None  # and closed
    finally:
        client.close()
    _assert_serving(server)


def test_a_reset_call_is_dropped_and_the_connection_serves_on(server: RunningServer) -> None:
    client = h2.H2Client(server.grpc_port)
    try:
        request = pb.ModelInferRequest(model_name="slow")
        item = request.inputs.add(name="INPUT__0", datatype="FP32")
        item.shape.extend([1, 4])
        request.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        stream = client.call("ModelInfer", request.SerializeToString())
        client.send(h2.RST_STREAM, 0, stream, struct.pack(">I", 8))  # CANCEL
        answer, data = client.response(client.call("ServerReady", b""))
        assert answer["grpc-status"] == "0" and pb.ServerReadyResponse.FromString(data[5:]).ready
    finally:
        client.close()
    _assert_serving(server)


@pytest.mark.parametrize("flood", ["rapid reset", "made reset", "priority frames",
                                   "continuations"])
def test_a_flooding_client_is_closed_and_others_are_served(server: RunningServer,
                                                           flood: str) -> None:
    """Calls opened and reset at once (HTTP/2 "rapid reset", CVE-2023-44487), or each broken
    by its client so that the server resets it ("MadeYouReset", CVE-2025-8671), or frames that
    ask for nothing (PRIORITY), are never held back by the concurrent limit or a reply: in
    one stream of bytes; or a header block never ended, its CONTINUATION frames empty
    (CVE-2024-27316). While they come, another connection's calls are answered (a
    connection parses at most 8 new streams a turn of the loop until its streams are
    answered, and 128 frames that carry nothing: one such client kept every other waiting
    0.5-5.3 s, bench/RESULTS.md), and past 1,280 wasted streams, 10,000 empty frames or a
    block's 16 CONTINUATIONs the client is told ENHANCE_YOUR_CALM and closed, and the
    metrics count it. (It floods from 127.0.0.2, so that the connections from 127.0.0.1 that
    later tests make do not start on probation.)"""
    floods = _flooding_connections(server)
    attacker = h2.H2Client(server.grpc_port, source="127.0.0.2")
    other = h2.H2Client(server.grpc_port)
    try:
        block = attacker.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":authority", "x"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            ("content-type", "application/grpc"), ("te", "trailers")])
        if flood == "rapid reset":
            data = attacker.streams(1, 3000, block, reset=True)
        elif flood == "made reset":  # a WINDOW_UPDATE of 0 on each: a stream error
            data = b"".join(attacker.frame(h2.HEADERS, h2.END_HEADERS, stream, block)
                            + attacker.frame(h2.WINDOW_UPDATE, 0, stream, b"\0\0\0\0")
                            for stream in range(1, 6000, 2))
        elif flood == "priority frames":
            data = attacker.frame(h2.PRIORITY, 0, 1, b"\0\0\0\0\x10") * 30_000
        else:
            data = (attacker.frame(h2.HEADERS, 0, 1, block)
                    + attacker.frame(h2.CONTINUATION, 0, 1, b"") * 30_000)
        sender = threading.Thread(target=_send_all, args=(attacker.sock, data))
        sender.start()
        answer, reply = other.response(other.call("ServerReady", b""))
        assert answer["grpc-status"] == "0" and pb.ServerReadyResponse.FromString(reply[5:]).ready
        sender.join(timeout=30)
        got = attacker.frames_until(lambda f: f.kind == h2.GOAWAY)
        assert h2.goaway_code(got) == 0xb  # ENHANCE_YOUR_CALM
        assert {"rapid reset": b"streams refused or reset unanswered",
                "made reset": b"reset unanswered (the last a WINDOW_UPDATE of 0)",
                "priority frames": b"frames that carry nothing",
                "continuations": b"in more than 16 CONTINUATION frames"}[flood] \
            in got[-1].payload[8:]
    finally:
        attacker.close()
        other.close()
    _assert_serving(server)
    assert _flooding_connections(server) == floods + 1


def test_an_address_that_flooded_has_its_next_connections_start_on_probation(
        server: RunningServer) -> None:
    """Rapid reset from 127.0.0.3 until the server ends the connection; the client's next
    connection from that address starts on probation (one new stream a turn of the loop
    until it has earned its streams: a client connecting again whenever closed cost every
    other ten times its P50, bench/RESULTS.md), counted, and its calls are still answered:
    many clients may share an address. A connection from another address is not."""
    h2.flood_until_told_to_calm_down(server.grpc_port, "127.0.0.3")
    on_probation = _flooding_connections(server, "probation")
    for source, more in (("127.0.0.3", 1), ("127.0.0.4", 0), ("127.0.0.3", 1)):
        client = h2.H2Client(server.grpc_port, source=source)
        try:
            for _ in range(3):
                answer, reply = client.response(client.call("ServerReady", b""))
                assert answer["grpc-status"] == "0"
                assert pb.ServerReadyResponse.FromString(reply[5:]).ready
        finally:
            client.close()
        assert _flooding_connections(server, "probation") == on_probation + more, source
        on_probation += more


def test_with_flood_probation_off_no_connection_starts_on_probation(
        tmp_path: pathlib.Path) -> None:
    """--grpc-flood-probation-s 0 (every client behind one proxy that bounds floods itself):
    a flood is still ended and counted, and the client's next connection is not on
    probation."""
    rb.add_torchscript(tmp_path, "identity", rb.Identity(), [4], [4])
    server = start_server(tmp_path, tmp_path / "server.log", "--grpc-flood-probation-s", "0")
    try:
        for _ in range(2):
            h2.flood_until_told_to_calm_down(server.grpc_port, "127.0.0.5")
        assert _flooding_connections(server) == 2
        assert _flooding_connections(server, "probation") == 0
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def _flooding_connections(server: RunningServer, which: str = "flooding") -> int:
    found = re.search(rf"^tensorgate_connections_{which}_total (\d+)$", scrape(server), re.M)
    assert found is not None
    return int(found.group(1))


def _send_all(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # closed by the server midway (its GOAWAY was written first)
        pass


frame_kinds = st.sampled_from([h2.DATA, h2.HEADERS, h2.PRIORITY, h2.RST_STREAM, h2.SETTINGS,
                               h2.PUSH_PROMISE, h2.PING, h2.GOAWAY, h2.WINDOW_UPDATE,
                               h2.CONTINUATION, 0x0b, 0xff])
frames = st.lists(st.tuples(frame_kinds, st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 5]),
                            st.binary(max_size=40)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=frames)
def test_hostile_frames_never_take_the_server_down(server: RunningServer,
                                                   sequence: list[tuple[int, int, int, bytes]]
                                                   ) -> None:
    """Any frames after a valid preface: the server answers, resets or says GOAWAY, and the
    next client is served."""
    client = h2.H2Client(server.grpc_port, timeout_s=5)
    try:
        for kind, flags, stream, payload in sequence:
            client.send(kind, flags, stream, payload)
        client.send(h2.PING, 0, 0, b"finished")
        client.frames_until(lambda f: f.kind in (h2.GOAWAY,) or
                            (f.kind == h2.PING and f.payload == b"finished"), limit_s=5)
    except (ConnectionError, TimeoutError):
        pass  # the server may close on us mid-send
    finally:
        client.close()
    with grpcclient.InferenceServerClient(server.grpc_url) as ok:
        assert ok.is_server_live()


def test_large_tensor_through_grpcio_flow_control(server: RunningServer) -> None:
    """900 KB each way: far past grpcio's initial 64 KiB windows, so both sides wait for
    WINDOW_UPDATEs mid-message."""
    values = np.random.default_rng(5).standard_normal(225_000).astype(np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        item = grpcclient.InferInput("INPUT__0", [values.size], "FP32")
        item.set_data_from_numpy(values)
        for _ in range(3):
            result = client.infer("wide", [item])
            assert result.as_numpy("OUTPUT__0").tobytes() == values.tobytes()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(server: RunningServer, algorithm: str) -> None:
    values = np.zeros(50_000, np.float32)
    values[::7] = 3.5
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        item = grpcclient.InferInput("INPUT__0", [values.size], "FP32")
        item.set_data_from_numpy(values)
        result = client.infer("wide", [item], compression_algorithm=algorithm)
        assert result.as_numpy("OUTPUT__0").tobytes() == values.tobytes()


def test_more_concurrent_calls_than_streams_allowed(server: RunningServer) -> None:
    """300 calls on one channel: grpcio queues what exceeds our 128 concurrent streams."""
    async def scenario() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            async def one(i: int) -> None:
                value = np.full((1, 3, 4), i, np.float32)
                item = grpcaio.InferInput("INPUT__0", [1, 3, 4], "FP32")
                item.set_data_from_numpy(value)
                result = await client.infer("identity", [item])
                assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()
            await asyncio.gather(*(one(i) for i in range(300)))
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_call_in_flight_finishes_during_shutdown(e2e_repo, tmp_path) -> None:
    """SIGTERM while a 0.3 s call runs: it is answered (GOAWAY stops new calls only)."""
    running = start_server(e2e_repo, tmp_path / "server.log")
    outcome: dict[str, object] = {}

    def call() -> None:
        with grpcclient.InferenceServerClient(running.grpc_url) as client:
            item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
            item.set_data_from_numpy(np.ones((1, 4), np.float32))
            try:
                outcome["result"] = client.infer("slow", [item]).as_numpy("OUTPUT__0")
            except InferenceServerException as error:
                outcome["error"] = error

    worker = threading.Thread(target=call)
    worker.start()
    running_call = re.compile(r'^tensorgate_model_call_seconds\{model="slow"[^}]*\} (?!0$)', re.M)
    deadline = time.monotonic() + 10  # until the call runs (a fixed 0.15 s was too short
    while time.monotonic() < deadline and not running_call.search(scrape(running)):
        time.sleep(0.01)  # on a loaded machine: the call came after the GOAWAY)
    assert stop_server(running) == 0
    worker.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].shape == (1, 4)


def test_large_frames_are_received_in_place(server: RunningServer) -> None:
    """grpcio sends a 900 KB tensor in frames far larger than 16 KiB; their payloads are
    read straight into the message buffer, so only the first few KiB are copied (counted).
    Best of five calls: grpcio may split a message into smaller frames now and then."""
    values = np.random.default_rng(9).standard_normal(225_000).astype(np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        copied = copied_per_call(client, values)
    assert min(copied) <= 64 << 10, copied


def copied_per_call(client: grpcclient.InferenceServerClient, values: np.ndarray,
                    calls: int = 5) -> list[int]:
    """`values` through `wide` `calls` times, each answer checked: the bytes the server
    copied for each call (its tensorgate_copied_bytes)."""
    item = grpcclient.InferInput("INPUT__0", [values.size], "FP32")
    item.set_data_from_numpy(values)
    copied = []
    for _ in range(calls):
        result = client.infer("wide", [item], parameters={"tensorgate_report_copies": True})
        assert result.as_numpy("OUTPUT__0").tobytes() == values.tobytes()
        copied.append(result.get_response().parameters["tensorgate_copied_bytes"].int64_param)
    return copied


def test_a_message_announced_large_costs_only_what_arrives(server: RunningServer) -> None:
    """20 calls (not ModelInfer: their messages are not placed) each announce a 1 MiB
    message in 5 bytes and send no more: the server's memory grows by what came, not by
    what was announced (it grew by 550 MB for 20 × 64 MiB), and it serves on."""
    def rss_mb() -> float:
        with open(f"/proc/{server.process.pid}/status") as status:
            return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024
    before = rss_mb()
    client = h2.H2Client(server.grpc_port)
    try:
        for _ in range(20):
            stream = client.call("ModelMetadata", None, end_stream=False)
            client.send(h2.DATA, 0, stream, b"\x00" + (1 << 20).to_bytes(4, "big") + b"\x0a")
        client.send(h2.PING, 0, 0, bytes(8))  # answered once the DATA before it is read
        client.frames_until(lambda frame: frame.kind == h2.PING)
        assert rss_mb() - before < 10, f"{rss_mb() - before:.0f} MB for 100 bytes sent"
    finally:
        client.close()
    _assert_serving(server)


def _non_reader(server: RunningServer, values: np.ndarray) -> h2.H2Client:
    """A connection that grants the largest windows, calls `wide` with `values` and reads
    nothing (yet): its 64 KiB receive buffer fills at once."""
    client = h2.H2Client(server.grpc_port, settings={INITIAL_WINDOW_SIZE: (1 << 31) - 1})
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    client.send(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65_535))
    client.call("ModelInfer", _wide_request(values))
    return client


def test_answers_a_client_grants_windows_for_but_does_not_read_wait_in_the_pool(
        e2e_repo, tmp_path) -> None:
    """Three connections grant the largest windows, ask for 12 MB answers and read none:
    what the socket cannot take waits in the answers' pooled views (bounded by the pool);
    at most a slice is copied into the transport's buffer (every answer was, whole, outside
    the pool: 10 such clients of 30 MB answers held 355 MB). A closed connection gives its
    answer back, and so does a call its client resets. Read at last, the last answer is
    whole."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes",
                          str(32 << 20))
    values = np.arange(3_000_000, dtype=np.float32)
    clients = []
    try:
        for _ in range(3):
            clients.append(_non_reader(server, values))
        time.sleep(0.5)
        metrics = scrape(server)
        assert value(metrics, "tensorgate_pool_bytes", state="in_use") >= 3 * values.nbytes
        assert value(metrics, "tensorgate_copies_by_reason_bytes_total", 0,
                     reason="send") <= 3 * ((1 << 20) + (64 << 10))
        clients.pop().close()
        deadline = time.monotonic() + 5
        while value(scrape(server), "tensorgate_pool_bytes", state="in_use") \
                >= 3 * values.nbytes:
            assert time.monotonic() < deadline, "a closed connection kept its answer"
            time.sleep(0.1)
        # a call reset by its client (RST_STREAM CANCEL) lets its unsent answer go
        clients[-1].send(h2.RST_STREAM, 0, 1, struct.pack(">I", 8))
        deadline = time.monotonic() + 5
        while value(scrape(server), "tensorgate_pool_bytes", state="in_use") \
                >= 2 * values.nbytes:
            assert time.monotonic() < deadline, "a reset call kept its answer"
            time.sleep(0.1)
        for client in clients[:-1]:
            client.sock.settimeout(30)
            headers, data = client.response(1, limit_s=30)
            assert headers["grpc-status"] == "0" and _output(data) == values.tobytes()
    finally:
        for client in clients:
            client.close()
        stop_server(server)



def test_unread_answers_give_way_when_the_pool_is_full(e2e_repo, tmp_path) -> None:
    """A 44 MiB pool: three connections that grant windows and read none of their 12 MB
    answers hold 36 MiB of it. A fourth client's 12 MB call does not fit: an unread
    answer's connection is dropped (none of its DATA taken for 2 s), one is enough, and the
    call is served. Before, gRPC's unread answers never gave way: the call was refused."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes",
                          str(32 << 20), "--host-pool-bytes", str(44 << 20))
    values = np.arange(3_000_000, dtype=np.float32)
    stalled = []
    try:
        for _ in range(3):
            stalled.append(_non_reader(server, values))
        time.sleep(3.5)  # unread for 2 s or more, with room for a slow machine
        assert value(scrape(server), "tensorgate_pool_bytes", state="in_use") >= 3 * values.nbytes
        with grpcclient.InferenceServerClient(server.grpc_url) as reader:
            item = grpcclient.InferInput("INPUT__0", [values.size], "FP32")
            item.set_data_from_numpy(values)
            assert reader.infer("wide", [item]).as_numpy("OUTPUT__0").tobytes() \
                == values.tobytes()
        # one answer's room was all the call needed
        assert count_dropped([client.sock for client in stalled]) == 1
        assert "unread answers refused" in server.log.read_text()
    finally:
        for client in stalled:
            client.close()
        stop_server(server)


def test_a_truncated_compressed_message_is_named(server: RunningServer) -> None:
    client = h2.H2Client(server.grpc_port)
    try:
        stream = client.call("ServerMetadata", None, [("grpc-encoding", "gzip")])
        packed = gzip.compress(b"\x00" * 64)[:-12]  # its end, and the gzip trailer, cut
        client.send(h2.DATA, h2.END_STREAM, stream,
                    b"\x01" + len(packed).to_bytes(4, "big") + packed)
        answer, _ = client.response(stream)
        assert answer["grpc-status"] == "3"
        assert answer["grpc-message"].replace("%3A", ":") == (
            "the gzip message is truncated: it ends before its compressed stream does")
    finally:
        client.close()
    _assert_serving(server)
