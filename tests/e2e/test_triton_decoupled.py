"""A decoupled Triton Python model's requests stream on after its execute returns, as on
Triton, through tritonclient's gRPC stream: the instance takes its next request meanwhile
(tests/testdata/triton_python/meeting), dynamic batching gives one execute several of them,
`async def execute`s overlap while they await (async_meeting), a response the model got
wrong fails its request alone, and a client that leaves is counted cancelled while the
server serves on (repeat). Sequence-batched: a sequence's next request runs once the
execute of the one before returned, final flag or not (lookahead), and a decoupled model
reschedules requests that stream a response each step (decoupled_iterative). An execute
that raised is counted as Triton counts it."""

from __future__ import annotations

import http.client
import json
import pathlib
import queue
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import RunningServer, start_server, stop_server, stream_answers
from tests.e2e.test_triton_python import repo, served  # noqa: F401  (the fixtures)
from tests.pipeline import repo_builder as rb

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


def _statistics_after(client: grpcclient.InferenceServerClient, model: str,
                      executions: int) -> dict[str, Any]:
    """`model`'s statistics once they count `executions` (or WAIT_S has passed). A
    decoupled model's response can reach its client before the executor has reported the
    execute that sent it: an execute is counted once it has returned."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = _statistics(client, model)
        if int(stats.get("execution_count", 0)) >= executions or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


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
        stats = _statistics_after(one, "meeting", before + 2)
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


def _repeat(served: RunningServer, requests: dict[str, int]  # noqa: F811
            ) -> tuple[dict[str, list[Any]], list[str]]:
    """The `repeat` model's answers to `requests` (request id: IN) on one gRPC stream: OUT's
    values by request id, and the errors."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, value in requests.items():
            client.async_stream_infer("repeat", _one("IN", value), request_id=request_id)
        client.stop_stream()
    return stream_answers(answers, lambda result: int(result.as_numpy("OUT")[0]))


def test_an_error_response_without_the_final_flag_does_not_end_the_request(
        served: RunningServer) -> None:  # noqa: F811
    """As on Triton (tools/triton_diff.py "stream probe: an error, then more"): the client
    gets the error, then what the model sends after it; over gRPC and generate_stream."""
    assert _repeat(served, {"goes-on": -3, "after": 1}) == (
        {"goes-on": [7], "after": [0]}, ["a passing error"])
    connection = http.client.HTTPConnection(served.host, served.port, timeout=30)
    try:
        connection.request("POST", "/v2/models/repeat/generate_stream", body=b'{"IN": -3}',
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        events = [json.loads(line[5:]) for line in answer.read().decode().splitlines()
                  if line.startswith("data:")]
    finally:
        connection.close()
    assert answer.status == 200
    assert events == [{"error": "a passing error"},
                      {"model_name": "repeat", "model_version": "1", "OUT": 7}]


def test_a_response_the_model_got_wrong_fails_its_request_alone(
        served: RunningServer) -> None:  # noqa: F811
    by_id, errors = _repeat(served, {"wrong": -2, "two": 2})
    assert by_id == {"two": [0, 1]}
    assert errors == ["model 'repeat' gave no output 'OUT' for request 'wrong', which asked "
                      "for it; its response has: OUTPUT"]


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


def _countdown(result: Any) -> tuple[int, int]:
    parameters = result.get_response().parameters
    return int(result.as_numpy("OUT")[0, 0]), int(parameters["batch"].int64_param)


def test_a_decoupled_model_reschedules_requests_that_stream_a_response_a_step(
        served: RunningServer) -> None:  # noqa: F811
    """Three requests without sequence ids, sent at once: each is a sequence of its own,
    answered once an execute, rescheduled until its last; they share executes."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            stream_timeout=30)
        for name, count in (("four", 4), ("two", 2), ("three", 3)):
            client.async_stream_infer("decoupled_iterative", _one("IN", count, True),
                                      request_id=name)
        client.stop_stream()
    by_id, errors = stream_answers(answers, _countdown)
    assert errors == []
    assert {name: [left for left, _ in got] for name, got in by_id.items()} == {
        "four": [3, 2, 1, 0], "two": [1, 0], "three": [2, 1, 0]}
    # the first step ran all three in one execute (the preferred batch of 3)
    assert {got[0][1] for got in by_id.values()} == {3}


def test_a_sequence_s_next_request_runs_before_the_one_before_has_ended(
        served: RunningServer) -> None:  # noqa: F811
    """`lookahead` answers a request only when the next of its sequence has come: two
    sequences, interleaved on one stream, each answered in full."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            stream_timeout=30)
        for step, value in enumerate((1, 2, 3)):
            for sequence, scale in ((71, 1), (72, 10)):
                client.async_stream_infer(
                    "lookahead", _one("IN", value * scale, True),
                    request_id=f"{sequence}-{step}", sequence_id=sequence,
                    sequence_start=step == 0, sequence_end=step == 2)
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: int(result.as_numpy("OUT")[0, 0]))
    assert errors == []
    assert by_id == {"71-0": [1], "71-1": [3], "71-2": [6],
                     "72-0": [10], "72-1": [30], "72-2": [60]}


def test_a_rescheduled_request_s_first_sender_refuses_what_its_rerun_sends(
        served: RunningServer) -> None:  # noqa: F811
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            stream_timeout=30)
        client.async_stream_infer("decoupled_iterative", _one("IN", -1, True),
                                  request_id="stale")
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: (
        int(result.as_numpy("OUT")[0, 0]),
        result.get_response().parameters["stale"].string_param))
    assert errors == []
    assert by_id == {"stale": [(0, "model 'decoupled_iterative': this request was rescheduled, "
                                   "so this sender sends no more; send through the sender of "
                                   "the execute that runs it next")]}


def test_an_ensemble_with_a_decoupled_step_streams_a_response_for_each_of_its(
        served: RunningServer) -> None:  # noqa: F811
    """repeat_doubled: repeat (decoupled) then int_double, in a Triton ensemble; its
    served config says it is decoupled, as Triton's does."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        config = client.get_model_config("repeat_doubled", as_json=True)["config"]
        assert config["model_transaction_policy"]["decoupled"] is True
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            stream_timeout=30)
        client.async_stream_infer("repeat_doubled", _one("IN", 4), request_id="four")
        client.async_stream_infer("repeat_doubled", _one("IN", -1), request_id="refused")
        client.stop_stream()
    by_id, errors = stream_answers(answers, lambda result: int(result.as_numpy("OUT")[0]))
    assert by_id == {"four": [0, 2, 4, 6]}
    assert errors == ["ensemble 'repeat_doubled', step 'repeat': IN must not be negative"]


RAISING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: IN < 0 makes execute raise; else one response (OUT = IN) and the final
    flag."""

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] < 0:
                raise pb_utils.TritonModelException("asked to raise")
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def test_an_execute_that_raised_counts_an_execution_and_no_inference(tmp_path: pathlib.Path
                                                                     ) -> None:
    """As Triton 2.51's Python backend counts a decoupled model's executes (measured with
    tools/triton_diff.py's stream_probe model): one that raised is an execution, its request
    a failure and not an inference."""
    root = tmp_path / "repo"
    rb.add_decoupled_int32(root, "raising", RAISING)
    server = start_server(root, tmp_path / "server.log")
    try:
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for value in (1, -1, 2):  # one at a time: each its own execute
                client.async_stream_infer("raising", _one("IN", value), request_id=str(value))
                answers.get(timeout=WAIT_S)
            client.stop_stream()
            stats = _statistics_after(client, "raising", 3)
        assert (int(stats["execution_count"]), int(stats["inference_count"])) == (3, 2)
        outcomes = stats["inference_stats"]
        assert (int(outcomes["success"]["count"]), int(outcomes["fail"]["count"])) == (2, 1)
    finally:
        assert stop_server(server) == 0, server.log.read_text()
