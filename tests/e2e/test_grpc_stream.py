"""ModelStreamInfer through tritonclient's stream APIs (sync and asyncio) and a plain grpcio
stream, and grpc.health.v1: every request answered by id, a failed request answered in the
stream without ending it, bounds and shutdown, hostile messages."""

from __future__ import annotations

import asyncio
import queue
import threading

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tests.e2e import h2_client as h2
from tests.e2e.conftest import RunningServer, health_check, start_server, stop_server
from tests.e2e.test_grpc_wire import _assert_serving

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _input(value: np.ndarray, module=grpcclient) -> object:
    item = module.InferInput("INPUT__0", list(value.shape), "FP32")
    item.set_data_from_numpy(value)
    return item


def _request(model: str, value: np.ndarray, request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.extend(value.shape)
    request.raw_input_contents.append(value.astype("<f4").tobytes())
    return request


def _grpcio_stream(server: RunningServer, requests: list[bytes],
                   timeout_s: float = 60) -> list[pb.ModelStreamInferResponse]:
    """Send `requests` (serialized) on one stream with a plain grpcio channel; all answers."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream(STREAM, request_serializer=lambda b: b,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        return list(call(iter(requests), timeout=timeout_s))


def test_sync_stream_answers_every_request(server: RunningServer) -> None:
    rng = np.random.default_rng(5)
    sent = {str(i): rng.standard_normal((1 + i % 3, 3, 4)).astype(np.float32)
            for i in range(48)}
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, value in sent.items():  # every other one asks for an empty final
            client.async_stream_infer("identity", [_input(value)], request_id=request_id,
                                      enable_empty_final_response=int(request_id) % 2 == 0)
        client.stop_stream()  # ends the client's side and waits for every answer
    got = {}
    while not answers.empty():
        result, error = answers.get_nowait()
        assert error is None
        response = result.get_response()
        got[response.id] = result.as_numpy("OUTPUT__0")
        # one response per request, each saying it is its request's last, asked or not (as
        # Triton 2.51 marks every streamed response)
        assert response.parameters["triton_final_response"].bool_param
    assert got.keys() == sent.keys()
    for request_id, value in sent.items():
        assert got[request_id].tobytes() == value.tobytes()


def test_a_failed_request_is_answered_in_the_stream_which_carries_on(
        server: RunningServer) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("linear", [_input(np.zeros((1, 7), np.float32))],
                                  request_id="bad-shape")
        client.async_stream_infer("nope", [_input(np.zeros((1, 8), np.float32))],
                                  request_id="no-model")
        client.async_stream_infer("identity", [_input(np.ones((1, 3, 4), np.float32))],
                                  request_id="after")
        client.stop_stream()
    results = [answers.get_nowait() for _ in range(3)]
    assert answers.empty()
    errors = sorted(str(error) for _, error in results if error is not None)
    assert len(errors) == 2
    assert "input 'INPUT__0' of model 'linear' has shape [1,7]; expected [-1,8]" in errors[0]
    assert "unknown model 'nope'" in errors[1]
    [ok] = [result for result, error in results if error is None]
    assert ok.get_response().id == "after"
    assert ok.as_numpy("OUTPUT__0").tolist() == np.ones((1, 3, 4)).tolist()


def test_error_answers_name_their_request(server: RunningServer) -> None:
    value = np.zeros((1, 7), np.float32)
    [answer] = _grpcio_stream(server, [_request("linear", value, "r-7").SerializeToString()])
    assert "has shape [1,7]" in answer.error_message
    assert (answer.infer_response.model_name, answer.infer_response.id) == ("linear", "r-7")


def test_asyncio_stream(server: RunningServer) -> None:
    values = [np.full((1, 3, 4), i, np.float32) for i in range(24)]

    async def scenario() -> dict[str, np.ndarray]:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            async def requests():
                for i, value in enumerate(values):
                    yield {"model_name": "identity", "inputs": [_input(value, grpcaio)],
                           "request_id": str(i)}
            got = {}
            async for result, error in client.stream_infer(requests()):
                assert error is None
                got[result.get_response().id] = result.as_numpy("OUTPUT__0")
            return got
    got = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(got, key=int) == [str(i) for i in range(len(values))]
    for i, value in enumerate(values):
        assert got[str(i)].tobytes() == value.tobytes()


def test_a_cancelled_stream_is_dropped_and_the_server_serves_on(server: RunningServer) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i in range(8):  # 0.05 s each, one at a time: most are still queued
            client.async_stream_infer("paced", [_input(np.ones((1, 4), np.float32))],
                                      request_id=str(i))
        client.stop_stream(cancel_requests=True)
    _assert_serving(server)


def test_too_many_waiting_requests_end_the_stream(server: RunningServer) -> None:
    """64 requests in the pipeline (paced: 0.05 s each), 1,024 more waiting: one more
    ends the stream with RESOURCE_EXHAUSTED; answers already sent stay sent."""
    message = _request("paced", np.ones((1, 4), np.float32), "").SerializeToString()
    client = h2.H2Client(server.grpc_port)
    try:
        stream = client.call("ModelStreamInfer", None, end_stream=False)  # headers only
        # a few over the bound: some of the 64 may finish while the burst arrives
        body = (b"\x00" + len(message).to_bytes(4, "big") + message) * (64 + 1024 + 20)
        for start in range(0, len(body), 16384):
            client.send(h2.DATA, 0, stream, body[start:start + 16384])
        frames = client.frames_until(
            lambda f: f.stream == stream and f.kind == h2.HEADERS and f.flags & h2.END_STREAM,
            limit_s=30)
        trailers = dict(client.decoder.decode(frames[-1].payload))
        assert trailers["grpc-status"] == "8"
        assert "more than 1024 requests wait on this stream" in trailers["grpc-message"]
    finally:
        client.close()
    _assert_serving(server)


def test_health_check(server: RunningServer) -> None:
    """grpc.health.v1.Health/Check: the server, the inference service and "readiness" are
    its readiness, "liveness" its liveness (test_loading.py has them apart)."""
    for service in ("", "inference.GRPCInferenceService", "readiness", "liveness"):
        assert health_check(server.grpc_url, service) == "SERVING"
    with pytest.raises(grpc.RpcError) as raised:
        health_check(server.grpc_url, "nope")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown service 'nope' for health checks" in raised.value.details()


def test_shutdown_answers_what_a_stream_sent_then_ends_it(e2e_repo, tmp_path) -> None:
    running = start_server(e2e_repo, tmp_path / "server.log")
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    try:
        with grpcclient.InferenceServerClient(running.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for i in range(4):
                client.async_stream_infer("paced", [_input(np.ones((1, 4), np.float32))],
                                          request_id=str(i))
            first = answers.get(timeout=30)  # the stream is running
            stopper = threading.Thread(target=stop_server, args=(running,))
            stopper.start()
            results = [first] + [answers.get(timeout=30) for _ in range(4)]
            client.stop_stream()
            stopper.join(timeout=60)
    finally:
        if running.process.poll() is None:
            running.process.kill()
    answered = sorted(r.get_response().id for r, e in results if e is None)
    assert answered == ["0", "1", "2", "3"]
    [(_, ended)] = [(r, e) for r, e in results if e is not None]
    assert "the server is shutting down" in str(ended) and "UNAVAILABLE" in str(ended)
    assert running.process.returncode == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.binary(max_size=200), min_size=1, max_size=6))
def test_hostile_stream_messages_are_answered_one_by_one(server: RunningServer,
                                                         messages: list[bytes]) -> None:
    answers = _grpcio_stream(server, messages, timeout_s=30)
    # each message, however malformed, gets exactly one answer: an error or a result
    assert len(answers) == len(messages)
    for answer in answers:
        assert answer.error_message or answer.infer_response.outputs


def test_a_message_the_pool_cannot_hold_is_answered_and_the_stream_goes_on(
        e2e_repo, tmp_path) -> None:
    """A 5 MiB pool and 3 MB requests: while the first request's answer waits for the
    client's window (1,000 bytes), the pool cannot take the next ones. They are answered with
    the pool's error and the stream ends normally once the client reads."""
    running = start_server(e2e_repo, tmp_path / "server.log", "--host-pool-bytes",
                           str(5 << 20), "--max-request-bytes", str(4 << 20))
    values = np.arange(750_000, dtype=np.float32)  # 3 MB
    messages = []
    for i in range(3):
        request = pb.ModelInferRequest(model_name="wide", id=f"m{i}")
        item = request.inputs.add(name="INPUT__0", datatype="FP32")
        item.shape.append(values.size)
        request.raw_input_contents.append(values.tobytes())
        messages.append(request.SerializeToString())
    client = h2.H2Client(running.grpc_port, settings={4: 1000})  # INITIAL_WINDOW_SIZE
    try:
        stream = client.call("ModelStreamInfer", messages[0], end_stream=False)
        rest = b"".join(b"\x00" + len(m).to_bytes(4, "big") + m for m in messages[1:])
        for start in range(0, len(rest), 16384):
            client.send(h2.DATA, 0, stream, rest[start:start + 16384])
        client.send(h2.DATA, h2.END_STREAM, stream)
        for window in (0, stream):  # the connection's and the stream's
            client.send(h2.WINDOW_UPDATE, 0, window, (64 << 20).to_bytes(4, "big"))
        headers, data = client.response(stream)
    finally:
        client.close()
        stop_server(running)
    assert headers["grpc-status"] == "0"
    answers = []
    while data:  # length-prefixed ModelStreamInferResponses
        size = int.from_bytes(data[1:5], "big")
        answers.append(pb.ModelStreamInferResponse.FromString(data[5:5 + size]))
        data = data[5 + size:]
    assert len(answers) == 3
    refused = [a for a in answers if a.error_message]
    assert refused and all("host buffer pool is full" in a.error_message for a in refused)
    served = [a for a in answers if not a.error_message]
    assert served[0].infer_response.id == "m0"
    assert all(a.infer_response.raw_output_contents[0] == values.tobytes() for a in served)
