"""The server on each event loop it runs on (`--loop uvloop`, the default where uvloop is
installed, and `--loop asyncio`): every place that touches a transport works with both, whose
classes are not one another's subclasses (an `isinstance` check refused every metrics scrape
and every connection past --max-connections on uvloop, unseen while the tests ran on asyncio
alone; now the rest of the suite runs on uvloop, and this keeps asyncio served)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import (RunningServer, binary_infer_request, read_answer, scrape,
                                start_server, stop_server, value)
from tests.pipeline import repo_builder as rb

LIMIT = 4


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    root = tmp_path_factory.mktemp(request.param)
    rb.add_torchscript(root / "models", "wide", rb.Identity(), [-1], [-1], max_batch=0)
    running = start_server(root / "models", root / "server.log", "--loop", request.param,
                           "--max-connections", str(LIMIT), "--max-request-bytes",
                           str(32 << 20))
    yield running
    stop_server(running)
    assert "Traceback" not in running.log.read_text()


def test_it_runs_on_the_loop_asked_for_and_serves_both_protocols(server: RunningServer,
                                                                 request: pytest.FixtureRequest
                                                                 ) -> None:
    loop = request.node.callspec.params["server"]
    assert f"\nevent loop: {loop} (--loop)\n" in server.log.read_text()
    values = np.arange(10, dtype=np.float32)
    with httpclient.InferenceServerClient(server.url) as http:
        item = httpclient.InferInput("INPUT__0", [10], "FP32")
        item.set_data_from_numpy(values)
        assert http.infer("wide", [item]).as_numpy("OUTPUT__0").tolist() == values.tolist()
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        item = grpcclient.InferInput("INPUT__0", [10], "FP32")
        item.set_data_from_numpy(values)
        assert grpc.infer("wide", [item]).as_numpy("OUTPUT__0").tolist() == values.tolist()
    assert value(scrape(server), "nv_inference_request_success", model="wide", version="1") >= 2


def test_a_connection_past_the_limit_is_answered_503(server: RunningServer) -> None:
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
            for _ in range(LIMIT)]
    try:
        time.sleep(0.2)  # accepted
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = extra.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"--max-connections" in answer
    finally:
        for connection in held:
            connection.close()
    deadline = time.monotonic() + 10
    while re.search(r"^tensorgate_connections_open 0$", scrape(server), re.M) is None:
        assert time.monotonic() < deadline, "the held connections were not closed"
        time.sleep(0.1)


def test_an_answer_its_client_does_not_read_waits_in_the_pool(server: RunningServer) -> None:
    values = np.arange(3_000_000, dtype="<f4")
    request = binary_infer_request("wide", values)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        connection.sendall(request)
        time.sleep(0.5)
        assert value(scrape(server), "tensorgate_pool_bytes", state="in_use") >= values.nbytes
        head, body = read_answer(connection)
        assert head.startswith(b"HTTP/1.1 200") and body.endswith(values.tobytes())


def test_refused_inference_keeps_it_serving(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as http:
        item = httpclient.InferInput("INPUT__0", [2, 2], "FP32")
        item.set_data_from_numpy(np.ones((2, 2), np.float32))
        with pytest.raises(InferenceServerException, match="shape"):
            http.infer("wide", [item])
        assert http.is_server_live()
