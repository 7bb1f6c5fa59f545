"""A decoupled model through tritonclient: its responses arrive on the gRPC stream one by
one, in order per request, with Triton's final-response flags; an error after some responses
comes after them and the stream carries on; unary calls (gRPC and HTTP) are refused with a
message that says how to call it."""

from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, stream_answers


def _input(first: float, module=grpcclient) -> object:
    item = module.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.full((1, 4), first, np.float32))
    return item


def _final(result) -> bool | None:
    parameters = result.get_response().parameters
    if "triton_final_response" not in parameters:
        return None
    return parameters["triton_final_response"].bool_param


def test_each_response_arrives_in_order_then_the_final_flag(server: RunningServer) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("counter", [_input(4)], request_id="four",
                                  enable_empty_final_response=True)
        client.async_stream_infer("counter", [_input(2)], request_id="two")
        client.async_stream_infer("counter", [_input(-3)], request_id="fails",
                                  enable_empty_final_response=True)
        client.async_stream_infer("counter", [_input(0)], request_id="none",
                                  enable_empty_final_response=True)
        client.stop_stream()  # ends our side; waits for every response
    by_id, errors = stream_answers(answers, lambda result: (
        result.as_numpy("OUTPUT__0")[0, 0] if result.get_response().outputs else None,
        _final(result)))
    assert by_id["four"] == [(0.0, False), (1.0, False), (2.0, False), (3.0, False),
                             (None, True)]
    # each says whether it is the last as Triton does (a generator's last is known only
    # after it); the empty final one only where asked
    assert by_id["two"] == [(0.0, False), (1.0, False)]
    assert by_id["fails"] == [(0.0, False)]  # then its error, and no final response
    assert by_id["none"] == [(None, True)]  # no response from the model: only the final
    assert errors == ["model 'counter' raised ValueError: stopped after one response"]


def test_a_short_request_streams_beside_a_long_one(server: RunningServer) -> None:
    """counter_pair interleaves two requests (streams_per_instance 2): the short one, sent
    after the long one on the same stream, ends while the long one still streams."""
    arrived: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: arrived.put((result, error)))
        client.async_stream_infer("counter_pair", [_input(30)], request_id="long")
        client.async_stream_infer("counter_pair", [_input(2)], request_id="short")
        client.stop_stream()
    order = []
    while not arrived.empty():
        result, error = arrived.get_nowait()
        assert error is None
        response = result.get_response()
        order.append((response.id, float(result.as_numpy("OUTPUT__0")[0, 0])))
    assert [v for i, v in order if i == "long"] == [float(k) for k in range(30)]
    assert [v for i, v in order if i == "short"] == [0.0, 1.0]
    short_end = order.index(("short", 1.0))
    assert order.index(("long", 29.0)) > short_end + 10  # most of the long one came after


def test_asyncio_stream_infer_gets_every_response(server: RunningServer) -> None:
    async def scenario() -> list[float]:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def requests():
                yield {"model_name": "counter", "inputs": [_input(3, grpcaio)],
                       "request_id": "r", "enable_empty_final_response": True}
            values = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                if _final(result):
                    break
                values.append(float(result.as_numpy("OUTPUT__0")[0, 0]))
            return values
        finally:
            await client.close()
    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == [0.0, 1.0, 2.0]


def test_unary_calls_to_a_decoupled_model_say_how_to_call_it(server: RunningServer) -> None:
    message = "model 'counter' is decoupled"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.infer("counter", [_input(2)])
        assert "ModelStreamInfer" in refused.value.message()
        assert client.is_model_ready("counter")
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.full((1, 4), 2, np.float32))
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.infer("counter", [item])
        assert refused.value.status() == "400"


def test_each_response_carries_the_parameters_its_model_set_for_it(
        server: RunningServer) -> None:
    """A tensorgate Model's generator sets `response_parameters` before each yield: each
    response has its own ("index"), and only the last has "finish_reason"."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"to be or not"]], dtype=object))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("words", [text], request_id="all")
        client.async_stream_infer("words", [text], request_id="cut", parameters={"max_tokens": 2})
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: (
        result.as_numpy("text_output")[0, 0],
        {k: v.WhichOneof("parameter_choice") and getattr(v, v.WhichOneof("parameter_choice"))
         for k, v in result.get_response().parameters.items() if k != "triton_final_response"}))
    assert errors == []
    assert by_id["all"] == [(b"TO", {"index": 0}), (b"BE", {"index": 1}),
                            (b"OR", {"index": 2}),
                            (b"NOT", {"index": 3, "finish_reason": "stop"})]
    assert by_id["cut"] == [(b"TO", {"index": 0}),
                            (b"BE", {"index": 1, "finish_reason": "length"})]
