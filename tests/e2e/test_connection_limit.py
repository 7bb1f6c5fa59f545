"""--max-connections: past the limit (HTTP and gRPC together) a new connection is answered at
once (HTTP 503 naming the flag, gRPC UNAVAILABLE) and closed; connections already open keep
being served, and a closed one frees its place."""

from __future__ import annotations

import pathlib
import re
import socket
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb

LIMIT = 3


def _infer_http(url: str) -> np.ndarray:
    with httpclient.InferenceServerClient(url, network_timeout=10) as client:
        item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer("a", [item]).as_numpy("OUTPUT__0")


def _refused_total(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(re.search(r"^tensorgate_connections_refused_total (\d+)$", text, re.M).group(1))


def test_connections_past_the_limit_are_refused_and_places_free_up(
        tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path / "models", "a", max_batch=4)
    server = start_server(tmp_path / "models", tmp_path / "server.log",
                          "--max-connections", str(LIMIT))
    held: list[socket.socket] = []
    try:
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc_client.is_server_live()  # one gRPC connection, open from now on
        for _ in range(LIMIT - 1):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(0.2)  # the server has accepted them
        with pytest.raises(InferenceServerException) as refused:
            _infer_http(server.url)
        assert refused.value.status() == "503"
        assert f"its limit (--max-connections {LIMIT})" in refused.value.message()
        # its own connection: grpcio otherwise shares one between channels to one address
        with grpcclient.InferenceServerClient(
                server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)]) as second:
            with pytest.raises(InferenceServerException) as refused_grpc:
                second.is_server_live(client_timeout=10)
        assert refused_grpc.value.status() == "StatusCode.UNAVAILABLE"  # at once, not at
        # the deadline: grpcio sees a failed handshake
        # the connection admitted before the limit is still served
        item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert grpc_client.infer("a", [item]).as_numpy("OUTPUT__0")[0, 0] == 3.0
        assert _refused_total(server.metrics_port) >= 2
        assert "refusing new connections: 3 open" in server.log.read_text()
        held.pop().close()  # a place frees up
        deadline = time.monotonic() + 10
        while True:
            try:
                assert _infer_http(server.url)[0, 0] == 3.0
                break
            except InferenceServerException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        grpc_client.close()
    finally:
        for sock in held:
            sock.close()
        assert stop_server(server) == 0
