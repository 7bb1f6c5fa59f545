"""Opentelemetry trace mode on its own: its settings as the config resolves them (OTEL_*
variables included), W3C traceparent parsing (fuzzed), a trace made into Triton's spans,
the tracer's sampling rules with a caller's context, and the exporter's queue bound."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tensorgate.config import ServerConfig
from tensorgate.trace_config import otlp_url
from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.trace import SpanContext, Trace
from tensorgate.tracing import Tracer
from tensorgate.tracing_otlp import OtlpExporter, parse_traceparent, trace_spans

TRACE = "0af7651916cd43dd8448eb211c12666c"
SPAN = "b7ad6b7169242424"
OTEL_VARIABLES = ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                  "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_RESOURCE_ATTRIBUTES",
                  "OTEL_SERVICE_NAME")


@pytest.fixture(autouse=True)
def _no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _otel(**fields: Any) -> ServerConfig:
    return ServerConfig(**{"trace_mode": "opentelemetry", "trace_level": ("TIMESTAMPS",),
                           **fields})


def test_config_fills_in_the_sdks_defaults() -> None:
    config = _otel()
    assert config.trace_otel_url == "http://localhost:4318/v1/traces"
    assert config.trace_otel_resource == ("service.name=tensorgate",)
    assert (config.trace_bsp_max_queue_size, config.trace_bsp_schedule_delay_ms,
            config.trace_bsp_max_export_batch_size) == (2048, 5000, 512)
    assert config.trace_file is None  # no file needed in this mode


def test_config_takes_the_otel_variables_and_its_own_settings_over_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml%20infra,service.name=from-env,"
                                                   "zone=a")
    config = _otel(trace_bsp_max_export_batch_size=50,
                   trace_otel_resource=("zone=b", "note=x=y,z"))
    assert (config.trace_bsp_max_queue_size, config.trace_bsp_schedule_delay_ms,
            config.trace_bsp_max_export_batch_size) == (100, 250, 50)
    assert config.trace_otel_resource == ("service.name=from-env", "team=ml infra", "zone=b",
                                          "note=x=y,z")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "named")
    assert _otel(trace_bsp_max_export_batch_size=50).trace_otel_resource[0] == \
        "service.name=named"


@pytest.mark.parametrize("given, whole", [
    ("", "http://localhost:4318/v1/traces"),
    ("collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ("collector:4318", "http://collector:4318/v1/traces"),
    ("https://otel.example.com/api/traces", "https://otel.example.com/api/traces"),
    ("[::1]:4318", "http://[::1]:4318/v1/traces"),
])
def test_collector_urls_are_made_whole(given: str, whole: str) -> None:
    assert otlp_url(given) == whole


@pytest.mark.parametrize("fields, message", [
    ({"trace_level": ("TENSORS",)}, "^opentelemetry trace mode records TIMESTAMPS only"),
    ({"trace_file": "/tmp/t.json"}, "^trace_file and trace_log_frequency are the triton"),
    ({"trace_otel_url": "ftp://collector/x"}, "^trace_otel_url 'ftp://collector/x' is not "
                                              "http\\(s\\)://HOST"),
    ({"trace_otel_url": "collector:port/x"}, "^trace_otel_url 'collector:port/x' has no "
                                             "valid port$"),
    ({"trace_otel_url": "http://user:key@c:1/v1/traces"}, "may not carry a query, fragment "
                                                          "or credentials"),
    ({"trace_bsp_max_queue_size": 10, "trace_bsp_max_export_batch_size": 11},
     "^trace_bsp_max_export_batch_size \\(11\\) must not exceed trace_bsp_max_queue_size "
     "\\(10\\)$"),
    ({"trace_bsp_schedule_delay_ms": -1}, "^trace_bsp_schedule_delay_ms must be 1 or more"),
    ({"trace_otel_resource": ("novalue",)}, "^trace_otel_resource: 'novalue' is not "
                                            "key=value$"),
    ({"trace_rate": -1}, "^trace_rate must be 0 or more, got -1$"),
])
def test_config_refuses_what_the_mode_cannot_do(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _otel(**fields)


def test_config_refuses_otel_settings_without_the_mode_and_bad_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="need trace_mode opentelemetry"):
        ServerConfig(trace_otel_url="collector:4318")
    with pytest.raises(ValueError, match="^trace_rate must be 1 or more, got 0$"):
        ServerConfig(trace_rate=0)  # rate 0 means something only in opentelemetry mode
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(ValueError, match="^OTEL_BSP_MAX_QUEUE_SIZE must be an integer, got "
                                         "'lots'$"):
        _otel()


# -- traceparent --------------------------------------------------------------------------

def test_traceparent_as_the_w3c_spec_reads_it() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == \
        (bytes.fromhex(TRACE), bytes.fromhex(SPAN), True)
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00") == \
        (bytes.fromhex(TRACE), bytes.fromhex(SPAN), False)
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-03-more") is not None  # a later version
    for wrong in [f"00-{TRACE.upper()}-{SPAN}-01", f"ff-{TRACE}-{SPAN}-01",
                  f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01",
                  f"00-{TRACE}-{SPAN}-01-more", f"00-{TRACE[:-1]}-{SPAN}-01", "", None,
                  f"00-{TRACE}-{SPAN}-1"]:
        assert parse_traceparent(wrong) is None, wrong


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=80),
                 st.builds(lambda v, t, s, f, r: f"{v}-{t}-{s}-{f}{r}",
                           st.text("0123456789abcdefABCDEF", min_size=2, max_size=2),
                           st.text("0123456789abcdef", min_size=31, max_size=33),
                           st.text("0123456789abcdef", min_size=15, max_size=17),
                           st.text("0123456789abcdefx", min_size=1, max_size=3),
                           st.text(max_size=5))))
@example("00-" + "a" * 32 + "-" + "b" * 16 + "-01\x00")
def test_any_header_parses_or_is_ignored(text: str) -> None:
    found = parse_traceparent(text)
    if found is not None:
        trace_id, span_id, _ = found
        assert len(trace_id) == 16 and len(span_id) == 8
        assert any(trace_id) and any(span_id)
        assert text.strip()[3:35] == trace_id.hex()


# -- spans --------------------------------------------------------------------------------

class _Sink:
    def __init__(self) -> None:
        self.collected: list[Trace] = []
        self.last = 0

    def next_id(self) -> int:
        self.last += 1
        return self.last

    def collect(self, trace: Trace) -> None:
        self.collected.append(trace)


def _stamped(trace: Trace, names: list[str], start: int = 1000) -> Trace:
    for step, name in enumerate(names):
        trace.stamp(name, start + step * 10)
    return trace


def test_a_request_becomes_tritons_three_spans_and_a_step_two() -> None:
    sink = _Sink()
    context = SpanContext.begin(bytes.fromhex(TRACE), bytes.fromhex(SPAN))
    trace = _stamped(Trace(1, "ensemble", sink, False, context=context),
                     ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
                      "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                      "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END",
                      "HTTP_SEND_START", "HTTP_SEND_END"])
    trace.version, trace.request_id = 3, 'r"1\n\u00e9'  # a client's text, escaped
    root, model, compute = map(json.loads, trace_spans(trace, offset_ns=5))
    assert (root["name"], model["name"], compute["name"]) == ("InferRequest", "ensemble",
                                                              "compute")
    assert root["traceId"] == model["traceId"] == compute["traceId"] == TRACE
    assert root["parentSpanId"] == SPAN
    assert model["parentSpanId"] == root["spanId"] == context.parent_id.hex()
    assert compute["parentSpanId"] == model["spanId"] == context.span_id.hex()
    assert [e["name"] for e in root["events"]] == [
        "HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
        "HTTP_SEND_END"]
    assert (root["startTimeUnixNano"], root["endTimeUnixNano"]) == ("1005", "1115")
    assert (model["startTimeUnixNano"], model["endTimeUnixNano"]) == ("1025", "1095")
    assert (compute["startTimeUnixNano"], compute["endTimeUnixNano"]) == ("1045", "1075")
    assert model["attributes"] == [
        {"key": "model_name", "value": {"stringValue": "ensemble"}},
        {"key": "model_version", "value": {"intValue": "3"}},
        {"key": "request_id", "value": {"stringValue": 'r"1\n\u00e9'}}]
    step = _stamped(trace.child("identity"), ["REQUEST_START", "QUEUE_START",
                                              "COMPUTE_START", "COMPUTE_END",
                                              "INFER_RESPONSE_COMPLETE", "REQUEST_END"])
    own, work = map(json.loads, trace_spans(step, offset_ns=0))
    assert own["parentSpanId"] == model["spanId"] and work["parentSpanId"] == own["spanId"]
    assert own["traceId"] == TRACE
    assert [e["name"] for e in own["events"]] == ["REQUEST_START", "QUEUE_START",
                                                   "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert {"key": "parent_id", "value": {"intValue": "1"}} in own["attributes"]
    assert trace_spans(Trace(9, "m", sink, False), 0) == []  # triton mode: no context


def test_a_new_trace_has_its_own_ids() -> None:
    one, two = SpanContext.begin(), SpanContext.begin()
    assert one.trace_id != two.trace_id and len(one.trace_id) == 16
    assert one.caller_id == b"" and one.span_id != one.parent_id
    assert one.traceparent() == f"00-{one.trace_id.hex()}-{one.span_id.hex()}-01"
    assert parse_traceparent(one.traceparent()) == (one.trace_id, one.span_id, True)


# -- the tracer's sampling in this mode ---------------------------------------------------

class _Held:
    """An exporter that keeps what it is given."""

    def __init__(self, done: Any) -> None:
        self.done = done
        self.traces: list[Trace] = []

    def add(self, trace: Trace) -> bool:
        self.traces.append(trace)
        return len(self.traces) <= 2

    async def close(self, timeout_s: float) -> None:
        pass


def test_a_sampled_caller_is_traced_whatever_rate_and_count_say() -> None:
    held: list[_Held] = []
    tracer = Tracer(level=("TIMESTAMPS",), rate=0, count=0,
                    exporter=lambda done: held.append(_Held(done)) or held[-1])
    assert tracer.on and tracer.mode == "opentelemetry"
    assert tracer.sample("m") is None  # rate 0: none of its own
    assert tracer.sample("m", f"00-{TRACE}-{SPAN}-00") is None  # the caller did not sample
    assert tracer.sample("m", "garbage") is None
    trace = tracer.sample("m", f"00-{TRACE}-{SPAN}-01")
    assert trace is not None and trace.context is not None
    assert trace.context.trace_id.hex() == TRACE and trace.context.caller_id.hex() == SPAN
    assert tracer.current()["trace_count"] == "0"  # not spent by a caller's trace
    tracer.update({"trace_rate": "2", "trace_count": "1"})
    assert tracer.sample("m") is None
    own = tracer.sample("m", f"00-{TRACE}-{SPAN}-00")  # the second: taken by the rate,
    assert own is not None and own.context is not None  # in the caller's trace
    assert own.context.trace_id.hex() == TRACE
    assert tracer.current()["trace_count"] == "0"
    for finished in (trace, own, tracer.sample("m", f"00-{TRACE}-{SPAN}-01")):
        assert finished is not None
        finished.stamp("REQUEST_START")
        finished.finish()
    assert len(held[0].traces) == 3
    assert tracer.statistics() == (0, 2, 1)  # the third found the queue full: dropped
    held[0].done(held[0].traces[:2], True)
    assert tracer.statistics() == (2, 0, 1)


def test_triton_mode_ignores_a_callers_context(tmp_path: Any) -> None:
    tracer = Tracer(tmp_path / "t.json", ("TIMESTAMPS",), rate=1)
    trace = tracer.sample("m", f"00-{TRACE}-{SPAN}-01")
    assert trace is not None and trace.context is None
    with pytest.raises(ValueError, match="must be 1 or more"):
        Tracer(tmp_path / "t.json", ("TIMESTAMPS",), rate=0)
    with pytest.raises(InvalidArgumentError, match="must be 1 or more"):
        tracer.update({"trace_rate": "0"})


# -- the exporter -------------------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_exporter_bounds_its_queue_and_reports_what_it_could_not_send() -> None:
    reports: list[tuple[int, bool]] = []

    async def scenario() -> list[bool]:
        exporter = OtlpExporter(f"http://127.0.0.1:{_closed_port()}/v1/traces",
                                ("service.name=t",), max_queue_size=7,
                                schedule_delay_ms=600_000, max_export_batch_size=7,
                                version="test", environ={},
                                done=lambda traces, sent: reports.append((len(traces), sent)))
        sink = _Sink()
        added = []
        for _ in range(3):  # three spans each: the third does not fit
            trace = Trace(sink.next_id(), "m", sink, False, context=SpanContext.begin())
            trace.stamp("REQUEST_START")
            added.append(exporter.add(trace))
        await exporter.close(timeout_s=10)
        return added

    assert asyncio.run(scenario()) == [True, True, False]
    assert reports == [(2, False)]  # nothing listens there: the two queued are dropped
