"""Triton's --grpc-infer-response-compression-level: inference answers compressed for the
clients that accept it, the encoding picked as Triton 2.51 picks it; other methods, and
clients that accept neither gzip nor deflate, answered plainly; tritonclient's calls and
streams carry on unchanged (grpcio decompresses)."""

from __future__ import annotations

import pathlib
import queue
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from tensorgate.network.grpc_compression import response_encoding
from tests.e2e import h2_client as h2
from tests.e2e.conftest import RunningServer, scrape, start_server, stop_server

ALL = "identity,deflate,gzip"  # what grpcio accepts


@pytest.fixture(scope="module")
def high(fast_and_slow: pathlib.Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("compressing") / "server.log"
    server = start_server(fast_and_slow, log, "--grpc-infer-response-compression-level",
                          "high")
    yield server
    assert stop_server(server) == 0, log.read_text()


def _call(server: RunningServer, method: str, message: bytes, accept: str | None
          ) -> tuple[dict[str, str], bytes]:
    """The answer's headers (and trailers) and its one message, as sent (flag, length,
    bytes)."""
    client = h2.H2Client(server.grpc_port)
    try:
        extra = [] if accept is None else [("grpc-accept-encoding", accept)]
        headers, data = client.response(client.call(method, message, extra))
    finally:
        client.close()
    assert headers["grpc-status"] == "0", headers
    assert int.from_bytes(data[1:5], "big") == len(data) - 5
    return headers, data


def _unpacked(headers: dict[str, str], data: bytes) -> bytes:
    if data[0] == 0:
        return data[5:]
    wbits = 16 + zlib.MAX_WBITS if headers["grpc-encoding"] == "gzip" else zlib.MAX_WBITS
    return zlib.decompress(data[5:], wbits)


def _encoded_bytes(server: RunningServer) -> int:
    found = re.search(r'^tensorgate_copies_by_reason_bytes_total\{reason="encode"\} (\d+)$',
                      scrape(server), re.M)
    return int(found.group(1)) if found else 0


def test_an_inference_answer_is_compressed_as_the_client_accepts(high: RunningServer) -> None:
    """high: deflate where accepted, else gzip; a client that accepts neither (or says
    nothing) is answered plainly. Each answer holds the same message; each compressed one
    counts its bytes read into the compressed buffer as a copy."""
    plain_headers, plain = _call(high, "ModelInfer", h2.infer_message("fast"), None)
    before = _encoded_bytes(high)
    assert plain[0] == 0 and "grpc-encoding" not in plain_headers
    for accept, expected in ((ALL, "deflate"), ("identity,gzip", "gzip"),
                             ("identity,deflate", "deflate"), ("identity", None)):
        headers, data = _call(high, "ModelInfer", h2.infer_message("fast"), accept)
        assert headers.get("grpc-encoding") == expected, accept
        assert data[0] == (expected is not None)
        assert _unpacked(headers, data) == plain[5:]
    assert _encoded_bytes(high) - before == 3 * (len(plain) - 5)
    answer = pb.ModelInferResponse.FromString(plain[5:])
    assert answer.model_name == "fast" and len(answer.raw_output_contents[0]) == 16


def test_other_methods_are_never_compressed(high: RunningServer) -> None:
    headers, data = _call(high, "ServerLive", b"", ALL)
    assert "grpc-encoding" not in headers and data[0] == 0
    assert pb.ServerLiveResponse.FromString(data[5:]).live


def test_a_streams_responses_are_compressed_too(high: RunningServer) -> None:
    """The stream's headers say deflate, and each response comes compressed."""
    client = h2.H2Client(high.grpc_port)
    try:
        stream = client.call("ModelStreamInfer", h2.infer_message("fast"),
                             [("grpc-accept-encoding", ALL)])
        headers, data = client.response(stream)
    finally:
        client.close()
    assert headers["grpc-encoding"] == "deflate" and data[0] == 1
    response = pb.ModelStreamInferResponse.FromString(_unpacked(headers, data))
    assert response.error_message == "" and response.infer_response.model_name == "fast"


def test_tritonclient_calls_and_streams_carry_on(high: RunningServer) -> None:
    x = grpcclient.InferInput("INPUT__0", [2, 4], "FP32")
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    x.set_data_from_numpy(values)
    with grpcclient.InferenceServerClient(high.grpc_url) as client:
        answer = client.infer("fast", [x]).as_numpy("OUTPUT__0")
        answers: queue.Queue[object] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for _ in range(3):
            client.async_stream_infer("fast", [x])
        client.stop_stream()
    streamed = [answers.get(timeout=10) for _ in range(3)]
    assert answer is not None and answer.shape == (2, 4)
    for result in streamed:
        assert isinstance(result, grpcclient.InferResult)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), answer)


def test_the_level_picks_the_encoding_as_triton_does() -> None:
    """gRPC's ranking (gzip, then deflate) cut to what the client accepts: low the first,
    medium the middle, high the last (tritonserver 2.51, probed with each header)."""
    picked = {(level, accept): response_encoding(level, accept)
              for level in ("none", "low", "medium", "high")
              for accept in (ALL, "identity,gzip", "identity,deflate", "identity", "")}
    assert picked == {
        ("none", ALL): None, ("none", "identity,gzip"): None,
        ("none", "identity,deflate"): None, ("none", "identity"): None, ("none", ""): None,
        ("low", ALL): "gzip", ("low", "identity,gzip"): "gzip",
        ("low", "identity,deflate"): "deflate", ("low", "identity"): None, ("low", ""): None,
        ("medium", ALL): "deflate", ("medium", "identity,gzip"): "gzip",
        ("medium", "identity,deflate"): "deflate", ("medium", "identity"): None,
        ("medium", ""): None,
        ("high", ALL): "deflate", ("high", "identity,gzip"): "gzip",
        ("high", "identity,deflate"): "deflate", ("high", "identity"): None,
        ("high", ""): None}
    assert response_encoding("low", " deflate , gzip ") == "gzip"


def test_the_level_is_checked() -> None:
    answer = subprocess.run([sys.executable, "-m", "tensorgate", "serve",
                             "--grpc-infer-response-compression-level", "max"],
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    assert "grpc_infer_response_compression_level must be none, low, medium or high, got " \
           "'max'" in answer.stderr, answer.stderr
