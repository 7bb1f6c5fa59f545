"""JSON that would parse into millions of Python objects is refused before it is parsed;
JSON that is large because of its tensors' numbers, or a BOOL tensor's true/false, is
served. Against a server with the default 64 MiB request limit."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from tests.e2e.conftest import RunningServer, memory_bytes, start_server, stop_server
from tests.pipeline import repo_builder as rb

BOUND = " holds more than 1,048,576 JSON values and keys, each a Python object to parse"
TENSORS_HINT = ("; send a large tensor's elements as numbers in its 'data' or with the binary "
                "tensor extension")


class Tally(torch.nn.Module):
    """How many flags are set, and the sum of the values."""

    def forward(self, flags: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.stack([flags.sum().to(torch.float32), values.sum()])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("json-bounds")
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


def still_serving(server: RunningServer) -> None:
    value = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    item = httpclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
    item.set_data_from_numpy(value)
    with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
        assert client.infer("identity", [item]).as_numpy("OUTPUT__0").tolist() == \
            value.tolist()


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
