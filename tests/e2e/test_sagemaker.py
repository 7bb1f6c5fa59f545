"""Amazon SageMaker's routes (--allow-sagemaker): GET /ping and POST /invocations on a port
of their own, as a SageMaker endpoint calls them, over real sockets."""

from __future__ import annotations

import http.client
import json
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from tensorgate.network.sagemaker_routes import BINARY_CONTENT_TYPE
from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline import repo_builder as rb


def _sagemaker_port(server: RunningServer) -> int:
    found = re.search(r"SageMaker on 127\.0\.0\.1:(\d+)", server.log.read_text())
    assert found, server.log.read_text()
    return int(found.group(1))


def _call(port: int, method: str, path: str, body: bytes = b"",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def _binary_request(values: np.ndarray, report_copies: bool = False) -> tuple[bytes, int]:
    """A request for model "wide" with its input and output as binary tensors: the body and
    the length of its JSON."""
    head = json.dumps({
        "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": list(values.shape),
                    "parameters": {"binary_data_size": values.nbytes}}],
        "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
        "parameters": {"tensorgate_report_copies": report_copies}}).encode()
    return head + values.tobytes(), len(head)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("sagemaker-models")
    rb.add_torchscript(root, "wide", rb.Identity(), [-1], [-1], max_batch=0)
    rb.add_text_models(root)
    return root


@pytest.fixture(scope="module")
def endpoint(repo: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[RunningServer, int]]:
    log = tmp_path_factory.mktemp("sagemaker") / "server.log"
    server = start_server(repo, log, "--allow-sagemaker", "true", "--sagemaker-port", "0",
                          env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "wide"})
    yield server, _sagemaker_port(server)
    assert stop_server(server) == 0, log.read_text()


def test_ping_answers_200_once_ready(endpoint: tuple[RunningServer, int]) -> None:
    _, port = endpoint
    assert _call(port, "GET", "/ping")[0] == 200
    status, headers, body = _call(port, "POST", "/ping")
    assert (status, headers["allow"]) == (405, "GET, HEAD"), body


def test_json_invocation_is_the_models_infer(endpoint: tuple[RunningServer, int]) -> None:
    server, port = endpoint
    body = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [3],
                                   "data": [1.5, -2.0, 3.25]}]}).encode()
    status, headers, answer = _call(port, "POST", "/invocations", body,
                                    {"Content-Type": "application/json"})
    assert (status, headers["content-type"]) == (200, "application/json"), answer
    same = _call(server.port, "POST", "/v2/models/wide/infer", body)[2]
    assert json.loads(answer) == json.loads(same)
    assert json.loads(answer)["outputs"][0]["data"] == [1.5, -2.0, 3.25]


def test_binary_invocation_both_ways_copies_as_v2(endpoint: tuple[RunningServer, int]) -> None:
    """The Content-Type's json-header-size marks binary tensors both ways; the body lands as
    /v2's does (aligned, the input a view): the same bytes copied for the same request."""
    server, port = endpoint
    values = np.arange(50_000, dtype=np.float32)
    body, head = _binary_request(values, report_copies=True)
    status, headers, answer = _call(port, "POST", "/invocations", body,
                                    {"Content-Type": f"{BINARY_CONTENT_TYPE}{head}"})
    assert status == 200, answer
    assert headers["content-type"].startswith(BINARY_CONTENT_TYPE)
    size = int(headers["content-type"][len(BINARY_CONTENT_TYPE):])
    document = json.loads(answer[:size])
    assert np.array_equal(np.frombuffer(answer[size:], np.float32), values)
    assert document["outputs"][0]["parameters"]["binary_data_size"] == values.nbytes
    status, v2_headers, v2_answer = _call(server.port, "POST", "/v2/models/wide/infer", body,
                                          {"Inference-Header-Content-Length": str(head)})
    v2 = json.loads(v2_answer[:int(v2_headers["inference-header-content-length"])])
    assert (document["parameters"]["tensorgate_copied_bytes"]
            == v2["parameters"]["tensorgate_copied_bytes"] < values.nbytes)


def test_answers_are_not_compressed(endpoint: tuple[RunningServer, int]) -> None:
    _, port = endpoint
    body, head = _binary_request(np.zeros(100_000, np.float32))  # would compress well
    status, headers, answer = _call(port, "POST", "/invocations", body, {
        "Content-Type": f"{BINARY_CONTENT_TYPE}{head}", "Accept-Encoding": "gzip"})
    assert status == 200 and "content-encoding" not in headers
    assert len(answer) > 400_000


@pytest.mark.parametrize(("method", "path", "content_type", "code", "said"), [
    ("POST", "/invocations", f"{BINARY_CONTENT_TYPE}abc", 400, "must be the JSON's length"),
    ("POST", "/invocations", f"{BINARY_CONTENT_TYPE}99999", 400, "exceeds the"),
    ("POST", "/invocations", f"text/plain;{BINARY_CONTENT_TYPE}10", 400, "must start with"),
    ("POST", "/invocations", "application/json", 400, "not valid JSON"),
    ("GET", "/invocations", "", 405, "use POST"),
    ("GET", "/models", "", 404, "multi-model endpoint"),
    ("POST", "/models/wide/invoke", "", 404, "multi-model endpoint"),
    ("GET", "/v2/health/ready", "", 404, "GET /ping and POST /invocations"),
])
def test_bad_requests_are_told_what_is_wrong(endpoint: tuple[RunningServer, int], method: str,
                                             path: str, content_type: str, code: int,
                                             said: str) -> None:
    _, port = endpoint
    headers = {"Content-Type": content_type} if content_type else {}
    status, _, answer = _call(port, method, path, b"{not json" if method == "POST" else b"",
                              headers)
    assert status == code and said in json.loads(answer)["error"], answer
    assert _call(port, "GET", "/ping")[0] == 200  # and it keeps serving
    body, head = _binary_request(np.ones(4, np.float32))
    assert _call(port, "POST", "/invocations", body,
                 {"Content-Type": f"{BINARY_CONTENT_TYPE}{head}"})[0] == 200


def test_stream_ping_live_and_restricted(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """SageMaker's image starts it as this: HTTP and gRPC off, SageMaker's routes only.
    /invocations as generate_stream streams the decoupled model's events; /ping in live mode
    answers 200 with a model that failed to load (ready mode: 503, as the server is not
    ready); the HTTP restricted APIs hold here too."""
    broken = tmp_path / "models"
    shutil.copytree(repo, broken)
    rb.write_config(broken, "broken", 'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
                    'input [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
                    'output [ { name: "Y" data_type: TYPE_FP32 dims: [1] } ]\n')  # no model.py
    for mode, ping in (("live", 200), ("ready", 503)):
        server = start_server(broken, tmp_path / f"{mode}.log", "--allow-http", "false",
                              "--allow-grpc", "false", "--allow-sagemaker", "true",
                              "--sagemaker-port", "0", "--http-restricted-api",
                              "inference:tenant=a", env={
                                  "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "words",
                                  "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate_stream",
                                  "SAGEMAKER_TRITON_PING_MODE": mode})
        try:
            port = _sagemaker_port(server)
            assert "not ready: broken" in server.log.read_text()
            assert _call(port, "GET", "/ping")[0] == ping
            body = json.dumps({"text_input": "one two three"}).encode()
            status, _, answer = _call(port, "POST", "/invocations", body)
            assert status == 403 and "tenant" in json.loads(answer)["error"]
            status, headers, answer = _call(port, "POST", "/invocations", body,
                                            {"tenant": "a"})
            assert status == 200 and headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[5:]) for line in answer.decode().splitlines()
                      if line.startswith("data:")]
            assert [e["text_output"] for e in events] == ["ONE", "TWO", "THREE"]
        finally:
            assert stop_server(server) == 0, server.log.read_text()


def test_generate_invocation(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    server = start_server(repo, tmp_path / "server.log", "--allow-sagemaker", "true",
                          "--sagemaker-port", "0", env={
                              "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "shout",
                              "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate"})
    try:
        status, _, answer = _call(_sagemaker_port(server), "POST", "/invocations",
                                  json.dumps({"text_input": "quiet"}).encode())
        assert status == 200, answer
        assert json.loads(answer) == {"model_name": "shout", "model_version": "1",
                                      "text_output": "QUIET", "length": 5}
    finally:
        assert stop_server(server) == 0, server.log.read_text()


@pytest.mark.parametrize(("named", "said"), [
    ("", "set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to one of shout, wide, words"),
    ("wdie", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME 'wdie' names no model"),
])
def test_a_start_without_its_model_fails_naming_it(repo: pathlib.Path, named: str,
                                                   said: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": named}
    finished = subprocess.run(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
         "--allow-sagemaker", "true", "--sagemaker-port", "0"],
        capture_output=True, text=True, timeout=60, env=env)
    assert finished.returncode != 0 and said in finished.stdout + finished.stderr


# -- multi-model endpoints ---------------------------------------------------------------


_CHAIN = """
    name: "chain"
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "RAW" data_type: TYPE_FP32 dims: [-1] } ]
    output [ { name: "SAME" data_type: TYPE_FP32 dims: [-1] } ]
    ensemble_scheduling { step [
      { model_name: "wide" model_version: -1 input_map { key: "INPUT__0" value: "RAW" }
        output_map { key: "OUTPUT__0" value: "SAME" } } ] }
    """


@pytest.fixture(scope="module")
def multi(repo: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[int, pathlib.Path]]:
    """A multi-model endpoint over an empty repository, and the folder SageMaker would unpack
    archives into: h1 holds a model's folder itself (its config.pbtxt at the top), h2 one
    model folder, h3 two, h4 a model whose load fails, h8 a link to a model elsewhere."""
    root = tmp_path_factory.mktemp("opt-ml-models")
    for name, folders in (("h1", {"": "wide"}), ("h2", {"shouting": "shout"}),
                          ("h3", {"a": "wide", "b": "shout"})):
        for inside, model in folders.items():
            shutil.copytree(repo / model, root / name / "model" / inside)
    for name in ("h9", "h10"):  # an ensemble and its step; h10's step is another "wide"
        shutil.copytree(repo / "wide", root / name / "model" / "wide")
        rb.write_config(root / name / "model", "chain", _CHAIN)
    rb.write_config(root / "h10" / "model", "wide", (repo / "wide" / "config.pbtxt")
                    .read_text() + "\n# another\n")
    (root / "h8" / "model").mkdir(parents=True)  # a link out of the root, in the archive
    (root / "h8" / "model" / "away").symlink_to(repo / "wide", target_is_directory=True)
    rb.write_config(root / "h4" / "model", "broken", 'name: "broken"\nbackend: "python"\n'
                    'max_batch_size: 0\ninput [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
                    'output [ { name: "Y" data_type: TYPE_FP32 dims: [1] } ]\n')
    empty = tmp_path_factory.mktemp("empty-repository")
    log = tmp_path_factory.mktemp("multi") / "server.log"
    server = start_server(empty, log, "--allow-sagemaker", "true", "--sagemaker-port", "0",
                          env={"SAGEMAKER_MULTI_MODEL": "true",
                               "TENSORGATE_SAGEMAKER_MODELS_ROOT": str(root)})
    yield _sagemaker_port(server), root
    assert stop_server(server) == 0, log.read_text()


def _load(port: int, name: str, url: pathlib.Path | str, target: str = ""
          ) -> tuple[int, bytes]:
    headers = {"X-Amzn-SageMaker-Target-Model": target} if target else {}
    status, _, answer = _call(port, "POST", "/models", json.dumps(
        {"model_name": name, "url": str(url)}).encode(), headers)
    return status, answer


def test_a_multi_model_endpoint_loads_lists_calls_and_unloads(
        multi: tuple[int, pathlib.Path]) -> None:
    port, root = multi
    assert json.loads(_call(port, "GET", "/models")[2]) == {"models": []}
    assert _load(port, "h1", root / "h1" / "model", "wide.tar.gz") == (200, b"")
    listed = {"modelName": "h1", "modelUrl": str(root / "h1" / "model")}
    assert json.loads(_call(port, "GET", "/models")[2]) == {"models": [listed]}
    assert json.loads(_call(port, "GET", "/models/h1")[2]) == listed
    values = np.arange(1000, dtype=np.float32)
    body, head = _binary_request(values)
    status, headers, answer = _call(port, "POST", "/models/h1/invoke", body, {
        "Content-Type": f"{BINARY_CONTENT_TYPE}{head}",
        "X-Amzn-SageMaker-Target-Model": "wide.tar.gz"})
    assert status == 200, answer
    size = int(headers["content-type"][len(BINARY_CONTENT_TYPE):])
    assert json.loads(answer[:size])["model_name"] == "wide.tar.gz"  # the name it was given
    assert np.array_equal(np.frombuffer(answer[size:], np.float32), values)
    status, answer = _load(port, "h1", root / "h1" / "model", "wide.tar.gz")
    assert status == 409 and b"loaded already" in answer
    # a model folder inside the archive, served as SageMaker's name without the header
    assert _load(port, "h2", root / "h2" / "model") == (200, b"")
    status, _, answer = _call(port, "POST", "/models/h2/invoke", json.dumps({"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["quiet"]}]}).encode())
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == ["QUIET"], answer
    assert _call(port, "DELETE", "/models/h1")[0] == 200
    for method, path in (("GET", "/models/h1"), ("POST", "/models/h1/invoke"),
                         ("DELETE", "/models/h1")):
        status, _, answer = _call(port, method, path, body)
        assert status == 404 and "not loaded" in json.loads(answer)["error"]
    assert [m["modelName"] for m in json.loads(_call(port, "GET", "/models")[2])["models"]] \
        == ["h2"]
    assert _load(port, "h1", root / "h1" / "model", "wide.tar.gz") == (200, b"")  # again
    status, _, answer = _call(port, "POST", "/invocations", body)
    assert status == 404 and "/models/NAME/invoke" in json.loads(answer)["error"]


@pytest.mark.parametrize(("name", "where", "code", "said"), [
    ("h3", "h3/model", 400, "holds 2 model folders (a, b)"),
    ("h5", "h5/model", 400, "is not a folder"),
    ("h6", "h1/model/../../../", 400, "is not under"),
    ("h7", "/etc", 400, "is not under"),
    ("h8", "h8/model", 400, "away leads to"),
    ("h4", "h4/model", 400, "h4/model/broken/1: no model artifact found"),
])
def test_a_load_that_cannot_be_served_is_refused_and_the_endpoint_stays_ready(
        multi: tuple[int, pathlib.Path], name: str, where: str, code: int, said: str) -> None:
    port, root = multi
    status, answer = _load(port, name, where if where.startswith("/") else root / where)
    assert status == code and said in json.loads(answer)["error"], answer
    assert _call(port, "GET", "/ping")[0] == 200  # a failed load leaves it ready
    assert name not in {m["modelName"] for m in
                        json.loads(_call(port, "GET", "/models")[2])["models"]}
    for body in (b'{"model_name": "x"}', b"{bad", b""):  # (Triton 2.51 aborts on {bad)
        status, _, answer = _call(port, "POST", "/models", body)
        assert status == 400, answer


def test_an_archive_of_an_ensemble_and_its_steps(multi: tuple[int, pathlib.Path]) -> None:
    """The ensemble is served by the name given, its step by its own, beside it; unloading
    the ensemble unloads the step; another archive whose step of that name is another
    folder is refused while the first is loaded."""
    port, root = multi
    assert _load(port, "h9", root / "h9" / "model", "chain.tar.gz") == (200, b"")
    body = json.dumps({"inputs": [{"name": "RAW", "datatype": "FP32", "shape": [2],
                                   "data": [0.5, 7.0]}]}).encode()
    status, _, answer = _call(port, "POST", "/models/h9/invoke", body)
    assert status == 200, answer
    assert json.loads(answer)["model_name"] == "chain.tar.gz"
    assert json.loads(answer)["outputs"][0]["data"] == [0.5, 7.0]
    status, answer = _load(port, "h10", root / "h10" / "model", "other-chain.tar.gz")
    assert status == 400 and "step model 'wide' is served already, from another folder" \
        in json.loads(answer)["error"], answer
    assert _call(port, "DELETE", "/models/h9")[0] == 200
    assert _load(port, "h10", root / "h10" / "model", "other-chain.tar.gz") == (200, b"")
    assert _call(port, "POST", "/models/h10/invoke", body)[0] == 200
    assert _call(port, "DELETE", "/models/h10")[0] == 200
    assert _call(port, "GET", "/ping")[0] == 200
