"""A real `tensorgate serve` process on 127.0.0.1, shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.pipeline import repo_builder as rb
from tests.pipeline import sequence_models as sm

STARTUP_TIMEOUT_S = 90


class RunningServer:
    def __init__(self, process: subprocess.Popen[str], port: int, grpc_port: int,
                 metrics_port: int, log: pathlib.Path, host: str = "127.0.0.1") -> None:
        self.metrics_port = metrics_port
        self.process = process
        self.port = port
        self.host = host  # as a URL writes it: "127.0.0.1" or "[::1]"
        self.url = f"{host}:{port}"
        self.grpc_url = f"{host}:{grpc_port}"
        self.grpc_port = grpc_port
        self.log = log


def start_server(repo: pathlib.Path, log: pathlib.Path, *extra: str,
                 until: str = "ready:", env: dict[str, str] | None = None) -> RunningServer:
    """The server on `repo`, once its log holds `until` ("ready:": every model loaded;
    "loading:": listening, its models loading); `env`: variables beside the process's."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
             "--host", "127.0.0.1", *extra],
            stdout=sink, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"HTTP (?:on (127\.0\.0\.1|\[::1\]):(\d+)|off), "
                          r"gRPC (?:on \S+:(\d+)|off), "
                          r"metrics (?:on \S+:(\d+)|off)", log.read_text())
        if match and until in log.read_text():
            return RunningServer(process, int(match.group(2) or 0), int(match.group(3) or 0),
                                 int(match.group(4) or 0), log, match.group(1) or "127.0.0.1")
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not start in {STARTUP_TIMEOUT_S} s:\n{log.read_text()}")


def until(condition: Callable[[], bool], what: str, wait_s: float = 20.0) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `wait_s` (a poll's
    load of a Python model takes well under 20 s on a busy machine)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {wait_s} s: {what}")


def post(url: str, path: str, body: bytes, timeout_s: float = 60.0) -> tuple[int, str]:
    """POST `body` to `path` of the server at `url` (host:port) on a connection of its own:
    the answer's status and text."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        connection.request("POST", path, body)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def memory_bytes(field: str, pid: int | str = "self") -> int:
    """A /proc/<pid>/status memory line in bytes: "VmRSS" (now), "VmHWM" (the peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def still_serving(server: RunningServer) -> None:
    """`identity` ([-1, 3, 4] FP32) answers a request exactly: the server serves on."""
    value = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    item = httpclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
    item.set_data_from_numpy(value)
    with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
        assert client.infer("identity", [item]).as_numpy("OUTPUT__0").tobytes() == \
            value.tobytes()


def scrape(server: RunningServer) -> str:
    """The server's /metrics text."""
    with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}/metrics",
                                timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def value(text: str, metric: str, default: float | None = None, **labels: str) -> float:
    """One sample of `metric` with exactly `labels`; `default` where it has none yet."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{metric}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    if match is None and default is not None:
        return default
    assert match, f"{metric}{{{wanted}}} not in:\n{text}"
    return float(match.group(1))


def binary_infer_request(model: str, values: np.ndarray) -> bytes:
    """An HTTP/1.1 request of `model` with one FP32 input INPUT__0 and its output OUTPUT__0,
    both as binary data."""
    head = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(values.shape),
                                   "datatype": "FP32",
                                   "parameters": {"binary_data_size": values.nbytes}}],
                       "outputs": [{"name": "OUTPUT__0",
                                    "parameters": {"binary_data": True}}]}).encode()
    return (b"POST /v2/models/%b/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n\r\n%b%b"
            % (model.encode(), len(head) + values.nbytes, len(head), head,
               values.astype("<f4").tobytes()))


def read_answer(connection: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer with a Content-Length, read whole: (head, body)."""
    data = bytearray()
    while b"\r\n\r\n" not in data:
        data += connection.recv(1 << 20)
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
    rest = bytearray(body)
    while len(rest) < length:
        chunk = connection.recv(1 << 20)
        assert chunk, "the connection closed before the answer's end"
        rest += chunk
    return head, bytes(rest)


def count_dropped(connections: list[socket.socket]) -> int:
    """How many of these connections the server dropped: each is read to its end (what the
    kernel still held, then EOF or a reset) within a second; one still open times out."""
    dropped = 0
    for connection in connections:
        connection.settimeout(1.0)
        try:
            while connection.recv(1 << 20):
                pass
            dropped += 1
        except ConnectionResetError:
            dropped += 1
        except TimeoutError:
            pass
    return dropped


def stop_server(server: RunningServer) -> int:
    """SIGTERM (a staged shutdown), then wait; kill only if it hangs. Returns the exit code."""
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise


def health_check(url: str, service: str) -> str:
    """grpc.health.v1.Health/Check's status for `service` at the gRPC `url`, as a Kubernetes
    gRPC probe asks; its messages written by hand (health.proto: the request's field 1 is
    the service's name, the response's field 1 its status; SERVING is 1, NOT_SERVING 2).
    An error status is raised as grpc.RpcError."""
    with grpc.insecure_channel(url) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda name: b"\x0a" + bytes([len(name)]) + name.encode()
            if name else b"",
            response_deserializer=lambda data: data)
        return {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}[check(service, timeout=10)]


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this process listens on, for a server that must not get it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def stream_answers(answers: queue.Queue[tuple[Any, Any]], value: Callable[[Any], Any]
                   ) -> tuple[dict[str, list[Any]], list[str]]:
    """What a finished gRPC stream's callback queued: each response's `value(result)` by
    request id, in arrival order, and the error messages."""
    by_id: dict[str, list[Any]] = {}
    errors = []
    while not answers.empty():
        result, error = answers.get_nowait()
        if error is not None:
            errors.append(error.message())
            continue
        by_id.setdefault(result.get_response().id, []).append(value(result))
    return by_id, errors


@pytest.fixture(scope="module")
def fast_and_slow(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Two Python models of INPUT__0 [-1, 4] FP32: "fast", and "slow" (1.5 s a call)."""
    root = tmp_path_factory.mktemp("fast-and-slow") / "models"
    rb.add_python(root, "fast", max_batch=4)
    rb.add_python(root, "slow", max_batch=4, delay_s=1.5)
    return root


@pytest.fixture(scope="session")
def e2e_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("e2e-models")
    rb.add_torchscript(root, "identity", rb.Identity(), [3, 4], [3, 4],
                       "dynamic_batching { max_queue_delay_microseconds: 1000 }", max_batch=16)
    rb.add_torchscript(root, "linear", rb.linear_module(), [8], [4],
                       "dynamic_batching { }")
    rb.add_torchscript(root, "failing", rb.Failing(), [4], [4])
    rb.add_python(root, "slow", "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
                  delay_s=0.3, max_batch=1)
    # 0.05 s a request, one at a time, no queue bound: requests that stay in flight
    rb.add_python(root, "paced", "dynamic_batching { }", delay_s=0.05, max_batch=1)
    # an ensemble: failing (x + 1, refuses negatives), then paced (2y + 1), as views
    rb.write_config(root, "pipeline", """
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 1
        input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "SCORES" data_type: TYPE_FP32 dims: [4] } ]
        ensemble_scheduling { step [
          { model_name: "failing" model_version: -1 input_map { key: "INPUT__0" value: "RAW" }
            output_map { key: "OUTPUT__0" value: "SHIFTED" } },
          { model_name: "paced" model_version: -1
            input_map { key: "INPUT__0" value: "SHIFTED" }
            output_map { key: "OUTPUT__0" value: "SCORES" } } ] }
        """)
    # decoupled: n responses to an input whose first value is n (repo_builder.COUNTER)
    rb.add_counter(root, "counter")
    # the same, 20 ms a response, two requests stepped in turn on its one instance
    rb.add_counter(root, "counter_pair", delay_s=0.02, extra='parameters { key: '
                   '"streams_per_instance" value { string_value: "2" } }')
    # 0.3 s a request, one at a time, two priority levels (2 unless a request says 1)
    rb.add_python(root, "ranked", "dynamic_batching { priority_levels: 2 "
                  "default_priority_level: 2 }", delay_s=0.3, max_batch=1)
    # any length of floats, no batching: messages larger than HTTP/2's default windows
    rb.add_torchscript(root, "wide", rb.Identity(), [-1], [-1], max_batch=0)
    # stateful: each sequence's requests add up, in an implicit state (sequence_models.py)
    sm.add_accumulate(root, "accumulate")
    # text: "words" streams its input's words (decoupled), "shout" capitalises (batched)
    rb.add_text_models(root)
    # answers with each request's parameters (response_cache on), and an ensemble around it
    rb.add_params_model(root, "params", extra="response_cache { enable: true }")
    rb.write_config(root, "params_ensemble", """
        name: "params_ensemble"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]
        output [ { name: "Y" data_type: TYPE_STRING dims: [1] } ]
        ensemble_scheduling { step [
          { model_name: "params" model_version: -1 input_map { key: "INPUT" value: "X" }
            output_map { key: "SEEN" value: "Y" } } ] }
        """)
    # response_cache enabled: the shared server runs with --response-cache-bytes
    rb.add_python(root, "memo", max_batch=4, extra="response_cache { enable: true }")
    return root


@pytest.fixture(scope="session")
def server(e2e_repo: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    running = start_server(e2e_repo, log, "--max-request-bytes", str(1 << 20),
                           "--response-cache-bytes", str(1 << 20),
                           "--allow-shared-memory", "--model-control-mode", "explicit",
                           "--load-model", "*", "--http-header-forward-pattern", "^x-pass-",
                           "--grpc-header-forward-pattern", "^x-pass-")
    yield running
    assert stop_server(running) == 0, log.read_text()
