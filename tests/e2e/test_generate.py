"""Triton's generate extension over real sockets: `/generate` answers one flat JSON object,
`/generate_stream` each response as a Server-Sent Event as the model makes it; errors before
the first response are HTTP errors, errors after it are `{"error": ...}` events; a client
that leaves a stream stops the model. tritonclient has no generate call: these tests speak
HTTP/1.1 with the standard library, as curl or an LLM client would."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import RunningServer


def _connect(server: RunningServer) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)


def _post(connection: http.client.HTTPConnection, path: str, body: object
          ) -> http.client.HTTPResponse:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, payload, {"Content-Type": "application/json"})
    return connection.getresponse()


def _generate(server: RunningServer, model: str, body: object) -> tuple[int, dict]:
    connection = _connect(server)
    try:
        response = _post(connection, f"/v2/models/{model}/generate", body)
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _events(response: http.client.HTTPResponse) -> list[dict]:
    """Every `data:` event of a finished event stream, in order."""
    text = response.read().decode()
    assert text.endswith("\n\n"), text
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        events.append(json.loads(block[len("data: "):]))
    return events


def test_generate_answers_one_flat_object(server: RunningServer) -> None:
    status, answer = _generate(server, "shout", {"text_input": "hello world"})
    assert status == 200
    assert answer == {"model_name": "shout", "model_version": "1",
                      "text_output": "HELLO WORLD", "length": 11}


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_a_compressed_generate_body_is_read_as_it_is_plain(server: RunningServer,
                                                            path: str) -> None:
    """Decompressed a piece at a time, as infer's bodies (this server takes 1 MiB at most:
    one piece here)."""
    text = "hello " * 150_000
    connection = _connect(server)
    try:
        connection.request("POST", f"/v2/models/shout/{path}",
                           gzip.compress(json.dumps({"text_input": text}).encode(), 1),
                           {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        answer = json.loads(response.read()) if path == "generate" else _events(response)[0]
    finally:
        connection.close()
    assert answer["text_output"] == text.upper() and answer["length"] == len(text)


def test_generate_fits_numbers_to_the_input_dims(server: RunningServer) -> None:
    values = np.arange(8, dtype=np.float32) / 4
    status, answer = _generate(server, "linear", {"INPUT__0": values.tolist()})
    assert status == 200
    with httpclient.InferenceServerClient(server.url) as client:
        item = httpclient.InferInput("INPUT__0", [1, 8], "FP32")
        item.set_data_from_numpy(values.reshape(1, 8))
        expected = client.infer("linear", [item]).as_numpy("OUTPUT__0").reshape(-1)
    assert np.allclose(answer["OUTPUT__0"], expected)
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    for value in (grid.tolist(), grid.reshape(-1).tolist()):  # as shaped, or laid out
        status, answer = _generate(server, "identity", {"INPUT__0": value})
        assert status == 200 and answer["OUTPUT__0"] == grid.reshape(-1).tolist()


@pytest.mark.parametrize(("model", "body", "status", "message"), [
    ("shout", {"text_input": "x", "temperature": 0.5, "parameters": {"temperature": 1}}, 400,
     "request parameter 'temperature' is given twice: as a member of the request and in its "
     "'parameters'"),
    ("shout", {"text_input": "x", "stop": ["a"]}, 400,
     "request parameter 'stop' must be a boolean, a number or a string, got list"),
    ("shout", {"parameters": {"priority": 1}}, 400,
     "model 'shout' needs input 'text_input'; the request has: no inputs"),
    ("shout", {"text_input": 7}, 400, "input 'text_input': BYTES 'data' must hold strings"),
    ("shout", {"text_input": "x", "parameters": []}, 400,
     "'parameters' of the generate request must be a JSON object, got list"),
    ("shout", b"[1, 2]", 400, "the generate request must be a JSON object, got list"),
    ("identity", {"INPUT__0": list(range(11))}, 400,
     "input 'INPUT__0' of model 'identity' takes dims [3,4]; the value has 11 elements "
     "(shape [11])"),
    ("identity", {"INPUT__0": [[1, 2], [3]]}, 400,
     "input 'INPUT__0' of model 'identity': the value is not a scalar or a rectangular array"),
    ("linear", {"INPUT__0": [2**40] * 8}, 200, None),  # FP32 takes any number
    ("nonexistent", {"text_input": "x"}, 404, None),
])
def test_bad_generate_requests_are_refused_by_name(server: RunningServer, model: str,
                                                   body: object, status: int,
                                                   message: str | None) -> None:
    got, answer = _generate(server, model, body)
    assert got == status, answer
    if message is not None:
        assert answer == {"error": message}


def test_members_that_are_not_inputs_reach_the_model_as_parameters(
        server: RunningServer) -> None:
    status, answer = _generate(server, "params", {"INPUT": 1.5, "temperature": 0.7,
                                                  "parameters": {"top_k": 5, "timeout": 10**7}})
    assert status == 200, answer
    seen = json.loads(answer["SEEN"])
    assert seen["parameters"] == {"temperature": 0.7, "top_k": 5}  # timeout is the server's
    connection = _connect(server)
    try:  # a streaming model stops at the max_tokens it was given, either way of giving it
        for body in ({"text_input": "one two three four", "max_tokens": 2},
                     {"text_input": "one two three four", "parameters": {"max_tokens": 2}}):
            response = _post(connection, "/v2/models/words/generate_stream", body)
            assert response.status == 200
            assert [e["text_output"] for e in _events(response)] == ["ONE", "TWO"]
    finally:
        connection.close()


def test_generate_stream_sends_each_response_as_it_is_made(server: RunningServer) -> None:
    connection = _connect(server)
    try:
        response = _post(connection, "/v2/models/words/generate_stream",
                         {"text_input": "serve the tail"})
        assert response.status == 200
        assert response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
        assert response.getheader("Transfer-Encoding") == "chunked"
        events = _events(response)
        assert [e["text_output"] for e in events] == ["SERVE", "THE", "TAIL"]
        assert all(e["model_name"] == "words" and e["model_version"] == "1" for e in events)
        # the connection is kept alive: a second stream on it, from a batched model
        response = _post(connection, "/v2/models/shout/generate_stream", {"text_input": "ok"})
        assert response.status == 200
        assert _events(response) == [{"model_name": "shout", "model_version": "1",
                                      "text_output": "OK", "length": 2}]
    finally:
        connection.close()


def test_an_error_after_the_first_response_is_the_last_event(server: RunningServer) -> None:
    connection = _connect(server)
    try:
        response = _post(connection, "/v2/models/words/generate_stream",
                         {"text_input": "one boom two"})
        assert response.status == 200
        assert _events(response)[-2:] == [
            {"model_name": "words", "model_version": "1", "text_output": "ONE"},
            {"error": "model 'words' raised ValueError: boom"}]
        # a failure before the first response is an HTTP error, as for /infer
        response = _post(connection, "/v2/models/words/generate_stream", {"text_input": "boom"})
        assert response.status >= 400
        assert response.getheader("Content-Type") == "application/json"
        assert json.loads(response.read()) == {"error": "model 'words' raised ValueError: boom"}
    finally:
        connection.close()


def test_generate_takes_exactly_one_response_from_a_decoupled_model(
        server: RunningServer) -> None:
    status, answer = _generate(server, "words", {"text_input": "single"})
    assert (status, answer) == (200, {"model_name": "words", "model_version": "1",
                                      "text_output": "SINGLE"})
    status, answer = _generate(server, "words", {"text_input": "two words"})
    assert status == 400
    assert answer == {"error": "model 'words' is decoupled and sent more than one response; "
                               "call generate_stream to receive each as it comes"}


def test_a_client_leaving_a_stream_stops_the_model(server: RunningServer) -> None:
    """"forever" never ends by itself, and "words" has one instance that runs one request at
    a time: the request after it is answered only if leaving stopped the model."""
    body = json.dumps({"text_input": "forever"}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/words/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        received = b""
        deadline = time.monotonic() + 30
        while received.count(b"FOREVER") < 3 and time.monotonic() < deadline:
            received += sock.recv(65536)
        assert received.count(b"FOREVER") >= 3, received[:400]
    started = time.monotonic()
    status, answer = _generate(server, "words", {"text_input": "after"})
    assert (status, answer["text_output"]) == (200, "AFTER")
    assert time.monotonic() - started < 10


def test_server_metadata_lists_generate(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        assert "generate" in client.get_server_metadata()["extensions"]
