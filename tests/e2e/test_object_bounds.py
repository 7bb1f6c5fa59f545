"""Requests that would have the server make millions of Python objects on its event loop
are refused before it makes them: JSON of millions of values, BYTES inputs of millions of
elements, gRPC messages of too many parts. JSON that is large because of its tensors'
numbers, or a BOOL tensor's true/false, is served, and so are BYTES inputs up to the bound
(a malformed one refused naming the element). Against a server with the default 64 MiB
request limit."""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import (RunningServer, memory_bytes, start_server, still_serving,
                                stop_server)
from tests.pipeline import repo_builder as rb

BOUND = " holds more than 1,048,576 JSON values and keys, each a Python object to parse"
TENSORS_HINT = ("; send a large tensor's elements as numbers in its 'data' or with the binary "
                "tensor extension")


COUNT = """
import numpy as np

from tensorgate import Model


class Count(Model):
    \"\"\"How many strings came, and how many bytes they hold.\"\"\"

    def forward(self, inputs):
        texts = inputs["T"].reshape(-1)
        return {"N": np.array([texts.size, sum(map(len, texts))], dtype=np.int64)}
"""


ECHO_TEXT = """
from tensorgate import Model


class EchoText(Model):
    def forward(self, inputs):
        return {"U": inputs["T"]}
"""


class Tally(torch.nn.Module):
    """How many flags are set, and the sum of the values."""

    def forward(self, flags: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.stack([flags.sum().to(torch.float32), values.sum()])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("object-bounds")
    rb.add_torchscript(root / "models", "identity", rb.Identity(), [3, 4], [3, 4], max_batch=4)
    folder = rb.write_config(root / "models", "tally", """
        name: "tally"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_BOOL dims: [-1] },
                { name: "INPUT__1" data_type: TYPE_FP32 dims: [-1] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [2] } ]
        """)
    torch.jit.script(Tally().eval()).save(str(folder / "1" / "model.pt"))
    folder = rb.write_config(root / "models", "count", """
        name: "count"
        backend: "python"
        max_batch_size: 0
        input [ { name: "T" data_type: TYPE_STRING dims: [-1] } ]
        output [ { name: "N" data_type: TYPE_INT64 dims: [2] } ]
        """)
    (folder / "1" / "model.py").write_text(COUNT)
    folder = rb.write_config(root / "models", "echo_text", """
        name: "echo_text"
        backend: "python"
        max_batch_size: 0
        input [ { name: "T" data_type: TYPE_STRING dims: [-1] } ]
        output [ { name: "U" data_type: TYPE_STRING dims: [-1] } ]
        """)
    (folder / "1" / "model.py").write_text(ECHO_TEXT)
    running = start_server(root / "models", root / "server.log",
                           "--model-control-mode", "explicit", "--load-model", "*")
    yield running
    assert stop_server(running) == 0, (root / "server.log").read_text()


def post(server: RunningServer, path: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", path, body, headers or {})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


JUNK = b"[" + b"{}," * 19_000_000 + b"{}]"  # 57 MB: parsed, 1.7 GB of dicts and 2 s


def _identity_json(**extra: object) -> bytes:
    head = {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 3, 4],
                        "data": list(range(12))}], **extra}
    return json.dumps(head).encode()


@pytest.mark.parametrize("what", ["all-JSON", "binary header", "load body", "load config"])
def test_millions_of_small_objects_are_refused_before_they_are_parsed(
        server: RunningServer, what: str) -> None:
    """57 MB of `{}`: refused naming the limit, the server's peak RSS moves by a fraction of
    what parsing it took (+1.7 GB before the bound), and it serves on."""
    peak = memory_bytes("VmHWM", server.process.pid)
    path, headers = "/v2/models/identity/infer", {}
    if what == "all-JSON":
        body = _identity_json()[:-1] + b', "junk": ' + JUNK + b"}"
        error = "the inference request header" + BOUND + TENSORS_HINT
    elif what == "binary header":
        head = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32",
                                       "shape": [1, 3, 4],
                                       "parameters": {"binary_data_size": 48}}]}).encode()
        head = head[:-1] + b', "junk": ' + JUNK + b"}"
        headers = {"Inference-Header-Content-Length": str(len(head))}
        body, error = head + bytes(48), "the inference request header" + BOUND + TENSORS_HINT
    elif what == "load body":
        path = "/v2/repository/models/identity/load"
        body, error = b'{"parameters": {"junk": ' + JUNK + b"}}", "the request body" + BOUND
    else:  # the same text as a string: one value to the body, millions to the config
        path = "/v2/repository/models/identity/load"
        body = b'{"parameters": {"config": "{\\"junk\\": ' + JUNK + b'}"}}'
        error = "load parameter 'config'" + BOUND
    status, answer = post(server, path, body, headers)
    assert (status, answer) == (400, {"error": error})
    assert memory_bytes("VmHWM", server.process.pid) - peak < 400 << 20
    still_serving(server)


def test_a_large_bool_tensor_and_large_json_beside_binary_are_served(
        server: RunningServer) -> None:
    """A BOOL tensor's 2 million true/false, and 2 million numbers in the JSON before a
    binary tensor: each more values than the bound, read in slices, not refused."""
    flags = np.arange(2_000_000) % 3 == 0
    values = np.full(2_000_000, 0.5, np.float32)
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        for binary_flags in (False, True):
            inputs = [httpclient.InferInput("INPUT__0", [flags.size], "BOOL"),
                      httpclient.InferInput("INPUT__1", [values.size], "FP32")]
            inputs[0].set_data_from_numpy(flags, binary_data=binary_flags)
            inputs[1].set_data_from_numpy(values, binary_data=False)
            output = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=False)
            answer = client.infer("tally", inputs, outputs=[output])
            assert answer.as_numpy("OUTPUT__0").tolist() == [666_667.0, 1_000_000.0]


BYTES_BOUND = 1 << 20


def _strings(count: int, mixed: bool) -> np.ndarray:
    return np.array([b"ab"[:i % 3] if mixed else b"x" for i in range(count)], dtype=object)


@pytest.mark.parametrize("mixed", [False, True])
def test_bytes_inputs_up_to_the_bound_are_served(server: RunningServer, mixed: bool) -> None:
    """A million strings of one length, or of mixed lengths, as binary over HTTP."""
    texts = _strings(BYTES_BOUND, mixed)
    item = httpclient.InferInput("T", [texts.size], "BYTES")
    item.set_data_from_numpy(texts)
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        answer = client.infer("count", [item]).as_numpy("N")
    assert answer.tolist() == [texts.size, sum(map(len, texts))]


@pytest.mark.parametrize("front_end", ["http", "grpc"])
def test_bytes_inputs_past_the_bound_are_refused_before_they_are_read(
        server: RunningServer, front_end: str) -> None:
    """Split across two inputs so that only the request's total is over: a clear error
    naming the count and the bound (13 million one-byte elements held the loop for 10 s)."""
    module = httpclient if front_end == "http" else grpcclient
    halves = [_strings(BYTES_BOUND // 2, False), _strings(BYTES_BOUND // 2 + 1, False)]
    items = []
    for name, texts in zip(("T", "U"), halves):
        items.append(module.InferInput(name, [texts.size], "BYTES"))
        items[-1].set_data_from_numpy(texts)
    url = server.url if front_end == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("count", items)
    assert raised.value.message() == (
        f"the request's BYTES inputs hold {BYTES_BOUND + 1:,} elements; at most "
        f"{BYTES_BOUND:,} are accepted (each becomes a Python bytes object)")
    still_serving(server)


def test_a_grpc_request_of_too_many_parts_is_refused_before_it_is_parsed(
        server: RunningServer) -> None:
    """30,000 request parameters are 120,000 parts on the wire (upb's parse of a map grows
    with the square of its entries: 1.5 million held the loop for 4 s)."""
    texts = _strings(1, False)
    item = grpcclient.InferInput("T", [1], "BYTES")
    item.set_data_from_numpy(texts)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("count", [item], parameters={f"p{i}": i for i in range(30_000)})
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert raised.value.message() == (
            "ModelInferRequest holds more than 65,536 fields, nested messages and map "
            "entries; at most that many are parsed")
        assert client.infer("count", [item]).as_numpy("N").tolist() == [1, 1]


@pytest.mark.parametrize("front_end", ["http", "grpc"])
def test_a_large_malformed_bytes_input_is_refused_naming_the_element(
        server: RunningServer, front_end: str) -> None:
    """A million elements of mixed lengths whose last claims more bytes than remain: checked
    as it is cut out, off the event loop, with the error a check at decode gave."""
    texts = _strings(BYTES_BOUND, True)
    layout = bytearray(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    layout[-4:] = struct.pack("<I", 7)  # the last element is empty: its prefix ends it
    expected = (f"BYTES tensor 'T': element {BYTES_BOUND - 1} of {BYTES_BOUND} declares 7 "
                f"bytes at byte {len(layout)}, but only 0 remain")
    if front_end == "http":
        head = json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [texts.size],
                                       "parameters": {"binary_data_size": len(layout)}}]})
        status, answer = post(server, "/v2/models/count/infer", head.encode() + layout,
                              {"Inference-Header-Content-Length": str(len(head))})
        assert (status, answer) == (400, {"error": expected})
    else:
        request = pb.ModelInferRequest(model_name="count")
        request.inputs.add(name="T", datatype="BYTES", shape=[texts.size])
        request.raw_input_contents.append(bytes(layout))
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                        request_serializer=lambda data: data,
                                        response_deserializer=pb.ModelInferResponse.FromString)
            with pytest.raises(grpc.RpcError) as raised:
                infer(request.SerializeToString(), timeout=60)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == expected
    still_serving(server)


def test_a_large_text_answer_as_json_is_written_whole_and_exact(
        server: RunningServer) -> None:
    """100,000 strings (some not UTF-8) answered as JSON: written 8,192 a step, the loop
    serving others between; the client reads what a whole write gives (bytes that are not
    UTF-8 replaced)."""
    texts = np.array([b"w%d" % i if i % 7 else b"\xff%d" % i for i in range(100_000)],
                     dtype=object)
    item = httpclient.InferInput("T", [texts.size], "BYTES")
    item.set_data_from_numpy(texts)
    output = httpclient.InferRequestedOutput("U", binary_data=False)
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        answer = client.infer("echo_text", [item], outputs=[output]).as_numpy("U")
    assert answer.tolist() == [t.decode("utf-8", "replace") for t in texts]


def test_strings_as_json_data_are_read_in_slices_and_exact(server: RunningServer) -> None:
    """200,000 strings in JSON `data` (quotes, backslashes, brackets, commas and characters
    of 2-4 bytes among them): parsed into the BYTES layout a slice at a time
    (protocol/json_strings.py), each element as sent; a lone surrogate among them is
    refused naming where it is, as the whole parse refuses it."""
    texts = np.array([f'w{i}"\\,]["é😀'.encode() if i % 5 else b"," for i in range(200_000)],
                     dtype=object)
    item = httpclient.InferInput("T", [texts.size], "BYTES")
    item.set_data_from_numpy(texts, binary_data=False)
    output = httpclient.InferRequestedOutput("U", binary_data=True)
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        answer = client.infer("echo_text", [item], outputs=[output]).as_numpy("U")
    assert answer.tolist() == texts.tolist()
    data = ["w"] * 199_999 + ["\ud800"]
    body = json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [200_000],
                                   "data": data}]}).encode()
    status, answer = post(server, "/v2/models/echo_text/infer", body)
    assert status == 400, answer
    assert answer["error"] == ("the inference request header is not valid JSON: the string "
                               "at inputs[0].data[199999] holds a lone surrogate (\\ud800), "
                               "which is not valid Unicode")
    still_serving(server)


def test_strings_in_grpc_typed_contents_are_served_up_to_the_bytes_bound(
        server: RunningServer) -> None:
    """200,000 strings in bytes_contents (as KServe's SDK and hand-written clients send
    them): served, where protobuf's counted parse refused past 65,536 parts; one more than
    the shape says is refused naming it."""
    texts = [b"ab"[:i % 3] for i in range(200_000)]
    request = pb.ModelInferRequest(model_name="count")
    item = request.inputs.add(name="T", datatype="BYTES", shape=[len(texts)])
    item.contents.bytes_contents.extend(texts)
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=lambda data: data,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        answer = infer(request.SerializeToString(), timeout=60)
        assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [
            len(texts), sum(map(len, texts))]
        item.contents.bytes_contents.append(b"x")
        with pytest.raises(grpc.RpcError) as raised:
            infer(request.SerializeToString(), timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == ("input 'T': contents has more than 200000 elements; "
                                      "shape [200000] needs 200000")
    still_serving(server)
