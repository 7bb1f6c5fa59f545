"""Opentelemetry trace mode end to end: tritonclient requests over HTTP, gRPC and a gRPC
stream become Triton's spans (InferRequest → model → compute; an ensemble's steps under
it), sent over OTLP/HTTP to a collector on 127.0.0.1 (a small HTTP server in this test);
a caller's W3C traceparent puts them in its trace; rate 0 traces only what callers sampled;
a collector that fails costs traces (counted), never requests; shutdown sends what waits."""

from __future__ import annotations

import http.server
import json
import pathlib
import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline import repo_builder as rb

CALLER_TRACE = "0af7651916cd43dd8448eb211c12666c"
CALLER_SPAN = "b7ad6b7169242424"
SAMPLED = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
NOT_SAMPLED = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}
ROOT_HTTP = {"HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE",
             "HTTP_SEND_START", "HTTP_SEND_END"}
ROOT_GRPC = {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
             "GRPC_SEND_START", "GRPC_SEND_END"}
MODEL = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: keeps every JSON body POSTed to /v1/traces, or
    answers `failing` (an HTTP status) instead."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        self.failing = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = collector.failing or (200 if self.path == "/v1/traces" else 404)
                if status == 200:
                    with collector.lock:
                        collector.bodies.append(json.loads(body))
                        collector.content_types.add(self.headers["Content-Type"])
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[dict[str, Any]]:
        with self.lock:
            return [span for body in self.bodies for resource in body["resourceSpans"]
                    for scope in resource["scopeSpans"] for span in scope["spans"]]

    def trace_of(self, request_id: str, count: int, timeout_s: float = 10.0
                 ) -> list[dict[str, Any]]:
        """The InferRequest span of request `request_id` and every span under it, once
        `count` of them came (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            found = [span for span in spans if span["name"] == "InferRequest"
                     and _attributes(span).get("request_id") == request_id]
            ids = {span["spanId"] for span in found}
            grew = True
            while grew:
                under = [span for span in spans if span.get("parentSpanId") in ids
                         and span["spanId"] not in ids]
                ids.update(span["spanId"] for span in under)
                found += under
                grew = bool(under)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {item["key"]: next(iter(item["value"].values())) for item in span["attributes"]}


def _events(span: dict[str, Any]) -> list[str]:
    return [event["name"] for event in span["events"]]


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    running = Collector()
    yield running
    running.close()


def _otel_args(port: int, delay_ms: int = 20) -> list[str]:
    return ["--trace-config", "mode=opentelemetry",
            "--trace-config", f"opentelemetry,url=127.0.0.1:{port}/v1/traces",
            "--trace-config", "opentelemetry,resource=test.key=test.value",
            "--trace-config", "opentelemetry,resource=service.name=test_tensorgate",
            "--trace-config", f"opentelemetry,bsp_schedule_delay={delay_ms}",
            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]


def _repo(root: pathlib.Path) -> pathlib.Path:
    repo = root / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4], "dynamic_batching { }")
    rb.write_config(repo, "pipeline", """
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [4] } ]
        ensemble_scheduling { step [
          { model_name: "identity" model_version: -1
            input_map { key: "INPUT__0" value: "RAW" } output_map { key: "OUTPUT__0" value: "OUT" }
          } ] }
        """)
    rb.write_config(repo, "traced_bls", """
        name: "traced_bls"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [1, 4] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [1, 4] },
                 { name: "CONTEXT" data_type: TYPE_STRING dims: [1] } ]
        """)
    (repo / "traced_bls" / "1").mkdir(exist_ok=True)
    (repo / "traced_bls" / "1" / "model.py").write_text(TRACED_BLS)
    return repo


# A Triton Python model whose BLS call joins its request's trace, and which answers with
# its trace context (what it would pass on to a service it calls)
TRACED_BLS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            answer = pb_utils.InferenceRequest(
                model_name="identity", requested_output_names=["OUTPUT__0"],
                inputs=[pb_utils.Tensor("INPUT__0", x.as_numpy())],
                trace=request.trace()).exec()
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT__0").as_numpy()
            context = request.trace().get_context() or "none"
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y),
                pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=object))]))
        return responses
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, collector: Collector
           ) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("otel")
    server = start_server(_repo(root), root / "server.log", *_otel_args(collector.port))
    yield server
    assert stop_server(server) == 0, server.log.read_text()


def _input(module: Any, name: str = "INPUT__0") -> Any:
    item = module.InferInput(name, [1, 4], "FP32")
    item.set_data_from_numpy(np.arange(4, dtype=np.float32)[None])
    return item


def _check_model_trace(spans: list[dict[str, Any]], model: str, root_events: set[str],
                       request_id: str, caller: bool) -> None:
    """Triton's three spans, nested, each with its events and the request's attributes."""
    by_name = {span["name"]: span for span in spans}
    assert sorted(by_name) == sorted(["InferRequest", model, "compute"]), spans
    root, own, compute = by_name["InferRequest"], by_name[model], by_name["compute"]
    assert own["parentSpanId"] == root["spanId"]
    assert compute["parentSpanId"] == own["spanId"]
    assert set(_events(root)) == root_events
    assert _events(own) == MODEL
    assert _events(compute) == COMPUTE
    for span in spans:
        assert _attributes(span) == {"model_name": model, "model_version": "1",
                                     "request_id": request_id}
        assert int(span["startTimeUnixNano"]) <= int(span["endTimeUnixNano"])
        assert abs(int(span["startTimeUnixNano"]) / 1e9 - time.time()) < 60  # wall clock
    assert int(root["startTimeUnixNano"]) <= int(own["startTimeUnixNano"]) <= \
        int(compute["startTimeUnixNano"])
    assert int(compute["endTimeUnixNano"]) <= int(own["endTimeUnixNano"]) <= \
        int(root["endTimeUnixNano"])
    if caller:
        assert root["traceId"] == CALLER_TRACE and root["parentSpanId"] == CALLER_SPAN
    else:
        assert root["traceId"] != CALLER_TRACE and "parentSpanId" not in root
    assert root["kind"] == 2 and own["kind"] == compute["kind"] == 1  # SERVER, INTERNAL


@pytest.mark.parametrize("headers", [None, SAMPLED], ids=["own trace", "caller's trace"])
def test_http_and_grpc_requests_become_tritons_spans(traced: RunningServer,
                                                     collector: Collector,
                                                     headers: dict[str, str] | None) -> None:
    tag = "caller" if headers else "own"
    with httpclient.InferenceServerClient(traced.url) as client:
        result = client.infer("identity", [_input(httpclient)], request_id=f"http-{tag}",
                              headers=dict(headers or {}))  # tritonclient adds to it
        assert result.as_numpy("OUTPUT__0").tolist() == [[0, 1, 2, 3]]
    with grpcclient.InferenceServerClient(traced.grpc_url) as client:
        client.infer("identity", [_input(grpcclient)], request_id=f"grpc-{tag}",
                     headers=dict(headers or {}))
    _check_model_trace(collector.trace_of(f"http-{tag}", 3), "identity", ROOT_HTTP,
                       f"http-{tag}", headers is not None)
    _check_model_trace(collector.trace_of(f"grpc-{tag}", 3), "identity", ROOT_GRPC,
                       f"grpc-{tag}", headers is not None)
    with collector.lock:
        resource = collector.bodies[-1]["resourceSpans"][0]["resource"]
        assert collector.content_types == {"application/json"}
    attributes = {item["key"]: item["value"] for item in resource["attributes"]}
    assert attributes["service.name"] == {"stringValue": "test_tensorgate"}
    assert attributes["test.key"] == {"stringValue": "test.value"}


def test_a_streams_requests_join_the_streams_trace_context(traced: RunningServer,
                                                          collector: Collector) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(traced.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result),
                            headers=SAMPLED)
        for index in range(2):
            client.async_stream_infer("identity", [_input(grpcclient)],
                                      request_id=f"stream-{index}")
        for _ in range(2):
            assert not isinstance(answers.get(timeout=10), InferenceServerException)
        client.stop_stream()
    for index in range(2):
        _check_model_trace(collector.trace_of(f"stream-{index}", 3), "identity", ROOT_GRPC,
                           f"stream-{index}", True)


def test_an_ensembles_steps_hang_under_its_span(traced: RunningServer,
                                                collector: Collector) -> None:
    with httpclient.InferenceServerClient(traced.url) as client:
        client.infer("pipeline", [_input(httpclient, "RAW")], request_id="ensemble",
                     headers=dict(SAMPLED))
    spans = collector.trace_of("ensemble", 4)
    names = {span["spanId"]: span["name"] for span in spans}
    nesting = sorted((names.get(span.get("parentSpanId", ""), "caller"), span["name"])
                     for span in spans)
    assert nesting == [("InferRequest", "pipeline"), ("caller", "InferRequest"),
                       ("identity", "compute"), ("pipeline", "identity")]
    step = next(span for span in spans if span["name"] == "identity")
    # a step has no InferRequest span: its response's time is on its model span
    assert _events(step) == [*MODEL[:2], "INFER_RESPONSE_COMPLETE", MODEL[2]]
    assert _attributes(step)["parent_id"] != "0"  # the ensemble request's trace id
    assert {span["traceId"] for span in spans} == {CALLER_TRACE}


def test_a_bls_call_given_the_requests_trace_hangs_under_its_model(
        traced: RunningServer, collector: Collector) -> None:
    with httpclient.InferenceServerClient(traced.url) as client:
        result = client.infer("traced_bls", [_input(httpclient, "X")], request_id="bls")
    assert result.as_numpy("Y").tolist() == [[0, 1, 2, 3]]
    spans = collector.trace_of("bls", 5)
    names = {span["spanId"]: span["name"] for span in spans}
    nesting = sorted((names.get(span.get("parentSpanId", ""), "-"), span["name"])
                     for span in spans)
    assert nesting == [("-", "InferRequest"), ("InferRequest", "traced_bls"),
                       ("identity", "compute"), ("traced_bls", "compute"),
                       ("traced_bls", "identity")]
    model = next(span for span in spans if span["name"] == "traced_bls")
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context == {"traceparent": f"00-{model['traceId']}-{model['spanId']}-01"}


def test_rate_zero_traces_only_what_callers_sampled(traced: RunningServer,
                                                    collector: Collector) -> None:
    with httpclient.InferenceServerClient(traced.url) as client:
        assert client.update_trace_settings(settings={"trace_rate": "0"})["trace_rate"] == "0"
        try:
            client.infer("identity", [_input(httpclient)], request_id="rate0-plain")
            client.infer("identity", [_input(httpclient)], request_id="rate0-unsampled",
                         headers=dict(NOT_SAMPLED))
            client.infer("identity", [_input(httpclient)], request_id="rate0-malformed",
                         headers={"traceparent": "00-xyz-" + CALLER_SPAN + "-01"})
            client.infer("identity", [_input(httpclient)], request_id="rate0-sampled",
                         headers=dict(SAMPLED))
        finally:
            client.update_trace_settings(settings={"trace_rate": None})
        assert client.get_trace_settings()["trace_rate"] == "1"
    # exports go in order: once the last request's spans came, the others' would have
    _check_model_trace(collector.trace_of("rate0-sampled", 3), "identity", ROOT_HTTP,
                       "rate0-sampled", True)
    traced_ids = {_attributes(span)["request_id"] for span in collector.spans()}
    assert not traced_ids & {"rate0-plain", "rate0-unsampled", "rate0-malformed"}


@pytest.mark.parametrize("change, message", [
    ({"trace_level": ["TENSORS"]}, "trace level TENSORS is not traced in opentelemetry mode"),
    ({"log_frequency": "5"}, "trace setting 'log_frequency' is the triton trace mode's"),
    ({"trace_rate": "-1"}, "trace setting 'trace_rate' must be 0 or more"),
    ({"trace_file": "/tmp/elsewhere.json"},
     "trace setting 'trace_file' cannot be changed over the API"),
    ({"trace_mode": "triton"}, "trace setting 'trace_mode' is chosen when the server starts"),
])
def test_what_opentelemetry_mode_cannot_do_is_refused_by_name(
        traced: RunningServer, change: dict[str, Any], message: str) -> None:
    with httpclient.InferenceServerClient(traced.url) as client:
        with pytest.raises(InferenceServerException, match=message):
            client.update_trace_settings("identity", change)
        assert client.get_trace_settings("identity") == {
            "trace_file": "", "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
            "trace_count": "-1", "log_frequency": "0", "trace_mode": "opentelemetry"}


def _metric(server: RunningServer, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                  timeout=10).read().decode()
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def test_a_failing_collector_costs_traces_not_requests(traced: RunningServer,
                                                       collector: Collector) -> None:
    dropped = _metric(traced, "tensorgate_traces_dropped_total")
    collector.failing = 503
    try:
        with httpclient.InferenceServerClient(traced.url) as client:
            for index in range(5):
                result = client.infer("identity", [_input(httpclient)],
                                      request_id=f"lost-{index}")
                assert result.as_numpy("OUTPUT__0").tolist() == [[0, 1, 2, 3]]
        deadline = time.monotonic() + 10
        while _metric(traced, "tensorgate_traces_dropped_total") < dropped + 5:
            assert time.monotonic() < deadline, traced.log.read_text()
            time.sleep(0.05)
    finally:
        collector.failing = 0
    assert "could not send" in traced.log.read_text() and "HTTP 503" in \
        traced.log.read_text()
    with httpclient.InferenceServerClient(traced.url) as client:  # it answers again
        client.infer("identity", [_input(httpclient)], request_id="after-failure")
    assert len(collector.trace_of("after-failure", 3)) == 3
    assert _metric(traced, "tensorgate_traces_written_total") > 0


def test_shutdown_sends_the_spans_still_waiting(tmp_path: pathlib.Path,
                                               collector: Collector) -> None:
    server = start_server(_repo(tmp_path), tmp_path / "server.log",
                          *_otel_args(collector.port, delay_ms=600_000))
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            client.infer("identity", [_input(httpclient)], request_id="at-shutdown")
        time.sleep(0.2)
        assert collector.trace_of("at-shutdown", 3, timeout_s=0) == []  # still waiting
    finally:
        assert stop_server(server) == 0, server.log.read_text()
    assert len(collector.trace_of("at-shutdown", 3, timeout_s=0)) == 3
