"""Restricted APIs through tritonclient, HTTP and gRPC: a restricted group answers only
requests that carry its header with its value (403 / UNAVAILABLE naming the header, never
its value), other APIs stay open, and a wrong restriction stops the server from starting."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline import repo_builder as rb

ADMIN = "model-repository,trace,logging:admin-key=s3cret"
GOOD_HTTP = {"admin-key": "s3cret"}
GOOD_GRPC = {"triton-grpc-protocol-admin-key": "s3cret"}


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("restricted")
    rb.add_torchscript(root / "models", "identity", rb.Identity(), [4], [4])
    server = start_server(root / "models", root / "server.log", "--model-control-mode",
                          "explicit", "--load-model", "*", "--http-restricted-api", ADMIN,
                          "--grpc-restricted-protocol", ADMIN)
    yield server
    assert stop_server(server) == 0, server.log.read_text()


def _infer(client: object, module: object) -> np.ndarray:
    item = module.InferInput("INPUT__0", [1, 4], "FP32")  # type: ignore[attr-defined]
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer("identity", [item]).as_numpy("OUTPUT__0")  # type: ignore[attr-defined]


def test_http_restricted_apis_need_the_header(restricted: RunningServer) -> None:
    with httpclient.InferenceServerClient(restricted.url) as client:
        message = "the model-repository API is restricted: send the header 'admin-key'"
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.load_model("identity")
        assert refused.value.status() == "403" and "s3cret" not in str(refused.value)
        with pytest.raises(InferenceServerException, match="the trace API is restricted"):
            client.get_trace_settings()
        with pytest.raises(InferenceServerException, match="the logging API is restricted"):
            client.update_log_settings({"log_info": False}, headers={"admin-key": "guess"})
        # the open APIs need nothing
        assert client.is_server_ready() and client.get_model_metadata("identity")
        np.testing.assert_array_equal(_infer(client, httpclient), np.ones((1, 4)))
        # the header opens them
        client.load_model("identity", headers=GOOD_HTTP)
        assert client.get_log_settings(headers=GOOD_HTTP)["log_info"] is True
        assert client.get_model_repository_index(headers=GOOD_HTTP)[0]["name"] == "identity"


def test_grpc_restricted_protocols_need_the_metadata(restricted: RunningServer) -> None:
    with grpcclient.InferenceServerClient(restricted.grpc_url) as client:
        with pytest.raises(InferenceServerException,
                           match="the model-repository API is restricted: send the header "
                                 "'triton-grpc-protocol-admin-key'") as refused:
            client.unload_model("identity")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        with pytest.raises(InferenceServerException, match="the trace API is restricted"):
            client.get_trace_settings(headers={"triton-grpc-protocol-admin-key": "S3CRET"})
        with pytest.raises(InferenceServerException, match="the trace API is restricted"):
            client.get_trace_settings(headers=GOOD_HTTP)  # the HTTP header is not it
        np.testing.assert_array_equal(_infer(client, grpcclient), np.ones((1, 4)))
        assert client.get_trace_settings(headers=GOOD_GRPC, as_json=True)["settings"]
        assert client.is_model_ready("identity")  # nothing was unloaded


@pytest.mark.parametrize("given, message", [
    ("trace:admin-key", "'trace:admin-key' is not API\\[,API...\\]:KEY=VALUE"),
    ("trace:admin-key=", "an empty key or value would let every request through"),
    ("tracing:k=v", "unknown API 'tracing'; APIs are: health, metadata, inference"),
    ("trace:k=v;trace,logging:j=w", "API 'trace' is already restricted"),
])
def test_a_wrong_restriction_stops_the_server_from_starting(tmp_path: pathlib.Path,
                                                            given: str, message: str) -> None:
    rb.add_torchscript(tmp_path / "models", "identity", rb.Identity(), [4], [4])
    with pytest.raises(RuntimeError, match=f"http_restricted_api: restriction .*{message}"):
        start_server(tmp_path / "models", tmp_path / "server.log",
                     *[a for part in given.split(";") for a in ("--http-restricted-api", part)])
