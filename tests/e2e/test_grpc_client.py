"""tritonclient gRPC (sync and asyncio) against the same real tensorgate process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer


@pytest.fixture
def client(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as connected:
        yield connected


def _input(value: np.ndarray, name: str = "INPUT__0", module=grpcclient) -> object:
    item = module.InferInput(name, list(value.shape), "FP32")
    item.set_data_from_numpy(value)
    return item


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity") and not client.is_model_ready("nope")
    assert "statistics" in client.get_server_metadata().extensions
    meta = client.get_model_metadata("identity")
    assert meta.inputs[0].name == "INPUT__0" and list(meta.inputs[0].shape) == [-1, 3, 4]
    assert client.get_model_config("linear").config.max_batch_size == 8
    index = {m.name for m in client.get_model_repository_index().models}
    assert {"identity", "linear", "failing", "slow"} <= index


def test_identity_bit_exact_and_counted(client: grpcclient.InferenceServerClient) -> None:
    value = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    result = client.infer("identity", [_input(value)], parameters={"tensorgate_report_copies": True})
    assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()
    copied = result.get_response().parameters["tensorgate_copied_bytes"].int64_param
    # In: DATA frames' payloads into the message buffer. Out: none (the frames are sent
    # vectored; asyncio's transport joined them before Python 3.12)
    assert copied == value.nbytes


def test_statistics_and_errors(client: grpcclient.InferenceServerClient) -> None:
    client.infer("linear", [_input(np.zeros((1, 8), np.float32))])
    stats = client.get_inference_statistics("linear").model_stats[0]
    assert stats.inference_count >= 1 and stats.inference_stats.success.count >= 1
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as raised:
        client.infer("nope", [_input(np.zeros((1, 8), np.float32))])
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException,
                       match=r"input 'INPUT__0' of model 'linear' has shape \[1,7\]; "
                             r"expected \[-1,8\]") as raised:
        client.infer("linear", [_input(np.zeros((1, 7), np.float32))])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="negative input") as raised:
        client.infer("failing", [_input(-np.ones((1, 4), np.float32))])
    assert raised.value.status() == "StatusCode.INTERNAL"
    assert client.is_server_ready()


def test_a_long_error_message_is_cut_and_keeps_its_status(
        client: grpcclient.InferenceServerClient) -> None:
    """grpcio drops a response whose metadata passes 16 KiB: an unknown model's 20,000-
    character name in the message had the client told RESOURCE_EXHAUSTED "Stream removed".
    The message is cut, says so, and the status stands."""
    with pytest.raises(InferenceServerException) as raised:
        client.infer("m" * 20_000, [_input(np.zeros((1, 8), np.float32))])
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    message = raised.value.message()
    assert message.startswith("unknown model 'mmm") and len(message) < 4200
    assert message.endswith(" more characters)")
    assert client.is_server_ready()


def test_asyncio_grpc_client(server: RunningServer) -> None:
    async def scenario() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            values = [np.full((1, 3, 4), i, np.float32) for i in range(8)]
            results = await asyncio.gather(*(client.infer("identity", [_input(v, module=grpcaio)])
                                             for v in values))
            for value, result in zip(values, results):
                assert result.as_numpy("OUTPUT__0").tobytes() == value.tobytes()
    asyncio.run(asyncio.wait_for(scenario(), 60))
