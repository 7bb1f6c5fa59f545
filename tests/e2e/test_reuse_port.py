"""Triton's --reuse-http-port and --reuse-grpc-port: servers started with them listen on one
port together, the kernel spreading new connections among them, each answering with its own
models; a server with the flag is not let onto a port held without it."""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import (RunningServer, held_port, scrape, start_server, stop_server,
                                value)
from tests.pipeline import repo_builder as rb

_CONNECTIONS = 24  # each new: all on one of two servers by chance, 1 time in 2**23


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 just now (each bound and let go without SO_REUSEPORT)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for held in sockets:
            held.bind(("127.0.0.1", 0))
        return [int(held.getsockname()[1]) for held in sockets]
    finally:
        for held in sockets:
            held.close()


@pytest.fixture(scope="module")
def identity_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("reuse-models")
    rb.add_torchscript(root, "identity", rb.Identity(), [3, 4], [3, 4], max_batch=4)
    return root


@pytest.fixture()
def pair(identity_repo: pathlib.Path, tmp_path: pathlib.Path
         ) -> Iterator[tuple[RunningServer, RunningServer]]:
    http_port, grpc_port = _free_ports(2)
    flags = ("--http-port", str(http_port), "--grpc-port", str(grpc_port),
             "--reuse-http-port", "true", "--reuse-grpc-port", "true")
    first = start_server(identity_repo, tmp_path / "first.log", *flags)
    try:
        second = start_server(identity_repo, tmp_path / "second.log", *flags)
    except BaseException:
        stop_server(first)
        raise
    try:
        yield first, second
    finally:
        assert stop_server(first) == 0 and stop_server(second) == 0


def _requests(server: RunningServer) -> float:
    """How many requests identity has answered on this server (its own metrics port)."""
    return value(scrape(server), "nv_inference_request_success", default=0.0,
                 model="identity", version="1")


def test_servers_reusing_the_ports_share_them_and_each_answers_some(
        pair: tuple[RunningServer, RunningServer]) -> None:
    first, second = pair
    assert (first.port, first.grpc_port) == (second.port, second.grpc_port)
    values = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    for _ in range(_CONNECTIONS):  # a client, so a connection, each: the kernel picks a server
        with httpclient.InferenceServerClient(first.url, network_timeout=30) as client:
            item = httpclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
            item.set_data_from_numpy(values)
            assert np.array_equal(client.infer("identity", [item]).as_numpy("OUTPUT__0"),
                                  values)
    over_http = [_requests(first), _requests(second)]
    assert sum(over_http) == _CONNECTIONS and min(over_http) > 0, over_http

    for _ in range(_CONNECTIONS):
        with grpcclient.InferenceServerClient(first.grpc_url) as client:
            item = grpcclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
            item.set_data_from_numpy(values)
            assert np.array_equal(client.infer("identity", [item]).as_numpy("OUTPUT__0"),
                                  values)
    over_grpc = [_requests(first) - over_http[0], _requests(second) - over_http[1]]
    assert sum(over_grpc) == _CONNECTIONS and min(over_grpc) > 0, over_grpc


def test_a_port_held_without_the_flag_is_not_shared(identity_repo: pathlib.Path,
                                                     tmp_path: pathlib.Path) -> None:
    """SO_REUSEPORT shares a port only among sockets that all set it: a server with the
    flag fails its start on a port held without it, saying which port and what to do."""
    with held_port() as port:
        with pytest.raises(RuntimeError, match=rf"cannot listen for HTTP on 127\.0\.0\.1 "
                                               rf"port {port}: Address already in use"):
            start_server(identity_repo, tmp_path / "refused.log", "--http-port", str(port),
                         "--reuse-http-port", "true")
