"""tritonclient (HTTP, sync and asyncio) against a real tensorgate process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib
import re
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import (RunningServer, binary_infer_request, count_dropped,
                                read_answer, scrape, start_server, stop_server, value)
from tests.pipeline import repo_builder as rb


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url, network_timeout=30) as connected:
        yield connected


def _input(name: str, value: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(value.shape), "FP32")
    item.set_data_from_numpy(value, binary_data=binary)
    return item


def test_health_metadata_config_and_index(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity") and not client.is_model_ready("nope")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "tensorgate" and "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("identity")
    assert model["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 3, 4]}]
    assert model["versions"] == ["1"]
    config = client.get_model_config("linear")
    assert config["max_batch_size"] == 8 and config["input"][0]["data_type"] == "TYPE_FP32"
    assert all(isinstance(d, int) for d in config["input"][0]["dims"])  # as Triton's
    names = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert names == {"identity": "READY", "linear": "READY", "failing": "READY",
                     "slow": "READY", "wide": "READY", "paced": "READY",
                     "ranked": "READY", "counter": "READY", "counter_pair": "READY",
                     "pipeline": "READY",
                     "accumulate": "READY", "words": "READY", "shout": "READY",
                     "memo": "READY", "params": "READY", "params_ensemble": "READY"}


@pytest.mark.parametrize("binary_in, binary_out", [(True, True), (False, False), (True, False),
                                                   (False, True)])
def test_identity_is_bit_exact(client: httpclient.InferenceServerClient, binary_in: bool,
                               binary_out: bool) -> None:
    value = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    value[0, 0, 0] = np.float32(1) / 3  # a value JSON must carry exactly too
    result = client.infer("identity", [_input("INPUT__0", value, binary_in)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT__0",
                                                                   binary_data=binary_out)])
    out = result.as_numpy("OUTPUT__0")
    assert out.dtype == np.float32 and out.tobytes() == value.tobytes()


def _raw_binary(server: RunningServer, model: str, body: bytes) -> tuple[int, dict, bytes]:
    """A raw binary request (Inference-Header-Content-Length: 0: the body is the one input)."""
    import http.client
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body,
                           {"Inference-Header-Content-Length": "0"})
        answer = connection.getresponse()
        data = answer.read()
        length = int(answer.getheader("Inference-Header-Content-Length") or len(data))
        return answer.status, json.loads(data[:length]), data[length:]
    finally:
        connection.close()


def test_a_raw_binary_request_is_its_one_input(server: RunningServer) -> None:
    """Numbers shaped by the input's dims (batch 1); a BYTES input's body is its one
    element's bytes, as Triton 2.51 reads it (an image file as it is: no length before it;
    a body that begins with one keeps it as part of the element), empty ones too."""
    values = np.arange(12, dtype=np.float32)
    status, header, tail = _raw_binary(server, "identity", values.tobytes())
    assert (status, header["outputs"][0]["shape"]) == (200, [1, 3, 4])
    assert np.frombuffer(tail, np.float32).tolist() == values.tolist()
    for text in (b"hello world", b"\x0b\x00\x00\x00prefixed", b""):
        status, header, tail = _raw_binary(server, "shout", text)
        assert status == 200, header
        lengths = {o["name"]: o["parameters"]["binary_data_size"] for o in header["outputs"]}
        shouted = tail[4:lengths["text_output"]]  # its one element after its length
        assert shouted == text.upper()
        assert np.frombuffer(tail[lengths["text_output"]:], np.int32).tolist() == [len(text)]


def test_binary_identity_copies_nothing(client: httpclient.InferenceServerClient) -> None:
    value = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    result = client.infer("identity", [_input("INPUT__0", value)],
                          parameters={"tensorgate_report_copies": True})
    assert result.get_response()["parameters"] == {"tensorgate_copied_bytes": 0}
    assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()


def test_linear_matches_torch(client: httpclient.InferenceServerClient) -> None:
    import torch
    value = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    out = client.infer("linear", [_input("INPUT__0", value)]).as_numpy("OUTPUT__0")
    expected = rb.linear_module().eval()(torch.from_numpy(value)).detach().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_classification_extension(client: httpclient.InferenceServerClient) -> None:
    value = np.array([[0.1, 3.0, -1.0, 2.0, 0.0, 1.0, 5.0, -2.0]], dtype=np.float32)
    result = client.infer("linear", [_input("INPUT__0", value)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT__0", class_count=2)])
    classes = result.as_numpy("OUTPUT__0")
    assert classes.shape == (1, 2)
    scores = client.infer("linear", [_input("INPUT__0", value)]).as_numpy("OUTPUT__0")[0]
    top = np.argsort(-scores)[:2]
    assert [c.decode().split(":")[1] for c in classes[0]] == [str(i) for i in top]


def test_statistics_count_inferences(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("linear")["model_stats"][0]["inference_count"]
    client.infer("linear", [_input("INPUT__0", np.zeros((2, 8), np.float32))])
    stats = client.get_inference_statistics("linear")["model_stats"][0]
    assert stats["inference_count"] == before + 2
    assert stats["inference_stats"]["success"]["count"] >= 1
    # every key Triton 2.51's entry has (its answer for the same repository, side by side)
    assert set(stats) == {"name", "version", "last_inference", "inference_count",
                          "execution_count", "inference_stats", "batch_stats", "memory_usage",
                          "response_stats"}


def test_repository_unload_and_load(client: httpclient.InferenceServerClient) -> None:
    client.unload_model("failing")
    assert not client.is_model_ready("failing")
    with pytest.raises(InferenceServerException, match="unknown model 'failing'"):
        client.infer("failing", [_input("INPUT__0", np.ones((1, 4), np.float32))])
    client.load_model("failing")
    assert client.is_model_ready("failing")


@pytest.mark.parametrize("call, status, message", [
    (lambda c: c.infer("nope", [_input("INPUT__0", np.ones((1, 4), np.float32))]),
     "404", r"^\[404\] unknown model 'nope'"),
    (lambda c: c.infer("linear", [_input("X", np.ones((1, 8), np.float32))]),
     "400", r"model 'linear' has no input 'X'; inputs are: INPUT__0"),
    (lambda c: c.infer("linear", [_input("INPUT__0", np.ones((1, 7), np.float32))]),
     "400", r"input 'INPUT__0' of model 'linear' has shape \[1,7\]; expected \[-1,8\]"),
    (lambda c: c.infer("failing", [_input("INPUT__0", -np.ones((1, 4), np.float32))]),
     "500", r"model 'failing' raised RuntimeError: negative input"),
    (lambda c: c.infer("linear", [_input("INPUT__0", np.ones((1, 8), np.float32))],
                       model_version="9"),
     "404", r"model 'linear' has no version 9"),
])
def test_client_errors_are_named(client: httpclient.InferenceServerClient, call, status: str,
                                 message: str) -> None:
    with pytest.raises(InferenceServerException, match=message) as raised:
        call(client)
    assert raised.value.status() == status
    assert client.is_server_ready()  # still serving


def test_a_long_error_message_is_cut_and_says_so(
        client: httpclient.InferenceServerClient) -> None:
    """Messages name what the client sent: an input named with 500,000 characters came back
    in full. Cut at 4,096 characters, as gRPC's are."""
    name = "x" * 500_000
    with pytest.raises(InferenceServerException) as raised:
        client.infer("linear", [_input(name, np.ones((1, 8), np.float32))])
    assert raised.value.status() == "400"
    whole = f"model 'linear' has no input '{name}'; inputs are: INPUT__0"
    assert raised.value.message() == \
        f"{whole[:4096]} ... ({len(whole) - 4096:,} more characters)"
    assert client.is_server_ready()


def test_wrong_datatype(client: httpclient.InferenceServerClient) -> None:
    item = httpclient.InferInput("INPUT__0", [1, 8], "FP64")
    item.set_data_from_numpy(np.ones((1, 8), np.float64))
    with pytest.raises(InferenceServerException,
                       match=r"input 'INPUT__0' of model 'linear' is FP64; expected FP32"):
        client.infer("linear", [item])


def test_asyncio_client_concurrent_requests(server: RunningServer) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(server.url) as client:
            values = [np.full((1, 3, 4), i, np.float32) for i in range(12)]
            results = await asyncio.gather(*(client.infer("identity", [
                _aio_input(v)]) for v in values))
            for value, result in zip(values, results):
                assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()
            assert await client.is_server_ready()
    asyncio.run(asyncio.wait_for(scenario(), 60))


def _aio_input(value: np.ndarray) -> aioclient.InferInput:
    item = aioclient.InferInput("INPUT__0", list(value.shape), "FP32")
    item.set_data_from_numpy(value)
    return item


def test_queue_full_is_503(server: RunningServer) -> None:
    async def scenario() -> list[object]:
        async with aioclient.InferenceServerClient(server.url) as client:
            requests = [client.infer("slow", [_aio_input(np.ones((1, 4), np.float32))])
                        for _ in range(5)]
            return await asyncio.gather(*requests, return_exceptions=True)
    outcomes = asyncio.run(asyncio.wait_for(scenario(), 60))
    refused = [o for o in outcomes if isinstance(o, InferenceServerException)]
    served = [o for o in outcomes if not isinstance(o, Exception)]
    assert served and refused, outcomes
    assert all(o.status() == "503" and "Exceeds maximum queue size" in o.message()
               for o in refused)


def test_a_large_json_request_and_answer_go_in_slices_and_stay_exact(
        server: RunningServer, client: httpclient.InferenceServerClient) -> None:
    """150,000 values as V2 JSON both ways (a 750 KB body, a 600 KB array): parsed and
    written a slice at a time (protocol/json_slices.py, json_answers.py), every value as
    sent; and a large body with a true among its numbers is refused as it was whole."""
    value = (np.arange(150_000) % 7 - 3).astype(np.float32) / 4
    result = client.infer("wide", [_input("INPUT__0", value, binary=False)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT__0",
                                                                   binary_data=False)])
    assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [150_001], "datatype": "FP32",
                                   "data": [*value.tolist(), True]}]}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        head, answer = read_answer(connection)
    assert head.startswith(b"HTTP/1.1 400"), head
    assert json.loads(answer)["error"] == ("input 'INPUT__0': FP32 'data' must hold numbers; "
                                           "it holds true/false among them")


def test_large_nested_json_data_is_read_in_row_major_order(server: RunningServer) -> None:
    """`data` as x.tolist() sends it, nested (300 lists of 500): read in slices, in order;
    lists of uneven widths are refused by name, as the whole parse refuses them."""
    value = (np.arange(150_000) % 11 - 5).astype(np.float32) / 2
    uneven = value.reshape(300, 500).tolist()
    uneven[-1].append(uneven[-2].pop())
    answers = []
    for data in (value.reshape(300, 500).tolist(), uneven):
        body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [150_000],
                                       "datatype": "FP32", "data": data}]}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
            connection.sendall(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            answers.append(read_answer(connection))
    (head, answer), (refused_head, refusal) = answers
    assert head.startswith(b"HTTP/1.1 200"), head
    output = json.loads(answer)["outputs"][0]
    assert np.asarray(output["data"], np.float32).tobytes() == value.tobytes()
    assert refused_head.startswith(b"HTTP/1.1 400"), refused_head
    assert "evenly nested" in json.loads(refusal)["error"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(client: httpclient.InferenceServerClient,
                                           algorithm: str) -> None:
    value = np.random.default_rng(3).standard_normal((1, 3, 4)).astype(np.float32)
    result = client.infer("identity", [_input("INPUT__0", value)],
                          request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()


def _gzip_binary_request(model: str, values: np.ndarray, parameters: dict | None = None,
                         header_multiple: int = 1) -> tuple[bytes, int]:
    """An HTTP/1.1 request of `model` (input INPUT__0, output OUTPUT__0, both binary) with
    its body gzipped, and the body's length once decompressed. Its JSON header's length is
    odd, so that a tensor right after it is aligned only if the server places it, or a
    multiple of `header_multiple` when that is given."""
    head = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(values.shape),
                                   "datatype": "FP32",
                                   "parameters": {"binary_data_size": values.nbytes}}],
                       "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
                       "parameters": parameters or {}}).encode()
    head += b" " * ((1 - len(head) % 2) if header_multiple == 1
                    else -len(head) % header_multiple)
    body = head + values.astype("<f4").tobytes()
    packed = gzip.compress(body, 1)
    return (b"POST /v2/models/%b/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\nInference-Header-Content-Length: %d\r\n\r\n%b"
            % (model.encode(), len(packed), len(head), packed)), len(body)


def test_a_compressed_body_is_decompressed_into_place(server: RunningServer) -> None:
    """A gzip body is decompressed into a pooled buffer with its tensor aligned: the only
    copies are the decompression's two writes a byte (zlib's chunk, then its place). From
    one `bytes` the tensor after an odd-length header was misaligned and copied again."""
    values = np.arange(200_000, dtype="<f4")
    request, length = _gzip_binary_request("wide", values, {"tensorgate_report_copies": True})
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(request)
        head, body = read_answer(connection)
    assert head.startswith(b"HTTP/1.1 200"), head
    header_length = int(re.search(rb"(?im)^inference-header-content-length: (\d+)",
                                  head).group(1))  # type: ignore[union-attr]
    answer = json.loads(body[:header_length])
    assert body[header_length:] == values.tobytes()
    assert answer["parameters"]["tensorgate_copied_bytes"] == 2 * length


def test_a_decompressed_body_counts_against_the_pool(e2e_repo: pathlib.Path,
                                                     tmp_path: pathlib.Path) -> None:
    """A 40 MiB pool, 30 MB of it held by a body half sent (at its rate so far it needs
    less than the read timeout: it does not give way). 24 MB of zeros in a 24 KB gzip body
    does not fit in the rest and is refused by name, over HTTP and gRPC (it was decompressed
    outside the pool and served: compressed requests were bounded only by
    --max-request-bytes each); the next request is served."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes",
                          str(32 << 20), "--host-pool-bytes", str(40 << 20))
    holding = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        holding.sendall(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 30000000\r\n\r\n" + b" " * 15_000_000)
        deadline = time.monotonic() + 10
        while value(scrape(server), "tensorgate_pool_bytes", state="in_use") < 30_000_000:
            assert time.monotonic() < deadline, "the half-sent body holds no pool"
            time.sleep(0.05)
        # a header of 64-byte multiples: the tensor is aligned in a malloc'd block too, and
        # no realigning copy (from the pool) refuses it instead
        request, _ = _gzip_binary_request("wide", np.zeros(6_000_000, np.float32),
                                          header_multiple=64)
        small, _ = _gzip_binary_request("wide", np.ones(1000, np.float32))
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
            connection.sendall(request)
            head, body = read_answer(connection)
            assert head.startswith(b"HTTP/1.1 503"), head
            assert b"host buffer pool is full" in body and b"--host-pool-bytes" in body
            connection.sendall(small)
            head, body = read_answer(connection)
            assert head.startswith(b"HTTP/1.1 200") and body.endswith(
                np.ones(1000, np.float32).tobytes())
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            item = grpcclient.InferInput("INPUT__0", [6_000_000], "FP32")
            item.set_data_from_numpy(np.zeros(6_000_000, np.float32))
            with pytest.raises(InferenceServerException, match="host buffer pool is full"):
                client.infer("wide", [item], compression_algorithm="gzip")
    finally:
        holding.close()
        stop_server(server)


def _paced_counts(client: httpclient.InferenceServerClient) -> tuple[int, int, int]:
    stats = client.get_inference_statistics("paced")["model_stats"][0]
    inference = stats["inference_stats"]
    return (stats["execution_count"], inference["success"]["count"], inference["fail"]["count"])


def test_a_client_that_goes_away_takes_its_queued_request_with_it(
        server: RunningServer, client: httpclient.InferenceServerClient) -> None:
    """Six connections ask `paced` (0.05 s a request, one at a time); five close at once:
    the first is answered, the five are counted cancelled and never run."""
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}]}).encode()
    request = (b"POST /v2/models/paced/infer HTTP/1.1\r\nHost: t\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    host, port = server.url.split(":")
    before = _paced_counts(client)
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(6)]
    try:
        for connection in sockets:
            connection.sendall(request)
        time.sleep(0.01)  # all six are queued or running: the first runs for 0.05 s
        for connection in sockets[1:]:
            connection.close()
        answer = sockets[0].recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer
    finally:
        for connection in sockets:
            connection.close()
    deadline = time.monotonic() + 5
    while _paced_counts(client)[2] - before[2] < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    executions, answered, cancelled = (a - b for a, b in zip(_paced_counts(client), before))
    assert (executions, answered, cancelled) == (1, 1, 5)


def test_json_carries_nan_and_infinities_both_ways(client: httpclient.InferenceServerClient
                                                   ) -> None:
    """tritonclient writes NaN and Infinity into JSON, as Triton reads and writes them."""
    value = np.array([[[np.nan, np.inf, -np.inf, 1.5]] * 3], dtype=np.float32)
    result = client.infer("identity", [_input("INPUT__0", value, binary=False)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT__0",
                                                                   binary_data=False)])
    assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()


def test_json_writes_nan_and_infinities_as_triton_does(server: RunningServer) -> None:
    body = (b'{"inputs":[{"name":"INPUT__0","shape":[1,3,4],"datatype":"FP32",'
            b'"data":[%b]}]}' % b",".join([b"NaN,Infinity,-Infinity,1.5"] * 3))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                           b"Connection: close\r\nContent-Length: %d\r\n\r\n%b"
                           % (len(body), body))
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(
        b'"data":[%b]}]}' % b",".join([b"NaN,Infinity,-Infinity,1.5"] * 3)), answer


def test_a_queued_json_request_gives_its_body_back_to_the_pool(server: RunningServer) -> None:
    """8 JSON bodies of 900 KB (whitespace around a [1,4] tensor) queue for `ranked` (0.3 s
    a request, one at a time): once decoded, their pooled buffers go back while they wait
    (held, 4 or more of them would still be in the pool 1.2 s on)."""
    body = (b'{"inputs":[{"name":"INPUT__0","shape":[1,4],"datatype":"FP32",'
            b'"data":[1,2,3,4]}]}' + b" " * 900_000)
    request = (b"POST /v2/models/ranked/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30)
                   for _ in range(8)]
    try:
        for connection in connections:
            connection.sendall(request)
        deadline = time.monotonic() + 1.2
        while value(scrape(server), "tensorgate_pool_bytes", state="in_use") >= 2_000_000:
            assert time.monotonic() < deadline, "queued JSON requests held their bodies"
            time.sleep(0.05)
        for connection in connections:
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and b'"data":[3.0,5.0,7.0,9.0]' in answer
    finally:
        for connection in connections:
            connection.close()




def test_answers_a_client_does_not_read_wait_in_the_pool(e2e_repo: pathlib.Path,
                                                         tmp_path: pathlib.Path) -> None:
    """Three clients ask for 12 MB answers and read none: what the socket cannot take (the
    kernel holds up to 4 MB a connection here) stays in the answers' pooled views, bounded
    by the pool, and never more than a slice is copied into the transport's buffer (asyncio
    copied all the rest: memory no bound covered, up to 4,096 connections times
    --max-request-bytes). Read at last, every answer is whole."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes",
                          str(32 << 20))
    values = np.arange(3_000_000, dtype="<f4")
    request = binary_infer_request("wide", values)
    connections: list[socket.socket] = []
    try:
        connections += _non_readers(server, request, 3)
        time.sleep(0.5)
        metrics = scrape(server)
        # the three bodies, held; at most a slice each copied
        assert value(metrics, "tensorgate_pool_bytes", state="in_use") >= 3 * values.nbytes
        assert value(metrics, "tensorgate_copies_by_reason_bytes_total", 0,
                     reason="send") <= 3 * (1 << 20)
        for connection in connections:
            head, body = read_answer(connection)
            assert head.startswith(b"HTTP/1.1 200") and body.endswith(values.tobytes())
    finally:
        for connection in connections:
            connection.close()
        stop_server(server)


def test_unread_answers_give_way_when_the_pool_is_full(e2e_repo: pathlib.Path,
                                                       tmp_path: pathlib.Path) -> None:
    """A 44 MiB pool: three clients that read none of their 12 MB answers hold 36 MiB of it.
    A fourth client's 12 MB request does not fit: an unread answer's connection is dropped
    (its client has read nothing for 2 s), one is enough, and the request is served."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes",
                          str(32 << 20), "--host-pool-bytes", str(44 << 20))
    values = np.arange(3_000_000, dtype="<f4")
    request = binary_infer_request("wide", values)
    stalled: list[socket.socket] = []
    try:
        stalled += _non_readers(server, request, 3)
        time.sleep(3.5)  # unread for 2 s or more, with room for a slow machine
        assert value(scrape(server), "tensorgate_pool_bytes", state="in_use") >= 3 * values.nbytes
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as reader:
            reader.sendall(request)
            head, body = read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body.endswith(values.tobytes())
        assert count_dropped(stalled) == 1  # one answer's room was all the request needed
        assert "unread answers refused" in server.log.read_text()
    finally:
        for connection in stalled:
            connection.close()
        stop_server(server)


def _non_readers(server: RunningServer, request: bytes, count: int) -> list[socket.socket]:
    """`count` connections that each send `request` and then read nothing (yet)."""
    connections = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        connection.sendall(request)
        connections.append(connection)
    return connections


def test_binary_tensors_are_compressed_only_where_they_shrink(server: RunningServer) -> None:
    """aiohttp, so tritonclient.http.aio, accepts gzip on every call without being asked:
    random FP32 went through zlib for a tenth less (17 ms a 602 KB identity call against
    0.7). Tensors that sample as incompressible go as they are; others, and JSON, are
    compressed as the client accepts."""
    rng = np.random.default_rng(5)
    for values, compressed in ((rng.standard_normal((2, 3, 4)).astype(np.float32), False),
                               (np.zeros((2, 3, 4), np.float32), True)):
        raw = binary_infer_request("identity", values).replace(
            b"\r\n\r\n", b"\r\nAccept-Encoding: gzip, deflate\r\n\r\n", 1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(raw)
            head, body = read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200")
        assert (b"Content-Encoding: gzip" in head) is compressed, head
        body = gzip.decompress(body) if compressed else body
        json_length = int(re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1))
        assert body[json_length:] == values.tobytes()
    # and the asyncio client gets its answer either way
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(server.url) as client:
            item = aioclient.InferInput("INPUT__0", [2, 3, 4], "FP32")
            item.set_data_from_numpy(values)
            result = await client.infer("identity", [item])
            assert result.as_numpy("OUTPUT__0").tobytes() == values.tobytes()
    asyncio.run(scenario())
