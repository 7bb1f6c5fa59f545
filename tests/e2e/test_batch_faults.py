"""A request that makes the model raise, batched with good ones, through tritonclient over
HTTP and gRPC at once: it alone fails, with the model's error, and the requests batched
with it are answered (the executor runs a failed batch again a request at a time)."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb


def test_a_bad_request_fails_alone_and_its_batch_mates_are_answered(
        tmp_path: pathlib.Path) -> None:
    # a long queue delay: the requests sent together are gathered into one batch
    rb.add_torchscript(tmp_path / "models", "failing", rb.Failing(), [4], [4],
                       "dynamic_batching { max_queue_delay_microseconds: 200000 }")
    server = start_server(tmp_path / "models", tmp_path / "server.log")
    try:
        sent = [np.full((1, 4), value, np.float32) for value in (1.0, 2.0, -1.0, 3.0, 4.0, -2.0)]

        async def infer(module: Any, url: str, x: np.ndarray) -> Any:
            client = module.InferenceServerClient(url)
            try:
                item = module.InferInput("INPUT__0", list(x.shape), "FP32")
                item.set_data_from_numpy(x)
                return (await client.infer("failing", [item])).as_numpy("OUTPUT__0")
            except InferenceServerException as error:
                return error
            finally:
                await client.close()

        async def scenario() -> list[Any]:
            return await asyncio.gather(*(
                infer(httpaio if index % 2 == 0 else grpcaio,
                      server.url if index % 2 == 0 else server.grpc_url, x)
                for index, x in enumerate(sent)))

        answers = asyncio.run(scenario())
        for x, answer in zip(sent, answers):
            if x[0, 0] < 0:
                assert isinstance(answer, InferenceServerException), answer
                assert "negative input" in str(answer), answer
            else:
                np.testing.assert_array_equal(answer, x + 1)

        async def statistics() -> dict[str, Any]:
            client = httpaio.InferenceServerClient(server.url)
            try:
                return (await client.get_inference_statistics("failing"))["model_stats"][0]
            finally:
                await client.close()

        stats = asyncio.run(statistics())
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1, stats  # were batched
        assert stats["inference_stats"]["fail"]["count"] == 2
        assert stats["inference_stats"]["success"]["count"] == 4
    finally:
        assert stop_server(server) == 0, server.log.read_text()
