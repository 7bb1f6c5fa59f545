"""Ragged batching over a real server: tritonclient requests of different lengths, sent at
once over HTTP and gRPC, run as one batch and each gets its own answer in its own shape;
the server's /config shows the batch input and output as given."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline.test_ragged import add_ragged


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("ragged")
    add_ragged(root / "models")
    running = start_server(root / "models", root / "server.log")
    yield running
    assert stop_server(running) == 0, running.log.read_text()


def _send_at_once(call: Callable[[int], tuple[np.ndarray, np.ndarray]],
                  lengths: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    answers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []

    def one(length: int) -> None:
        try:
            answers[length] = call(length)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=one, args=(n,)) for n in lengths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return answers


def _values(length: int) -> np.ndarray:
    return np.arange(1, length + 1, dtype=np.float32).reshape(1, length)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_different_lengths_batch_and_come_back_in_their_own_shapes(
        server: RunningServer, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url

    def call(length: int) -> tuple[np.ndarray, np.ndarray]:
        item = module.InferInput("INPUT", [1, length], "FP32")
        item.set_data_from_numpy(_values(length))
        client = module.InferenceServerClient(url)
        try:
            result = client.infer("ragged", [item])
            return result.as_numpy("SUM"), result.as_numpy("OUT")
        finally:
            client.close()

    with httpclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("ragged")["model_stats"][0]["execution_count"]
    lengths = [3, 4, 5, 6]
    answers = _send_at_once(call, lengths)
    for length in lengths:
        total, doubled = answers[length]
        assert total.tolist() == [[float(_values(length).sum())]]
        assert doubled.shape == (1, length)
        np.testing.assert_array_equal(doubled, _values(length) * 2)
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("ragged")["model_stats"][0]
        # four lengths, fewer executions: they were batched (the queue waits up to 200 ms)
        assert stats["execution_count"] - before < len(lengths)
        config = client.get_model_config("ragged")
        assert config["batch_input"][0]["kind"] == "BATCH_ACCUMULATED_ELEMENT_COUNT"
        assert config["batch_output"][0]["target_name"] == ["OUT"]
        assert config["input"][0]["allow_ragged_batch"] is True
