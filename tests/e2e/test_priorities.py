"""The `priority` request parameter from tritonclient (HTTP and gRPC, asyncio) on a model with
two priority levels: a later request of level 1 runs before an earlier one of level 2."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer

GAP_S = 0.05  # between sends; the model takes 0.3 s a request


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_later_high_priority_request_runs_before_earlier_low_one(
        server: RunningServer, protocol: str) -> None:
    module: Any = httpaio if protocol == "http" else grpcaio
    url = server.url if protocol == "http" else server.grpc_url

    def inputs(value: float) -> list[Any]:
        item = module.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.full((1, 4), value, np.float32))
        return [item]

    async def scenario() -> tuple[list[str], dict[str, Any]]:
        client = module.InferenceServerClient(url)
        order: list[str] = []

        async def send(name: str, value: float, priority: int) -> Any:
            result = await client.infer("ranked", inputs(value), priority=priority)
            order.append(name)
            return result.as_numpy("OUTPUT__0")
        try:
            tasks = {}
            for name, value, priority in (("first", 1.0, 0), ("low", 2.0, 2), ("high", 3.0, 1)):
                tasks[name] = asyncio.create_task(send(name, value, priority))
                await asyncio.sleep(GAP_S)
            values = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        finally:
            await client.close()
        return order, values

    order, values = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert order == ["first", "high", "low"]
    for name, value in (("first", 1.0), ("low", 2.0), ("high", 3.0)):
        assert np.array_equal(values[name], np.full((1, 4), 2 * value + 1, np.float32))


def test_bad_priority_is_named_and_the_server_keeps_serving(server: RunningServer) -> None:
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("ranked", [item], priority=-1)
        assert refused.value.status() == "400"
        assert "request parameter 'priority' must be a non-negative integer" in \
            refused.value.message()
        served = client.infer("ranked", [item], priority=1).as_numpy("OUTPUT__0")
        assert np.array_equal(served, np.full((1, 4), 3.0, np.float32))
