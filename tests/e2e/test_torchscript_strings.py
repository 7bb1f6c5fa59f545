"""A TorchScript model that takes and returns strings (`List[str]`), served to tritonclient
over HTTP (binary and JSON) and gRPC: the answers are the model's strings in the config's
shape, byte for byte."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline.test_torch_io import add_string_models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("strings")
    add_string_models(root / "models")
    running = start_server(root / "models", root / "server.log")
    yield running
    assert stop_server(running) == 0, running.log.read_text()


@pytest.mark.parametrize("protocol", ["http-binary", "http-json", "grpc"])
def test_strings_in_and_out(server: RunningServer, protocol: str) -> None:
    grpc = protocol == "grpc"
    module = grpcclient if grpc else httpclient
    client = module.InferenceServerClient(server.grpc_url if grpc else server.url)
    text = np.array([["héllo".encode(), b"a b"], [b"", b"xyz"]], dtype=object)
    inputs = [module.InferInput("TEXT", [2, 2], "BYTES"),
              module.InferInput("SCALE", [2, 1], "FP32")]
    binary = {} if grpc else {"binary_data": protocol == "http-binary"}
    inputs[0].set_data_from_numpy(text, **binary)
    inputs[1].set_data_from_numpy(np.ones((2, 1), dtype=np.float32), **binary)
    outputs = [module.InferRequestedOutput(name, **binary) for name in ("SHOUTED", "LENGTH")]
    result = client.infer("shout", inputs, outputs=outputs)
    shouted = result.as_numpy("SHOUTED")
    assert shouted.shape == (2, 2)
    # JSON answers text (tritonclient gives str); binary and gRPC the bytes
    texts = [[v if isinstance(v, str) else v.decode() for v in row] for row in shouted.tolist()]
    assert texts == [["HéLLO!", "A B!"], ["!", "XYZ!"]]
    assert result.as_numpy("LENGTH").tolist() == [[6.0, 3.0], [0.0, 3.0]]

    words = module.InferInput("TEXT", [1], "BYTES")
    words.set_data_from_numpy(np.array([b"one two three"], dtype=object), **binary)
    answer = client.infer("words", [words]).as_numpy("WORDS")
    assert [v if isinstance(v, str) else v.decode() for v in answer] == ["one", "two", "three"]
    client.close()
