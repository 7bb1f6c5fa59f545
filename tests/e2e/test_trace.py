"""The trace extension through tritonclient, HTTP and gRPC: settings read, change and clear
as Triton's do (a model's unset ones follow the global ones); sampled requests leave their
stages' timestamps, in order, in the trace file; ensemble steps name their parent; level
TENSORS keeps the tensors; a failed request's trace is still written; wrong settings are
refused by name and the server serves on."""

from __future__ import annotations

import contextlib
import json
import pathlib
import queue
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

HTTP_STAGES = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
               "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
               "INFER_RESPONSE_COMPLETE", "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_STAGES = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_STAGES[2:-2],
               "GRPC_SEND_START", "GRPC_SEND_END"]
START = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
         "log_frequency": "0", "trace_mode": "triton"}
CLEAR = {name: None for name in ("trace_level", "trace_rate", "trace_count", "log_frequency")}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer,
                                                                       pathlib.Path]]:
    """A server with a trace file and tracing off; tests turn it on for one model at a time
    with log_frequency 1 (a file per trace) and clear it again."""
    root = tmp_path_factory.mktemp("trace")
    repo = root / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4], "dynamic_batching { }")
    rb.add_torchscript(repo, "failing", rb.Failing(), [4], [4])
    rb.write_config(repo, "pipeline", """
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [4] } ]
        ensemble_scheduling { step [
          { model_name: "failing" model_version: -1 input_map { key: "INPUT__0" value: "RAW" }
            output_map { key: "OUTPUT__0" value: "SHIFTED" } },
          { model_name: "identity" model_version: -1
            input_map { key: "INPUT__0" value: "SHIFTED" }
            output_map { key: "OUTPUT__0" value: "OUT" } } ] }
        """)
    rb.add_counter(repo, "counter")
    traces = root / "traces"
    traces.mkdir()
    server = start_server(repo, root / "server.log", "--trace-config",
                          f"triton,file={traces / 'trace.json'}")
    yield server, traces
    assert stop_server(server) == 0, server.log.read_text()


def _entries(folder: pathlib.Path) -> dict[int, dict[str, Any]]:
    """Every trace written so far, by id: its head entry with `timestamps` (names in time
    order) and `tensors` added."""
    found: dict[int, dict[str, Any]] = {}
    for path in folder.glob("trace.json*"):
        for entry in _read_whole(path):
            trace = found.setdefault(entry["id"], {"timestamps": [], "tensors": []})
            if "model_name" in entry:
                trace.update(entry)
            elif "timestamps" in entry:
                trace["timestamps"] += entry["timestamps"]
            else:
                trace["tensors"].append(entry)
    return found


def _read_whole(path: pathlib.Path) -> list[dict[str, Any]]:
    """A trace file's entries, read again while the server is midway through writing it
    (it writes them off its loop, a batch at a time: the file can be caught empty)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _new_traces(folder: pathlib.Path, before: set[int], count: int) -> list[dict[str, Any]]:
    """The `count` traces written after `before` (the server writes them off its loop)."""
    deadline = time.monotonic() + 10
    while True:
        found = _entries(folder)
        new = [found[i] for i in sorted(set(found) - before)]
        if len(new) >= count or time.monotonic() > deadline:
            return new
        time.sleep(0.02)


@contextlib.contextmanager
def _tracing(client: Any, model: str, **settings: Any) -> Iterator[None]:
    """Every request to `model` traced, a file per trace (or as `settings` say), then its
    settings cleared: the server is shared by the tests of this module."""
    client.update_trace_settings(model, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                         "log_frequency": "1", **settings})
    try:
        yield
    finally:
        client.update_trace_settings(model, CLEAR)


def _names_in_order(trace: dict[str, Any]) -> list[str]:
    stamps = trace["timestamps"]
    assert [s["ns"] for s in stamps] == sorted(s["ns"] for s in stamps)
    return [s["name"] for s in stamps]


def _input(module: Any, values: list[float], name: str = "INPUT__0") -> Any:
    item = module.InferInput(name, [1, 4], "FP32")
    item.set_data_from_numpy(np.array([values], np.float32))
    return item


def test_settings_read_change_and_clear_as_tritons_do(traced: tuple[RunningServer,
                                                                    pathlib.Path]) -> None:
    server, folder = traced
    start = {**START, "trace_file": str(folder / "trace.json")}
    with httpclient.InferenceServerClient(server.url) as client:
        assert "trace" in client.get_server_metadata()["extensions"]
        assert client.get_trace_settings() == start
        assert client.get_trace_settings("identity") == start
        # a model's own settings; the rest follow the global ones, even when they change
        assert client.update_trace_settings("identity", {"trace_rate": "12",
                                                         "log_frequency": "34"}) == \
            {**start, "trace_rate": "12", "log_frequency": "34"}
        assert client.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78",
                                                      "trace_level": ["TIMESTAMPS"]}) == \
            {**start, "trace_rate": "56", "trace_count": "78", "trace_level": ["TIMESTAMPS"]}
        assert client.get_trace_settings("identity") == \
            {**start, "trace_rate": "12", "trace_count": "78", "trace_level": ["TIMESTAMPS"],
             "log_frequency": "34"}
        # clearing a global setting gives back the server's start value; a model's, the
        # global value
        assert client.update_trace_settings(settings={"trace_rate": None,
                                                      "trace_count": None}) == \
            {**start, "trace_level": ["TIMESTAMPS"]}
        assert client.update_trace_settings("identity", {"trace_rate": None}) == \
            {**start, "trace_level": ["TIMESTAMPS"], "log_frequency": "34"}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        settings = client.get_trace_settings("identity", as_json=True)["settings"]
        assert settings["log_frequency"] == {"value": ["34"]}
        assert settings["trace_level"] == {"value": ["TIMESTAMPS"]}
        client.update_trace_settings("identity", {"log_frequency": None})  # None: cleared
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
        settings = client.get_trace_settings("identity", as_json=True)["settings"]
        assert settings["trace_level"] == {"value": ["TIMESTAMPS", "TENSORS"]}
        assert settings["log_frequency"] == {"value": ["0"]}
        client.update_trace_settings(settings=CLEAR)
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.get_trace_settings() == start
        assert client.get_trace_settings("identity") == start


def test_the_settings_read_can_be_written_back_unchanged(
        traced: tuple[RunningServer, pathlib.Path]) -> None:
    """As Triton 2.51 shows them, trace_mode among them (set at start, so it may only be
    written back as it is)."""
    server, _ = traced
    with httpclient.InferenceServerClient(server.url) as client:
        current = client.get_trace_settings()
        assert current["trace_mode"] == "triton"
        assert client.update_trace_settings(settings=current) == current


@pytest.mark.parametrize("change, message", [
    ({"trace_file": "/tmp/elsewhere.json"},
     "trace setting 'trace_file' cannot be changed over the API"),
    ({"trace_rate": "0"}, "trace setting 'trace_rate' must be 1 or more"),
    ({"trace_count": "-2"}, "trace setting 'trace_count' must be -1 or more"),
    ({"log_frequency": "often"}, "trace setting 'log_frequency' must be an integer; got 'often'"),
    ({"trace_level": ["OFF", "TENSORS"]}, "trace level OFF must stand alone"),
    ({"trace_level": ["EVERYTHING"]}, "trace level 'EVERYTHING' is not one of OFF, TIMESTAMPS, "
                                      "TENSORS"),
    ({"trace_rate": ["1", "2"]}, "trace setting 'trace_rate' takes one value"),
    ({"trace_mode": "opentelemetry"}, "trace setting 'trace_mode' is chosen when the server "
                                      "starts \\(--trace-config mode=triton\\|opentelemetry\\); "
                                      "this server's is triton"),
    ({"trace_bogus": "1"}, "unknown trace setting 'trace_bogus'; settings are: trace_file, "
                           "trace_level, trace_rate, trace_count, log_frequency, trace_mode"),
])
def test_wrong_settings_are_refused_by_name_and_change_nothing(
        traced: tuple[RunningServer, pathlib.Path], change: dict[str, Any],
        message: str) -> None:
    server, folder = traced
    start = {**START, "trace_file": str(folder / "trace.json")}
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match=message):
            client.update_trace_settings(settings={"trace_rate": "5", **change})
        assert client.get_trace_settings() == start  # nothing of the request was applied
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match=message):
            client.update_trace_settings("identity", change)
        assert client.get_trace_settings("identity", as_json=True)["settings"][
            "trace_rate"] == {"value": ["1000"]}


def test_an_unknown_model_has_no_trace_settings(traced: tuple[RunningServer,
                                                              pathlib.Path]) -> None:
    server, _ = traced
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match="unknown model 'nope' for trace "
                                                           "settings; models are: counter, "
                                                           "failing, identity, pipeline"):
            client.update_trace_settings("nope", {"trace_rate": "1"})
        with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
            client.get_trace_settings("nope")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_traced_request_has_every_stage_in_order(traced: tuple[RunningServer, pathlib.Path],
                                                   protocol: str) -> None:
    server, folder = traced
    before = set(_entries(folder))
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        with _tracing(client, "identity"):
            for n in range(3):
                client.infer("identity", [_input(module, [n, 1, 2, 3])], request_id=f"r{n}")
    traces = _new_traces(folder, before, 3)
    assert [t["request_id"] for t in traces] == ["r0", "r1", "r2"]
    for trace in traces:
        assert (trace["model_name"], trace["model_version"]) == ("identity", 1)
        assert "parent_id" not in trace
        assert _names_in_order(trace) == (HTTP_STAGES if protocol == "http" else GRPC_STAGES)


def test_rate_and_count_choose_which_requests_are_traced(
        traced: tuple[RunningServer, pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    with httpclient.InferenceServerClient(server.url) as client:
        with _tracing(client, "identity", trace_rate="2", trace_count="3"):
            for n in range(10):
                client.infer("identity", [_input(httpclient, [n, 0, 0, 0])],
                             request_id=f"r{n}")
            assert client.get_trace_settings("identity")["trace_count"] == "0"
    traces = _new_traces(folder, before, 3)
    time.sleep(0.2)  # nothing more comes
    assert len(_entries(folder)) - len(before) == 3
    assert [t["request_id"] for t in traces] == ["r1", "r3", "r5"]  # one in two, three in all


def test_an_ensembles_steps_are_traced_under_it(traced: tuple[RunningServer,
                                                              pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    with httpclient.InferenceServerClient(server.url) as client:
        with _tracing(client, "pipeline"):
            result = client.infer("pipeline", [_input(httpclient, [1, 2, 3, 4], "RAW")],
                                  request_id="whole")
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[2, 3, 4, 5]])
    traces = _new_traces(folder, before, 3)
    (ensemble,) = [t for t in traces if t["model_name"] == "pipeline"]
    steps = [t for t in traces if t["model_name"] != "pipeline"]
    assert ensemble["request_id"] == "whole"
    assert sorted(t["model_name"] for t in steps) == ["failing", "identity"]
    assert all(t["parent_id"] == ensemble["id"] for t in steps)
    for step in steps:  # each step ran in its model's executor, inside the ensemble's time
        names = _names_in_order(step)
        assert names[:2] == ["REQUEST_START", "QUEUE_START"] and "COMPUTE_END" in names
        first, last = step["timestamps"][0]["ns"], step["timestamps"][-1]["ns"]
        stamps = {s["name"]: s["ns"] for s in ensemble["timestamps"]}
        assert stamps["REQUEST_START"] <= first <= last <= stamps["REQUEST_END"]


def test_level_tensors_keeps_what_went_in_and_came_out(
        traced: tuple[RunningServer, pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with _tracing(client, "failing", trace_level=["TIMESTAMPS", "TENSORS"]):
            client.infer("failing", [_input(grpcclient, [0.5, 1, 2, 3])])
    (trace,) = _new_traces(folder, before, 1)
    assert [(t["activity"], t["tensor"]) for t in trace["tensors"]] == [
        ("TENSOR_QUEUE_INPUT", {"name": "INPUT__0", "data": "0.5,1.0,2.0,3.0",
                                "shape": "1,4", "dtype": "FP32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT__0", "data": "1.5,2.0,3.0,4.0",
                                   "shape": "1,4", "dtype": "FP32"})]


def test_a_failed_request_is_traced_and_the_server_serves_on(
        traced: tuple[RunningServer, pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    with httpclient.InferenceServerClient(server.url) as client:
        with _tracing(client, "failing"):
            with pytest.raises(InferenceServerException, match="negative input"):
                client.infer("failing", [_input(httpclient, [-1, 0, 0, 0])])
            result = client.infer("failing", [_input(httpclient, [1, 0, 0, 0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), [[2, 1, 1, 1]])
    failed, answered = _new_traces(folder, before, 2)
    assert _names_in_order(failed) == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START",
                                       "QUEUE_START", "REQUEST_END", "HTTP_SEND_START",
                                       "HTTP_SEND_END"]
    assert _names_in_order(answered) == HTTP_STAGES


def test_a_decoupled_requests_trace_has_each_response(
        traced: tuple[RunningServer, pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with _tracing(client, "counter"):
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            client.async_stream_infer("counter", [_input(grpcclient, [3, 0, 0, 0])],
                                      request_id="three")
            got = [answers.get(timeout=10) for _ in range(3)]
            client.stop_stream()
    assert all(error is None for _, error in got)
    (trace,) = _new_traces(folder, before, 1)
    names = _names_in_order(trace)
    assert names.count("INFER_RESPONSE_COMPLETE") == 3
    assert names[:4] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START",
                         "QUEUE_START"]
    assert names[-1] == "REQUEST_END"


def test_traces_started_from_the_command_line_are_written_by_shutdown(
        tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4], "dynamic_batching { }")
    file = tmp_path / "trace.json"
    server = start_server(repo, tmp_path / "server.log", "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", "rate=1", "--trace-config",
                          f"triton,file={file}")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            for n in range(5):
                client.infer("identity", [_input(httpclient, [n, 0, 0, 0])],
                             request_id=f"r{n}")
    finally:
        assert stop_server(server) == 0, server.log.read_text()
    traces = _entries(tmp_path)  # log_frequency 0: one file, a JSON array, at shutdown
    assert [t["request_id"] for t in traces.values()] == [f"r{n}" for n in range(5)]
    assert all(_names_in_order(t) == HTTP_STAGES for t in traces.values())


def test_a_bad_trace_config_stops_the_server_from_starting(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    for given, message in [
            ("level=TIMESTAMPS", "trace_level needs trace_file"),
            ("opentelemetry,url=localhost:4318", "the opentelemetry trace settings \\(url, "
                                                 "resource, bsp_\\*\\) need trace_mode "
                                                 "opentelemetry"),
            ("rate=0", "trace_rate must be 1 or more, got 0")]:
        with pytest.raises(RuntimeError, match=message):
            start_server(repo, tmp_path / "server.log", "--trace-config", given)


def _trace_metrics(server: RunningServer) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as answer:
        text = answer.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("tensorgate_traces_")}


def test_metrics_count_the_traces_written(traced: tuple[RunningServer, pathlib.Path]) -> None:
    server, folder = traced
    before = set(_entries(folder))
    counted = _trace_metrics(server)
    with httpclient.InferenceServerClient(server.url) as client:
        with _tracing(client, "identity"):
            for n in range(2):
                client.infer("identity", [_input(httpclient, [n, 0, 0, 0])])
    assert len(_new_traces(folder, before, 2)) == 2
    deadline = time.monotonic() + 5  # the writer reports its write done a moment later
    while (now := _trace_metrics(server))["tensorgate_traces_held"] and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert now["tensorgate_traces_written_total"] == \
        counted["tensorgate_traces_written_total"] + 2
    assert now["tensorgate_traces_held"] == 0
    assert now["tensorgate_traces_dropped_total"] == 0
