"""Triton's gRPC keepalive flags: a quiet connection is sent a PING (while a call is open on
it, or idle too when permitted), closed when the PING goes unanswered, and its calls given
up; clients that answer (grpcio's, tritonclient's) carry on. A client that PINGs too often
with no data between is told GOAWAY "too_many_pings" and closed, as gRPC's servers tell it
(grpcio then PINGs half as often, and its calls carry on)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e import h2_client as h2
from tests.e2e.conftest import RunningServer, scrape, start_server, stop_server


def _closed(server: RunningServer, metric: str = "keepalive_closed") -> int:
    found = re.search(rf"^tensorgate_connections_{metric}_total (\d+)$", scrape(server), re.M)
    assert found, f"no tensorgate_connections_{metric}_total"
    return int(found.group(1))


def _pings(client: h2.H2Client, limit_s: float, answer: bool) -> tuple[list[float], bool]:
    """The times (from now) the server's PINGs came within `limit_s`, each answered if
    `answer`, and whether the server closed the connection meanwhile."""
    began = time.monotonic()
    seen = []
    client.sock.settimeout(0.05)
    while time.monotonic() - began < limit_s:
        try:
            frame = client.read_frame()
        except TimeoutError:
            continue
        if frame is None:
            return seen, True
        if frame.kind == h2.PING and not frame.flags & h2.ACK:
            seen.append(time.monotonic() - began)
            if answer:
                client.send(h2.PING, h2.ACK, 0, frame.payload)
    return seen, False


@pytest.fixture(scope="module")
def idle(fast_and_slow: pathlib.Path, tmp_path_factory: pytest.TempPathFactory):
    """Idle connections pinged after 300 ms quiet, given 400 ms to answer, no bound on the
    PINGs without data; nor on the client's own (test_a_connection_read_from_is_not_pinged
    PINGs every 100 ms)."""
    log = tmp_path_factory.mktemp("idle") / "server.log"
    server = start_server(fast_and_slow, log, "--grpc-keepalive-time", "300", "--grpc-keepalive-timeout",
                          "400", "--grpc-keepalive-permit-without-calls", "true",
                          "--grpc-http2-max-pings-without-data", "0",
                          "--grpc-http2-max-ping-strikes", "0")
    yield server
    assert stop_server(server) == 0, log.read_text()


def test_a_quiet_connection_is_pinged_and_closed_when_it_does_not_answer(
        idle: RunningServer) -> None:
    before = _closed(idle)
    client = h2.H2Client(idle.grpc_port)
    try:
        pings, closed = _pings(client, 1.5, answer=True)
        assert not closed and len(pings) >= 3, pings  # every ~0.3 s of quiet, answered
        assert 0.2 <= pings[0] <= 0.3 + 0.3, pings
        pings, closed = _pings(client, 3.0, answer=False)
        assert closed and len(pings) == 1, pings  # one unanswered, then the close
    finally:
        client.close()
    assert _closed(idle) == before + 1
    with grpcclient.InferenceServerClient(idle.grpc_url) as ok:  # and it serves on
        assert ok.is_server_live()


def test_a_connection_read_from_is_not_pinged(idle: RunningServer) -> None:
    """Reads put the next PING off: a client that sends every 100 ms is never pinged."""
    client = h2.H2Client(idle.grpc_port)
    try:
        client.sock.settimeout(0.05)
        seen = []
        began = time.monotonic()
        while time.monotonic() - began < 1.2:
            client.send(h2.PING, 0, 0, b"12345678")
            deadline = time.monotonic() + 0.1
            while time.monotonic() < deadline:
                try:
                    frame = client.read_frame()
                except TimeoutError:
                    continue
                if frame is not None and frame.kind == h2.PING and not frame.flags & h2.ACK:
                    seen.append(frame)
        assert seen == []
    finally:
        client.close()


def test_clients_that_answer_carry_on_across_pings(idle: RunningServer) -> None:
    before = _closed(idle)
    with grpcclient.InferenceServerClient(idle.grpc_url) as client:
        x = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("fast", [x]).as_numpy("OUTPUT__0") is not None
        time.sleep(1.5)  # a few PINGs, which grpcio answers
        assert client.infer("fast", [x]).as_numpy("OUTPUT__0") is not None
    assert _closed(idle) == before


def test_without_permission_only_connections_with_a_call_open_are_pinged(
        fast_and_slow: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Triton's defaults but for the times: an idle connection is left alone; one waiting
    on a 1.5 s call is pinged, at most 2 PINGs with no response sent between them."""
    server = start_server(fast_and_slow, tmp_path / "server.log", "--grpc-keepalive-time", "200",
                          "--grpc-keepalive-timeout", "5000")
    client = h2.H2Client(server.grpc_port)
    try:
        headers, _ = client.response(client.call("ServerLive", b""))
        assert headers["grpc-status"] == "0"
        pings, closed = _pings(client, 1.0, answer=True)
        assert (pings, closed) == ([], False)  # idle: no PING
        client.call("ModelInfer", h2.infer_message("slow"))
        pings, closed = _pings(client, 1.2, answer=True)
        assert not closed and len(pings) == 2, pings  # then the bound: no response between
    finally:
        client.close()
        assert stop_server(server) == 0, server.log.read_text()


@pytest.fixture(scope="module")
def tritons(fast_and_slow: pathlib.Path, tmp_path_factory: pytest.TempPathFactory):
    """Triton's defaults: a client's PING within 300 s of its last (2 h with no call open)
    with no data between is a strike, and 2 are allowed."""
    log = tmp_path_factory.mktemp("tritons") / "server.log"
    server = start_server(fast_and_slow, log)
    yield server
    assert stop_server(server) == 0, log.read_text()


def test_a_client_that_pings_too_often_is_told_too_many_pings(tritons: RunningServer) -> None:
    """Its first PING is answered, and two more; the fourth (answered too) ends the
    connection: GOAWAY ENHANCE_YOUR_CALM "too_many_pings", counted as a flood. Other
    clients are served."""
    before = _closed(tritons, "flooding")
    client = h2.H2Client(tritons.grpc_port)
    try:
        for number in range(4):
            client.send(h2.PING, 0, 0, number.to_bytes(8, "big"))
        frames = []
        while (frame := client.read_frame()) is not None:
            frames.append(frame)
    finally:
        client.close()
    acks = [f.payload for f in frames if f.kind == h2.PING and f.flags & h2.ACK]
    goaways = [f.payload for f in frames if f.kind == h2.GOAWAY]
    assert acks == [n.to_bytes(8, "big") for n in range(4)]
    assert len(goaways) == 1 and int.from_bytes(goaways[0][4:8], "big") == 0xb
    assert goaways[0][8:] == b"too_many_pings"
    assert _closed(tritons, "flooding") == before + 1
    with grpcclient.InferenceServerClient(tritons.grpc_url) as other:
        assert other.is_server_live()


def test_grpcio_told_too_many_pings_pings_less_and_its_calls_carry_on(
        tritons: RunningServer) -> None:
    """grpcio PINGs an idle connection every second at most, whatever keepalive time it is
    given: its fourth PING, with no call between, gets the GOAWAY; it reconnects for its next
    call (which is answered) and doubles its keepalive time, as it does with gRPC's own
    servers."""
    before = _closed(tritons, "flooding")
    keepalive = grpcclient.KeepAliveOptions(keepalive_time_ms=200, keepalive_timeout_ms=5000,
                                            keepalive_permit_without_calls=True,
                                            http2_max_pings_without_data=0)
    x = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    with grpcclient.InferenceServerClient(tritons.grpc_url, keepalive_options=keepalive) as client:
        assert client.infer("fast", [x]).as_numpy("OUTPUT__0") is not None
        deadline = time.monotonic() + 15.0
        while _closed(tritons, "flooding") == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _closed(tritons, "flooding") == before + 1
        assert client.infer("fast", [x]).as_numpy("OUTPUT__0") is not None


def test_the_flags_are_checked() -> None:
    for flag, value, said in (("--grpc-keepalive-time", "0", "grpc_keepalive_time_ms must be 1"),
                              ("--grpc-http2-max-pings-without-data", "-1",
                               "grpc_http2_max_pings_without_data must be 0"),
                              ("--grpc-http2-max-ping-strikes", "-1",
                               "grpc_http2_max_ping_strikes must be 0"),
                              ("--grpc-http2-min-recv-ping-interval-without-data", "-5",
                               "grpc_http2_min_recv_ping_interval_without_data_ms must be 0")):
        answer = subprocess.run([sys.executable, "-m", "tensorgate", "serve", flag, value],
                                capture_output=True, text=True, timeout=60)
        assert answer.returncode == 2 and said in answer.stderr, answer.stderr
