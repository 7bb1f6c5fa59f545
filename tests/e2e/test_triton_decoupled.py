"""A decoupled Triton Python model's requests stream on after its execute returns, as on
Triton, through tritonclient's gRPC stream: the instance takes its next request meanwhile
(tests/testdata/triton_python/meeting), dynamic batching gives one execute several of them,
`async def execute`s overlap while they await (async_meeting), a response the model got
wrong fails its request alone, and a client that leaves is counted cancelled while the
server serves on (repeat)."""

from __future__ import annotations

import queue
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import RunningServer, stream_answers
from tests.e2e.test_triton_python import repo, served  # noqa: F401  (the fixtures)

WAIT_S = 5.0  # a bound on polling the server's statistics


def _one(name: str, value: int, batched: bool = False) -> list[Any]:
    """One INT32 input of one element (in a batch of one, for a batching model)."""
    array = np.array([[value]] if batched else [value], np.int32)
    item = grpcclient.InferInput(name, list(array.shape), "INT32")
    item.set_data_from_numpy(array)
    return [item]


def _statistics(client: grpcclient.InferenceServerClient, model: str) -> dict[str, Any]:
    return client.get_inference_statistics(model, as_json=True)["model_stats"][0]


def _executions(client: grpcclient.InferenceServerClient, model: str) -> int:
    return int(_statistics(client, model).get("execution_count", 0))


def _outcomes(client: grpcclient.InferenceServerClient) -> tuple[int, int]:
    """The `repeat` model's requests that succeeded, and that failed."""
    stats = _statistics(client, "repeat")["inference_stats"]
    return (int(stats.get("success", {}).get("count", 0)),
            int(stats.get("fail", {}).get("count", 0)))


def _meeting_answers(answers: queue.Queue) -> tuple[dict[str, list[Any]], list[str]]:
    return stream_answers(answers, lambda result: (int(result.as_numpy("OPEN")[0, 0]),
                                                   int(result.as_numpy("BATCH")[0, 0])))


def test_an_instance_takes_its_next_request_while_earlier_ones_stream(
        served: RunningServer) -> None:  # noqa: F811
    """The first request waits in the model's thread for a second to be open; the second
    is sent only once the first's execute has returned (the statistics count it), and is
    run by the same (only) instance: both see two open."""
    first: queue.Queue = queue.Queue()
    second: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as one, \
            grpcclient.InferenceServerClient(served.grpc_url) as other:
        before = _executions(one, "meeting")
        one.start_stream(callback=lambda result, error: first.put((result, error)))
        one.async_stream_infer("meeting", _one("WAIT_FOR", 2, True), request_id="first")
        deadline = time.monotonic() + WAIT_S
        while _executions(one, "meeting") == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _executions(one, "meeting") == before + 1, \
            "the first request's execute did not return while its request was open"
        other.start_stream(callback=lambda result, error: second.put((result, error)))
        other.async_stream_infer("meeting", _one("WAIT_FOR", 2, True), request_id="second")
        other.stop_stream()  # each waits for its stream's responses
        one.stop_stream()
        stats = _statistics(one, "meeting")
    assert _meeting_answers(first) == ({"first": [(2, 1)]}, [])
    assert _meeting_answers(second) == ({"second": [(2, 1)]}, [])
    assert int(stats["execution_count"]) == before + 2


def test_dynamic_batching_gives_one_execute_several_streaming_requests(
        served: RunningServer) -> None:  # noqa: F811
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for name in ("a", "b", "c"):  # within the model's 200 ms queue delay
            client.async_stream_infer("meeting", _one("WAIT_FOR", 3, True), request_id=name)
        client.stop_stream()
    assert _meeting_answers(answers) == ({name: [(3, 3)] for name in "abc"}, [])


def test_async_decoupled_executes_overlap_while_they_await(served: RunningServer  # noqa: F811
                                                           ) -> None:
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for name in ("a", "b"):  # one instance, one request an execute
            client.async_stream_infer("async_meeting", _one("WAIT_FOR", 2), request_id=name)
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: int(result.as_numpy("OPEN")[0]))
    assert (by_id, errors) == ({"a": [2], "b": [2]}, [])


def test_a_response_the_model_got_wrong_fails_its_request_alone(
        served: RunningServer) -> None:  # noqa: F811
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("repeat", _one("IN", -2), request_id="wrong")
        client.async_stream_infer("repeat", _one("IN", 2), request_id="two")
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: int(result.as_numpy("OUT")[0]))
    assert by_id == {"two": [0, 1]}
    assert errors == ["model 'repeat' output 'OUT' is FP32; its config says INT32"]


def test_a_client_that_leaves_mid_stream_is_counted_cancelled(
        served: RunningServer) -> None:  # noqa: F811
    """A million responses asked for: the model sends ahead until its client stops taking
    them, sees the request cancelled once the client has gone, and sends its final flag."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        before = _outcomes(client)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("repeat", _one("IN", 1_000_000), request_id="many")
        answers.get(timeout=WAIT_S)  # the first response came
        client.stop_stream(cancel_requests=True)
        deadline = time.monotonic() + WAIT_S
        while _outcomes(client) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _outcomes(client) == (before[0], before[1] + 1)  # no success, one failure
        again: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: again.put((result, error)))
        client.async_stream_infer("repeat", _one("IN", 3), request_id="three")
        client.stop_stream()
    by_id, errors = stream_answers(again, lambda result: int(result.as_numpy("OUT")[0]))
    assert (by_id, errors) == ({"three": [0, 1, 2]}, [])
