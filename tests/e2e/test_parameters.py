"""Triton's parameters extension: a request's own parameters reach its Python model, each
request of a batch its own, over HTTP and gRPC; reserved ones stay the server's; bad ones are
refused by name. The "params" model answers each row with what its request carried."""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer

CUSTOM = {"temperature": 0.25, "mode": "greedy", "top_k": 40, "stream": False}


def _seen(result: httpclient.InferResult | grpcclient.InferResult, output: str = "SEEN"
          ) -> list[dict]:
    return [json.loads(row) for row in result.as_numpy(output).reshape(-1)]


def _input(module, rows: int, value: float = 1.0):  # type: ignore[no-untyped-def]
    item = module.InferInput("INPUT", [rows, 1], "FP32")
    item.set_data_from_numpy(np.full((rows, 1), value, np.float32))
    return item


def test_parameters_reach_the_model_over_http_and_grpc(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("params", [_input(httpclient, 1, 2.0)], request_id="h1",
                              parameters={**CUSTOM, "tensorgate_report_copies": True},
                              priority=1, timeout=10**7)
    [seen] = _seen(result)
    # priority, timeout and tensorgate_* are the server's; the model sees the rest with
    # their JSON types
    assert seen == {"id": "h1", "rows": [0, 1], "parameters": CUSTOM, "requests": 1}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("params", [_input(grpcclient, 1, 3.0)], request_id="g1",
                              parameters=CUSTOM, priority=1, timeout=10**7)
    [seen] = _seen(result)
    assert seen == {"id": "g1", "rows": [0, 1], "parameters": CUSTOM, "requests": 1}
    assert type(seen["parameters"]["top_k"]) is int and seen["parameters"]["stream"] is False


def test_each_request_of_a_batch_sees_its_own_parameters_and_rows(server: RunningServer) -> None:
    # 1 + 2 + 3 + 2 rows: together they fill the model's batch of 8 (it waits up to 0.5 s)
    sizes = [1, 2, 3, 2]

    def call(index: int) -> list[dict]:
        with httpclient.InferenceServerClient(server.url) as client:
            return _seen(client.infer("params", [_input(httpclient, sizes[index], 4.0)],
                                      request_id=f"r{index}", parameters={"who": index}))

    with ThreadPoolExecutor(len(sizes)) as pool:
        answers = list(pool.map(call, range(len(sizes))))
    for index, rows in enumerate(answers):
        assert len(rows) == sizes[index]
        first = rows[0]
        assert all(row == first for row in rows)  # every row of a request says the same
        assert first["id"] == f"r{index}" and first["parameters"] == {"who": index}
        start, stop = first["rows"]
        assert stop - start == sizes[index]
    assert max(rows[0]["requests"] for rows in answers) > 1, "no two requests were batched"


def test_an_ensemble_passes_its_parameters_to_its_steps(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        item = grpcclient.InferInput("X", [1, 1], "FP32")
        item.set_data_from_numpy(np.full((1, 1), 5.0, np.float32))
        result = client.infer("params_ensemble", [item], parameters={"route": "a"})
    [seen] = _seen(result, "Y")
    assert seen["parameters"] == {"route": "a"}


def test_the_response_cache_tells_requests_apart_by_their_parameters(
        server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        def hits() -> int:
            stats = client.get_inference_statistics("params")["model_stats"][0]
            return int(stats["inference_stats"]["cache_hit"]["count"])

        def ask(parameters: dict) -> dict:
            return _seen(client.infer("params", [_input(httpclient, 1, 7.5)],
                                      parameters=parameters))[0]

        before = hits()
        assert ask({"n": 1})["parameters"] == {"n": 1}
        assert ask({"n": 1})["parameters"] == {"n": 1} and hits() == before + 1
        # the same input with other parameters is another question: the model answers it
        assert ask({"n": 2})["parameters"] == {"n": 2} and hits() == before + 1
        assert ask({"n": True})["parameters"] == {"n": True} and hits() == before + 1
        assert ask({"n": 2})["parameters"] == {"n": 2} and hits() == before + 2


@pytest.mark.parametrize(("parameters", "message"), [
    ({"style": {"a": 1}}, "request parameter 'style' must be a boolean, a number or a string, "
                          "got dict"),
    ({"stop": ["x"]}, "request parameter 'stop' must be a boolean, a number or a string, "
                      "got list"),
    ({"seed": None}, "request parameter 'seed' must be a boolean, a number or a string, "
                     "got no value"),
    ({"triton_mine": 1}, "request parameter 'triton_mine': keys starting with 'triton_' are "
                         "reserved; the server knows triton_enable_empty_final_response"),
    ({"headers": {"a": "b"}}, "request parameter 'headers' is reserved: it is where a server "
                              "puts the HTTP headers it forwards to the model (here each "
                              "forwarded header is a parameter of its own name: "
                              "--http-header-forward-pattern)"),
])
def test_bad_parameters_are_refused_by_name(server: RunningServer, parameters: dict,
                                            message: str) -> None:
    body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
            "parameters": parameters}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", "/v2/models/params/infer", json.dumps(body).encode(),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 400
        assert json.loads(response.read()) == {"error": message}
        # the connection and the server go on serving
        body["parameters"] = {"ok": "yes"}
        connection.request("POST", "/v2/models/params/infer", json.dumps(body).encode(),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        [output] = json.loads(response.read())["outputs"]
        assert json.loads(output["data"][0])["parameters"] == {"ok": "yes"}
    finally:
        connection.close()


def test_the_server_says_it_has_the_parameters_extension(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        assert "parameters" in client.get_server_metadata()["extensions"]


def test_headers_matching_the_forward_pattern_reach_the_model(server: RunningServer) -> None:
    # the shared server forwards headers named ^x-pass- (HTTP and gRPC); a header wins over
    # a parameter of its name (a proxy sets headers, a client the body)
    headers = {"X-Pass-Tenant": "acme", "x-pass-n": "7", "X-Other": "kept back"}
    with httpclient.InferenceServerClient(server.url) as client:
        [seen] = _seen(client.infer("params", [_input(httpclient, 1, 8.0)], headers=headers,
                                    parameters={"x-pass-n": 1, "mine": True}))
    assert seen["parameters"] == {"x-pass-tenant": "acme", "x-pass-n": "7", "mine": True}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        [seen] = _seen(client.infer("params", [_input(grpcclient, 1, 8.5)],
                                    headers={"x-pass-tenant": "acme", "x-other": "no"}))
        assert seen["parameters"] == {"x-pass-tenant": "acme"}
        answers: list[object] = []  # and on the stream, from the stream's metadata
        client.start_stream(callback=lambda result, error: answers.append(error or result),
                            headers={"x-pass-tenant": "streamed"})
        client.async_stream_infer("params", [_input(grpcclient, 1, 9.0)])
        client.stop_stream()
    [result] = answers
    assert _seen(result)[0]["parameters"] == {"x-pass-tenant": "streamed"}  # type: ignore[arg-type]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:  # and with the generate extension
        connection.request("POST", "/v2/models/params/generate", json.dumps({"INPUT": 1}),
                           {"Content-Type": "application/json", "X-Pass-Tenant": "gen"})
        response = connection.getresponse()
        assert response.status == 200
        seen = json.loads(json.loads(response.read())["SEEN"])
        assert seen["parameters"] == {"x-pass-tenant": "gen"}
    finally:
        connection.close()


def test_a_model_answers_parameters_of_its_own(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("params", [_input(httpclient, 2, 1.5)],
                              parameters={"echo": "from http"})
        assert result.get_response()["parameters"] == {"echo": "from http", "rows": 2}
        plain = client.infer("params", [_input(httpclient, 1, 1.5)])  # sets none
        assert "parameters" not in plain.get_response()
        with pytest.raises(InferenceServerException,
                           match=r"model 'params': its response's parameter 'bad' is list "
                                 r"\[1, 2\]; a response parameter must be"):
            client.infer("params", [_input(httpclient, 1, 1.5)],
                         parameters={"answer_badly": True})
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("params", [_input(grpcclient, 3, 2.5)], parameters={"echo": 7})
        parameters = result.get_response().parameters
        assert parameters["echo"].int64_param == 7 and parameters["rows"].int64_param == 3
