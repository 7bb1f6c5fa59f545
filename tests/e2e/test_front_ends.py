"""Triton's --allow-http / --allow-grpc and the per-protocol addresses: a protocol turned off
is not listened for, the other serves, and the metrics port follows its own setting; an
IPv6 address serves all three."""

from __future__ import annotations

import pathlib
import socket
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import scrape, start_server, stop_server
from tests.pipeline import repo_builder as rb


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("front_ends") / "models"
    rb.add_torchscript(root, "identity", rb.Identity(), [4], [4])
    return root


def _start_line(log: pathlib.Path) -> str:
    return next(line for line in log.read_text().splitlines() if " on 127.0.0.1:" in line)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def test_grpc_off_serves_http_only(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    server = start_server(repo, tmp_path / "server.log", "--allow-grpc", "false")
    try:
        line = _start_line(server.log)
        assert "gRPC off" in line and "HTTP on 127.0.0.1:" in line, line
        item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        with httpclient.InferenceServerClient(server.url) as client:
            result = client.infer("identity", [item]).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(result, np.arange(4, dtype=np.float32).reshape(1, 4))
        assert 'nv_inference_request_success{model="identity",version="1"} 1' in _metrics(
            server.metrics_port)
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_http_off_serves_grpc_only(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # a free port the server is told to use for HTTP: with HTTP off nothing may listen there
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    server = start_server(repo, tmp_path / "server.log", "--allow-http", "false",
                          "--http-port", str(http_port))
    try:
        line = _start_line(server.log)
        assert "HTTP off" in line and "gRPC on 127.0.0.1:" in line, line
        with pytest.raises(ConnectionRefusedError), \
                socket.create_connection(("127.0.0.1", http_port), timeout=5):
            pass
        item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), np.float32))
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.is_server_ready()
            assert client.infer("identity", [item]).as_numpy("OUTPUT__0").sum() == 4
        assert "nv_inference_request_success" in _metrics(server.metrics_port)
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_each_protocol_binds_its_own_address(repo: pathlib.Path, tmp_path: pathlib.Path
                                             ) -> None:
    # --host says 0.0.0.0 (every interface); each protocol's own address overrides it, so
    # nothing here listens beyond the loopback interface
    server = start_server(repo, tmp_path / "server.log", "--host", "0.0.0.0",
                          "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                          "--metrics-address", "127.0.0.1")
    try:
        line = _start_line(server.log)
        assert "0.0.0.0" not in line, line
        with httpclient.InferenceServerClient(server.url) as http, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            assert http.is_server_ready() and grpc.is_server_ready()
        assert "nv_inference_request_success" in _metrics(server.metrics_port)
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_an_ipv6_address_serves_http_grpc_and_metrics(repo: pathlib.Path,
                                                       tmp_path: pathlib.Path) -> None:
    """`--host ::1` (dual-stack clusters bind `::`): the start line writes the address as a
    URL does, and tritonclient's HTTP and gRPC clients and a scrape reach it."""
    server = start_server(repo, tmp_path / "server.log", "--host", "::1")
    try:
        assert server.host == "[::1]"
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            item = module.InferInput("INPUT__0", [1, 4], "FP32")
            item.set_data_from_numpy(value)
            with module.InferenceServerClient(url) as client:
                answer = client.infer("identity", [item]).as_numpy("OUTPUT__0")
            assert answer.tolist() == value.tolist()
        assert "nv_inference_request_success" in scrape(server)
    finally:
        assert stop_server(server) == 0, server.log.read_text()
